"""Export a tablefree checkpoint to a Hugging Face ``transformers`` directory, and import one back.

Two architectures map exactly onto a standard ``transformers`` class, so the exported directory loads with
``AutoModelForCausalLM.from_pretrained(DIR)`` and no ``trust_remote_code``:

* RMSNorm + SwiGLU (the Llama body, with or without grouped-query attention) -> ``LlamaForCausalLM``.
* LayerNorm + GELU MLP with multi-head attention (the GPT-style variant) -> ``GPTNeoXForCausalLM`` with
  ``use_parallel_residual=False`` (sequential residual, as ours), ``rotary_pct=1.0`` (full rotate-half RoPE),
  exact ``gelu``, and all biases zero (ours have none). NeoX fuses q/k/v per head: rows ``[q_h; k_h; v_h]``.

Any other combination (LayerNorm + SwiGLU, RMSNorm + GELU, or GELU with grouped-query attention) has no exact
``transformers`` equivalent and is refused.

The input interface is exported through its contract (``tablefree.interfaces.base.InputInterface``): its V×d
``table()`` becomes the embedding matrix (untied from the head), its ``describe()`` goes into the model card,
its options into ``config.json`` under ``"tablefree"``, and its ``export_state()`` (e.g. affine's A and b,
projected's K×d map) into ``tablefree_interface.safetensors``. ``import_hf`` rebuilds the recorded interface
and keeps it when its ``adopt_table`` recognises the embedding matrix exactly; otherwise (or without a record)
the matrix becomes a ``learned`` table, with a warning when a record was there.

Import checks ``config.json`` against the safetensors headers (read without loading a tensor) before it
allocates anything: sizes must be whole numbers within bounds, every tensor must exist with the shape the config
implies, and a truncated or malformed file is refused naming the file.

Python API: ``export_hf(checkpoint, out_dir)``, ``import_hf(hf_dir, out_checkpoint)``.
"""

from __future__ import annotations

import math
import shutil
import warnings
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

import tablefree
from tablefree.checkpoint.layout import META_FILE, MODEL_FILE, TOKENIZER_FILE, run_name_of
from tablefree.checkpoint.model_dir import empty_model, load_model, save_model
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.checkpoint.verify import check_finite
from tablefree.config_parsing import to_dict
from tablefree.data.tokenizer import eot_id, load_tokenizer
from tablefree.fileio import read_json, sha256_file, staged_directory, write_json_atomic
from tablefree.interfaces import build_interface, parse_interface_options
from tablefree.interfaces.options import InterfaceConfig
from tablefree.model import TablefreeLM
from tablefree.model_config import ModelConfig
from tablefree.safetensors_header import TensorInfo, is_count, read_safetensors_header

EXPORT_FORMATS = ("hf",)
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
INTERFACE_STATE_FILE = "tablefree_interface.safetensors"  # the interface's own tensors (A and b, a K×d map)
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
    """The V×d input table, fp32 on the CPU: the interface's own materialisation (``InputInterface.table``)."""
    return model.input.table()


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
    """What ``import_hf`` needs to restore the interface: its options, and the file of its own tensors."""
    return {
        "interface": to_dict(model.config.interface),
        "interface_state": INTERFACE_STATE_FILE if model.input.export_state() else None,
    }


# ----------------------------------------------------------------------------------------------------------
# Export


