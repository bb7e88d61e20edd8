"""Zero-shot evaluation with lm-evaluation-harness semantics (see docs/evaluation.md).

``run_eval(checkpoint, tasks, ...)`` scores a checkpoint; ``engine.loglikelihoods(model, requests, batch_size)`` is
the token-level scoring engine the tasks (and the lm-eval adapter) share.
"""

from tablefree.evaluate.engine import encode_pair, encode_pairs, loglikelihoods
from tablefree.evaluate.evaluator import VALIDATION, evaluate_task, format_results, run_eval
from tablefree.evaluate.tasks import TASKS, Task, get_task, load_docs

__all__ = [
    "TASKS",
    "VALIDATION",
    "Task",
    "encode_pair",
    "encode_pairs",
    "evaluate_task",
    "format_results",
    "get_task",
    "load_docs",
    "loglikelihoods",
    "run_eval",
]
