"""``EvalSpec``: what ``run_eval`` scores and how, parsed once (from ``tablefree eval``'s flags, a compare
config's ``eval:`` section, or a test) and checked when it is built."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TASKS = ("hellaswag", "piqa", "lambada")
DTYPES = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation of ``checkpoint`` (a checkpoint, run or ``step_*`` parent directory).

    ``tasks``: names from ``tablefree.evaluate.TASKS`` (or their aliases, e.g. ``lambada_openai``), ``all``,
    task files (``.yaml``, see ``tablefree.evaluate.task_record``) and/or ``"validation"`` (needs ``val_data``,
    a prepared dataset directory), as a list or a comma list. ``data_dir``: the benchmark files (None:
    $TABLEFREE_EVAL_DATA, then ~/.cache/tablefree/eval). ``limit``: the first N documents of each task (windows
    for validation); None means the full sets, and 0 is refused. ``tokenizer``: used instead of the
    checkpoint's; either must hash to the ``tokenizer_hash`` in the checkpoint's meta.json. ``out`` (the
    results JSON) and ``examples_out`` (per-example JSONL) are written atomically, again after each finished
    task. ``dtype`` (auto | fp32 | bf16): the forward pass's precision, decided as training's ``precision``.
    ``bootstrap_iters``: resamples for the perplexity standard error (0: none). ``verify``: the checkpoint's
    digests and finite-weights check.
    """

    checkpoint: str | Path
    tasks: str | Sequence[str] = DEFAULT_TASKS
    data_dir: str | Path | None = None
    limit: int | None = None
    batch_size: int = 32
    device: str = "cpu"
    examples_out: str | Path | None = None
    val_data: str | Path | None = None
    tokenizer: str | Path | None = None
    bootstrap_iters: int = 100_000
    out: str | Path | None = None
    progress: bool = False
    dtype: str = "auto"
    verify: bool = True

    def __post_init__(self) -> None:
        limit = self.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(
                f"limit must be a positive number of documents, got {limit!r}; leave it out for the full sets"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected auto, fp32 or bf16, got {self.dtype!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size: expected a positive integer, got {self.batch_size!r}")
        if isinstance(self.bootstrap_iters, bool) or not isinstance(self.bootstrap_iters, int):
            raise ValueError(f"bootstrap_iters: expected an integer (0: none), got {self.bootstrap_iters!r}")
        if self.bootstrap_iters < 0:
            raise ValueError(f"bootstrap_iters: expected 0 (none) or more, got {self.bootstrap_iters}")
