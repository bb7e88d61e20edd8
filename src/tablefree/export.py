"""Export a tablefree checkpoint to a Hugging Face ``transformers`` directory, and import one back.

Two architectures map exactly onto a standard ``transformers`` class, so the exported directory loads with
``AutoModelForCausalLM.from_pretrained(DIR)`` and no ``trust_remote_code``:

* RMSNorm + SwiGLU (the Llama body, with or without grouped-query attention) -> ``LlamaForCausalLM``.
* LayerNorm + GELU MLP with multi-head attention (the GPT-style variant) -> ``GPTNeoXForCausalLM`` with
  ``use_parallel_residual=False`` (sequential residual, as ours), ``rotary_pct=1.0`` (full rotate-half RoPE),
  exact ``gelu``, and all biases zero (ours have none). NeoX fuses q/k/v per head: rows ``[q_h; k_h; v_h]``.

Any other combination (LayerNorm + SwiGLU, RMSNorm + GELU, or GELU with grouped-query attention) has no exact
``transformers`` equivalent and is refused.

A fixed-code input interface (``canonical`` / ``affine``) is deterministic: it is exported as its V×d table,
materialised in the embedding matrix (untied from the head), and the model card says so. The interface and
its options (and A, b for ``affine``) are also recorded in ``config.json`` under ``"tablefree"``, which
``import_hf`` uses to recognise the table and restore the table-free interface exactly.

Python API: ``export_hf(checkpoint, out_dir)``, ``import_hf(hf_dir, out_checkpoint)``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

import tablefree
from tablefree.checkpoint import (
    META_FILE,
    TOKENIZER_FILE,
    load_model,
    read_json,
    save_model,
    write_json_atomic,
)
from tablefree.codes import AffineMap
from tablefree.config import InterfaceConfig, ModelConfig, from_dict, to_dict
from tablefree.data.tokenizer import eot_id, load_tokenizer
from tablefree.fileio import staged_directory
from tablefree.interfaces import build_interface
from tablefree.model import TablefreeLM

EXPORT_FORMATS = ("hf",)
FIXED_INTERFACES = ("canonical", "affine")
HF_WEIGHTS = "model.safetensors"
METADATA_KEY = "tablefree"  # our section of the exported config.json
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------------------------------
# Architecture mapping


def hf_architecture(config: ModelConfig) -> str:
    """``"llama"`` or ``"gpt_neox"``: the ``transformers`` model type that computes exactly what ours does.

    Raises ``ValueError`` naming the mismatch for a variant with no exact equivalent.
    """
    if config.norm == "rmsnorm" and config.mlp == "swiglu":
        return "llama"
    if config.norm == "layernorm" and config.mlp == "gelu":
        if config.n_kv_heads != config.n_heads:
            raise ValueError(
                f"cannot export: the LayerNorm/GELU variant maps onto GPTNeoXForCausalLM, which has no "
                f"grouped-query attention (n_kv_heads={config.n_kv_heads} != n_heads={config.n_heads})"
            )
        return "gpt_neox"
    raise ValueError(
        f"cannot export: norm={config.norm!r} with mlp={config.mlp!r} has no exact transformers equivalent "
        f"(exportable: rmsnorm+swiglu -> LlamaForCausalLM, layernorm+gelu -> GPTNeoXForCausalLM)"
    )


def input_table(model: TablefreeLM) -> torch.Tensor:
    """The V×d input table: the learned weight, or a fixed code materialised for every token id."""
    if model.config.interface.name == "learned":
        return model.input.weight.detach().float().cpu()
    return code_table(model.input, model.config.vocab_size)


def code_table(interface: torch.nn.Module, vocab_size: int) -> torch.Tensor:
    """A fixed-code interface evaluated on every token id: its V×d table, fp32 on the CPU."""
    with torch.no_grad():
        ids = torch.arange(vocab_size, device=next(interface.buffers()).device)
        return interface(ids).float().cpu()


def llama_state_dict(model: TablefreeLM) -> dict[str, torch.Tensor]:
    """tablefree weight names -> ``LlamaForCausalLM`` names (identical layouts, RoPE included)."""
    state = {"model.embed_tokens.weight": input_table(model)}
    for i, block in enumerate(model.layers):
        hf = f"model.layers.{i}"
        state[f"{hf}.self_attn.q_proj.weight"] = block.attn.wq.weight
        state[f"{hf}.self_attn.k_proj.weight"] = block.attn.wk.weight
        state[f"{hf}.self_attn.v_proj.weight"] = block.attn.wv.weight
        state[f"{hf}.self_attn.o_proj.weight"] = block.attn.wo.weight
        state[f"{hf}.mlp.gate_proj.weight"] = block.mlp.w1.weight
        state[f"{hf}.mlp.up_proj.weight"] = block.mlp.w3.weight
        state[f"{hf}.mlp.down_proj.weight"] = block.mlp.w2.weight
        state[f"{hf}.input_layernorm.weight"] = block.attn_norm.weight
        state[f"{hf}.post_attention_layernorm.weight"] = block.mlp_norm.weight
    state["model.norm.weight"] = model.norm.weight
    state["lm_head.weight"] = model.head.weight
    return state


def neox_state_dict(model: TablefreeLM) -> dict[str, torch.Tensor]:
    """tablefree weight names -> ``GPTNeoXForCausalLM`` names (hub layout: ``embed_out`` is the head).

    NeoX splits its fused projection as ``view(B, T, H, 3*hd).chunk(3)``, so the rows are grouped per head:
    ``[q_0; k_0; v_0; q_1; k_1; v_1; ...]``. Biases NeoX always has (MLP, LayerNorm) are written as zeros.
    """
    config = model.config
    d, hd, h = config.d_model, config.head_dim, config.n_heads
    state = {"gpt_neox.embed_in.weight": input_table(model)}
    for i, block in enumerate(model.layers):
        hf = f"gpt_neox.layers.{i}"
        q, k, v = (w.weight.view(h, hd, d) for w in (block.attn.wq, block.attn.wk, block.attn.wv))
        state[f"{hf}.attention.query_key_value.weight"] = torch.cat((q, k, v), dim=1).reshape(3 * d, d)
        state[f"{hf}.attention.dense.weight"] = block.attn.wo.weight
        state[f"{hf}.mlp.dense_h_to_4h.weight"] = block.mlp.w1.weight
        state[f"{hf}.mlp.dense_h_to_4h.bias"] = torch.zeros(config.d_ff)
        state[f"{hf}.mlp.dense_4h_to_h.weight"] = block.mlp.w2.weight
        state[f"{hf}.mlp.dense_4h_to_h.bias"] = torch.zeros(d)
        for ours, theirs in (
            (block.attn_norm, "input_layernorm"),
            (block.mlp_norm, "post_attention_layernorm"),
        ):
            state[f"{hf}.{theirs}.weight"] = ours.weight
            state[f"{hf}.{theirs}.bias"] = torch.zeros(d)
    state["gpt_neox.final_layer_norm.weight"] = model.norm.weight
    state["gpt_neox.final_layer_norm.bias"] = torch.zeros(d)
    state["embed_out.weight"] = model.head.weight
    return state


def llama_config(config: ModelConfig, dtype: str, special: dict[str, int | None]) -> dict[str, Any]:
    """``config.json`` of ``LlamaForCausalLM``. RoPE is written both as ``rope_parameters`` (transformers 5)
    and as ``rope_theta`` / ``rope_scaling`` (transformers 4)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "initializer_range": config.init_std,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
        **special,
    }


