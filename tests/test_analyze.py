"""tablefree analyze: bit probes on synthetic models whose answer is known, CKA's invariances, the effective
embeddings, the output files, and the errors for mismatched inputs (tiny untrained models: fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tablefree
from tablefree.analysis import (
    AnalyzeSpec,
    MLPProbeSettings,
    analysis_markdown,
    cka_null,
    effective_embeddings,
    fit_mlp,
    fit_ridge,
    frequency_r2,
    linear_cka,
    nearest_neighbours,
    probe_code_bits,
    random_labels,
    run_analysis,
)
from tablefree.analysis.probes import code_sets
from tablefree.analysis.run import controlled_probes
from tablefree.checkpoint.model_dir import save_model
from tablefree.cli import main
from tablefree.data.tokenizer import tokenizer_hash
from train_helpers import make_dataset

VOCAB = 96


def tiny_model(interface: str = "canonical", vocab_size: int = VOCAB, seed: int = 0, **overrides):
    shape = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "max_seq_len": 32, **overrides}
    config = tablefree.preset("tiny", interface=interface, vocab_size=vocab_size, **shape)
    return tablefree.build_model(config, seed=seed)


class CopyBlock(torch.nn.Module):
    """A block that passes the residual state through unchanged."""

    def forward(self, x, cos, sin, mask, cache, outputs=None):
        return x


class ZeroBlock(torch.nn.Module):
    """A block that erases the residual state."""

    def forward(self, x, cos, sin, mask, cache, outputs=None):
        return torch.zeros_like(x)


def random_windows(count: int, seed: int, vocab_size: int = VOCAB) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (4, 32), generator=generator) for _ in range(count)]


# ------------------------------------------------------------------------------------------------------------
# Probes with a known answer


def test_probe_reads_copied_bits_perfectly_and_erased_bits_at_chance():
    model = tiny_model("canonical")
    model.layers[0] = CopyBlock()  # layer 1 = layer 0 = the code itself
    model.layers[1] = ZeroBlock()  # layer 2 carries nothing
    result = probe_code_bits(model, random_windows(12, seed=1), random_windows(4, seed=2), split="positions")
    canonical = result["code_sets"]["canonical"]
    assert canonical["bits"] == 7  # K = ceil(log2 96)
    assert result["positions"] == {"fit": 12 * 128, "score": 4 * 128}
    for layer in (0, 1):
        assert canonical["accuracy"][layer] == [1.0] * 7
    erased = canonical["accuracy"][2]
    # an erased state leaves only the constant probe: exactly the majority baseline, about 50% on uniform ids
    assert erased == pytest.approx(canonical["majority_baseline"], abs=1e-12)
    assert 0.4 < canonical["mean_accuracy"][2] < 0.6
    assert "interface" not in result["code_sets"]  # the canonical interface's own code is the canonical one


def test_probe_reads_the_affine_interface_own_code_at_layer_zero():
    model = tiny_model("affine", seed=3)
    result = probe_code_bits(model, random_windows(12, seed=1), random_windows(4, seed=2), split="positions")
    own, canonical = result["code_sets"]["interface"], result["code_sets"]["canonical"]
    assert own["accuracy"][0] == [1.0] * 7
    # c' = A·c ⊕ b is linear over GF(2), not over the reals: some canonical bits are not linearly readable
    assert min(canonical["accuracy"][0]) < 0.9


def test_type_disjoint_probes_cannot_memorise_types():
    # Random labels per token type: a learned table (random rows, d = 32 for 96 types) lets a probe fitted on
    # positions memorise them; fitted on half the types and scored on the other half, it is at chance.
    model = tiny_model("learned")
    labels = random_labels(VOCAB, 7, seed=5)
    windows = random_windows(16, seed=1)
    by_position = probe_code_bits(model, windows[:12], windows[12:], split="positions", sets=[labels])
    by_type = probe_code_bits(model, windows, windows, split="types", sets=[labels])
    assert by_position["code_sets"]["random labels"]["mean_accuracy"][0] > 0.75
    assert abs(by_type["code_sets"]["random labels"]["mean_accuracy"][0] - 0.5) < 0.1
    assert by_type["shared_types"] == 0 and by_type["types"]["fit"] + by_type["types"]["score"] == VOCAB
    assert by_position["shared_types"] > 0
    # a fixed code stays readable on unseen types: the probe reads the code, not a lookup of the types
    canonical = probe_code_bits(tiny_model("canonical"), windows, windows, split="types")
    assert canonical["code_sets"]["canonical"]["accuracy"][0] == [1.0] * 7


@pytest.mark.slow  # 10-11 CPU s in the full suite: over the guard's limit for unmarked tests
def test_mlp_probe_reads_the_xor_that_the_linear_probe_cannot():
    # An affine model's input is c' = A·c ⊕ b, so each canonical bit of c is an XOR of input bits: no linear
    # probe reads it from layer 0, by construction. The MLP probe must, on token types it never saw (K = 10,
    # half of the 1,024 types fit), while random per-type labels stay at chance for both probes.
    vocab_size = 1024
    model = tiny_model("affine", vocab_size=vocab_size, n_layers=1)
    windows = random_windows(24, seed=1, vocab_size=vocab_size)
    sets = [code_sets(model)[0], random_labels(vocab_size, 10, seed=5)]
    assert sets[0].name == "canonical"
    linear = probe_code_bits(model, windows, windows, sets=sets)["code_sets"]
    mlp = probe_code_bits(model, windows, windows, sets=sets, kind="mlp")
    assert mlp["probe"] == "mlp" and mlp["mlp"]["hidden"] == 256 and mlp["shared_types"] == 0
    assert linear["canonical"]["mean_accuracy"][0] < 0.6
    assert mlp["code_sets"]["canonical"]["mean_accuracy"][0] > 0.9
    assert mlp["code_sets"]["canonical"]["min_accuracy"][0] > 0.75
    for probed in (linear, mlp["code_sets"]):
        assert abs(probed["random labels"]["mean_accuracy"][0] - 0.5) < 0.05


def test_mlp_probe_is_seeded_and_an_erased_state_leaves_only_the_base_rate():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=generator)
    y = torch.stack([(x[:, 0] * x[:, 1] > 0), torch.ones(300, dtype=torch.bool)], dim=1).long()
    settings = MLPProbeSettings(hidden=32, steps=300)
    first, second = fit_mlp(x, y, settings), fit_mlp(x, y, settings)
    for a, b in zip(first.network.parameters(), second.network.parameters(), strict=True):
        assert torch.equal(a, b)
    assert (first.predict(x) == y.bool()).float().mean() > 0.9  # x0·x1 > 0 is an XOR of two signs
    y_skewed = (torch.arange(300) % 10 < 7).long().unsqueeze(1)  # 70% ones
    erased = fit_mlp(torch.zeros(300, 6), y_skewed, settings)
    assert bool(erased.predict(x).all())  # a constant state: the probe can only answer the common value


def test_mlp_probe_has_the_same_controls_and_rejects_bad_settings():
    model = tiny_model("affine", seed=0)  # the untrained model of seed 0 itself: selectivity exactly 0
    windows = random_windows(8, seed=1)
    probes = controlled_probes(model, 0, windows, windows, kind="mlp", mlp=MLPProbeSettings(steps=50))
    assert set(probes["code_sets"]) == {"canonical", "interface", "random labels"}
    for entry in probes["code_sets"].values():
        assert entry["selectivity"] == [0.0] * 3
    with pytest.raises(ValueError, match="probe kind must be one of"):
        probe_code_bits(model, windows, windows, kind="kernel")
    with pytest.raises(ValueError, match="MLP probe hidden must be a positive integer, got 0"):
        MLPProbeSettings(hidden=0)


def test_untrained_control_gives_an_untrained_model_zero_selectivity(setup):
    _, data, canonical, _ = setup
    result = run_analysis(AnalyzeSpec(canonical, data=data, positions=512, embedding_tokens=30))
    probes = result["probes"]
    assert probes["split"] == "types" and probes["controls"]["untrained"]["seed"] == 0
    assert set(probes["code_sets"]) == {"canonical", "random labels"}
    for entry in probes["code_sets"].values():  # the checkpoint *is* the untrained model of its seed
        assert entry["selectivity"] == [0.0] * 3
    # every fixed code is read at 100% before any training
    assert probes["code_sets"]["canonical"]["untrained_mean_accuracy"][0] == 1.0
    assert "(+0.0 pts)" in analysis_markdown(result)


def test_ridge_recovers_a_linear_map_and_a_constant_feature_gets_no_weight():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(500, 4, generator=generator)
    x = torch.cat([x, torch.zeros(500, 1)], dim=1)  # a dead feature
    y = x[:, :4] @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 7.0
    model = fit_ridge(x, y, ridge=1e-9)
    assert model.predict(x).squeeze(1) == pytest.approx(y.double(), abs=1e-5)
    assert float(model.weights[4, 0]) == 0.0


# ------------------------------------------------------------------------------------------------------------
# CKA and the embedding measures


def test_linear_cka_is_one_for_itself_rotations_and_scalings_and_low_for_unrelated():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 16, generator=generator) @ torch.randn(16, 16, generator=generator)
    rotation, _ = torch.linalg.qr(torch.randn(16, 16, generator=generator, dtype=torch.float64))
    for debiased in (True, False):
        assert linear_cka(x, x, debiased) == pytest.approx(1.0, abs=1e-12)
        assert linear_cka(x, x.double() @ rotation, debiased) == pytest.approx(1.0, abs=1e-10)
        assert linear_cka(x, 3.0 * x + 5.0, debiased) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, torch.zeros(400, 3)) is None


def test_debiased_cka_of_unrelated_representations_is_about_zero_and_its_null_is_reported():
    # The biased estimator's floor: unrelated 128-d representations of 2,000 items score about d/n = 0.06; the
    # debiased one scores about 0, and the permutation null's 95th percentile sits just above 0.
    generator = torch.Generator().manual_seed(1)
    x, y = (torch.randn(2000, 128, generator=generator) for _ in range(2))
    assert linear_cka(x, y, debiased=False) > 0.04
    assert abs(linear_cka(x, y)) < 0.005
    null = cka_null(x, y, permutations=20)
    assert 0 < null < 0.01
    related = y + 0.5 * x  # shares x's structure
    assert linear_cka(x, related) > cka_null(x, related, permutations=20) + 0.1


def test_effective_embeddings_start_with_the_learned_table():
    model = tiny_model("learned")
    embeddings = effective_embeddings(model, batch_size=40)  # batches that do not divide V
    assert len(embeddings) == 3 and embeddings[0].shape == (VOCAB, 32)
    assert torch.equal(embeddings[0], model.input.weight.detach())
    single = model.hidden(torch.tensor([[5]]))  # E_L before the final norm equals the last block's output
    assert torch.allclose(model.norm(embeddings[2][5:6]), single[0], atol=1e-6)


def test_frequency_r2_reads_a_linear_signal_and_not_noise():
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(300, 8, generator=generator)
    signal = embeddings[:, 0] * 2 + 1
    assert frequency_r2(embeddings, signal) > 0.99
    assert frequency_r2(embeddings, torch.randn(300, generator=generator)) < 0.1


def test_nearest_neighbours_by_cosine_exclude_the_query():
    embeddings = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0], [2.0, 0.1]])
    found = nearest_neighbours(embeddings, torch.tensor([0]), torch.arange(5), k=2)
    assert found.tolist() == [[4, 1]]


# ------------------------------------------------------------------------------------------------------------
# End to end through the command line, and the errors


def save_checkpoint(directory: Path, model, data: Path) -> Path:
    tokenizer = data / "tokenizer.json"
    meta = {"step": 0, "seed": 0, "tokenizer_hash": tokenizer_hash(tokenizer), "data_dir": str(data)}
    return save_model(directory, model, meta=meta, tokenizer_path=tokenizer)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    data = make_dataset(root / "data", vocab_size=VOCAB, train_tokens=6_000, val_tokens=3_000, shards=1)
    canonical = save_checkpoint(root / "canonical", tiny_model("canonical"), data)
    learned = save_checkpoint(root / "learned", tiny_model("learned"), data)
    return root, data, canonical, learned


@pytest.mark.slow
def test_cli_writes_json_markdown_and_figures(setup, capsys):
    root, data, canonical, learned = setup
    out = root / "out"
    args = ["analyze", str(canonical), "--reference", str(learned), "--out", str(out), "--positions", "512"]
    assert main([*args, "--words", "t1,t2,missing", "--mlp-probe"]) == 0
    result = json.loads((out / "analysis.json").read_text())
    assert result["probes"]["code_sets"]["canonical"]["accuracy"][0] == [1.0] * 7
    assert result["probes"]["positions"]["fit"] + result["probes"]["positions"]["score"] == 512
    assert result["data"] == str(data)  # from the checkpoint's meta.json
    emb = result["embeddings"]
    assert len(emb["cka_reference_table"]) == 3 and all(-1 <= v <= 1 for v in emb["cka_reference_table"])
    assert len(emb["cka_reference_table_null95"]) == 3
    assert emb["cka_reference_layer"][0] == pytest.approx(emb["cka_reference_table"][0])
    assert [w["word"] for w in emb["neighbours"]["words"]] == [" t1", " t2"]
    assert emb["neighbours"]["left_out"] == [" missing"]
    assert len(emb["neighbours"]["words"][0]["layers"][2]) == 5
    for name in ("probes.png", "embeddings.png"):
        assert (out / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "analysis.md").read_text()
    assert "| 0 (interface) | 100.0% / 100.0% (+0.0 pts) |" in markdown and "figures/probes.png" in markdown
    assert "null 95%" in markdown and "type-disjoint" in markdown
    printed = capsys.readouterr().out
    assert "canonical bits, mean linear probe accuracy per layer: 100.0%" in printed
    assert "canonical bits, mean MLP probe accuracy per layer: 100.0%" in printed
    mlp = result["mlp_probes"]
    assert mlp["probe"] == "mlp" and mlp["code_sets"]["canonical"]["selectivity"] == [0.0] * 3
    assert "## MLP probe (nonlinear)" in markdown and "MLP probe acc. (selectivity)" in markdown
    # a second run replaces the earlier analysis; without --mlp-probe there is no MLP probe
    assert main([*args]) == 0
    assert "mlp_probes" not in json.loads((out / "analysis.json").read_text())


def test_markdown_section_can_be_embedded_at_another_level(setup):
    _, data, canonical, _ = setup
    result = run_analysis(AnalyzeSpec(canonical, data=data, positions=512, embedding_tokens=30))
    assert (
        result["embeddings"]["tokens"] == 30 and "the 30 most frequent" in result["embeddings"]["token_set"]
    )
    section = analysis_markdown(result, level=3, figures="runs/x/analysis/figures", title="canonical, seed 0")
    assert section.startswith("### canonical, seed 0\n")
    assert "#### Per layer" in section and "](runs/x/analysis/figures/probes.png)" in section
    assert "CKA vs" not in section and "reference table |" not in section  # no reference: no such columns


def test_error_tokenizer_does_not_match_the_dataset(setup, tmp_path, capsys):
    _, _, canonical, _ = setup
    other = make_dataset(
        tmp_path / "other", vocab_size=VOCAB - 6, train_tokens=2_000, val_tokens=2_000, shards=1
    )
    assert main(["analyze", str(canonical), "--data", str(other), "--out", str(tmp_path / "o")]) == 1
    error = capsys.readouterr().err
    assert "tablefree analyze: error:" in error and "manifest.json: the dataset was tokenized with" in error
    assert not (tmp_path / "o").exists()


def test_error_reference_with_another_vocabulary(setup, tmp_path, capsys):
    _, data, canonical, _ = setup
    bigger = save_checkpoint(tmp_path / "big", tiny_model("learned", vocab_size=128), data)
    assert main(["analyze", str(canonical), "--reference", str(bigger), "--out", str(tmp_path / "o")]) == 1
    assert "vocabulary of 128 ids, the model has 96" in capsys.readouterr().err


def test_error_too_little_text_says_needed_and_found(tmp_path, capsys):
    data = make_dataset(tmp_path / "small", vocab_size=VOCAB, train_tokens=2_000, val_tokens=100, shards=1)
    checkpoint = save_checkpoint(tmp_path / "c", tiny_model("canonical"), data)
    assert main(["analyze", str(checkpoint), "--out", str(tmp_path / "o")]) == 1
    error = capsys.readouterr().err
    # 4 × (32 + 1) = 132 fit positions, about half of the positions under the type split, in windows of 32
    # tokens → 9 windows; 99 // 32 = 3 windows found
    assert "need at least 288 positions (9 windows of 32 tokens" in error and "holds 96 (3 windows)" in error


def test_error_out_directory_that_is_not_an_analysis(setup, tmp_path, capsys):
    _, _, canonical, _ = setup
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["analyze", str(canonical), "--out", str(tmp_path)]) == 1
    assert "is not an analysis directory" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


# ------------------------------------------------------------------------------------------------------------
# Inside a comparison sweep (compare's `analysis: true`)


def test_sweep_reference_is_the_learned_run_of_the_same_seed_or_the_next_seed_for_learned():
    from types import SimpleNamespace

    from tablefree.analysis.sweep import reference_for

    runs = [
        SimpleNamespace(name=f"{i}-s{s}", interface=i, seed=s)
        for i in ("learned", "affine")
        for s in (0, 1, 2)
    ]
    finished = {r.name for r in runs} - {"learned-s2"}
    by_name = {r.name: r for r in runs}
    assert reference_for(by_name["affine-s1"], runs, finished).name == "learned-s1"
    assert reference_for(by_name["affine-s2"], runs, finished) is None  # its learned run did not finish
    assert reference_for(by_name["learned-s0"], runs, finished).name == "learned-s1"
    assert reference_for(by_name["learned-s1"], runs, finished).name == "learned-s0"  # wraps around


@pytest.mark.slow
def test_sweep_analyses_finished_runs_once_and_reports_them_side_by_side(setup, tmp_path):
    from types import SimpleNamespace

    from tablefree.analysis.sweep import analyze_runs, sweep_analysis, sweep_analysis_markdown

    _, data, _, _ = setup
    runs = []
    for interface in ("learned", "canonical", "affine"):
        directory = save_checkpoint(tmp_path / "runs" / f"{interface}-s0", tiny_model(interface), data)
        runs.append(SimpleNamespace(name=f"{interface}-s0", interface=interface, seed=0, directory=directory))
    runs[0].recipe = {"data": {"dir": str(data)}}
    logged = []
    outcome = analyze_runs(runs, {"learned-s0", "canonical-s0"}, positions=512, log=logged.append)
    assert outcome == {"learned-s0": "done", "canonical-s0": "done"}  # affine-s0 did not finish
    assert any("canonical-s0 against learned-s0" in line for line in logged)
    assert analyze_runs(runs, {"learned-s0", "canonical-s0"}, positions=512, log=logged.append) == {
        "learned-s0": "skipped",
        "canonical-s0": "skipped",
    }
    summary = sweep_analysis(runs, tmp_path)
    assert json.loads(json.dumps(summary)) == summary  # JSON-ready, for report.json
    section = sweep_analysis_markdown(summary, level=2)
    probe_table = section.split("**Canonical-bit linear probe accuracy (mean over bits)**")[1]
    assert "| layer | `learned` | `canonical` |" in probe_table
    assert "| 0 | " in probe_table and " | 100.0% |\n" in probe_table.split("| 1 |")[0]
    cka_table = section.split("**Debiased linear CKA")[1].split("\n**")[0]
    assert "| layer | `canonical` |" in cka_table  # one learned seed: no learned-vs-learned ceiling
    assert "- [canonical-s0](runs/canonical-s0/analysis/analysis.md)" in section
    assert "MLP probe" not in section  # no run was analysed with it
    assert sweep_analysis(runs[2:], tmp_path) is None and sweep_analysis_markdown(None) == ""


def test_code_sets_add_the_interface_code_only_when_it_differs_from_the_canonical_bits():
    from tablefree.analysis import code_sets

    names = {
        label: [s.name for s in code_sets(tiny_model(interface))]
        for label, interface in (
            ("msb", {"name": "canonical", "bit_order": "msb"}),  # the same bits, reordered
            ("affine", "affine"),
            ("learned", "learned"),
        )
    }
    assert names == {"msb": ["canonical"], "affine": ["canonical", "interface"], "learned": ["canonical"]}


@pytest.mark.slow
def test_compare_with_analysis_true_adds_the_section_to_the_report(tmp_path):
    from tablefree.compare import CompareConfig, run_sweep
    from tablefree.config_parsing import from_dict

    data = make_dataset(tmp_path / "data", vocab_size=VOCAB, train_tokens=6_000, val_tokens=3_000, shards=1)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["val"]["document_starts"] = [0]  # one validation document (the evaluation reads them)
    (data / "manifest.json").write_text(json.dumps(manifest))
    recipe = {
        "model": {
            "preset": "tiny",
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 64,
            "max_seq_len": 32,
        },
        "budget": "2 steps",
        "batch_tokens": 128,
        "micro_batch": 4,
        "seq_len": 32,
        "schedule": {"name": "cosine", "warmup_steps": 1},
        "val_batches": 1,
    }
    config = from_dict(
        CompareConfig,
        {
            "name": "toy",
            "train": recipe,
            "dataset": {"dir": str(data)},
            "interfaces": ["learned", "canonical"],
            "seeds": [0],
            "eval": {"tasks": ["validation"], "val_limit": 4, "device": "cpu"},
            "out": str(tmp_path / "sweep"),
            "bootstrap": 200,
            "analysis": True,
        },
    )
    result = run_sweep(config, log=lambda _: None)
    assert result["analysis"] == {"learned-s0": "done", "canonical-s0": "done"}
    analysed = json.loads((tmp_path / "sweep/runs/canonical-s0/analysis/analysis.json").read_text())
    assert analysed["reference"]["interface"] == "learned"
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "## Analysis: what the layers build from the input" in report
    assert "- [canonical-s0](runs/canonical-s0/analysis/analysis.md)" in report
    assert (
        json.loads((tmp_path / "sweep" / "report.json").read_text())["analysis"]["runs"][1]["run"]
        == "canonical-s0"
    )


def test_an_analysis_by_the_earlier_method_is_redone(tmp_path):
    # analyses made before the controls and the debiased CKA (no method_version) must not be skipped as current
    from tablefree.analysis.run import METHOD_VERSION
    from tablefree.analysis.sweep import _up_to_date

    checkpoint = save_model(tmp_path / "ckpt", tiny_model("canonical"))
    out = tmp_path / "analysis"
    out.mkdir()
    recorded = {"checkpoint": str(checkpoint.resolve()), "reference": None}
    (out / "analysis.json").write_text(json.dumps(recorded))
    assert not _up_to_date(out, checkpoint, None)
    (out / "analysis.json").write_text(json.dumps({**recorded, "method_version": METHOD_VERSION}))
    assert _up_to_date(out, checkpoint, None)
    assert not _up_to_date(out, checkpoint, None, mlp_probe=True)  # asked for the MLP probe, which it lacks
