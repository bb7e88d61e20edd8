"""tablefree: language models with no trainable input embedding table."""

from pathlib import Path

import torch

from tablefree.checkpoint import model_dir
from tablefree.codes import AffineMap, bits_to_ids, ids_to_bits, num_bits
from tablefree.interfaces import INTERFACES, InputInterface, build_interface, register_interface
from tablefree.interfaces.options import InterfaceConfig
from tablefree.model import TablefreeLM, build_model
from tablefree.model_config import ModelConfig, preset
from tablefree.params import param_breakdown

__version__ = "0.1.0"


def load_model(path: str | Path, device: str | torch.device = "cpu") -> TablefreeLM:
    """A trained model for inference, in eval mode: ``path`` is a run directory (its newest complete
    checkpoint), a directory of ``step_*`` checkpoints or one checkpoint. The tokenizer is the checkpoint's
    ``tokenizer.json`` (``tablefree.checkpoint.model_dir.load_model`` also returns that directory); a Hugging Face export
    loads with transformers' ``AutoModelForCausalLM`` instead."""
    return model_dir.load_model(path, device)[0]


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
