"""lm-evaluation-harness model adapter: ``lm_eval --model tablefree --model_args checkpoint=PATH``.

lm-eval 0.4.13 discovers models only through its registry (``lm_eval.api.registry.model_registry``); it reads
no plugin entry points. Importing this module registers the adapter as ``tablefree``. To use lm-eval's own
command line with it, run it through us, which registers first and then hands over to lm-eval's CLI::

    python -m tablefree.evaluate.lm_eval_adapter --model tablefree --model_args checkpoint=PATH --tasks hellaswag
    tablefree lm-eval --model tablefree --model_args checkpoint=PATH --tasks hellaswag

From Python: ``import tablefree.evaluate.lm_eval_adapter`` then ``lm_eval.simple_evaluate(model="tablefree",
model_args={"checkpoint": PATH}, ...)``. ``verify=False`` in the model_args skips the checkpoint's digests
and finite-weights check, as ``--no-verify`` does for ``tablefree eval``.

Text is tokenised by lm-eval's own ``TemplateLM`` code (context/continuation split, empty contexts, rolling
windows), exactly as for its ``hf`` backend; scoring is ``tablefree.evaluate.engine.loglikelihoods`` (the
engine behind ``tablefree eval``), and generation is ``tablefree.generate``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lm_eval
import torch
import yaml
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from tablefree import device as devices
from tablefree.checkpoint.layout import TOKENIZER_FILE
from tablefree.checkpoint.model_dir import load_model
from tablefree.checkpoint.tokenizer import checked_tokenizer
from tablefree.data.tokenizer import eot_id
from tablefree.evaluate.engine import loglikelihoods
from tablefree.evaluate.tasks import TASKS, check_task_files, load_docs, parse_task_names
from tablefree.fileio import write_text_atomic
from tablefree.generate import GenerateSpec, generate

logger = logging.getLogger(__name__)
MODEL_NAME = "tablefree"
DEFAULT_BATCH_SIZE = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TablefreeLMEval(TemplateLM):
    """A tablefree checkpoint as an lm-eval ``LM``.

    Model args: ``checkpoint`` (checkpoint, run dir or dir of ``step_*``), ``device`` (lm-eval's default is
    ``cuda:0``; without CUDA we fall back to the CPU, as lm-eval's ``hf`` backend does when none is given),
    ``batch_size`` (packed rows per forward pass; ``auto`` means 32), ``dtype`` (float32 | bfloat16 | float16),
    ``max_length`` (default the model's ``max_seq_len``), ``tokenizer`` (default the checkpoint's
    ``tokenizer.json``), ``max_gen_toks`` (default 256), ``seed`` (sampling seed for ``generate_until``).
    """

    def __init__(
        self,
        checkpoint: str,
        device: str | None = "cpu",
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        max_batch_size: int | None = None,
        dtype: str = "float32",
        max_length: int | None = None,
        tokenizer: str | None = None,
        max_gen_toks: int = 256,
        seed: int = 1234,
        verify: bool | str = True,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"model_args dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        # lm-eval's CLI default is cuda:0: an absent CUDA falls back to the CPU with a warning, as its hf backend
        device = devices.resolve_device(device, fallback_to_cpu=True)
        # model_args arrive as strings: verify=False (or 0/no) is lm-eval's spelling of --no-verify
        verify = parse_verify(verify)
        self.model, self.checkpoint = load_model(checkpoint, device=device, verify=verify)
        self.model.to(DTYPES[dtype])
        # the same check as `tablefree eval`: a tokenizer other than the checkpoint's is refused
        self.tokenizer, _ = checked_tokenizer(self.checkpoint, tokenizer)
        self._tokenizer_path = Path(tokenizer) if tokenizer else self.checkpoint / TOKENIZER_FILE
        self._eot_token_id = eot_id(self.tokenizer)
        self._batch_size = _parse_batch_size(batch_size, max_batch_size)
        self._max_length = int(max_length or self.model.config.max_seq_len)
        self._max_gen_toks = int(max_gen_toks)
        self.seed = int(seed)
        self._device = device

    # -- properties lm-eval reads ---------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self._eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(self._tokenizer_path)

    # -- tokenisation (as HFLM.tok_encode with add_special_tokens left to the tokenizer) --------------------

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        if add_special_tokens is None:
            # As HF: a string that already starts with the prefix token gets no special tokens added.
            add_special_tokens = not string.startswith(self.tok_decode([self.prefix_token_id], False))
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens).ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # -- scoring ------------------------------------------------------------------------------------------

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        results = loglikelihoods(
            self.model,
            [(context, continuation) for _, context, continuation in requests],
            self.batch_size,
            max_len=self.max_length,
            progress=not disable_tqdm,
        )
        for (request, _, _), answer in zip(requests, results, strict=True):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Summed log-likelihood of whole texts, in lm-eval's disjoint rolling windows of ``max_length``."""
        windows, owners = [], []
        for index, (string,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(string)
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, context_len=1),
            ):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(
            owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm), strict=True
        ):
            totals[owner] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with ``do_sample``/``temperature``/``top_k``/``top_p``) continuations, cut at
        the first ``until`` string or ``<|endoftext|>``; contexts left-truncated to ``max_length -
        max_gen_toks`` as lm-eval's ``hf`` backend does."""
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        outputs = []
        for context, gen_kwargs in tqdm(
            [req.args for req in requests], disable=disable_tqdm, desc="generating"
        ):
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            max_context = self.max_length - max_gen_toks
            if max_context <= 0:
                raise ValueError(
                    f"max_gen_toks ({max_gen_toks}) must be less than the model's context ({self.max_length})"
                )
            spec = GenerateSpec(
                self.tok_encode(context)[-max_context:] or [self.prefix_token_id],
                max_gen_toks,
                temperature=float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0,
                top_k=kwargs.get("top_k") or None,  # 0 means "no top-k" in transformers
                top_p=kwargs.get("top_p"),
                seed=self.seed,
                stop=[s for s in until if s != eos],
            )
            text = generate(self.model, self.tokenizer, spec)
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return outputs

    def get_model_info(self) -> dict[str, Any]:
        return {"checkpoint": str(self.checkpoint), "model_config": str(self.model.config)}