def neox_config(config: ModelConfig, dtype: str, special: dict[str, int | None]) -> dict[str, Any]:
    """``config.json`` of ``GPTNeoXForCausalLM`` equivalent to our LayerNorm/GELU variant."""
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "hidden_act": "gelu",  # exact (erf) GELU, as torch.nn.functional.gelu
        "max_position_embeddings": config.max_seq_len,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.norm_eps,
        "use_parallel_residual": False,
        "rotary_pct": 1.0,
        "rotary_emb_base": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": config.rope_theta,
            "partial_rotary_factor": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "classifier_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
        **special,
    }


def interface_metadata(model: TablefreeLM) -> dict[str, Any]:
    """What ``import_hf`` needs to restore the interface: its config and, for affine, A and b."""
    interface = model.config.interface
    data: dict[str, Any] = {"interface": to_dict(interface)}
    if interface.name == "affine":
        affine = model.input.affine_map
        data["affine_matrix"] = affine.matrix.cpu().tolist()
        data["affine_offset"] = affine.offset.cpu().tolist()
    return data


# ----------------------------------------------------------------------------------------------------------
# Export


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    tokenizer_path: str | Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``out_dir`` as a ``transformers`` model directory (config, weights, generation config,
    tokenizer files, model card) from a tablefree checkpoint, run dir or directory of checkpoints.

    The directory is assembled next to ``out_dir`` and renamed into place, so it is never half-written.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty (pass overwrite=True / --overwrite)")
    model, source = load_model(checkpoint, device="cpu")
    config = model.config
    architecture = hf_architecture(config)
    tokenizer_file = Path(tokenizer_path) if tokenizer_path else source / TOKENIZER_FILE
    if not tokenizer_file.exists():
        raise FileNotFoundError(
            f"{tokenizer_file}: no tokenizer.json in the checkpoint; pass tokenizer_path= / --tokenizer"
        )
    special = special_token_ids(tokenizer_file, config.vocab_size)

    state_fn, config_fn = (
        (llama_state_dict, llama_config) if architecture == "llama" else (neox_state_dict, neox_config)
    )
    state = {name: t.detach().to(DTYPES[dtype]).contiguous().cpu() for name, t in state_fn(model).items()}
    meta = _read_json(source / META_FILE)
    hf_config = config_fn(config, dtype, special)
    hf_config["transformers_version"] = _transformers_version()
    hf_config[METADATA_KEY] = {
        "version": 1,
        "tablefree_version": tablefree.__version__,
        "model": to_dict(config),
        **interface_metadata(model),
        "source_checkpoint": str(source),
        "step": meta.get("step"),
        "tokens_seen": meta.get("tokens_seen"),
        "tokenizer_hash": meta.get("tokenizer_hash"),
    }

    with staged_directory(out_dir) as staging:
        save_file(state, str(staging / HF_WEIGHTS), metadata={"format": "pt"})
        write_json_atomic(staging / "config.json", hf_config)
        write_json_atomic(staging / "generation_config.json", generation_config(special))
        write_tokenizer_files(staging, tokenizer_file, config.max_seq_len)
        (staging / "README.md").write_text(model_card(model, architecture, source, meta), encoding="utf-8")
    return out_dir


