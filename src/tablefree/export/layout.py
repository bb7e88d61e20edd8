"""The files of an exported ``transformers`` directory that export and import both name, and the dtypes an
export may write."""

from __future__ import annotations

import torch

EXPORT_FORMATS = ("hf",)
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
INTERFACE_STATE_FILE = "tablefree_interface.safetensors"  # the interface's own tensors (A and b, a K×d map)
METADATA_KEY = "tablefree"  # our section of the exported config.json
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
