"""Percentile bootstrap intervals over rows: a condition's mean and the paired difference of two conditions.

Every condition scores the same rows, and a row's value is the mean over its samples (:func:`row_values`), so the
rows are the unit that is resampled: B resamples draw ``n`` row indices with replacement from
``numpy.random.default_rng(seed)``, and the interval is the (1 - level) / 2 and (1 + level) / 2 quantiles of the B
resampled means (numpy's default linear interpolation). The paired difference resamples the per-row differences
``a[r] - b[r]`` with the same indices, so what the rows share (an easy row is easy for every condition) cancels. One
seed gives the same indices for every condition and the same numbers on every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

LEVEL = 0.95
NUM_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A mean and its bootstrap interval [low, high]."""

    mean: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "low": self.low, "high": self.high}


def row_values(samples: Sequence[Sequence[float]]) -> np.ndarray:
    """Each row's value: the mean of its samples (``samples[r]``: row r's sample values)."""
    out = []
    for r, values in enumerate(samples):
        if len(values) == 0:
            raise ValueError(f"row {r} has no samples to average.")
        out.append(float(np.mean(np.asarray(values, dtype=np.float64))))
    if not out:
        raise ValueError("no rows: a bootstrap interval needs at least one row.")
    return np.asarray(out, dtype=np.float64)


def resample_indices(num_rows: int, num_resamples: int = NUM_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(num_resamples, num_rows) row indices drawn with replacement by ``numpy.random.default_rng(seed)``."""
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}.")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}.")
    return np.random.default_rng(seed).integers(0, num_rows, size=(num_resamples, num_rows))


def bootstrap_mean(
    values: Sequence[float], *, level: float = LEVEL, num_resamples: int = NUM_RESAMPLES, seed: int = 0
) -> Interval:
    """The mean of the per-row ``values`` and its percentile bootstrap interval over rows."""
    x = _rows(values, "values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}.")
    means = x[resample_indices(len(x), num_resamples, seed)].mean(axis=1)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Interval(float(x.mean()), float(low), float(high))


def paired_difference(
    values: Sequence[float],
    control: Sequence[float],
    *,
    level: float = LEVEL,
    num_resamples: int = NUM_RESAMPLES,
    seed: int = 0,
) -> Interval:
    """``mean(values - control)`` over rows and its bootstrap interval, resampling the rows' differences."""
    a, b = _rows(values, "values"), _rows(control, "control")
    if len(a) != len(b):
        raise ValueError(f"a paired difference needs the same rows: {len(a)} values against {len(b)} control rows.")
    return bootstrap_mean(a - b, level=level, num_resamples=num_resamples, seed=seed)


def _rows(values: Sequence[float], name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"{name}: expected one value per row (a non-empty 1-d sequence), got shape {x.shape}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: row {int(np.flatnonzero(~np.isfinite(x))[0])} is not finite.")
    return x
