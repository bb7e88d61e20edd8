"""``export_hf``: a tablefree checkpoint -> a ``transformers`` model directory (config, weights, generation
config, tokenizer files, model card), assembled beside the destination and renamed into place.

The input interface is exported through its contract: its V×d ``table()`` becomes the embedding matrix (untied
from the head), its ``describe()`` goes into the model card, its options into ``config.json`` under
``"tablefree"``, and its ``export_state()`` into ``tablefree_interface.safetensors``.
"""

from __future__ import annotations

import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

import tablefree
from tablefree.checkpoint.layout import META_FILE, TOKENIZER_FILE, run_name_of
from tablefree.checkpoint.model_dir import load_model, weights_provenance
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.config_parsing import to_dict
from tablefree.data.tokenizer import eot_id, load_tokenizer
from tablefree.export.architectures import (
    hf_architecture,
    llama_config,
    llama_state_dict,
    neox_config,
    neox_state_dict,
)
from tablefree.export.layout import DTYPES, HF_WEIGHTS, INTERFACE_STATE_FILE, METADATA_KEY
from tablefree.fileio import read_json, staged_directory, write_json_atomic
from tablefree.model import TablefreeLM


def interface_metadata(model: TablefreeLM) -> dict[str, Any]:
    """What ``import_hf`` needs to restore the interface: its options, and the file of its own tensors."""
    return {
        "interface": to_dict(model.config.interface),
        "interface_state": INTERFACE_STATE_FILE if model.input.export_state() else None,
    }


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
    position, and the hashes that identify the weights (full or sharded: ``weights_provenance``) and the
    tokenizer."""
    meta = read_json(source / META_FILE, default={})
    return {
        "source_run": run_name_of(source),
        "source_checkpoint": source.name,
        **weights_provenance(source),
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
        + _weights_hash(provenance)
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


def _weights_hash(provenance: dict[str, Any]) -> str:
    if provenance.get("source_weights_format") == "dcp":
        count = len(provenance.get("source_weights_files") or {})
        return (
            f"; sharded (DCP) weights in {count} files, sha256 of their digests "
            f"`{provenance['source_weights_sha256']}` (each file's in config.json)"
        )
    return f"; weights sha256 `{provenance['source_weights_sha256']}`"


def _transformers_version() -> dict[str, str]:
    """``{"transformers_version": ...}`` of the installed transformers; nothing when it is not installed."""
    try:
        return {"transformers_version": version("transformers")}
    except PackageNotFoundError:
        return {}
