"""tablefree: language models with no trainable input embedding table.

The names below are imported on first use, so ``import tablefree.cli`` does not load torch before the command
line has chosen OpenMP's wait policy (``tablefree.cpu_threads``)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tablefree.codes import AffineMap, bits_to_ids, ids_to_bits, num_bits
    from tablefree.interfaces import INTERFACES, InputInterface, build_interface, register_interface
    from tablefree.interfaces.options import InterfaceConfig
    from tablefree.model import TablefreeLM, build_model
    from tablefree.model_config import ModelConfig, preset
    from tablefree.params import param_breakdown

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "AffineMap": "tablefree.codes",
    "bits_to_ids": "tablefree.codes",
    "ids_to_bits": "tablefree.codes",
    "num_bits": "tablefree.codes",
    "INTERFACES": "tablefree.interfaces",
    "InputInterface": "tablefree.interfaces",
    "build_interface": "tablefree.interfaces",
    "register_interface": "tablefree.interfaces",
    "InterfaceConfig": "tablefree.interfaces.options",
    "TablefreeLM": "tablefree.model",
    "build_model": "tablefree.model",
    "ModelConfig": "tablefree.model_config",
    "preset": "tablefree.model_config",
    "param_breakdown": "tablefree.params",
}

__all__ = [
    "INTERFACES",
    "AffineMap",
    "InputInterface",
    "InterfaceConfig",
    "ModelConfig",
    "TablefreeLM",
    "bits_to_ids",
    "build_interface",
    "build_model",
    "ids_to_bits",
    "load_model",
    "num_bits",
    "param_breakdown",
    "preset",
    "register_interface",
]


def load_model(path: str | Path, device: str | torch.device = "cpu") -> TablefreeLM:
    """A trained model for inference, in eval mode: ``path`` is a run directory (its newest complete
    checkpoint), a directory of ``step_*`` checkpoints or one checkpoint. The tokenizer is the checkpoint's
    ``tokenizer.json`` (``tablefree.checkpoint.model_dir.load_model`` also returns that directory); a Hugging
    Face export loads with transformers' ``AutoModelForCausalLM`` instead."""
    from tablefree.checkpoint import model_dir

    return model_dir.load_model(path, device)[0]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tablefree' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