def special_token_ids(tokenizer_file: Path, vocab_size: int) -> dict[str, int | None]:
    """bos/eos/pad ids for the HF config: all the end-of-text token (the document separator in training)."""
    tokenizer = load_tokenizer(tokenizer_file)
    if tokenizer.get_vocab_size() > vocab_size:
        raise ValueError(
            f"{tokenizer_file}: tokenizer has {tokenizer.get_vocab_size()} tokens but the model's "
            f"vocab_size is {vocab_size}"
        )
    eot = eot_id(tokenizer)
    return {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}


def generation_config(special: dict[str, int | None]) -> dict[str, Any]:
    return {
        "_from_model_config": False,
        "bos_token_id": special["bos_token_id"],
        "eos_token_id": special["eos_token_id"],
        "pad_token_id": special["pad_token_id"],
        "transformers_version": _transformers_version(),
    }


def write_tokenizer_files(directory: Path, tokenizer_file: Path, max_seq_len: int) -> None:
    """tokenizer.json as trained, plus a tokenizer_config.json that makes ``AutoTokenizer`` load it as a
    ``PreTrainedTokenizerFast`` with the end-of-text token (``<|endoftext|>``) as bos/eos/pad and no extra
    special tokens added."""
    shutil.copyfile(tokenizer_file, directory / "tokenizer.json")
    tokenizer = load_tokenizer(tokenizer_file)
    eot = tokenizer.id_to_token(eot_id(tokenizer))
    special = {"bos_token": eot, "eos_token": eot, "pad_token": eot}
    write_json_atomic(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_seq_len,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            **special,
        },
    )
    write_json_atomic(directory / "special_tokens_map.json", special)


