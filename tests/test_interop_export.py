"""Export to Hugging Face transformers and import back: logits parity, refusals, round trip, model card."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from interop_support import make_checkpoint, make_tokenizer
from tablefree.checkpoint.model_dir import load_model, mark_complete, read_model_config
from tablefree.cli import main
from tablefree.export import export_hf, import_hf
from tablefree.model_config import ModelConfig

transformers = pytest.importorskip("transformers")

SHAPE = dict(d_model=64, n_layers=2, n_heads=4, d_ff=96, max_seq_len=48)
CASES = {
    "learned": dict(interface="learned"),
    "canonical": dict(interface="canonical"),
    "affine": dict(interface=dict(name="affine", seed=3, values="pm1", lift="interleave", bit_order="msb")),
    "affine-gqa": dict(interface="affine", n_kv_heads=2),
    "gelu-layernorm": dict(interface="canonical", mlp="gelu", norm="layernorm", norm_eps=1e-6),
    "gaussian": dict(interface=dict(name="gaussian", seed=3, sigma=0.5)),
    "projected": dict(interface=dict(name="projected", code="affine", values="pm1", init="lift")),
    "wide-random": dict(interface=dict(name="wide-random", width=40, lift="interleave")),
    "hashed": dict(interface=dict(name="hashed", bits=6, values="pm1")),
    "separable": dict(interface=dict(name="separable", generator_hidden=8)),
    "separable-concat": dict(interface=dict(name="separable", combine="concat", coordinates=3)),
}
ABLATIONS = ["gaussian", "projected", "wide-random", "hashed", "separable", "separable-concat"]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", vocab_size=400)


def _config(case: str, vocab_size: int = 400) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, rope_theta=5000.0, **{**SHAPE, **CASES[case]})


def _hf_model(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_logits_match(tmp_path, tokenizer_path, case):
    config = _config(case)
    model = make_checkpoint(tmp_path / "ck", config, tokenizer_path, seed=7)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    hf = _hf_model(tmp_path / "hf")
    expected = "GPTNeoXForCausalLM" if config.mlp == "gelu" else "LlamaForCausalLM"
    assert type(hf).__name__ == expected
    assert hf.config.tie_word_embeddings is False
    ids = torch.randint(
        0, config.vocab_size, (3, config.max_seq_len), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.std() > 1.0  # far from uniform, so the comparison means something
    assert (ours - theirs).abs().max() <= 1e-4 * ours.abs().max()


def test_export_writes_a_complete_loadable_directory(tmp_path, tokenizer_path):
    make_checkpoint(tmp_path / "ck", _config("canonical"), tokenizer_path, meta={"step": 12})
    out = export_hf(tmp_path / "ck", tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert {"tokenizer_config.json", "README.md"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf.tmp")]  # no staging left behind
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == 5000.0 and config["rope_theta"] == 5000.0
    assert config["rms_norm_eps"] == 1e-5 and config["max_position_embeddings"] == 48
    assert (
        config["attention_bias"] is False and config["mlp_bias"] is False and config["rope_scaling"] is None
    )
    assert config["tablefree"]["step"] == 12
    weights = load_file(str(out / "model.safetensors"))
    assert weights["model.embed_tokens.weight"].shape == (400, 64)
    assert "auto_map" not in config  # plain transformers classes, no remote code


def test_exported_tokenizer_matches_ours(tmp_path, tokenizer_path):
    from tablefree.data.tokenizer import load_tokenizer

    make_checkpoint(tmp_path / "ck", _config("learned"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_tokenizer(tokenizer_path)
    text = "  Hello, world!\n\nNaïve café — 日本語 tabs\tand <|endoftext|> the end "
    assert hf_tok.encode(text) == ours.encode(text).ids
    assert hf_tok.decode(hf_tok.encode(text)) == text
    eot = ours.token_to_id("<|endoftext|>")
    assert hf_tok.eos_token_id == eot and hf_tok.bos_token_id == eot
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == eot


def test_model_card_describes_the_fixed_code(tmp_path, tokenizer_path):
    model = make_checkpoint(tmp_path / "ck", _config("affine"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "fixed function of the token id" in card
    for option in ("lift=interleave", "values=pm1", "bit_order=msb", "seed=3"):
        assert option in card
    block = card.split("```")[-2].split()  # the last code block holds A, one row per line
    matrix = [[int(bit) for bit in row] for row in block]
    assert matrix == model.input.affine_matrix.tolist()
    offset = "".join(str(b) for b in model.input.affine_offset.tolist())
    assert f"b = `{offset}`" in card


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(mlp="swiglu", norm="layernorm"), "no exact transformers equivalent"),
        (dict(mlp="gelu", norm="rmsnorm"), "no exact transformers equivalent"),
        (dict(mlp="gelu", norm="layernorm", n_kv_heads=2), "grouped-query attention"),
    ],
)
def test_export_refuses_variants_without_an_exact_equivalent(tmp_path, tokenizer_path, overrides, message):
    config = ModelConfig(vocab_size=400, **{**SHAPE, **overrides})
    make_checkpoint(tmp_path / "ck", config, tokenizer_path)
    with pytest.raises(ValueError, match=message):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("case", ["learned", "affine", "affine-gqa", "gelu-layernorm", *ABLATIONS])
def test_round_trip_restores_the_checkpoint(tmp_path, tokenizer_path, case):
    config = _config(case)
    model = make_checkpoint(tmp_path / "ck", config, tokenizer_path, meta={"step": 5})
    export_hf(tmp_path / "ck", tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "back")
    restored, _ = load_model(tmp_path / "back")
    assert restored.config == model.config  # interface and its options (resolved seed) included
    original = model.state_dict()
    for name, tensor in restored.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == tokenizer_path.read_bytes()
    assert json.loads((tmp_path / "back" / "meta.json").read_text())["step"] == 5


def test_import_of_a_modified_table_falls_back_to_learned(tmp_path, tokenizer_path):
    make_checkpoint(tmp_path / "ck", _config("canonical"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    weights["model.embed_tokens.weight"][7, 3] += 0.5
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.warns(UserWarning, match="not the table of the recorded 'canonical' interface"):
        import_hf(tmp_path / "hf", tmp_path / "back")
    restored, _ = load_model(tmp_path / "back")
    assert restored.config.interface.name == "learned"
    assert torch.equal(restored.input.weight, weights["model.embed_tokens.weight"])


def test_import_a_foreign_llama_with_tied_embeddings(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=40,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 123.0},
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.2)
    hf.save_pretrained(tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "ours")
    model, _ = load_model(tmp_path / "ours")
    assert model.config.interface.name == "learned" and model.config.n_kv_heads == 1
    ids = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert (ours - theirs).abs().max() <= 1e-4 * ours.abs().max()


def test_import_refuses_parallel_residual_neox(tmp_path, tokenizer_path):
    make_checkpoint(tmp_path / "ck", _config("gelu-layernorm"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["use_parallel_residual"] = True
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_parallel_residual"):
        import_hf(tmp_path / "hf", tmp_path / "back")


def test_import_names_a_missing_config_field(tmp_path, tokenizer_path):
    make_checkpoint(tmp_path / "ck", _config("learned"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["hidden_size"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: missing the field 'hidden_size'"):
        import_hf(tmp_path / "hf", tmp_path / "back")


def test_export_refuses_a_non_empty_directory_unless_overwrite(tmp_path, tokenizer_path):
    make_checkpoint(tmp_path / "ck", _config("learned"), tokenizer_path)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "stale.txt").write_text("old")
    with pytest.raises(FileExistsError):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    export_hf(tmp_path / "ck", tmp_path / "hf", overwrite=True)
    assert not (tmp_path / "hf" / "stale.txt").exists()


def test_cli_export_and_import(tmp_path, tokenizer_path, capsys):
    make_checkpoint(tmp_path / "ck", _config("affine"), tokenizer_path)
    assert main(["export", str(tmp_path / "ck"), "--format", "hf", str(tmp_path / "hf")]) == 0
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    assert "interface: affine" in capsys.readouterr().out
    assert read_model_config(tmp_path / "back") == _config("affine")
    bad = ModelConfig(vocab_size=400, **{**SHAPE, "mlp": "gelu"})
    make_checkpoint(tmp_path / "bad", bad, tokenizer_path)
    assert main(["export", str(tmp_path / "bad"), "--format", "hf", str(tmp_path / "hf2")]) == 1
    assert "no exact transformers equivalent" in capsys.readouterr().err


def test_a_new_interface_exports_and_imports_as_itself(tmp_path, tokenizer_path):
    """An interface defined outside the package (a buffer-held codebook) round-trips through the contract
    alone: its table, its model card paragraph and its state file; import does not make it learned."""
    from scratch_interface import scratch_interface

    with scratch_interface():
        config = ModelConfig(vocab_size=400, rope_theta=5000.0, **SHAPE, interface={"name": "scratch"})
        model = make_checkpoint(tmp_path / "ck", config, tokenizer_path)
        export_hf(tmp_path / "ck", tmp_path / "hf")
        assert "seeded N(0, 1.0²) codebook" in (tmp_path / "hf" / "README.md").read_text()
        import_hf(tmp_path / "hf", tmp_path / "back")
        restored, _ = load_model(tmp_path / "back")
        assert restored.config.interface == model.config.interface
        assert torch.equal(restored.input.codebook, model.input.codebook)


def test_exports_of_the_first_format_still_import(tmp_path, tokenizer_path):
    """Exports written before the interface state file kept affine's A and b as lists in config.json."""
    model = make_checkpoint(tmp_path / "ck", _config("affine"), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    record = config["tablefree"]
    del record["interface_state"]
    record["affine_matrix"] = model.input.affine_matrix.tolist()
    record["affine_offset"] = model.input.affine_offset.tolist()
    record["interface"] |= {"lift": record["interface"]["lift"]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf" / "tablefree_interface.safetensors").unlink()
    import_hf(tmp_path / "hf", tmp_path / "back")
    restored, _ = load_model(tmp_path / "back")
    assert restored.config == model.config
    assert torch.equal(restored.input.affine_matrix, model.input.affine_matrix)


def test_model_card_names_the_run_and_hashes_not_a_local_path(tmp_path, tokenizer_path):
    run = tmp_path / "my-run"
    make_checkpoint(
        run / "checkpoints" / "step_00000007", _config("canonical"), tokenizer_path, meta={"step": 7}
    )
    export_hf(run, tmp_path / "hf")
    card = (tmp_path / "hf" / "README.md").read_text()
    config = (tmp_path / "hf" / "config.json").read_text()
    assert str(tmp_path) not in card and str(tmp_path) not in config
    assert "run `my-run`, checkpoint `step_00000007` (step 7" in card
    weights = run / "checkpoints" / "step_00000007" / "model.safetensors"
    import hashlib

    assert hashlib.sha256(weights.read_bytes()).hexdigest() in card
    assert json.loads(config)["tablefree"]["source_run"] == "my-run"


@pytest.mark.parametrize("case", ["gaussian", "projected", "separable"])
def test_a_bfloat16_export_imports_as_the_interface(tmp_path, tokenizer_path, case):
    """The table is rounded to bfloat16, but the interface is recognised from its own tensors, and restored
    at full precision (projected's map and separable's codebooks come from the state file, gaussian's table
    from its seed)."""
    model = make_checkpoint(tmp_path / "ck", _config(case), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf", dtype="bfloat16")
    import_hf(tmp_path / "hf", tmp_path / "back")
    restored, _ = load_model(tmp_path / "back")
    assert restored.config == model.config
    assert torch.equal(restored.input.table(), model.input.table())


def test_model_cards_of_the_ablation_interfaces(tmp_path, tokenizer_path):
    for case, phrase in [
        ("gaussian", "σ = 0.5"),
        ("projected", "trained 64×9 matrix (576 parameters"),
        ("wide-random", "random 40-bit code of t"),
        ("hashed", "first K' = 6 bits"),
        ("separable", "2 trained codebooks (20×64 + 20×64)"),
        ("separable-concat", "3 trained codebooks (8×22 + 8×21 + 7×21)"),
    ]:
        make_checkpoint(tmp_path / case, _config(case), tokenizer_path)
        export_hf(tmp_path / case, tmp_path / f"{case}-hf")
        card = (tmp_path / f"{case}-hf" / "README.md").read_text()
        assert phrase in card, case
        assert ("**not trained**" in card) == (case in ("gaussian", "wide-random", "hashed")), case


# ----------------------------------------------------------------------------------------------------------
# Import of damaged or lying directories: the project's own error, naming the file, before any allocation


def _export(tmp_path, tokenizer_path, case="affine-gqa"):
    make_checkpoint(tmp_path / "ck", _config(case), tokenizer_path)
    export_hf(tmp_path / "ck", tmp_path / "hf")
    return tmp_path / "hf"


def _edit_config(hf, **changes):
    config = json.loads((hf / "config.json").read_text())
    config.update(changes)
    (hf / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            dict(hidden_size=128, head_dim=32),
            r"model.safetensors: tensor 'model.embed_tokens.weight' has shape \[400, 64\]",
        ),
        (
            dict(vocab_size=500),
            r"model.safetensors: tensor 'model.embed_tokens.weight' has shape \[400, 64\].*\[500, 64\]",
        ),
        (dict(intermediate_size=80), r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight'"),
        (
            dict(num_key_value_heads=4),
            r"model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape \[32, 64\]",
        ),
        (
            dict(num_hidden_layers=3),
            r"model.safetensors: weight 'model.layers.2.self_attn.q_proj.weight' missing",
        ),
        (dict(num_hidden_layers=1), r"unexpected weights \['model.layers.1"),
        (
            dict(max_position_embeddings=1e6),
            r"config.json: max_position_embeddings = 1000000: expected a whole number from 1 to 262,144",
        ),
        (dict(hidden_size=-64), r"config.json: hidden_size = -64: expected a whole number"),
        (dict(vocab_size=10**12), r"config.json: vocab_size = 1000000000000: expected a whole number"),
        (dict(num_attention_heads="4"), r"config.json: num_attention_heads = '4': expected a whole number"),
        (dict(num_attention_heads=True), r"config.json: num_attention_heads = True"),
        (dict(rms_norm_eps="tiny"), r"config.json: rms_norm_eps = 'tiny': expected a positive number"),
        (dict(num_attention_heads=3), r"config.json: head_dim 21 × 3 heads != hidden_size 64"),
    ],
)
def test_import_refuses_a_config_that_disagrees_with_the_weights(
    tmp_path, tokenizer_path, monkeypatch, changes, message
):
    hf = _export(tmp_path, tokenizer_path)
    _edit_config(hf, **changes)
    if "head_dim" in message:
        _edit_config(hf, head_dim=None)
    if "unexpected" not in message:  # checked from the headers alone: no tensor is ever loaded
        monkeypatch.setattr(
            "tablefree.export.hf_import.load_file", lambda *a, **k: pytest.fail("loaded a tensor")
        )
    with pytest.raises(ValueError, match=message):
        import_hf(hf, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_import_refuses_a_tensor_of_the_wrong_shape(tmp_path, tokenizer_path):
    hf = _export(tmp_path, tokenizer_path)
    weights = load_file(str(hf / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"][
        :, :50
    ].contiguous()
    save_file(weights, str(hf / "model.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' has shape \[64, 50\], but config.json .* implies \[64, 96\]",
    ):
        import_hf(hf, tmp_path / "back")


def test_import_fuzz_over_corrupted_export_directories(tmp_path, tokenizer_path):
    """Seeded corruptions of every file import reads: truncations anywhere, flipped bytes in the headers, a
    truncated config.json. Each must end in the project's own error naming the damaged
    file, or (a harmless flip, e.g. in the header's metadata) in an import identical to the clean one."""
    import random
    import shutil

    clean = _export(tmp_path, tokenizer_path, case="affine")
    import_hf(clean, tmp_path / "reference")
    reference, _ = load_model(tmp_path / "reference")
    rng = random.Random(12)
    outcomes = {"error naming the file": 0, "harmless": 0}
    targets = ["model.safetensors", "tablefree_interface.safetensors", "config.json"]
    for trial in range(60):
        hf = tmp_path / f"v{trial}"
        shutil.copytree(clean, hf)
        name = targets[trial % len(targets)]
        path = hf / name
        data = bytearray(path.read_bytes())
        header_end = 8 + int.from_bytes(data[:8], "little") if name.endswith(".safetensors") else len(data)
        if trial % 2 == 0 or name == "config.json":  # config.json is the authority: a flip there can be valid
            del data[rng.randrange(0, len(data)) :]  # truncate
        else:
            for _ in range(rng.randint(1, 4)):  # flip bytes of the header (the data cannot be checked)
                data[rng.randrange(0, header_end)] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        try:
            import_hf(hf, tmp_path / f"back{trial}")
        except (ValueError, FileNotFoundError) as error:
            assert name in str(error), (trial, name, str(error))
            outcomes["error naming the file"] += 1
            continue
        restored, _ = load_model(tmp_path / f"back{trial}")
        assert restored.config == reference.config, (trial, name)
        assert all(torch.equal(v, reference.state_dict()[k]) for k, v in restored.state_dict().items()), trial
        outcomes["harmless"] += 1
    assert outcomes["error naming the file"] >= 45, outcomes


def test_import_refuses_a_singular_recorded_affine_map(tmp_path, tokenizer_path):
    hf = _export(tmp_path, tokenizer_path, case="affine")
    state = load_file(str(hf / "tablefree_interface.safetensors"))
    state["affine_matrix"][0] = state["affine_matrix"][1]
    save_file(state, str(hf / "tablefree_interface.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"tablefree_interface.safetensors: the recorded affine interface's state is invalid: .*singular",
    ):
        import_hf(hf, tmp_path / "back")


def test_export_of_a_damaged_checkpoint_names_the_file(tmp_path, tokenizer_path):
    """A truncated model.safetensors, or a config.json whose sizes disagree with the weights, in the source
    checkpoint: the project's error naming the file, not a torch traceback."""
    make_checkpoint(tmp_path / "ck", _config("canonical"), tokenizer_path)
    weights = tmp_path / "ck" / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(ValueError, match=r"ck/model.safetensors: damaged after it was written"):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    mark_complete(tmp_path / "ck")  # digests recorded after the damage: the header check still catches it
    with pytest.raises(ValueError, match=r"ck/model.safetensors: tensor .* ends at byte .*truncated"):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    weights.write_bytes(intact)
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    config["model"]["d_ff"] = 128
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    mark_complete(tmp_path / "ck")
    with pytest.raises(
        ValueError,
        match=r"model.safetensors: tensor 'layers.0.mlp.w1.weight' has shape \[96, 64\], but .*config.json implies \[128, 64\]",
    ):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_and_generate_refuse_a_tokenizer_the_checkpoint_did_not_record(
    tmp_path, tokenizer_path, capsys
):
    """Issue 26: `export` shipped, and `generate` used, a tokenizer whose hash disagreed with the checkpoint's
    recorded one (2,048 tokens beside a 4,096 vocabulary)."""
    make_checkpoint(tmp_path / "ck", _config("canonical"), tokenizer_path)
    other = make_tokenizer(tmp_path / "other.json", vocab_size=300)
    (tmp_path / "ck" / "tokenizer.json").write_bytes(other.read_bytes())  # swapped beside the weights
    mark_complete(
        tmp_path / "ck"
    )  # digests recorded afterwards: the tokenizer-hash check itself must catch it
    with pytest.raises(ValueError, match="does not match the tokenizer_hash"):
        export_hf(tmp_path / "ck", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert main(["generate", str(tmp_path / "ck"), "--prompt", "the", "--max-new-tokens", "2"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("tablefree generate: error: tokenizer ") and "does not match" in line
    # the recorded tokenizer given explicitly is used; another one given explicitly is refused
    (tmp_path / "ck" / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    mark_complete(tmp_path / "ck")
    export_hf(tmp_path / "ck", tmp_path / "hf", tokenizer_path=tokenizer_path)
    with pytest.raises(ValueError, match="does not match the tokenizer_hash"):
        export_hf(tmp_path / "ck", tmp_path / "hf2", tokenizer_path=other)
