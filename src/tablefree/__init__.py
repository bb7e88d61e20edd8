"""tablefree: language models with no trainable input embedding table.

The names below are imported on first use, so ``import tablefree.cli`` does not load torch before the command
line has chosen OpenMP's wait policy (``tablefree.cpu_threads``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tablefree.codes import AffineMap, bits_to_ids, ids_to_bits, num_bits
    from tablefree.interfaces import INTERFACES, InputInterface, build_interface, register_interface
    from tablefree.model import TablefreeLM, build_model
    from tablefree.model_config import InterfaceConfig, ModelConfig, preset
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
    "TablefreeLM": "tablefree.model",
    "build_model": "tablefree.model",
    "InterfaceConfig": "tablefree.model_config",
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
    "num_bits",
    "param_breakdown",
    "preset",
    "register_interface",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tablefree' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
