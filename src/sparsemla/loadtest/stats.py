"""Statistics for load-test summaries and A/B reports: percentiles and 95 % confidence intervals.

Where a CI comes from:
- several repeats of a point: Student-t interval of the repeats' values (:func:`t_interval`);
- one run: within-run intervals stored in its summary — batch means over equal time slices for throughput
  (:func:`batch_means_interval`), a seeded bootstrap over requests for latency percentiles (:func:`bootstrap_interval`),
  a Wilson interval for shares such as goodput (:func:`wilson_interval`).
Two estimates differ significantly only when their intervals do not overlap (:func:`overlaps`), a conservative test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

PERCENTILES = (50, 90, 95, 99)
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """A value with its 95 % interval [lo, hi]; ``n`` is the number of observations behind it."""

    value: float
    lo: float
    hi: float
    n: int
    method: str

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi) and self.hi >= self.lo

    def to_json(self) -> dict[str, float | int | str]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi, "n": self.n, "method": self.method}


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p95, p99, mean, max}`` of ``values`` (all None when empty)."""
    keys = [f"p{p}" for p in PERCENTILES] + ["mean", "max"]
    if len(values) == 0:
        return dict.fromkeys(keys)
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {
        f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES), strict=True)
    }
    out["mean"] = float(arr.mean())
    out["max"] = float(arr.max())
    return out


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean of repeated measurements with a Student-t interval (no interval for fewer than 2 values)."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(arr)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "t")
    mean = float(arr.mean())
    if n < 2:
        return Estimate(mean, math.nan, math.nan, n, "t")
    sem = float(arr.std(ddof=1)) / math.sqrt(n)
    half = float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * sem
    return Estimate(mean, mean - half, mean + half, n, "t")


def batch_means_interval(
    slices: Sequence[float], confidence: float = CONFIDENCE, value: float | None = None
) -> Estimate:
    """Mean rate over equal time slices with a t interval over the slices (the batch-means method).

    ``value``: the run's overall rate, when the slices do not tile the window exactly (whole-second slices of a
    fractional window); the interval's half-width comes from the slices and is centred on ``value``, so the reported
    rate always lies inside its own interval."""
    est = t_interval(slices, confidence)
    if value is None or not est.has_interval:
        return Estimate(est.value if value is None else value, est.lo, est.hi, est.n, "batch-means")
    half = (est.hi - est.lo) / 2
    return Estimate(value, value - half, value + half, est.n, "batch-means")


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    resamples: int = 300,
    max_sample: int = 20000,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """``statistic(values)`` with a percentile-bootstrap interval (seeded; subsampled to ``max_sample`` for speed).

    ``statistic`` maps a 2-D array ``[resamples, n]`` to one value per row (vectorised, e.g. a percentile on axis 1)."""
    arr = np.asarray(values, dtype=float)
    if len(arr) == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "bootstrap")
    value = float(statistic(arr[None, :])[0])
    if len(arr) < 2:
        return Estimate(value, math.nan, math.nan, len(arr), "bootstrap")
    rng = np.random.default_rng(seed)
    if len(arr) > max_sample:
        arr = rng.choice(arr, max_sample, replace=False)
    idx = rng.integers(0, len(arr), size=(resamples, len(arr)))
    boots = np.asarray(statistic(arr[idx]))
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return Estimate(value, float(min(lo, value)), float(max(hi, value)), len(values), "bootstrap")


def wilson_interval(successes: int, total: int, confidence: float = CONFIDENCE) -> Estimate:
    """A share ``successes/total`` with the Wilson score interval."""
    if total <= 0:
        return Estimate(math.nan, math.nan, math.nan, 0, "wilson")
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), total, "wilson")


def overlaps(a: Estimate, b: Estimate) -> bool:
    """True when the two intervals overlap (or either has none): no significant difference can be claimed."""
    if not (a.has_interval and b.has_interval):
        return True
    return a.lo <= b.hi and b.lo <= a.hi


def ratio(a: Estimate, b: Estimate) -> Estimate:
    """B / A with an approximate interval (log-scale error propagation of the two relative half-widths)."""
    if not (a.value and math.isfinite(a.value) and math.isfinite(b.value)) or a.value <= 0 or b.value <= 0:
        return Estimate(math.nan, math.nan, math.nan, min(a.n, b.n), "ratio")
    r = b.value / a.value
    if not (a.has_interval and b.has_interval):
        return Estimate(r, math.nan, math.nan, min(a.n, b.n), "ratio")
    rel_a = (a.hi - a.lo) / 2 / a.value
    rel_b = (b.hi - b.lo) / 2 / b.value
    spread = math.sqrt(rel_a**2 + rel_b**2)
    return Estimate(r, r * math.exp(-spread), r * math.exp(spread), min(a.n, b.n), "ratio")


def percentile_stat(q: float) -> Callable[[np.ndarray], np.ndarray]:
    """A vectorised percentile statistic for :func:`bootstrap_interval`."""
    return lambda rows: np.percentile(rows, q, axis=1)
