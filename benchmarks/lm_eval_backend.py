"""lm-evaluation-harness's ``hf`` backend as a scoring backend of ``benchmarks/eval_speed.py``.

The tablefree model is exported with ``tablefree.export.export_hf`` (once per model) and loaded by lm-eval's
``HFLM`` in fp32; ``HFLM._loglikelihood_tokens`` then scores exactly the token requests the other backends score,
so the column compares the scoring engines on the same model and examples, in the same (paired) run. Needs the
interop extra (``pip install 'tablefree[interop]'``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from lm_eval.models.huggingface import HFLM

from tablefree.checkpoint.model_dir import save_model
from tablefree.data.tokenizer import save_tokenizer
from tablefree.export import export_hf

_EXPORTS: dict[int, Path] = {}  # id(model) -> exported directory
_LOADED: dict[tuple[int, int], HFLM] = {}  # (id(model), batch size) -> lm-eval model
_TMP = tempfile.TemporaryDirectory(prefix="tablefree-lm-eval-bench-")


def _hflm(model: torch.nn.Module, tokenizer, batch_size: int) -> HFLM:
    """The model exported (in its own dtype) and loaded by lm-eval, cached."""
    weight = model.head.weight
    dtype = str(weight.dtype).removeprefix("torch.")
    if id(model) not in _EXPORTS:
        root = Path(_TMP.name) / f"model{len(_EXPORTS)}"
        save_tokenizer(tokenizer, root / "tokenizer.json")
        save_model(root / "checkpoint", model, tokenizer_path=root / "tokenizer.json")
        _EXPORTS[id(model)] = export_hf(root / "checkpoint", root / "hf", dtype=dtype)
    key = (id(model), batch_size)
    if key not in _LOADED:
        _LOADED[key] = HFLM(
            pretrained=str(_EXPORTS[id(model)]), dtype=dtype, device=str(weight.device), batch_size=batch_size
        )
    return _LOADED[key]


def lm_eval_hf_loglikelihoods(model, tokenizer, requests, batch_size) -> list[tuple[float, bool]]:
    """lm-eval ``hf`` backend scoring of (context ids, continuation ids) requests."""
    hflm = _hflm(model, tokenizer, batch_size)
    return hflm._loglikelihood_tokens([(None, list(c), list(x)) for c, x in requests], disable_tqdm=True)
