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


ALPHA = 0.05  # every interval and test of the bench: 95 %, two-sided


def _binom_cdfs(n: int, p: float) -> list[float]:
    """[P(B <= 0), ..., P(B <= n)] for B ~ Binomial(n, p), each term from its logarithm (no overflow at large n)."""
    out, total = [], 0.0
    for i in range(n + 1):
        if p in (0.0, 1.0):
            term = 1.0 if i == (0 if p == 0.0 else n) else 0.0
        else:
            term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                            + i * math.log(p) + (n - i) * math.log1p(-p))
        total += term
        out.append(total)
    out[-1] = 1.0  # rounding: the whole distribution sums to 1
    return out


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(B <= k) for B ~ Binomial(n, p) (0 for k < 0, 1 for k >= n)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return _binom_cdfs(n, p)[k]


def order_ranks(q: float, n: int, alpha: float = ALPHA) -> tuple[int, int] | None:
    """The 1-based ranks (l, u) of the distribution-free, equal-tailed 1 - alpha interval [x_(l), x_(u)] of the q-th
    percentile of n samples (W. J. Conover, Practical Nonparametric Statistics, 3rd ed. 1999, section 3.2; the same
    ranks as scipy.stats.quantile_test's confidence_interval): B ~ Binomial(n, q/100) counts the samples below the
    percentile, l is the largest rank with P(B <= l - 1) <= alpha/2, u the smallest with P(B >= u) <= alpha/2.
    None when n is too small for either end to exist inside the sample: at 95 % p50 needs n >= 6, p95 72, p99 368."""
    if not 0.0 < q < 100.0:
        raise ValueError(f"percentile {q} is not within 0-100 (exclusive)")
    if n < 1:
        return None
    cdf = _binom_cdfs(n, q / 100.0)
    below = [0.0, *cdf]  # below[r] = P(B <= r - 1)
    if below[1] > alpha / 2 or 1.0 - below[n] > alpha / 2:
        return None
    low = max(r for r in range(1, n + 1) if below[r] <= alpha / 2)
    high = min(r for r in range(1, n + 1) if 1.0 - below[r] <= alpha / 2)
    return low, high


def min_n(q: float, alpha: float = ALPHA) -> int:
    """The fewest samples for which the q-th percentile has a distribution-free 1 - alpha interval inside the sample
    (order_ranks): both q^n and (1 - q)^n at most alpha/2. At 95 %: p50 6, p95 72, p99 368. With fewer, a p99 is
    the largest samples interpolated and nothing bounds it from above: the bench prints "n too small" instead."""
    if not 0.0 < q < 100.0:
        raise ValueError(f"percentile {q} is not within 0-100 (exclusive)")
    p = max(q, 100.0 - q) / 100.0
    return math.ceil(math.log(alpha / 2) / math.log(p) - 1e-9)


def percentile_interval(values: list[float], q: float, alpha: float = ALPHA) -> list[float] | None:
    """[x_(l), x_(u)], the distribution-free 1 - alpha interval of the q-th percentile (order_ranks); None when n is
    too small."""
    ranks = order_ranks(q, len(values), alpha)
    if ranks is None:
        return None
    ordered = sorted(values)
    return [ordered[ranks[0] - 1], ordered[ranks[1] - 1]]


UNBOUNDED = 1e300  # a censored latency's stand-in above any bound (finite: 0 x it is 0 in an interpolation)