def model_card(model: TablefreeLM, architecture: str, source: Path, meta: dict[str, Any]) -> str:
    config = model.config
    interface = config.interface
    cls = "LlamaForCausalLM" if architecture == "llama" else "GPTNeoXForCausalLM"
    embed = "model.embed_tokens.weight" if architecture == "llama" else "gpt_neox.embed_in.weight"
    lines = [
        "---",
        "library_name: transformers",
        "tags:",
        "- tablefree",
        f"- {interface.name}-input-interface",
        "---",
        "",
        f"# tablefree model ({interface.name} input interface), exported to `{cls}`",
        "",
        f"Exported by tablefree {tablefree.__version__} from `{source}`"
        + _provenance(meta)
        + ". It loads with plain `transformers`, no `trust_remote_code`:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'model = AutoModelForCausalLM.from_pretrained("PATH", dtype="float32")',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
        "## Architecture",
        "",
        f"- d_model {config.d_model}, {config.n_layers} layers, {config.n_heads} heads "
        f"({config.n_kv_heads} key/value heads), MLP {config.mlp} {config.d_ff}, norm {config.norm} "
        f"(eps {config.norm_eps}), RoPE theta {config.rope_theta}, context {config.max_seq_len}, "
        f"vocabulary {config.vocab_size}, untied output head.",
    ]
    if architecture == "gpt_neox":
        lines.append(
            "- Mapped exactly onto GPT-NeoX: sequential residual (`use_parallel_residual=false`), full "
            "rotary (`rotary_pct=1.0`), exact GELU, every bias zero."
        )
    lines += ["", "## Input interface", ""]
    if interface.name == "learned":
        lines.append(f"`{embed}` is the trained V×d embedding table (the `learned` control).")
    else:
        lines += [
            f"`{embed}` is **not trained**: it is a fixed function of the token id, materialised here as a "
            "V×d table only so that standard tooling can load the model. The tablefree model computes it on "
            "the fly and has no input-embedding parameters. The table is untied from the output head.",
            "",
            f"Row t is the K-bit binary code of t (K = {model.input.num_bits}, bit order `{interface.bit_order}`)"
            + (", recoded by the affine map c' = A·c ⊕ b over GF(2)" if interface.name == "affine" else "")
            + f", with bits as {'{0, 1}' if interface.values == '01' else '{-1, +1}'} (`values={interface.values}`), "
            f"lifted to width {config.d_model} by `{interface.lift}` "
            + (
                "(x_j = c_{j mod K})."
                if interface.lift == "tile"
                else f"(x_j = c_{{floor(j / {-(-config.d_model // model.input.num_bits)})}})."
            ),
            "",
            f"Interface options: `name={interface.name}`, `lift={interface.lift}`, `values={interface.values}`, "
            f"`bit_order={interface.bit_order}`"
            + (f", `affine_seed={interface.affine_seed}`." if interface.name == "affine" else "."),
        ]
        if interface.name == "affine":
            affine = model.input.affine_map
            lines += [
                "",
                "A (row i lists A[i, 0..K-1]; c'_i = sum_j A[i, j]·c_j mod 2, then xor b_i):",
                "",
                "```",
                *("".join(str(int(v)) for v in row) for row in affine.matrix.tolist()),
                "```",
                "",
                f"b = `{''.join(str(int(v)) for v in affine.offset.tolist())}` (b_0 first)",
            ]
        lines += [
            "",
            "`config.json` records the same under `tablefree`; `tablefree import-hf` uses it to restore the "
            "table-free interface exactly.",
        ]
    return "\n".join(lines) + "\n"


def _provenance(meta: dict[str, Any]) -> str:
    parts = [f"step {meta['step']}"] if meta.get("step") is not None else []
    if meta.get("tokens_seen") is not None:
        parts.append(f"{meta['tokens_seen']:,} tokens seen")
    return f" ({', '.join(parts)})" if parts else ""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return read_json(path)
    except FileNotFoundError:
        return {}


def _transformers_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return "5.24.0"


# ----------------------------------------------------------------------------------------------------------
# Import


