#!/usr/bin/env python3
"""bench-compare: two bench reports (playbooks/bench.yml's JSON, e.g. yesterday's nightly and today's) into one table
and one plot of the differences, with one false-alarm budget for all of them.

  tools/bench_compare.py OLD.json NEW.json [--plot diff.png] [--json diff.json] [--method holm|bh] [--alpha 0.05]
  (or: make bench-compare OLD=... NEW=...)

Per instance both reports benched (host/name), every figure that can be tested is, each with a p-value:
- accuracy, PAIRED: both runs answered the same suite, so each (case, question) is a pair; the right -> wrong and
  wrong -> right flips are listed by case and question and judged by the exact McNemar test (two-sided binomial test
  of the discordant pairs: d3_bench_stats.mcnemar_exact). With greedy answers every flip is a real change of answer;
  the test says whether the flips are beyond what chance would shuffle;
- failed requests, paired per case (one case is one request): failed or not, the newly failing and the no longer
  failing cases listed and judged by the same exact McNemar test (paired_failures): a build returning errors is
  flagged;
- calibration, paired the same way: per question the proper score (Brier for choice and noul, RPS for score) new -
  old, judged by the exact sign-flip permutation test of their mean (d3_bench_stats.sign_flip_p);
- latency (2- and 4-question, one at a time) and closed-loop throughput per concurrency, on RUN-LEVEL figures: each
  run's median latency (requests/s) is one observation, so the spread between runs is measured, not assumed; Welch's
  t test on their logarithms gives the ratio new/old of the runs' geometric means, with its 95 % interval and its
  interval at an adjusted level (adjusted_interval: the verdict's level, or Benjamini-Yekutieli's for BH's flagged),
  and the smallest ratio the test could detect with power 0.8 given the spread measured and the number of runs
  (a lower bound on the power if the measured spread were the true one: d3_bench_stats.detectable_ratio; an
  estimate, since the spread of a few runs is itself noisy: at true 2 %, k = 5, alpha 0.05 the true power at the
  printed ratio is below 0.8 in 35 % of comparisons, the statistician's third review). With one run a side there is no spread
  to measure: the figure is shown as "cannot tell noise from change" and not tested (bench with d3_bench_repeats >= 2).
  Closed-loop throughput is quantized (completions over the window: steps of 1/window): Sheppard's rounding variance
  step^2/12 is added to each side's spread, so a side whose runs all fell on one step is not taken as exactly known.
  Every run identical on one side or both with no known step (latency; a report without windows): the exact
  permutation test of the runs instead of Welch's (no interval; the line says which side is flat), "untestable"
  and not tested when it cannot reach p <= alpha.
Questions whose request failed on either side (no HTTP 200: network failure, timeout, error status) are left out
of the accuracy pairs and counted per side; a 200 reply without a usable answer is wrong and paired (it can flip).
Tests that cannot reject (no flips, every paired difference 0), and under Holm those whose smallest attainable p is
above Tarone's alpha/K (attainable_bound), are shown but left out of the family.
Every p-value of the comparison, over all instances, is one family: Holm's step-down (default; family-wise error
rate alpha) or Benjamini-Hochberg (--method bh; false discovery rate alpha) adjusts them, and a figure is CHANGED
when its adjusted p <= alpha. The output names the method, alpha and the family. Exit code 0; the flags are in the
table and the JSON."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_bench_stats as st  # noqa: E402

METHODS = {"holm": ("Holm (1979) step-down", "family-wise error rate", st.holm),
           "bh": ("Benjamini-Hochberg (1995) step-up", "false discovery rate", st.benjamini_hochberg)}
KINDS = (("choice", "choice Brier"), ("noul", "noul Brier"), ("score", "score RPS"))


def _pairs(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], dict]]:
    def rows(inst: dict[str, Any]) -> dict[tuple[str, str], dict]:
        return {(str(r["case"]), str(r["question"])): r for r in (inst.get("score") or {}).get("questions") or []}

    return rows(old), rows(new)


def _sent(row: dict[str, Any]) -> bool:
    """Whether a per-question row's request got a reply (HTTP 200) to judge: d3_bench.score_cases marks `failed` the
    rows whose request did not (network failure, timeout, error status). A 200 reply without a usable answer (null,
    a string, missing: d3_bench.judge's `given` None) is the model's answer, wrong, so it is paired and can flip.
    A report from before `failed` was recorded: `given` None stands for failed (the two cannot be told apart there);
    a row from before `given` was recorded counts as sent."""
    if "failed" in row:
        return not row["failed"]
    return "given" not in row or row["given"] is not None


def paired_accuracy(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """The flips between two runs of the same suite, per (case, question) answered in both: right -> wrong and wrong
    -> right listed as "case/question", with the exact McNemar p; None when a report carries no per-question rows.
    A question whose request failed on either side (no HTTP 200: d3_bench scores it wrong) is left out of the pairs
    and counted in `failed` [old, new], never as a flip: before the statistician's second review, identical answers
    with 3 of 10 cases timed out gave 9 right -> wrong flips, McNemar p 0.0039, CHANGED. A 200 reply without a
    usable answer is paired, wrong (`no_answer` [old, new] counts them among the pairs): after the second review's
    fix they were left out too, so a build that stops answering was never flagged (third review item 1: 12 right ->
    no answer gave 0 flips; now 12 flips, p 0.0005, CHANGED). No flip at all: the test
    cannot reject (p 1 whatever happens elsewhere), so it is `untestable` and left out of the family (compare)."""
    before, after = _pairs(old, new)
    asked = [k for k in after if k in before]
    if not asked:
        return None
    both = [k for k in asked if _sent(before[k]) and _sent(after[k])]
    worse = [f"{c}/{q}" for c, q in both if before[(c, q)]["correct"] and not after[(c, q)]["correct"]]
    better = [f"{c}/{q}" for c, q in both if not before[(c, q)]["correct"] and after[(c, q)]["correct"]]
    out = {"test": "exact McNemar", "pairs": len(both), "old": sum(bool(before[k]["correct"]) for k in both),
           "new": sum(bool(after[k]["correct"]) for k in both), "right_to_wrong": worse, "wrong_to_right": better,
           "failed": [sum(not _sent(before[k]) for k in asked), sum(not _sent(after[k]) for k in asked)],
           "no_answer": [sum(side[k].get("given", "") is None for k in both) for side in (before, after)],
           "p": st.mcnemar_exact(len(worse), len(better)), "min_p": st.mcnemar_exact(len(worse) + len(better), 0)}
    if not worse and not better:
        out["untestable"] = "no flips: the test cannot reject"
    return out


def paired_failures(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Failed requests (no HTTP 200: _sent), paired per case asked in both runs: a case is one request, so a request
    that fails fails every question of it (d3_bench marks each question of the case), and pairing per question would
    count one failure two or three times as independent pairs (the fifth review: 3 failed requests read as 9 failed
    questions, p 0.0039 instead of 0.25; a false-alarm rate of 10-18 % at alpha 0.05). The cases that newly fail
    and those that no longer fail are listed and judged by the exact McNemar test; None when a report carries no
    per-question rows. Before the fourth review failed requests were only counted, never tested: a build answering
    HTTP 500 to 6 of 10 cases showed nothing CHANGED; now 0 -> 6 failed requests gives p 2 x 2^-6 = 0.031. Nothing
    newly failing or recovered: `untestable`, left out of the family (compare)."""
    before, after = _pairs(old, new)
    asked = [k for k in after if k in before]
    if not asked:
        return None

    def failed(rows: dict[tuple[str, str], Any]) -> dict[str, bool]:
        # per case: failed when any of its asked questions carries the failed mark (all of them do when it fails)
        out: dict[str, bool] = {}
        for c, q in asked:
            out[c] = out.get(c, False) or not _sent(rows[(c, q)])
        return out

    was, now = failed(before), failed(after)
    cases = list(was)
    worse = [c for c in cases if not was[c] and now[c]]
    better = [c for c in cases if was[c] and not now[c]]
    out = {"test": "exact McNemar", "pairs": len(cases), "old": sum(was.values()), "new": sum(now.values()),
           "newly_failed": worse, "no_longer_failed": better,
           "p": st.mcnemar_exact(len(worse), len(better)), "min_p": st.mcnemar_exact(len(worse) + len(better), 0)}
    if not worse and not better:
        out["untestable"] = "no request newly failed or recovered: the test cannot reject"
    return out


def paired_calibration(old: dict[str, Any], new: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The proper score of one question type, paired per (case, question) with a score in both runs: mean old, mean
    new, the exact sign-flip p of the mean difference; None when no pair has one."""
    before, after = _pairs(old, new)
    both = [k for k in after if k in before and after[k].get("type") == kind
            and before[k].get("proper") is not None and after[k].get("proper") is not None]
    if not both:
        return None
    a, b = [before[k]["proper"] for k in both], [after[k]["proper"] for k in both]
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    out = {"test": "paired sign-flip", "pairs": len(both), "old": sum(a) / len(a), "new": sum(b) / len(b),
           **st.sign_flip_test(diffs)}
    if out["exact"]:  # the smallest p m non-zero differences can give: every sign alike, 2 of the 2^m assignments
        out["min_p"] = min(1.0, 2.0 ** (1 - sum(x != 0 for x in diffs)))
    if not any(diffs):
        out["untestable"] = "every difference 0: the test cannot reject"  # left out of the family (compare)
    return out


def run_level(old: list[float], new: list[float], step: float | None = None, alpha: float = st.ALPHA) -> dict[str, Any]:
    """Run-level figures (one per run) of old and new: {runs, values (the run figures, old and new), old, new (means
    of the runs), ratio new/old and its 95 % interval (unadjusted), p} from Welch's t test on their logarithms; with
    fewer than 2 runs a side, no test: `single`. compare() adds the interval at the verdict's adjusted level and the
    smallest detectable ratio. `step`: the figure's quantization step (closed-loop requests/s: 1/window), whose
    rounding variance (Sheppard's, on the log scale at each side's mean: `rounding`) is added to each side's spread.
    Every run identical on a side and no step: Welch has no standard error, or takes that side as exactly known
    (its false-alarm rate above alpha: third review item 2); the exact permutation test of the
    log run figures is run instead (`test` says so; no interval), kept in the family when it can reject at `alpha`
    (its smallest attainable p, 2 / C(10, 5) = 0.0079 at 5 + 5 runs, 1 / C(7, 2) = 0.048 at 2 + 5, is at most alpha),
    else `untestable` (2 + 2 runs: at least 0.33)."""
    old = [float(x) for x in old if x is not None and x > 0]
    new = [float(x) for x in new if x is not None and x > 0]
    out: dict[str, Any] = {"runs": [len(old), len(new)], "values": [old, new], "old": sum(old) / len(old) if old else None,
                           "new": sum(new) / len(new) if new else None}
    if step and old and new:
        out["rounding"] = [st.sheppard(step, out["old"]), st.sheppard(step, out["new"])]
    logs = [math.log(x) for x in old], [math.log(x) for x in new]
    test = st.welch(*logs, rounding=tuple(out.get("rounding") or (0.0, 0.0)))
    if test is None:
        return {**out, "single": True, "p": None}
    flat = [len(set(side)) == 1 for side in logs]
    if test.get("untestable") or (any(flat) and not out.get("rounding")):
        # zero spread on a side and no known step (a report without windows; latency): that side would count as
        # exactly known (third review item 2), so the exact permutation test instead
        perm = st.permutation_test(*logs)
        out.update({"single": False, "test": "exact permutation on log run figures", "ratio": math.exp(test["diff"]),
                    "p": perm["p"], "min_p": perm["min_p"]})
        if perm["min_p"] > alpha:
            out["untestable"] = (f"no spread in either side's runs, and the exact permutation test on "
                                 f"{len(old)} + {len(new)} runs cannot reach p <= {alpha:g} (at least {perm['min_p']:.3g})")
        return out
    return {**out, "single": False, "test": "Welch on log run figures", "ratio": math.exp(test["diff"]),
            "interval": [math.exp(test["interval"][0]), math.exp(test["interval"][1])], "p": test["p"]}


def adjusted_interval(d: dict[str, Any], alpha: float, family: int, detect: bool = True,
                      selected: int | None = None) -> None:
    """A run-level test's interval at an adjusted level, and the smallest ratio it could detect.
    Holm (and a figure not flagged under Benjamini-Hochberg): the interval at the marginal level the verdict used,
    1 - alpha x p / adjusted p (the verdict is CHANGED when adjusted p <= alpha, i.e. p <= alpha x p / adjusted p), so
    it excludes a ratio of 1 exactly when the figure is CHANGED: the inverted adjusted test, a display of the verdict,
    with no simultaneous-coverage claim (Holm-compatible simultaneous intervals are another construction: K.
    Strassburger and F. Bretz, Statistics in Medicine 27 (2008) 4914-4927). Benjamini-Hochberg, a flagged figure
    (`selected` = R of the family's m flagged): Benjamini and Yekutieli's false-coverage-statement-rate adjusted
    interval for the selected, at level 1 - R x alpha / m for every selected one (JASA 100 (2005) 71-81, Definition 1
    with the BH selection: the rate of non-covering intervals among the selected stays at most alpha); it excludes 1
    since BH selected p <= R x alpha / m. Before the second review the code used the verdict's level for BH too
    and called it BY's: p = (0.001, 0.002) gave 97.5 % and 95 % where BY's rule gives 95 % to both.
    `detectable`: the smallest slowdown ratio Welch's test on these runs' logarithms detects
    with power 0.8 at alpha / m (the level Holm's first step, and a lone Benjamini-Hochberg discovery, need), given
    the run-to-run spread measured on both sides (d3_bench_stats.detectable_ratio); None when there is no spread
    estimate (or `detect` false)."""
    verdict = alpha * d["p"] / d["adjusted_p"] if d["adjusted_p"] > 0 else alpha / family
    level = selected * alpha / family if selected else verdict
    logs = [[math.log(x) for x in side] for side in d["values"]]
    rounding = tuple(d.get("rounding") or (0.0, 0.0))
    test = st.welch(logs[0], logs[1], level, rounding)
    d["adjusted_level"] = 1.0 - level
    d["adjusted_interval"] = [math.exp(test["interval"][0]), math.exp(test["interval"][1])]
    d["detectable"] = (st.detectable_ratio(d["values"][0], d["values"][1], alpha / family, rounding=rounding)
                       if detect else None)


def _latency_runs(inst: dict[str, Any], label: str) -> list[float]:
    fig = (inst.get("latency") or {}).get(label) or {}
    runs = fig.get("runs")
    if runs:
        return [r["p50"] for r in runs if r.get("p50") is not None]
    return [fig["p50"]] if fig.get("p50") is not None else []  # a report from before runs: one run


def _closed_runs(inst: dict[str, Any]) -> dict[int, list[float]]:
    return {t["concurrency"]: [r["requests_per_s"] for r in t.get("runs") or [t]] for t in inst.get("throughput") or []}


def _closed_step(*insts: dict[str, Any]) -> dict[int, float]:
    """Per concurrency, the quantization step of closed-loop requests/s (completions over the window: 1/window), the
    coarser of the reports'; none for a level without a recorded window (a report from before windows)."""
    steps: dict[int, float] = {}
    for inst in insts:
        for t in inst.get("throughput") or []:
            length = (t.get("window") or {}).get("length_s")
            if length:
                steps[t["concurrency"]] = max(steps.get(t["concurrency"], 0.0), 1.0 / length)
    return steps


def attainable_bound(min_ps: list[float], alpha: float, method: str) -> tuple[float, int]:
    """(bound, K): a test is kept in the family when its smallest attainable p (`min_p`: exact discrete tests; 0 for
    Welch's) is at most bound = alpha / K. Holm: Tarone's rule (R. E. Tarone, "A modified Bonferroni method for
    discrete data", Biometrics 46 (1990) 515-522): K is the smallest k for which at most k tests have a smallest
    attainable p <= alpha / k; the others could not reject at Holm's first step, alpha / K, and in the family they
    only made every other test stricter. Before the statistician's fourth review a test stayed whenever its smallest
    p was <= alpha: 16.0 x5 -> 8.0 x5 without windows (the permutation test, smallest p 2/252 = 0.0079) beside 8
    latency figures, m = 9, adjusted 0.071. Which tests are kept depends on the smallest attainable p's only, never
    on the p's, so Holm's guarantee holds for the family kept (a test left out is never CHANGED; under Holm it could
    have been at a later step, once every smaller p was: the price of the rule). Benjamini-Hochberg: K = 1, bound
    alpha (BH's largest threshold, alpha x m / m: a test above it can never be flagged, one at or below it can); the
    selection is again by the smallest attainable p's only, so BH's false-discovery guarantee holds for the family
    kept."""
    if method == "bh" or not min_ps:
        return alpha, 1
    k = next(k for k in range(1, len(min_ps) + 1) if sum(x <= alpha / k for x in min_ps) <= k)
    return alpha / k, k


def compare(old: dict[str, Any], new: dict[str, Any], method: str = "holm", alpha: float = st.ALPHA,
            detect: bool = True) -> dict[str, Any]:
    """{method, alpha, family (every test: instance, figure, p, adjusted p, changed), rows (one per instance in both
    reports, in the new report's order)}. `detect`: compute each run-level test's detectable ratio (about 50 ms
    each; simulations of many comparisons leave it out)."""
    before = {f"{i['host']}/{i['name']}": i for i in old["instances"] if i.get("health") == 200}
    rows = []
    for inst in new["instances"]:
        key = f"{inst['host']}/{inst['name']}"
        if inst.get("health") != 200 or key not in before:
            continue
        was = before[key]
        closed_old, closed_new, step = _closed_runs(was), _closed_runs(inst), _closed_step(was, inst)
        rows.append({
            "instance": key, "model": inst["model"],
            "image": ((was.get("record") or {}).get("image_ref"), (inst.get("record") or {}).get("image_ref")),
            "accuracy": paired_accuracy(was, inst),
            "failures": paired_failures(was, inst),
            "calibration": {kind: paired_calibration(was, inst, kind) for kind, _ in KINDS},
            "latency": {q: run_level(_latency_runs(was, q), _latency_runs(inst, q), alpha=alpha) for q in ("q2", "q4")},
            "throughput": {c: run_level(closed_old[c], closed_new[c], step.get(c), alpha)
                           for c in closed_new if c in closed_old},
        })
    tests = []
    for r in rows:
        figures = [("accuracy", r["accuracy"]), ("failed requests", r["failures"]),
                   *((f"calibration {k}", r["calibration"][k]) for k, _ in KINDS),
                   *((f"latency {q}", r["latency"][q]) for q in ("q2", "q4")),
                   *((f"closed loop c={c}", d) for c, d in r["throughput"].items())]
        tests += [(r["instance"], name, d) for name, d in figures
                  if d is not None and d.get("p") is not None and not d.get("untestable")]
        for _, d in figures:  # a test that cannot reject is not in the family (Holm's m, BH's m): it stays valid
            if d is not None and d.get("untestable"):
                d["adjusted_p"], d["changed"] = None, False
    bound, k = attainable_bound([d.get("min_p", 0.0) for _, _, d in tests], alpha, method)
    for _, _, d in tests:
        if d.get("min_p", 0.0) > bound:
            d["untestable"] = (f"its smallest attainable p ({d['min_p']:.3g}) is above alpha/{k} = {bound:.3g}: it "
                               "cannot reject in this family (Tarone's rule)")
            d["adjusted_p"], d["changed"] = None, False
    tests = [t for t in tests if not t[2].get("untestable")]
    name, rate, adjust = METHODS[method]
    for (_, _, d), adj in zip(tests, adjust([d["p"] for _, _, d in tests]), strict=True):
        d["adjusted_p"], d["changed"] = adj, adj <= alpha
    flagged = sum(d["changed"] for _, _, d in tests)
    for _, _, d in tests:
        if "ratio" in d and d["test"].startswith("Welch"):
            adjusted_interval(d, alpha, len(tests), detect, flagged if method == "bh" and d["changed"] else None)
    return {"method": f"{name}, {rate} {alpha:g}", "alpha": alpha, "tests": len(tests),
            "family": [{"instance": i, "figure": n, "p": d["p"], "adjusted_p": d["adjusted_p"], "changed": d["changed"]}
                       for i, n, d in tests],
            "rows": rows}


def _p(d: dict[str, Any]) -> str:
    if d.get("untestable"):
        return f"p {d['p']:.3g}, not tested ({d['untestable']}: left out of the family)"
    return f"p {d['p']:.3g}, adjusted {d['adjusted_p']:.3g}"


def _flag(d: dict[str, Any]) -> str:
    return " CHANGED" if d["changed"] else ""


def _run_line(d: dict[str, Any], unit: str, fmt: str) -> str:
    if d["old"] is None or d["new"] is None:
        return "-"
    head = f"{fmt.format(d['old'])} -> {fmt.format(d['new'])} {unit}"
    if d["single"]:
        return (f"{head}: {d['runs'][0]} run(s) -> {d['runs'][1]}: cannot tell noise from change (not tested; "
                "bench with d3_bench_repeats >= 2)")
    if d.get("untestable"):
        return (f"{head} (x{d['ratio']:.3f}; {d['runs'][0]} + {d['runs'][1]} runs): untestable, {d['untestable']}: "
                "not tested, not CHANGED")
    if d["test"].startswith("exact permutation"):
        flat = [len(set(side)) == 1 for side in d["values"]]
        which = "on both sides" if all(flat) else "on the old side" if flat[0] else "on the new side"
        return (f"{head} (x{d['ratio']:.3f}; every run identical {which}: exact permutation test on "
                f"{d['runs'][0]} + {d['runs'][1]} runs, no interval; {_p(d)}){_flag(d)}")
    lo, hi = d["interval"]
    alo, ahi = d["adjusted_interval"]
    det = "-" if d["detectable"] is None else f"x{d['detectable']:.3f}"
    return (f"{head} (x{d['ratio']:.3f}, 95 % [{lo:.3f}, {hi:.3f}], {100 * d['adjusted_level']:.2f} % at the verdict's "
            f"level [{alo:.3f}, {ahi:.3f}]; Welch on {d['runs'][0]} + {d['runs'][1]} runs; {_p(d)}; detectable {det})"
            f"{_flag(d)}")


def table(result: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    sim = " [SIMULATED]" if old.get("simulated") or new.get("simulated") else ""
    kinds = sorted({f["figure"].split(" c=")[0] for f in result["family"]})
    lines = [f"bench-compare{sim}: {old.get('generated')} -> {new.get('generated')}",
             f"  one family of {result['tests']} tests ({', '.join(kinds) or 'none'}; over every instance below), "
             f"{result['method']}: CHANGED where the adjusted p <= {result['alpha']:g}",
             "  accuracy and calibration paired per question, failed requests per case (exact McNemar; sign-flip, exact up to 32 "
             "pairs); latency and throughput on run-level figures (each run's median, or its requests/s), ratio new/old of their "
             "geometric means",
             "  intervals: 95 % unadjusted, and adjusted: Holm, and BH's unflagged, at the level the verdict used "
             "(alpha x p / adjusted p: it excludes 1 exactly when CHANGED; no simultaneous coverage claimed), BH's "
             "flagged at Benjamini-Yekutieli's 1 - R alpha/m; tests that cannot reject (no flips, no difference, no "
             "spread; under Holm a smallest attainable p above alpha/K: Tarone's rule) are not in the family; "
             "detectable: an estimate of the smallest ratio Welch's test on these runs detects "
             f"with power 0.8 at alpha/m = {result['alpha']:g}/{max(result['tests'], 1)}, taking the run-to-run spread "
             "measured as the true one (a few runs' spread is noisy: no guarantee)"]
    for r in result["rows"]:
        lines.append(f"{r['instance']} ({r['model']}): image {r['image'][0]} -> {r['image'][1]}")
        a = r["accuracy"]
        if a is None:
            lines.append("  accuracy      - (no per-question rows: not tested)")
        else:
            miss, mute = a.get("failed") or [0, 0], a.get("no_answer") or [0, 0]
            gone = (f" ({miss[0]} old, {miss[1]} new questions of failed requests, e.g. timed out: left out, not flips)"
                    if any(miss) else "")
            gone += (f" ({mute[0]} old, {mute[1]} new replied without a usable answer: wrong, paired)"
                     if any(mute) else "")
            lines += [f"  accuracy      {a['old']}/{a['pairs']} -> {a['new']}/{a['pairs']} replied to both times{gone}: "
                      f"right->wrong {len(a['right_to_wrong'])}, wrong->right {len(a['wrong_to_right'])}; exact McNemar "
                      f"{_p(a)}{_flag(a)}",
                      f"    right->wrong: {', '.join(a['right_to_wrong']) or '-'}",
                      f"    wrong->right: {', '.join(a['wrong_to_right']) or '-'}"]
        e = r["failures"]
        if e is not None:
            lines += [f"  failed requests {e['old']}/{e['pairs']} -> {e['new']}/{e['pairs']} requests (cases) without an HTTP 200 "
                      f"reply: newly failing {len(e['newly_failed'])}, no longer failing {len(e['no_longer_failed'])}; "
                      f"exact McNemar {_p(e)}{_flag(e)}",
                      f"    newly failing: {', '.join(e['newly_failed']) or '-'}",
                      f"    no longer failing: {', '.join(e['no_longer_failed']) or '-'}"]
        for kind, label in KINDS:
            c = r["calibration"][kind]
            if c is not None:
                how = "exact" if c["exact"] else f"normal approximation, p within +-{c['max_error']:.3f}"
                lines.append(f"  calibration   {label} {c['old']:.3f} -> {c['new']:.3f} (paired, n={c['pairs']}; "
                             f"sign-flip, {how}: {_p(c)}){_flag(c)}")
        lines += [f"  {q} latency    {_run_line(r['latency'][q], 'ms (mean of the run medians)', '{:.1f}')}" for q in ("q2", "q4")]
        lines += [f"  closed loop c={c}: {_run_line(d, 'req/s (mean of the runs)', '{:.1f}')}" for c, d in r["throughput"].items()]
    return lines


def plot(result: dict[str, Any], path: str, simulated: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.4), dpi=110, sharey=True)
    ys = list(range(len(rows)))
    for y, r in zip(ys, rows, strict=True):
        a = r["accuracy"]
        if a:
            colour = "tab:red" if a["changed"] else "tab:grey"
            left.barh([y], [-len(a["right_to_wrong"])], color=colour, height=0.6)
            left.barh([y], [len(a["wrong_to_right"])], color=colour, height=0.6, alpha=0.5)
        d = r["latency"]["q4"]
        if d["old"] is None or d["new"] is None:
            continue
        if d["single"] or "adjusted_interval" not in d:  # one run, untestable, or the permutation test: no interval
            right.plot([d["new"] / d["old"]], [y], marker="o", mfc="none", color="tab:grey")
        else:
            lo, hi = d["adjusted_interval"]
            right.errorbar([d["ratio"]], [y], xerr=[[d["ratio"] - lo], [hi - d["ratio"]]], fmt="o", capsize=4,
                           color="tab:red" if d["changed"] else "tab:grey")
    left.axvline(0, color="black", linewidth=0.8)
    left.set_xlabel("answers flipped per question: right->wrong (left), wrong->right (right)")
    right.axvline(1, color="black", linewidth=0.8)
    right.set_xlabel("4-question latency, new / old geometric mean of the run medians [interval at the verdict's level] "
                     "(hollow: one run, no interval)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    left.set_yticks(ys, [r["instance"] for r in rows])
    left.invert_yaxis()
    title = f"bench-compare: red = CHANGED ({result['method']}, {result['tests']} tests)"
    fig.suptitle(title + ("\nSIMULATED (lab stand-in): not a property of D3" if simulated else ""), fontsize=10,
                 color="darkred" if simulated else "black")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--plot", help="write the plot of the differences here (png or svg)")
    ap.add_argument("--json", help="write the comparison here as JSON")
    ap.add_argument("--method", choices=sorted(METHODS), default="holm", help="multiple-comparison adjustment")
    ap.add_argument("--alpha", type=float, default=st.ALPHA, help="the false-alarm budget of the whole family")
    args = ap.parse_args(argv)
    if not 0.0 < args.alpha < 1.0:
        ap.error(f"--alpha must be between 0 and 1, not {args.alpha:g}")
    old, new = json.loads(args.old.read_text()), json.loads(args.new.read_text())
    result = compare(old, new, args.method, args.alpha)
    print("\n".join(table(result, old, new)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot, bool(old.get("simulated") or new.get("simulated")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
