"""Zero-shot evaluation with lm-evaluation-harness semantics (see docs/evaluation.md).

``run_eval(EvalSpec(checkpoint, tasks, ...))`` scores a checkpoint; ``engine.loglikelihoods(model, requests, batch_size)`` is
the token-level scoring engine the tasks (and the lm-eval adapter) share.
"""

from tablefree.evaluate.engine import encode_pair, encode_pairs, loglikelihoods
from tablefree.evaluate.evaluator import VALIDATION, evaluate_task, format_results, run_eval
from tablefree.evaluate.spec import EvalSpec
from tablefree.evaluate.task_record import Task, read_task_file
from tablefree.evaluate.tasks import TASKS, get_task, load_docs

__all__ = [
    "TASKS",
    "VALIDATION",
    "EvalSpec",
    "Task",
    "encode_pair",
    "encode_pairs",
    "evaluate_task",
    "format_results",
    "get_task",
    "load_docs",
    "loglikelihoods",
    "read_task_file",
    "run_eval",
]