def import_hf(hf_dir: str | Path, out_checkpoint: str | Path, *, overwrite: bool = False) -> Path:
    """Load a ``LlamaForCausalLM`` (or GPT-NeoX, as exported here) directory into a tablefree checkpoint.

    The input interface is ``canonical`` / ``affine`` when the embedding matrix is exactly the fixed code
    recorded under ``"tablefree"`` in ``config.json``; otherwise it is ``learned`` (the matrix becomes the
    table). A tied output head (e.g. SmolLM2-135M) is copied into our untied head, computing the same function.
    """
    hf_dir, out_checkpoint = Path(hf_dir), Path(out_checkpoint)
    config_path = hf_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: not a transformers model directory (no config.json)")
    if out_checkpoint.exists() and any(out_checkpoint.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_checkpoint} exists and is not empty (pass overwrite=True / --overwrite)")
    hf_config = read_json(config_path)
    state = _load_hf_weights(hf_dir)
    model_type = hf_config.get("model_type")
    converters = {"llama": _from_llama, "gpt_neox": _from_neox}
    if model_type not in converters:
        raise ValueError(
            f"{config_path}: model_type {model_type!r} is not supported (expected llama or gpt_neox)"
        )
    try:
        config, ours = converters[model_type](hf_config, state, config_path)
    except KeyError as error:  # a required config field (weights are checked by _take)
        raise ValueError(f"{config_path}: missing the field {error.args[0]!r}") from None

    embedding = ours.pop("input.weight")
    config.interface, fixed_buffers = _detect_interface(hf_config.get(METADATA_KEY), embedding, config)
    if config.interface.name == "learned":
        ours["input.weight"] = embedding
    with torch.device("meta"):
        model = TablefreeLM(config)
    model.to_empty(device="cpu")
    model.init_weights()  # fills the fixed buffers; every saved tensor is overwritten below
    model.load_state_dict({k: v.float() for k, v in ours.items()} | fixed_buffers, strict=True)

    tokenizer = hf_dir / "tokenizer.json"
    metadata = hf_config.get(METADATA_KEY) or {}
    meta = {
        "imported_from": str(hf_dir),
        "model_type": model_type,
        **{k: metadata[k] for k in ("step", "tokens_seen", "tokenizer_hash") if metadata.get(k) is not None},
    }
    with staged_directory(out_checkpoint) as staging:
        save_model(staging, model, meta=meta, tokenizer_path=tokenizer if tokenizer.exists() else None)
    return out_checkpoint