def parse_verify(value: bool | str) -> bool:
    """The ``verify`` model_arg: a bool (lm-eval converts true/false), or its spelling as a string."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"model_args verify: expected True or False, got {value!r}")


def _parse_batch_size(batch_size: int | str | None, max_batch_size: int | None) -> int:
    """lm-eval passes ``auto``, ``auto:N`` or a number (possibly as a string)."""
    if batch_size is None or str(batch_size).startswith("auto"):
        return int(max_batch_size or DEFAULT_BATCH_SIZE)
    try:
        value = int(batch_size)
    except ValueError:
        raise ValueError(f"batch_size: expected an integer or 'auto', got {batch_size!r}") from None
    if value < 1:
        raise ValueError(f"batch_size must be >= 1, got {value}")
    return value


# Our task -> lm-eval's official task YAML (under lm_eval/tasks) and the split our file holds, from the task
# records. The local task includes that YAML, so prompts, choices, targets, preprocessing and metrics are
# lm-eval's own; only the data source changes, to the official-format files `tablefree eval` reads.
LOCAL_TASKS = {name: (task.lm_eval_yaml, task.lm_eval_split) for name, task in TASKS.items()}


def write_local_tasks(
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    limit: int | None = None,
    prefix: str = "tablefree_",
) -> dict[str, str]:
    """Write lm-eval task definitions that read the local evaluation files, for ``--include_path out_dir``.

    Each ``{prefix}{task}.yaml`` includes lm-eval's official YAML and points ``dataset_path: json`` at a JSON
    lines copy of the task's records (the first ``limit``; PIQA with its labels joined, BoolQ's ``answer`` as
    SuperGLUE's ``label``), evaluated on the split our file holds (``validation`` here also for ARC, OpenBookQA
    and SciQ, whose official task scores ``test``). ``tasks``: names or aliases as ``tablefree eval`` takes
    them (default: all). ``data_dir`` is found as for ``tablefree eval``; the paths written into the YAML are
    absolute. Returns {our task name: lm-eval task name}.
    """
    official = Path(lm_eval.__file__).parent / "tasks"
    out_dir = Path(out_dir).resolve()  # absolute data paths: the YAML works from any directory
    names = parse_task_names(tasks) if tasks else list(TASKS)
    check_task_files([TASKS[name] for name in names], data_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in names:
        task = TASKS[name]
        yaml_path, split = LOCAL_TASKS[name]
        records = [doc.fields for doc in load_docs(task, data_dir, limit)]
        if task.lm_eval_doc is not None:
            records = [task.lm_eval_doc(r) for r in records]
        task_name = f"{prefix}{name}"
        data = out_dir / f"{task_name}.jsonl"
        write_text_atomic(data, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        config = {
            "include": str(official / yaml_path),
            "task": task_name,
            "tag": [],
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {
                "data_files": {split: str(data)},
                "cache_dir": str(out_dir / "datasets_cache"),
            },
            "training_split": None,
            "validation_split": split if split == "validation" else None,
            "test_split": split if split == "test" else None,
            "fewshot_split": None,
        }
        write_text_atomic(out_dir / f"{task_name}.yaml", yaml.safe_dump(config, sort_keys=False))
        written[name] = task_name
    return written


def register() -> None:
    """Register the adapter as lm-eval model ``tablefree`` (once; importing this module does it)."""
    if model_registry.get(MODEL_NAME, None) is None:
        model_registry.register(MODEL_NAME)(TablefreeLMEval)


register()


def run_cli(argv: list[str]) -> None:
    """Run lm-eval's own command line (``lm_eval run ...``) with the ``tablefree`` model registered.

    lm-eval's CLI passes ``batch_size=1`` unless ``--batch_size`` is given; for ``--model tablefree`` we pass
    the engine's own default (or ``batch_size`` from ``--model_args``) instead."""
    saved = sys.argv
    sys.argv = ["lm-eval", *with_default_batch_size(argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved


def _option(argv: list[str], *names: str) -> tuple[int, str | None] | None:
    """(index, value) of the first ``--name value`` / ``--name=value`` in ``argv``, or None."""
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name:
                return index, argv[index + 1] if index + 1 < len(argv) else None
            if arg.startswith(name + "=") and name.startswith("--"):
                return index, arg[len(name) + 1 :]
    return None


def with_default_batch_size(argv: list[str]) -> list[str]:
    """``argv`` with ``--batch_size`` added for ``--model tablefree`` when none is given (lm-eval's CLI would
    pass 1): ``batch_size`` from ``--model_args`` moved there (lm-eval refuses it in both places), else
    ``DEFAULT_BATCH_SIZE``."""
    model = _option(argv, "--model", "-M")
    if model is None or model[1] != MODEL_NAME or _option(argv, "--batch_size", "-b") is not None:
        return list(argv)
    argv = list(argv)
    size = str(DEFAULT_BATCH_SIZE)
    found = _option(argv, "--model_args", "-a")
    if found is not None and found[1] and not found[1].lstrip().startswith("{"):
        index, value = found
        kept, size_args = [], []
        for item in value.split(","):
            (size_args if item.strip().startswith("batch_size=") else kept).append(item)
        if size_args:
            size = size_args[-1].split("=", 1)[1].strip()
            joined = ",".join(kept)
            if argv[index] in ("--model_args", "-a"):
                argv[index + 1] = joined
            else:
                argv[index] = f"--model_args={joined}"
    return [*argv, "--batch_size", size]


if __name__ == "__main__":
    run_cli(sys.argv[1:])
