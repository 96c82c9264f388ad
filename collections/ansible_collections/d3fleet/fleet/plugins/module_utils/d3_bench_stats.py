"""Latency statistics of the bench load generator (module `bench_load`, on the hosts): the report's percentiles are
the ones it computes there. Standard library only."""

from __future__ import annotations

import math
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default, "linear");
    None for no values."""
    if not values:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is not within 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: list[float], digits: int = 1) -> dict[str, Any]:
    """n, mean, min, p50, p95, p99, max of latencies in ms (None when there are none), rounded to `digits`."""

    def rnd(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    n = len(values)
    return {
        "n": n,
        "mean": rnd(sum(values) / n) if n else None,
        "min": rnd(min(values)) if n else None,
        "p50": rnd(percentile(values, 50)),
        "p95": rnd(percentile(values, 95)),
        "p99": rnd(percentile(values, 99)),
        "max": rnd(max(values)) if n else None,
    }
