"""Per-document scoring and aggregation, as lm-evaluation-harness 0.4 does them.

Per document (``lm_eval.api.task.ConfigurableTask.process_results``, multiple choice): ``acc`` takes the argmax of
the summed log-likelihoods, ``acc_norm`` the argmax of log-likelihood / len(choice) in characters, ``acc_bytes``
of log-likelihood / len(choice) in UTF-8 bytes, where choice is ``doc_to_choice(doc)[i]`` (without the target
delimiter). ``np.argmax`` breaks ties towards the lowest index; so does ours.

Aggregates (``lm_eval.api.metrics``): ``mean`` for accuracies, with standard error ``sample_stddev / sqrt(n)``
(closed form, no bootstrap); ``perplexity = exp(-mean(loglikelihoods))`` with a bootstrap standard error of
``bootstrap_iters`` resamples (lm-eval's default 100,000), drawn exactly as lm-eval draws them: chunk i of 1,000
resamples uses ``random.Random(i).choices``, which we reproduce with NumPy's identical Mersenne Twister (seeded by
the same init_by_array key), so the figure matches lm-eval's to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (as ``np.argmax``)."""
    return int(np.argmax(np.asarray(values, dtype=np.float64)))


def multiple_choice_scores(
    loglikelihoods: Sequence[float], choices: Sequence[str], gold: int
) -> dict[str, int]:
    """pred / pred_norm / pred_bytes and the 0/1 acc, acc_norm, acc_bytes of one document."""
    lls = np.asarray(loglikelihoods, dtype=np.float64)
    chars = np.array([float(len(c)) for c in choices])
    nbytes = np.array([float(len(c.encode("utf-8"))) for c in choices])
    pred, pred_norm, pred_bytes = argmax(lls), argmax(lls / chars), argmax(lls / nbytes)
    return {
        "pred": pred,
        "pred_norm": pred_norm,
        "pred_bytes": pred_bytes,
        "acc": int(pred == gold),
        "acc_norm": int(pred_norm == gold),
        "acc_bytes": int(pred_bytes == gold),
    }


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def sample_stddev(values: Sequence[float]) -> float:
    mu = mean(values)
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (len(values) - 1))


def mean_stderr(values: Sequence[float]) -> float:
    return sample_stddev(values) / math.sqrt(len(values))


def perplexity(loglikelihoods: Sequence[float]) -> float:
    return math.exp(-mean(loglikelihoods))


def bootstrap_stderr(
    statistic: Callable[[np.ndarray], np.ndarray], values: Sequence[float], iters: int = 100_000
) -> float:
    """lm-eval's ``bootstrap_stderr``: sample stddev of ``statistic`` over resamples with replacement.

    ``statistic`` maps a (resamples, n) array to (resamples,). Resamples come in chunks of min(1000, iters);
    chunk i draws ``random.Random(i).choices(values, k=n)`` for each resample — reproduced bit for bit by
    ``np.random.RandomState([i])`` (same MT19937 seeding, same 53-bit doubles, same ``floor(random() * n)``).
    """
    xs = np.asarray(values, dtype=np.float64)
    n = len(xs)
    chunk = min(1000, iters)
    replicates = []
    for i in range(iters // chunk):
        draws = np.random.RandomState([i]).random_sample(chunk * n)
        indices = np.floor(draws * float(n)).astype(np.int64).reshape(chunk, n)
        replicates.append(statistic(xs[indices]))
    return sample_stddev(np.concatenate(replicates).tolist())


def perplexity_rows(resamples: np.ndarray) -> np.ndarray:
    """``perplexity`` of each resample (row)."""
    return np.exp(-resamples.mean(axis=1))


def aggregate(name: str, values: Sequence[float], bootstrap_iters: int) -> tuple[float, float | None]:
    """(value, standard error) of metric ``name`` over per-document values, as lm-eval reports them.

    The standard error is None for a single document (lm-eval prints "N/A"), or for perplexity when
    ``bootstrap_iters`` is 0.
    """
    if name == "perplexity":
        value = perplexity(values)
        if len(values) < 2 or bootstrap_iters <= 0:
            return value, None
        return value, bootstrap_stderr(perplexity_rows, values, bootstrap_iters)
    return mean(values), (mean_stderr(values) if len(values) > 1 else None)