def summary(values: list[float], digits: int = 1, censored: list[float] | None = None) -> dict[str, Any]:
    """n, mean, min, p50, p95, p99, max of latencies in ms (None when there are none), rounded to `digits`;
    `interval`: per percentile its distribution-free 95 % interval (order statistics) or None, and `unsupported`: the
    percentiles n is too small for (min_n: p50 6, p95 72, p99 368), e.g. ["p95", "p99"] for n = 20.

    `censored` (given only for the open loop's latency from the schedule): the lower bounds of latencies never
    observed - a request the generator never sent waited at least from its intended time to the window's end.
    They are part of the sample (n counts them, as `censored`); each figure is computed with every censored latency
    at its lower bound, and a figure that would change if they were larger (a percentile whose interpolation reaches
    a censored latency, the mean, the max) is a lower bound, listed in `lower_bound` (the table prints ">= X"). An
    interval's lower end is then a lower bound too, and its upper end null when it is a censored latency (unbounded)."""

    def rnd(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    if censored is None:
        n = len(values)
        intervals = {f"p{q}": percentile_interval(values, q) for q in PERCENTILES}
        return {
            "n": n,
            "mean": rnd(sum(values) / n) if n else None,
            "min": rnd(min(values)) if n else None,
            **{f"p{q}": rnd(percentile(values, q)) for q in PERCENTILES},
            "max": rnd(max(values)) if n else None,
            "interval": {k: None if v is None else [rnd(v[0]), rnd(v[1])] for k, v in intervals.items()},
            "unsupported": [k for k, v in intervals.items() if v is None],
        }
    low = [float(v) for v in values] + [float(c) for c in censored]  # every censored latency at its lower bound
    high = [float(v) for v in values] + [UNBOUNDED] * len(censored)  # ... and beyond any bound
    out = summary(low, digits)
    out["censored"] = len(censored)
    changes = {"min": min(low, default=None) != min(high, default=None), "mean": bool(censored), "max": bool(censored),
               **{f"p{q}": percentile(low, q) != percentile(high, q) for q in PERCENTILES}}
    out["lower_bound"] = [k for k in ("mean", "min", *(f"p{q}" for q in PERCENTILES), "max") if changes[k]]
    for key in out["interval"]:
        if out["interval"][key] is not None:
            top = percentile_interval(high, float(key[1:]))[1]
            out["interval"][key][1] = None if top >= UNBOUNDED else rnd(top)
    return out


# ------------------------------------------------------------------------------------------- comparing two runs
def mcnemar_exact(right_to_wrong: int, wrong_to_right: int) -> float:
    """The exact (conditional) McNemar test of paired right/wrong answers: two-sided binomial test of the discordant
    pairs, 2 P(B <= min(b, c)) for B ~ Binomial(b + c, 1/2), capped at 1 (1 when there is no flip). Seven right
    answers turned wrong and none back: 2 / 2^7 = 0.016 (issue 34); b = 1, c = 7: 0.070 (Fagerland, Lydersen and
    Laake, BMC Medical Research Methodology 13 (2013) 91, table 2, the exact conditional test)."""
    b, c = int(right_to_wrong), int(wrong_to_right)
    if b < 0 or c < 0:
        raise ValueError(f"flip counts must be >= 0, not {b} and {c}")
    return min(1.0, 2.0 * binom_cdf(min(b, c), b + c, 0.5))  # no flip: binom_cdf(0, 0) = 1, p = 1


BERRY_ESSEEN_C = 0.56  # Shevtsova (2010): the Berry-Esseen constant for independent, not identically distributed terms


def _all_sums(values: list[float]) -> list[float]:
    """The 2^m sums of +-values (every sign assignment)."""
    sums = [0.0]
    for v in values:
        sums = [s + v for s in sums] + [s - v for s in sums]
    return sums


def sign_flip_test(diffs: list[float], exact_up_to: int = 32) -> dict[str, Any]:
    """Two-sided paired permutation test (R. A. Fisher's sign-flip test, The Design of Experiments 1935, 21) of the
    mean of paired differences: {p, exact, max_error}. p is the share of the 2^m sign assignments of the m non-zero
    differences whose |sum| is at least the observed one. Up to `exact_up_to` (32) non-zero pairs it is counted
    exactly, by meeting in the middle (the 2^(m/2) sums of each half, one half sorted, each sum of the other half
    looked up by bisection: 2 x 65,536 sums at m = 32). Beyond it, the normal approximation of the sign-flip
    distribution (mean 0, variance sum(d^2)), and `max_error` bounds its error: twice the Berry-Esseen bound
    C x sum|d|^3 / (sum d^2)^(3/2), C = 0.56 (I. G. Shevtsova, "An improvement of convergence rate estimates in the
    Lyapunov theorem", Doklady Mathematics 82 (2010) 862-864), capped at 1. With equal |d| the test is the exact
    two-sided sign (binomial) test. p is 1 when every difference is 0."""
    import bisect

    nz = [float(d) for d in diffs if d != 0]
    if not nz:
        return {"p": 1.0, "exact": True, "max_error": 0.0}
    total = sum(nz)
    observed = abs(total) - 1e-9 * sum(abs(d) for d in nz)  # float noise: a tie counts as at least as extreme
    if observed <= 0.0:
        return {"p": 1.0, "exact": True, "max_error": 0.0}  # a sum of 0: every assignment is at least as far from 0
    if len(nz) <= exact_up_to:
        half = len(nz) // 2
        left, right = _all_sums(nz[:half]), sorted(_all_sums(nz[half:]))
        hits = 0
        for a in left:  # a + b >= observed, or a + b <= -observed (observed > 0: never both)
            hits += len(right) - bisect.bisect_left(right, observed - a) + bisect.bisect_right(right, -observed - a)
        return {"p": hits / (len(left) * len(right)), "exact": True, "max_error": 0.0}
    var = sum(d * d for d in nz)
    bound = BERRY_ESSEEN_C * sum(abs(d) ** 3 for d in nz) / var ** 1.5
    return {"p": math.erfc(abs(total) / math.sqrt(var) / math.sqrt(2.0)), "exact": False,
            "max_error": min(1.0, 2.0 * bound)}


def sign_flip_p(diffs: list[float], exact_up_to: int = 32) -> float:
    """sign_flip_test's p-value."""
    return sign_flip_test(diffs, exact_up_to)["p"]


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Numerical Recipes, 3rd ed., 6.4, Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail P(|T| >= |t|) of Student's t with df (not necessarily whole) degrees of freedom."""
    return _ibeta(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with df degrees of freedom: Newton's method on the cumulative
    distribution from t = 0. For t >= 0 that distribution is concave (its density falls), so every Newton step lands
    below the quantile and the iteration climbs to it without overshooting."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"quantile {p} is not within (0.5, 1)")
    want = 2.0 * (1.0 - p)  # the two-sided tail at the quantile
    log_c = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    t = 0.0
    for _ in range(200):
        pdf = math.exp(log_c - (df + 1.0) / 2.0 * math.log1p(t * t / df))
        step = (t_sf2(t, df) - want) / (2.0 * pdf)
        t += step
        if step < 1e-12 * max(1.0, t):
            break
    return t


def _variances(old: list[float], new: list[float], rounding: tuple[float, float]) -> tuple[float, float]:
    """The squared standard errors of the two means: (sample variance + the side's rounding variance) / k."""
    out = []
    for xs, extra in zip((old, new), rounding, strict=True):
        m = sum(xs) / len(xs)
        out.append((sum((x - m) ** 2 for x in xs) / (len(xs) - 1) + extra) / len(xs))
    return out[0], out[1]


def sheppard(step: float, level: float) -> float:
    """The rounding variance of a figure quantized in steps of `step` (e.g. closed-loop requests/s, completions over
    the window: steps of 1/window), on the logarithmic scale at the figure's level `level` (delta method: the step
    there is about step / level): (step / level)^2 / 12, W. F. Sheppard's correction for grouping (Proc. London Math.
    Soc. 29 (1898) 353-380), the variance of a uniform rounding error over one step. Added to each side's sample
    variance (welch's `rounding`), it keeps a side whose runs all fell on one step from counting as exactly known."""
    return (step / level) ** 2 / 12.0 if step > 0 and level > 0 else 0.0


def welch(old: list[float], new: list[float], alpha: float = ALPHA,
          rounding: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any] | None:
    """Welch's (1947) t test of mean(new) - mean(old) with the Welch-Satterthwaite degrees of freedom: {diff,
    interval (1 - alpha, unadjusted), p (two-sided), df}; None with fewer than 2 values a side (no spread to measure).
    `rounding`: each side's per-value rounding variance (sheppard), added to its sample variance: a quantized figure
    (closed-loop throughput, steps of 1/window) can show no spread in a few runs while it has some; treated as
    exactly known (the standard error of that side 0, Welch's df that of the other side alone) the test's false-alarm
    rate exceeded alpha (the statistician's third review: 2 runs at 16.0 against 5 at 16.0 or 15.875, the worst
    null rate 0.078 at alpha 0.05; with the rounding variance at most alpha at every level share, exactly computed:
    0 at 2 + 5 runs, 0.047 at 5 + 3, 0.022 at 5 + 5: tests/test_bench_review3.py).
    Two runs with no spread at all and no rounding variance: the test cannot say anything (the standard error is 0, any
    difference would be "infinitely" significant; the statistician's second review saw a 1 % latency change give p 0,
    CHANGED): p None and `untestable` says why (bench-compare falls back to permutation_test)."""
    if len(old) < 2 or len(new) < 2:
        return None
    m1, m2 = sum(old) / len(old), sum(new) / len(new)
    v1, v2 = _variances(old, new, rounding)
    diff = m2 - m1
    if v1 + v2 == 0.0:
        return {"diff": diff, "interval": None, "p": None, "df": None,
                "untestable": "no spread in either side's runs: no standard error, nothing to test against"}
    se = math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1 * v1 / (len(old) - 1) + v2 * v2 / (len(new) - 1))
    half = t_quantile(1.0 - alpha / 2.0, df) * se
    return {"diff": diff, "interval": [diff - half, diff + half], "p": min(1.0, t_sf2(diff / se, df)), "df": df}


def _phi(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def t_power(shift: float, df: float, alpha: float, critical_df: float | None = None) -> float:
    """The power of the two-sided level-alpha t test with df degrees of freedom against a true shift of `shift`
    standard errors: P(|T'| > t_(1-alpha/2)) for T' = (Z + shift) / sqrt(V / df), V ~ chi-square(df) (the noncentral
    t), integrated over the chi distribution of sqrt(V) by Simpson's rule (400 intervals on [0, sqrt(df) + 12]).
    `critical_df` (default df): the degrees of freedom of the critical value t_(1-alpha/2), when the test compares
    its statistic with a quantile at other df than the statistic's (Welch's: detectable_ratio)."""
    c = t_quantile(1.0 - alpha / 2.0, df if critical_df is None else critical_df)
    top, steps = math.sqrt(df) + 12.0, 400
    h = top / steps
    log_norm = (df / 2.0 - 1.0) * math.log(2.0) + math.lgamma(df / 2.0)
    total = 0.0
    for i in range(steps + 1):
        x = i * h
        if x == 0.0:
            continue  # the chi density is 0 there for df > 1 (and the integrand bounded for df = 1: weight negligible)
        dens = math.exp((df - 1.0) * math.log(x) - x * x / 2.0 - log_norm)
        edge = c * x / math.sqrt(df)
        weight = 1 if i == steps else 4 if i % 2 else 2
        total += weight * dens * (_phi(shift - edge) + _phi(-edge - shift))
    return total * h / 3.0


def permutation_test(old: list[float], new: list[float]) -> dict[str, Any]:
    """The exact two-sample permutation test (Fisher 1935; Pitman 1937) of mean(new) - mean(old): every split of the
    pooled values into k_old and k_new counted; {p: the share of splits whose |difference of means| is at least the
    observed one, min_p: the smallest p any data of these sizes can give (1 / C(k_old + k_new, k_old), twice that at
    equal sizes)}. Exact and distribution-free under exchangeable runs; bench-compare's fallback when Welch's test
    has no standard error (every run identical on both sides): 16.0 x5 -> 8.0 x5 gives p 2/252 = 0.0079. Enumerates
    the C(n, k) splits: meant for a few runs a side (at most C(20, 10) = 184756)."""
    import itertools

    pooled, k = [*old, *new], len(old)
    total = sum(pooled)
    n = len(pooled)
    observed = abs((total - sum(old)) / len(new) - sum(old) / k)
    tol = 1e-12 * max(1.0, abs(observed))
    hits = count = 0
    for idx in itertools.combinations(range(n), k):
        a = sum(pooled[i] for i in idx)
        count += 1
        hits += abs((total - a) / (n - k) - a / k) >= observed - tol
    least = (2 if len(old) == len(new) else 1) / math.comb(n, k)
    return {"p": min(1.0, hits / count), "min_p": least}


def detectable_ratio(old: list[float], new: list[float], alpha: float = ALPHA, power: float = 0.8,
                     rounding: tuple[float, float] = (0.0, 0.0)) -> float | None:
    """The smallest ratio new/old of run figures that Welch's test on their logarithms (as bench-compare runs it)
    detects with probability `power` at level `alpha`, given the run-to-run spread measured in `old` and `new`
    (their logarithms' standard deviations) and their numbers of runs: exp(shift x SE), SE = sqrt(s_old^2/k_old +
    s_new^2/k_new), the shift (in standard errors) where the noncentral t's power (t_power) reaches `power`: the
    statistic's noncentral t at the Welch-Satterthwaite df of the measured variances, but compared with the critical
    value at Welch's lower-bound df min(k_old, k_new) - 1 (the df Welch's test uses is random and lies between that
    bound and k_old + k_new - 2: B. L. Welch, Biometrika 34 (1947) 28-35). The largest critical value Welch's test
    can use makes the power a lower bound. Before the statistician's second review both were at the measured df
    (2k - 2 at equal spreads: the pooled t test's power), and the ratio printed was detected with power 0.69, not
    0.8, at k = 5 and alpha 0.05/40 (0.48 at k = 3; 0.47 at k = 2, alpha 0.05). tests/test_bench_review2.py
    simulates Welch's power at the printed ratio: >= 0.8. None with fewer than 2 positive figures a side, and when
    neither side varies (zero spread: Welch's test cannot be run, see welch). A slowdown of this ratio or more is
    flagged with that power; a speed-up of its inverse the same."""
    a = [math.log(x) for x in old if x is not None and x > 0]
    b = [math.log(x) for x in new if x is not None and x > 0]
    if len(a) < 2 or len(b) < 2:
        return None
    v1, v2 = _variances(a, b, rounding)
    if v1 + v2 == 0.0:
        return None
    df = (v1 + v2) ** 2 / (v1 * v1 / (len(a) - 1) + v2 * v2 / (len(b) - 1))
    lowest = min(len(a), len(b)) - 1.0
    return math.exp(detectable_shift(df, alpha, power, critical_df=lowest) * math.sqrt(v1 + v2))


def detectable_shift(df: float, alpha: float = ALPHA, power: float = 0.8, critical_df: float | None = None) -> float:
    """The true shift, in standard errors, that the two-sided level-alpha t test with df degrees of freedom detects
    with probability `power` (0.5 < power < 1): t_power solved by bisection (40 halvings). Two samples of n, sd 1:
    shift x sqrt(2/n) is the detectable difference, Cohen's (1988) table 2.4.1 (d = 0.8 needs n = 26, 0.5 n = 64)."""
    if not 0.5 < power < 1.0:
        raise ValueError(f"power {power} is not within (0.5, 1)")
    crit = df if critical_df is None else critical_df
    low, high = 0.0, t_quantile(1.0 - alpha / 2.0, crit) + t_quantile(power, df) + 10.0
    for _ in range(40):  # power rises with the shift
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_power(mid, df, alpha, critical_df) < power else (low, mid)
    return high


def run_interval(values: list[float], alpha: float = ALPHA) -> list[float] | None:
    """The 1 - alpha Student t interval of the mean of run-level figures (one per run: its median, or its p95...):
    mean +- t_(1-alpha/2, k-1) x s / sqrt(k). The run is the unit: samples inside one run are autocorrelated
    (an interval from their order statistics is too narrow), runs are close to independent. None with fewer than 2
    runs."""
    xs = [float(x) for x in values if x is not None]
    k = len(xs)
    if k < 2:
        return None
    mean = sum(xs) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (k - 1))
    half = t_quantile(1.0 - alpha / 2.0, k - 1) * sd / math.sqrt(k) if sd else 0.0
    return [mean - half, mean + half]


def holm(pvalues: list[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values ("A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 6, 65-70): sorted ascending, the i-th (0-based) times m - i, made monotone
    and capped at 1. Rejecting where the adjusted p <= alpha keeps the family-wise error rate at alpha under any
    dependence. (0.01, 0.04, 0.03, 0.005) -> (0.03, 0.06, 0.06, 0.02)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = {}, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return [out[i] for i in range(m)]


def benjamini_hochberg(pvalues: list[float]) -> list[float]:
    """Benjamini and Hochberg's (1995) step-up adjusted p-values (JRSS B 57, 289-300; scipy.stats.
    false_discovery_control): sorted ascending, the i-th (1-based) times m / i, made monotone from the top, capped at
    1. Rejecting where it is <= alpha keeps the false discovery rate at alpha for independent tests.
    (0.01, 0.04, 0.03, 0.005) -> (0.02, 0.04, 0.04, 0.02)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i], reverse=True)
    out, running = {}, 1.0
    for k, i in enumerate(order):
        running = min(running, pvalues[i] * m / (m - k))  # starts at 1: never above it
        out[i] = running
    return [out[i] for i in range(m)]


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
