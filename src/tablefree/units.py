"""Counts for people to read: ``human(2_500_000) == "2.5M"``, the one formatter of token and parameter counts."""

from __future__ import annotations

from tablefree.stats import fmt

SCALES = (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3))


def human(value: float | None, decimals: int | None = None) -> str:
    """A count with a k/M/B/T suffix: three significant digits, trailing zeros dropped (2,500,000 → 2.5M;
    163,840 → 164k), or exactly ``decimals`` decimals (the trainer's console lines: 4,096 → 4.10k). None → "–"."""
    if value is None:
        return "–"
    for suffix, scale in SCALES:
        if abs(value) >= scale:
            if decimals is not None:
                return f"{value / scale:.{decimals}f}{suffix}"
            text = fmt(value / scale, 3)
            return f"{text.rstrip('0').rstrip('.') if '.' in text else text}{suffix}"
    return f"{value:.0f}" if decimals is not None else f"{value:g}"