def _load_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of a sharded ``model.safetensors.index.json``."""
    single = hf_dir / HF_WEIGHTS
    if single.exists():
        return load_file(str(single))
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(read_json(index)["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(hf_dir / name)))
        return state
    raise FileNotFoundError(f"{hf_dir}: no {HF_WEIGHTS} or model.safetensors.index.json (pickle is not read)")


def _require(condition: bool, where: Path, message: str) -> None:
    if not condition:
        raise ValueError(f"{where}: {message}; no exact tablefree equivalent")


def _rope_theta(hf_config: dict[str, Any], where: Path, default: float) -> float:
    rope = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling")
    kind = (rope or scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    _require(kind == "default", where, f"RoPE type {kind!r} (only default RoPE is supported)")
    return float(
        rope.get("rope_theta", hf_config.get("rope_theta", hf_config.get("rotary_emb_base", default)))
    )


def _take(state: dict[str, torch.Tensor], name: str, where: Path) -> torch.Tensor:
    if name not in state:
        raise ValueError(f"{where}: weight {name!r} missing from the checkpoint")
    return state.pop(name)


def _from_llama(
    hf_config: dict[str, Any], state: dict[str, torch.Tensor], where: Path
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    _require(not hf_config.get("attention_bias", False), where, "attention_bias=true")
    _require(not hf_config.get("mlp_bias", False), where, "mlp_bias=true")
    _require(
        hf_config.get("hidden_act", "silu") == "silu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    _require(hf_config.get("pretraining_tp", 1) in (1, None), where, "pretraining_tp != 1")
    d, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or d // heads
    _require(head_dim * heads == d, where, f"head_dim {head_dim} × {heads} heads != hidden_size {d}")
    config = ModelConfig(
        vocab_size=hf_config["vocab_size"],
        d_model=d,
        n_layers=hf_config["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=hf_config.get("num_key_value_heads") or heads,
        d_ff=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 2048),
        rope_theta=_rope_theta(hf_config, where, 10_000.0),
        mlp="swiglu",
        norm="rmsnorm",
        norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        init_std=hf_config.get("initializer_range", 0.02),
    )
    ours = {"input.weight": _take(state, "model.embed_tokens.weight", where)}
    for i in range(config.n_layers):
        hf = f"model.layers.{i}"
        for theirs, mine in (
            ("self_attn.q_proj", "attn.wq"),
            ("self_attn.k_proj", "attn.wk"),
            ("self_attn.v_proj", "attn.wv"),
            ("self_attn.o_proj", "attn.wo"),
            ("mlp.gate_proj", "mlp.w1"),
            ("mlp.up_proj", "mlp.w3"),
            ("mlp.down_proj", "mlp.w2"),
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "mlp_norm"),
        ):
            ours[f"layers.{i}.{mine}.weight"] = _take(state, f"{hf}.{theirs}.weight", where)
    ours["norm.weight"] = _take(state, "model.norm.weight", where)
    head = state.pop("lm_head.weight", None)
    if head is None:
        _require(
            hf_config.get("tie_word_embeddings", False), where, "no lm_head.weight and untied embeddings"
        )
        head = ours["input.weight"].clone()
    ours["head.weight"] = head
    _require_consumed(state, where)
    return config, ours


def _from_neox(
    hf_config: dict[str, Any], state: dict[str, torch.Tensor], where: Path
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    _require(hf_config.get("use_parallel_residual") is False, where, "use_parallel_residual is not false")
    rope = hf_config.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", hf_config.get("rotary_pct", 0.25))
    _require(partial == 1.0, where, f"partial rotary factor {partial} (ours rotates the whole head)")
    _require(
        hf_config.get("hidden_act", "gelu") == "gelu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    d, heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    hd = d // heads
    config = ModelConfig(
        vocab_size=hf_config["vocab_size"],
        d_model=d,
        n_layers=hf_config["num_hidden_layers"],
        n_heads=heads,
        d_ff=hf_config["intermediate_size"],
        max_seq_len=hf_config.get("max_position_embeddings", 2048),
        rope_theta=_rope_theta(hf_config, where, 10_000.0),
        mlp="gelu",
        norm="layernorm",
        norm_eps=hf_config.get("layer_norm_eps", 1e-5),
        init_std=hf_config.get("initializer_range", 0.02),
    )
    ours = {"input.weight": _take(state, "gpt_neox.embed_in.weight", where)}
    for i in range(config.n_layers):
        hf = f"gpt_neox.layers.{i}"
        qkv = _take(state, f"{hf}.attention.query_key_value.weight", where).view(heads, 3, hd, d)
        for j, name in enumerate(("wq", "wk", "wv")):
            ours[f"layers.{i}.attn.{name}.weight"] = qkv[:, j].reshape(d, d)
        ours[f"layers.{i}.attn.wo.weight"] = _take(state, f"{hf}.attention.dense.weight", where)
        ours[f"layers.{i}.mlp.w1.weight"] = _take(state, f"{hf}.mlp.dense_h_to_4h.weight", where)
        ours[f"layers.{i}.mlp.w2.weight"] = _take(state, f"{hf}.mlp.dense_4h_to_h.weight", where)
        ours[f"layers.{i}.attn_norm.weight"] = _take(state, f"{hf}.input_layernorm.weight", where)
        ours[f"layers.{i}.mlp_norm.weight"] = _take(state, f"{hf}.post_attention_layernorm.weight", where)
    ours["norm.weight"] = _take(state, "gpt_neox.final_layer_norm.weight", where)
    head = state.pop("embed_out.weight", None)
    if head is None:
        head = state.pop("lm_head.weight", None)
    _require(head is not None, where, "no embed_out.weight")
    ours["head.weight"] = head
    for name in [n for n in state if n.endswith(".bias")]:
        _require(not state[name].any(), where, f"nonzero bias {name}")
        state.pop(name)
    _require_consumed(state, where)
    return config, ours


def _require_consumed(state: dict[str, torch.Tensor], where: Path) -> None:
    leftover = sorted(n for n in state if not n.endswith(("rotary_emb.inv_freq", "attention.masked_bias")))
    _require(not leftover, where, f"unexpected weights {leftover[:5]}")


def _detect_interface(
    metadata: dict[str, Any] | None, embedding: torch.Tensor, config: ModelConfig
) -> tuple[InterfaceConfig, dict[str, torch.Tensor]]:
    """The fixed interface recorded at export (with its buffers) if the embedding is exactly its table,
    else ``learned``."""
    learned = InterfaceConfig(name="learned"), {}
    if not metadata or metadata.get("interface", {}).get("name") not in FIXED_INTERFACES:
        return learned
    interface = from_dict(InterfaceConfig, metadata["interface"], where="config.json:tablefree.interface")
    code = build_interface(interface, config.vocab_size, config.d_model)
    buffers: dict[str, torch.Tensor] = {}
    if interface.name == "affine":
        affine = AffineMap.from_tensors(
            torch.tensor(metadata["affine_matrix"], dtype=torch.int64),
            torch.tensor(metadata["affine_offset"], dtype=torch.int64),
        )
        code.affine_matrix.copy_(affine.matrix)
        code.affine_offset.copy_(affine.offset)
        buffers = {"input.affine_matrix": affine.matrix, "input.affine_offset": affine.offset}
    table = code_table(code, config.vocab_size)
    if table.shape == embedding.shape and torch.equal(table, embedding.float()):
        return interface, buffers
    return learned