def export_hf(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    tokenizer_path: str | Path | None = None,
    overwrite: bool = False,
    verify: bool = True,
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
    model, source = load_model(checkpoint, device="cpu", verify=verify)
    config = model.config
    architecture = hf_architecture(config)
    tokenizer_file = Path(tokenizer_path) if tokenizer_path else source / TOKENIZER_FILE
    if not tokenizer_file.exists():
        raise FileNotFoundError(
            f"{tokenizer_file}: no tokenizer.json in the checkpoint; pass tokenizer_path= / --tokenizer"
        )
    checked_tokenizer(source, tokenizer_path)  # the tokenizer whose hash the checkpoint recorded, or an error
    special = special_token_ids(tokenizer_file, config.vocab_size)

    state_fn, config_fn = (
        (llama_state_dict, llama_config) if architecture == "llama" else (neox_state_dict, neox_config)
    )
    state = {name: t.detach().to(DTYPES[dtype]).contiguous().cpu() for name, t in state_fn(model).items()}
    interface_state = model.input.export_state()
    provenance = source_provenance(source)
    hf_config = config_fn(config, dtype, special)
    hf_config.update(_transformers_version())
    hf_config[METADATA_KEY] = {
        "version": 2,
        "tablefree_version": tablefree.__version__,
        "model": to_dict(config),
        **interface_metadata(model),
        **provenance,
    }

    with staged_directory(out_dir) as staging:
        save_file(state, str(staging / HF_WEIGHTS), metadata={"format": "pt"})
        if interface_state:
            save_file(interface_state, str(staging / INTERFACE_STATE_FILE), metadata={"format": "pt"})
        write_json_atomic(staging / "config.json", hf_config)
        write_json_atomic(staging / "generation_config.json", generation_config(special))
        write_tokenizer_files(staging, tokenizer_file, config.max_seq_len)
        (staging / "README.md").write_text(model_card(model, architecture, provenance), encoding="utf-8")
    return out_dir


def source_provenance(source: Path) -> dict[str, Any]:
    """Where an export came from, without the local path: the run's name, the checkpoint's, the training
    position, and the hashes that identify the weights and the tokenizer."""
    meta = read_json(source / META_FILE, default={})
    return {
        "source_run": run_name_of(source),
        "source_checkpoint": source.name,
        "source_weights_sha256": sha256_file(source / MODEL_FILE),
        "step": meta.get("step"),
        "tokens_seen": meta.get("tokens_seen"),
        "tokenizer_hash": meta.get("tokenizer_hash"),
    }


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
        **_transformers_version(),
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


def model_card(model: TablefreeLM, architecture: str, provenance: dict[str, Any]) -> str:
    config = model.config
    interface = model.input
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
        f"Exported by tablefree {tablefree.__version__} from run `{provenance['source_run']}`, checkpoint "
        f"`{provenance['source_checkpoint']}`"
        + _position(provenance)
        + f"; weights sha256 `{provenance['source_weights_sha256']}`"
        + (f", tokenizer hash `{provenance['tokenizer_hash']}`" if provenance.get("tokenizer_hash") else "")
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
    if interface.is_fixed:
        lines += [
            f"`{embed}` is **not trained**: it is a fixed function of the token id, materialised here as a "
            "V×d table only so that standard tooling can load the model. The tablefree model computes it on "
            "the fly and has no input-embedding parameters. The table is untied from the output head.",
            "",
        ]
    elif interface.name != "learned":
        trainable = sum(p.numel() for p in interface.parameters())
        lines += [
            f"`{embed}` is materialised from the `{interface.name}` interface, which has {trainable:,} "
            "trainable parameters (not a free V×d table). The table is untied from the output head.",
            "",
        ]
    lines.append(interface.describe())
    options = ", ".join(f"`{key}={value}`" for key, value in to_dict(config.interface).items())
    lines += [
        "",
        f"Interface options: {options}.",
        "",
        "`config.json` records the interface under `tablefree` (its own tensors, if any, in "
        f"`{INTERFACE_STATE_FILE}`); `tablefree import-hf` uses them to restore the interface exactly.",
    ]
    return "\n".join(lines) + "\n"


def _position(provenance: dict[str, Any]) -> str:
    parts = [f"step {provenance['step']}"] if provenance.get("step") is not None else []
    if provenance.get("tokens_seen") is not None:
        parts.append(f"{provenance['tokens_seen']:,} tokens seen")
    return f" ({', '.join(parts)})" if parts else ""


def _transformers_version() -> dict[str, str]:
    """``{"transformers_version": ...}`` of the installed transformers; nothing when it is not installed."""
    try:
        return {"transformers_version": version("transformers")}
    except PackageNotFoundError:
        return {}


# ----------------------------------------------------------------------------------------------------------
# Import: read and check before allocating

# Bounds on the sizes an imported config may state: far above anything tablefree trains, far below what
# would make a table allocation absurd. A size outside them is refused before any tensor is read.
SIZE_LIMITS = {
    "vocab_size": 1 << 24,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "max_position_embeddings": 1 << 18,
}


def read_weight_headers(hf_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of ``model.safetensors`` or of the shards a ``model.safetensors.index.json`` lists."""
    single = hf_dir / HF_WEIGHTS
    if single.exists():
        return read_safetensors_header(single)
    index = hf_dir / HF_INDEX
    if not index.exists():
        raise FileNotFoundError(f"{hf_dir}: no {HF_WEIGHTS} or {HF_INDEX} (pickle is not read)")
    weight_map = _read_config_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise ValueError(f"{index}: expected a 'weight_map' of tensor name -> file name")
    tensors: dict[str, TensorInfo] = {}
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name:
            raise ValueError(f"{index}: shard {name!r} is not a file name in {hf_dir}")
        if not (hf_dir / name).exists():
            raise FileNotFoundError(f"{index}: shard {name} is missing from {hf_dir}")
        tensors.update(read_safetensors_header(hf_dir / name))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ValueError(f"{index}: tensors listed but absent from their shards: {missing[:5]}")
    return tensors


def load_tensors(headers: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    """Load the (already checked) tensors, file by file; a read error, or a NaN or inf, names the file."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted({info.file for info in headers.values()}):
        try:
            loaded = load_file(str(path))
        except Exception as error:  # safetensors raises its own error types
            raise ValueError(f"{path}: cannot read the weights ({error})") from None
        check_finite(loaded, path)  # NaN or inf would be imported as if trained
        state.update(loaded)
    return state


def _read_config_json(path: Path) -> dict[str, Any]:
    data = read_json(
        path
    )  # malformed JSON, undecodable bytes and deep nesting are ValueErrors naming the file
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    return data


def _size(hf_config: dict[str, Any], key: str, where: Path, default: int | None = None) -> int:
    """A size field of ``config.json``: a whole number in [1, SIZE_LIMITS[key]]."""
    value = hf_config.get(key, default)
    if value is None:
        raise ValueError(f"{where}: missing the field {key!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    limit = SIZE_LIMITS[key]
    if not is_count(value) or value > limit:
        raise ValueError(f"{where}: {key} = {value!r}: expected a whole number from 1 to {limit:,}")
    return value


def _number(hf_config: dict[str, Any], key: str, where: Path, default: float) -> float:
    value = hf_config.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{where}: {key} = {value!r}: expected a positive number")
    return float(value)


def check_shapes(
    expected: dict[str, tuple[int, ...]],
    optional: set[str],
    headers: dict[str, TensorInfo],
    where: Path,
    sizes: str,
) -> None:
    """Every expected tensor present with the shape ``config.json`` implies; ``sizes`` names the fields."""
    for name, shape in expected.items():
        info = headers.get(name)
        if info is None:
            if name in optional:
                continue
            files = sorted({str(info.file) for info in headers.values()}) or [str(where.parent)]
            raise ValueError(f"{', '.join(files)}: weight {name!r} missing from the checkpoint")
        if info.shape != shape:
            raise ValueError(
                f"{info.file}: tensor {name!r} has shape {list(info.shape)}, but {where.name} ({sizes}) "
                f"implies {list(shape)}"
            )
        if not info.dtype.startswith(("F", "BF")):
            raise ValueError(f"{info.file}: tensor {name!r} has dtype {info.dtype}; expected floating point")


def _require(condition: bool, where: Path, message: str) -> None:
    if not condition:
        raise ValueError(f"{where}: {message}; no exact tablefree equivalent")


def _rope_theta(hf_config: dict[str, Any], where: Path, default: float) -> float:
    rope = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling")
    if not isinstance(rope, dict) or not isinstance(scaling or {}, dict):
        raise ValueError(f"{where}: rope_parameters / rope_scaling: expected a mapping or null")
    kind = (rope or scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    _require(kind == "default", where, f"RoPE type {kind!r} (only default RoPE is supported)")
    merged = {"rope_theta": hf_config.get("rope_theta", hf_config.get("rotary_emb_base", default)), **rope}
    return _number(merged, "rope_theta", where, default)


def _model_config(where: Path, **fields: Any) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


# ----------------------------------------------------------------------------------------------------------
# Import: the two architectures


@dataclass
class Conversion:
    """An imported architecture: our config, the HF tensors it needs (with shapes), and the mapping."""

    config: ModelConfig
    expected: dict[str, tuple[int, ...]]
    optional: set[str]
    sizes: str  # the config.json fields the shapes come from, for error messages
    convert: Any  # (state, where) -> our state dict, with "input.weight" for the embedding matrix


def _body_sizes(hf_config: dict[str, Any], where: Path) -> tuple[int, int, int, int, int]:
    """(vocab, width, heads, layers, feed-forward width) from an HF config.json."""
    return tuple(  # type: ignore[return-value]
        _size(hf_config, key, where)
        for key in (
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "intermediate_size",
        )
    )


def _imported_config(
    hf_config: dict[str, Any],
    where: Path,
    sizes: tuple[int, int, int, int, int],
    *,
    eps_field: tuple[str, float],
    **architecture: Any,
) -> ModelConfig:
    """Our config of an imported model: its ``_body_sizes``, context, RoPE base, norm epsilon (config.json's
    field ``eps_field[0]``, default ``eps_field[1]``) and init scale, a learned input table, and
    ``architecture``."""
    v, d, heads, layers, ff = sizes
    return _model_config(
        where,
        vocab_size=v,
        d_model=d,
        n_layers=layers,
        n_heads=heads,
        d_ff=ff,
        max_seq_len=_size(hf_config, "max_position_embeddings", where, 2048),
        rope_theta=_rope_theta(hf_config, where, 10_000.0),
        norm_eps=_number(hf_config, eps_field[0], where, eps_field[1]),
        init_std=_number(hf_config, "initializer_range", where, 0.02),
        interface="learned",
        **architecture,
    )


def _llama(hf_config: dict[str, Any], where: Path) -> Conversion:
    _require(not hf_config.get("attention_bias", False), where, "attention_bias=true")
    _require(not hf_config.get("mlp_bias", False), where, "mlp_bias=true")
    _require(
        hf_config.get("hidden_act", "silu") == "silu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    _require(hf_config.get("pretraining_tp", 1) in (1, None), where, "pretraining_tp != 1")
    sizes = v, d, heads, layers, ff = _body_sizes(hf_config, where)
    kv = _size(hf_config, "num_key_value_heads", where, heads)
    head_dim = _size(hf_config, "head_dim", where, d // heads) if hf_config.get("head_dim") else d // heads
    _require(head_dim * heads == d, where, f"head_dim {head_dim} × {heads} heads != hidden_size {d}")
    config = _imported_config(
        hf_config, where, sizes, n_kv_heads=kv, mlp="swiglu", norm="rmsnorm", eps_field=("rms_norm_eps", 1e-6)
    )
    names = {
        "self_attn.q_proj": ("attn.wq", (heads * head_dim, d)),
        "self_attn.k_proj": ("attn.wk", (kv * head_dim, d)),
        "self_attn.v_proj": ("attn.wv", (kv * head_dim, d)),
        "self_attn.o_proj": ("attn.wo", (d, heads * head_dim)),
        "mlp.gate_proj": ("mlp.w1", (ff, d)),
        "mlp.up_proj": ("mlp.w3", (ff, d)),
        "mlp.down_proj": ("mlp.w2", (d, ff)),
        "input_layernorm": ("attn_norm", (d,)),
        "post_attention_layernorm": ("mlp_norm", (d,)),
    }
    expected = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(layers):
        expected |= {f"model.layers.{i}.{theirs}.weight": shape for theirs, (_, shape) in names.items()}
    tied = bool(hf_config.get("tie_word_embeddings", False))

    def convert(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
        ours = {
            "input.weight": state.pop("model.embed_tokens.weight"),
            "norm.weight": state.pop("model.norm.weight"),
        }
        for i in range(layers):
            for theirs, (mine, _) in names.items():
                ours[f"layers.{i}.{mine}.weight"] = state.pop(f"model.layers.{i}.{theirs}.weight")
        head = state.pop("lm_head.weight", None)
        _require(head is not None or tied, where, "no lm_head.weight and untied embeddings")
        ours["head.weight"] = head if head is not None else ours["input.weight"].clone()
        _require_consumed(state, where)
        return ours

    sizes = "vocab_size, hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim"
    return Conversion(config, expected, {"lm_head.weight"} if tied else set(), sizes, convert)


def _neox(hf_config: dict[str, Any], where: Path) -> Conversion:
    _require(hf_config.get("use_parallel_residual") is False, where, "use_parallel_residual is not false")
    rope = hf_config.get("rope_parameters") or {}
    partial = (rope if isinstance(rope, dict) else {}).get(
        "partial_rotary_factor", hf_config.get("rotary_pct", 0.25)
    )
    _require(partial == 1.0, where, f"partial rotary factor {partial} (ours rotates the whole head)")
    _require(
        hf_config.get("hidden_act", "gelu") == "gelu", where, f"hidden_act={hf_config.get('hidden_act')!r}"
    )
    sizes = v, d, heads, layers, ff = _body_sizes(hf_config, where)
    _require(d % heads == 0, where, f"hidden_size {d} is not a multiple of num_attention_heads {heads}")
    hd = d // heads
    config = _imported_config(
        hf_config, where, sizes, mlp="gelu", norm="layernorm", eps_field=("layer_norm_eps", 1e-5)
    )
    expected = {"gpt_neox.embed_in.weight": (v, d), "embed_out.weight": (v, d), "lm_head.weight": (v, d)}
    expected |= {"gpt_neox.final_layer_norm.weight": (d,), "gpt_neox.final_layer_norm.bias": (d,)}
    for i in range(layers):
        hf = f"gpt_neox.layers.{i}"
        expected |= {
            f"{hf}.attention.query_key_value.weight": (3 * d, d),
            f"{hf}.attention.query_key_value.bias": (3 * d,),
            f"{hf}.attention.dense.weight": (d, d),
            f"{hf}.attention.dense.bias": (d,),
            f"{hf}.mlp.dense_h_to_4h.weight": (ff, d),
            f"{hf}.mlp.dense_h_to_4h.bias": (ff,),
            f"{hf}.mlp.dense_4h_to_h.weight": (d, ff),
            f"{hf}.mlp.dense_4h_to_h.bias": (d,),
            **{
                f"{hf}.{norm}.{p}": (d,)
                for norm in ("input_layernorm", "post_attention_layernorm")
                for p in ("weight", "bias")
            },
        }
    optional = {name for name in expected if name.endswith(".bias")} | {"embed_out.weight", "lm_head.weight"}

    def convert(state: dict[str, torch.Tensor], where: Path) -> dict[str, torch.Tensor]:
        ours = {"input.weight": state.pop("gpt_neox.embed_in.weight")}
        for i in range(layers):
            hf = f"gpt_neox.layers.{i}"
            qkv = state.pop(f"{hf}.attention.query_key_value.weight").view(heads, 3, hd, d)
            for j, name in enumerate(("wq", "wk", "wv")):
                ours[f"layers.{i}.attn.{name}.weight"] = qkv[:, j].reshape(d, d)
            ours[f"layers.{i}.attn.wo.weight"] = state.pop(f"{hf}.attention.dense.weight")
            ours[f"layers.{i}.mlp.w1.weight"] = state.pop(f"{hf}.mlp.dense_h_to_4h.weight")
            ours[f"layers.{i}.mlp.w2.weight"] = state.pop(f"{hf}.mlp.dense_4h_to_h.weight")
            ours[f"layers.{i}.attn_norm.weight"] = state.pop(f"{hf}.input_layernorm.weight")
            ours[f"layers.{i}.mlp_norm.weight"] = state.pop(f"{hf}.post_attention_layernorm.weight")
        ours["norm.weight"] = state.pop("gpt_neox.final_layer_norm.weight")
        head = state.pop("embed_out.weight", None)
        if head is None:
            head = state.pop("lm_head.weight", None)
        _require(head is not None, where, "no embed_out.weight")
        ours["head.weight"] = head
        for name in [n for n in state if n.endswith(".bias")]:
            _require(not state[name].any(), where, f"nonzero bias {name}")
            state.pop(name)
        _require_consumed(state, where)
        return ours

    return Conversion(config, expected, optional, "vocab_size, hidden_size, intermediate_size", convert)


CONVERSIONS = {"llama": _llama, "gpt_neox": _neox}


def _require_consumed(state: dict[str, torch.Tensor], where: Path) -> None:
    leftover = sorted(n for n in state if not n.endswith(("rotary_emb.inv_freq", "attention.masked_bias")))
    _require(not leftover, where, f"unexpected weights {leftover[:5]}")


# ----------------------------------------------------------------------------------------------------------
# Import


def import_hf(hf_dir: str | Path, out_checkpoint: str | Path, *, overwrite: bool = False) -> Path:
    """Load a ``LlamaForCausalLM`` (or GPT-NeoX, as exported here) directory into a tablefree checkpoint.

    Everything is checked before a tensor is allocated: ``config.json``'s sizes (whole numbers within
    ``SIZE_LIMITS``) against the safetensors headers (every tensor present, with the shape the config implies;
    no truncated file). The input interface recorded under ``"tablefree"`` is rebuilt and kept when its table
    equals the embedding matrix exactly; otherwise the matrix becomes a ``learned`` table (a warning says why
    when an interface was recorded). A tied output head (e.g. SmolLM2-135M) is copied into our untied head.
    """
    hf_dir, out_checkpoint = Path(hf_dir), Path(out_checkpoint)
    config_path = hf_dir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path}: not a transformers model directory (no config.json)")
    if out_checkpoint.exists() and any(out_checkpoint.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_checkpoint} exists and is not empty (pass overwrite=True / --overwrite)")
    hf_config = _read_config_json(config_path)
    model_type = hf_config.get("model_type")
    if model_type not in CONVERSIONS:
        raise ValueError(
            f"{config_path}: model_type {model_type!r} is not supported (expected llama or gpt_neox)"
        )
    conversion = CONVERSIONS[model_type](hf_config, config_path)
    headers = read_weight_headers(hf_dir)
    check_shapes(conversion.expected, conversion.optional, headers, config_path, conversion.sizes)
    metadata = hf_config.get(METADATA_KEY)
    metadata = metadata if isinstance(metadata, dict) else {}
    interface_state = read_interface_state(hf_dir, metadata, config_path)

    ours = conversion.convert(load_tensors(headers), config_path)
    config = conversion.config
    config.interface, interface_tensors = restore_interface(
        metadata, ours.pop("input.weight"), interface_state, config, config_path
    )
    model = empty_model(config)  # every tensor but the fixed codes is loaded below
    state = {k: v.float() for k, v in ours.items()} | {f"input.{k}": v for k, v in interface_tensors.items()}
    model.load_state_dict(state, strict=True)

    tokenizer = hf_dir / "tokenizer.json"
    meta = {
        "imported_from": str(hf_dir),
        "model_type": model_type,
        **{k: metadata[k] for k in ("step", "tokens_seen", "tokenizer_hash") if metadata.get(k) is not None},
    }
    with staged_directory(out_checkpoint) as staging:
        save_model(staging, model, meta=meta, tokenizer_path=tokenizer if tokenizer.exists() else None)
    return out_checkpoint


def read_interface_state(hf_dir: Path, metadata: dict[str, Any], where: Path) -> dict[str, torch.Tensor]:
    """The interface's own tensors recorded at export: ``tablefree_interface.safetensors`` (or, in exports of
    the first format, affine's A and b as lists in ``config.json``)."""
    name = metadata.get("interface_state")
    if name:
        if name != INTERFACE_STATE_FILE:
            raise ValueError(
                f"{where}: tablefree.interface_state: expected {INTERFACE_STATE_FILE!r}, got {name!r}"
            )
        path = hf_dir / name
        if not path.exists():
            raise FileNotFoundError(f"{where}: names {name}, which is missing from {hf_dir}")
        return load_tensors(read_safetensors_header(path))
    if "affine_matrix" in metadata and "affine_offset" in metadata:
        try:
            return {
                "affine_matrix": torch.tensor(metadata["affine_matrix"], dtype=torch.int64),
                "affine_offset": torch.tensor(metadata["affine_offset"], dtype=torch.int64),
            }
        except (TypeError, ValueError, OverflowError, RuntimeError):
            raise ValueError(
                f"{where}: tablefree.affine_matrix / affine_offset: expected 0/1 lists"
            ) from None
    return {}


def restore_interface(
    metadata: dict[str, Any],
    table: torch.Tensor,
    state: dict[str, torch.Tensor],
    config: ModelConfig,
    where: Path,
) -> tuple[InterfaceConfig, dict[str, torch.Tensor]]:
    """The recorded interface and its state when it recognises ``table`` (``adopt_table``), else ``learned``
    with the table as its weight."""
    learned = parse_interface_options("learned")
    if "interface" not in metadata:
        return learned, {"weight": table.float()}
    recorded = metadata["interface"]
    try:
        options = parse_interface_options(recorded, f"{where}:tablefree.interface")
    except ValueError as error:
        warnings.warn(f"{error}; the embedding matrix is imported as a learned table", stacklevel=3)
        return learned, {"weight": table.float()}
    interface = build_interface(options, config.vocab_size, config.d_model)
    try:
        adopted = interface.adopt_table(table, state)
    except (RuntimeError, ValueError) as error:  # missing or misshapen tensors, a singular affine matrix
        source = where.parent / INTERFACE_STATE_FILE if metadata.get("interface_state") else where
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{source}: the recorded {options.name} interface's state is invalid: {reason}"
        ) from None
    if adopted is None:
        warnings.warn(
            f"{where}: the embedding matrix is not the table of the recorded {options.name!r} interface (it was "
            "changed after export); imported as a learned table",
            stacklevel=3,
        )
        return learned, {"weight": table.float()}
    return options, adopted
