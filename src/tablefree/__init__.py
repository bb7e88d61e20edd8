"""tablefree: language models with no trainable input embedding table."""

from tablefree.codes import AffineMap, bits_to_ids, ids_to_bits, num_bits
from tablefree.interfaces import INTERFACES, InputInterface, build_interface, register_interface
from tablefree.interfaces.options import InterfaceConfig
from tablefree.model import TablefreeLM, build_model
from tablefree.model_config import ModelConfig, preset
from tablefree.params import param_breakdown

__version__ = "0.1.0"

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
