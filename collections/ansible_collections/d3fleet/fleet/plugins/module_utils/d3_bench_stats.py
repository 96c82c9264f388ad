"""Statistics of the bench (playbooks/bench.yml): latency percentiles and the n they need (computed on the hosts by
the module `bench_load`), binomial intervals and proper scoring rules (computed on the controller by the
d3_bench filters), and the reading of a vLLM `/metrics` page. Standard library only.

Sources: the Wilson score interval (E. B. Wilson, "Probable inference, the law of succession, and statistical
inference", JASA 22 (1927) 209-212; NIST/SEMATECH e-Handbook of Statistical Methods 7.2.4.1); the Brier score
(G. W. Brier, "Verification of forecasts expressed in terms of probability", Monthly Weather Review 78 (1950) 1-3:
the sum over all classes); the ranked probability score (E. S. Epstein, "A scoring system for probability forecasts
of ranked categories", J. Applied Meteorology 8 (1969) 985-987, in A. H. Murphy's form, "On the 'ranked probability
score'", J. Applied Meteorology 10 (1971) 155-156: squared differences of the cumulative distributions, divided by
K - 1). vLLM's metric names: vllm-project/vllm vllm/v1/metrics/loggers.py (PrometheusStatLogger), recorded in
tests/contracts/metrics/names.yml (tests/test_bench_stats.py checks METRICS against it)."""

from __future__ import annotations

import math
import re
from typing import Any

# the 95 % two-sided normal quantile
Z95 = 1.959963984540054
PERCENTILES = (50, 95, 99)


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


def min_n(q: float) -> int:
    """The fewest samples a q-th percentile needs to be more than the largest sample's neighbourhood: at least one
    sample must lie above it on average, n * (1 - q/100) >= 1, so n >= 100 / (100 - q): p50 2, p95 20, p99 100.
    With fewer, the interpolated p99 of 20 samples is 81 % of the way from the 19th to the 20th (the maximum)."""
    if not 0.0 <= q < 100.0:
        raise ValueError(f"percentile {q} is not within 0-100 (exclusive)")
    return math.ceil(100.0 / (100.0 - q) - 1e-9)


def summary(values: list[float], digits: int = 1) -> dict[str, Any]:
    """n, mean, min, p50, p95, p99, max of latencies in ms (None when there are none), rounded to `digits`, and
    `unsupported`: the percentiles n is too small for (min_n), e.g. ["p95", "p99"] for n = 10."""

    def rnd(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    n = len(values)
    return {
        "n": n,
        "mean": rnd(sum(values) / n) if n else None,
        "min": rnd(min(values)) if n else None,
        **{f"p{q}": rnd(percentile(values, q)) for q in PERCENTILES},
        "max": rnd(max(values)) if n else None,
        "unsupported": [f"p{q}" for q in PERCENTILES if n < min_n(q)],
    }


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval (Wilson 1927) of a proportion successes/n at the normal quantile z (95 % by
    default); None for n = 0. 17/26 gives (0.462, 0.806)."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def brier(probs: dict[str, float], outcome: str) -> float:
    """Brier's (1950) score of one forecast over all its classes: sum over k of (p_k - o_k)^2, o_k 1 for the class
    that happened. 0 is perfect, 2 the worst; two classes give twice the binary (p - o)^2."""
    return sum((float(p) - (1.0 if str(k) == str(outcome) else 0.0)) ** 2 for k, p in probs.items()) + (
        0.0 if str(outcome) in {str(k) for k in probs} else 1.0)


def rps(probs: list[float], outcome: int) -> float:
    """The ranked probability score (Epstein 1969, Murphy 1971) of a forecast over ordered levels 0..K-1: the mean over
    the K - 1 thresholds of (P(level <= k) - O(level <= k))^2. 0 is perfect, 1 the worst (all mass on the far end)."""
    k = len(probs)
    if k < 2:
        raise ValueError("a ranked probability score needs at least two levels")
    cum_p = cum_o = total = 0.0
    for level in range(k - 1):
        cum_p += float(probs[level])
        cum_o += 1.0 if level == outcome else 0.0
        total += (cum_p - cum_o) ** 2
    return total / (k - 1)


# ----------------------------------------------------------------------------------------------------- /metrics
# what the bench reads before, during and after each load level (vLLM's names; a histogram's _sum and _count, a
# counter's _total as prometheus_client exposes them)
METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:prompt_tokens_total",
)
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str, names: list[str]) -> dict[str, float | None]:
    """The value of each of `names` in a Prometheus text page, summed over label sets (one per engine); None for a
    name the page does not carry (an older or other server)."""
    found: dict[str, float] = {}
    for line in (text or "").splitlines():
        m = SAMPLE.match(line.strip())  # a "# HELP" or "# TYPE" line does not match
        if not m:
            continue
        name = m.group(1)
        if name in names:
            try:
                found[name] = found.get(name, 0.0) + float(m.group(3))
            except ValueError:
                continue
    return {n: found.get(n) for n in names}
