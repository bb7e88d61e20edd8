"""Scaling across separate runs: final validation loss against tokens (or parameters), measured and fitted.
Pure functions of arrays and records (numpy only), in the statistics layer beside ``tablefree.stats``.

The parts, each with its own job:

- ``observations``: one final loss per separate run (``Observation``), and the design a fit rests on or the
  reason it is refused (``check_design``);
- ``measured``: no fit, how each pair's measured gap moved between consecutive budgets;
- ``fits``: one curve, L = E + B·x^(−β), by a robust loss and a vectorised L-BFGS;
- ``intervals``: seed-resampled intervals of fitted curves;
- ``backtests``: a fit refitted without its largest budgets against what was measured there;
- ``analysis``: one fit with everything it derives (gaps, slopes, parity, the check against its points);
- ``sentences``: what a fit says, in words;
- ``report``: all of it for a set of observations as strict JSON (``scaling_report(observations, ScalingReportSpec(...))``).
"""

from tablefree.scaling.analysis import DEFAULT_HORIZON, analyse
from tablefree.scaling.fits import HUBER_DELTA, PowerLaw, fit_power_law
from tablefree.scaling.intervals import DEFAULT_BOOTSTRAP
from tablefree.scaling.measured import measured_changes
from tablefree.scaling.observations import (
    EXACT,
    MIN_BUDGETS,
    MIN_SEEDS,
    MIN_SPAN,
    RATIO_TOLERANCE,
    Design,
    Observation,
    check_design,
    groups_by_tokens_per_param,
    observations_from_dicts,
)
from tablefree.scaling.report import ScalingReportSpec, scaling_report

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_HORIZON",
    "EXACT",
    "HUBER_DELTA",
    "MIN_BUDGETS",
    "MIN_SEEDS",
    "MIN_SPAN",
    "RATIO_TOLERANCE",
    "Design",
    "Observation",
    "PowerLaw",
    "ScalingReportSpec",
    "analyse",
    "check_design",
    "fit_power_law",
    "groups_by_tokens_per_param",
    "measured_changes",
    "observations_from_dicts",
    "scaling_report",
]
