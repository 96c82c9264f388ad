#!/usr/bin/env python3
"""bench-compare: two bench reports (playbooks/bench.yml's JSON, e.g. yesterday's nightly and today's) into one table
and one plot of the differences, each difference flagged only when it is larger than its interval.

  tools/bench_compare.py OLD.json NEW.json [--plot diff.png]        (or: make bench-compare OLD=... NEW=...)

Per instance present in both (host/name): accuracy, its difference with Newcombe's hybrid score interval (R. G.
Newcombe, "Interval estimation for the difference between independent proportions", Statistics in Medicine 17
(1998) 873-890, method 10: from the two 95 % Wilson intervals), flagged when the interval excludes 0; the 2- and
4-question latency (one at a time): the Hodges-Lehmann shift of the two runs' samples with its distribution-free
95 % interval (Moses, from the exact Mann-Whitney distribution; at least 4 samples a side), flagged when it excludes
0; the three calibration scores and the closed-loop requests/s per
concurrency, shown without a flag (the report carries no interval for them). Exit code 0; the flags are in the
table (`CHANGED`)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

Z95 = 1.959963984540054


def wilson(k: int, n: int) -> tuple[float, float]:
    p, d = k / n, 1 + Z95 * Z95 / n
    c = (p + Z95 * Z95 / (2 * n)) / d
    h = Z95 / d * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n))
    return max(0.0, c - h), min(1.0, c + h)


def accuracy_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """new - old accuracy with Newcombe's hybrid score 95 % interval; changed when it excludes 0."""
    p1, p2 = a["correct"] / a["total"], b["correct"] / b["total"]
    (l1, u1), (l2, u2) = wilson(a["correct"], a["total"]), wilson(b["correct"], b["total"])
    d = p2 - p1
    low, high = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return {"old": p1, "new": p2, "diff": d, "interval": [low, high], "changed": not low <= 0.0 <= high}


def u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m + n, m) orderings of two samples give each Mann-Whitney U (0..m*n) when nothing changed
    (Mann and Whitney 1947): f(m, n, u) = f(m - 1, n, u - n) + f(m, n - 1, u)."""
    table = {(0, j): [1] for j in range(n + 1)} | {(i, 0): [1] for i in range(m + 1)}
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            a, b = table[(i - 1, j)], table[(i, j - 1)]
            table[(i, j)] = [(a[u - j] if 0 <= u - j < len(a) else 0) + (b[u] if u < len(b) else 0) for u in range(i * j + 1)]
    return table[(m, n)]


def shift_interval(old: list[float], new: list[float], alpha: float = 0.05) -> tuple[float, list[float] | None, float]:
    """(Hodges-Lehmann shift new - old, its distribution-free 1 - alpha interval or None when the samples are too few
    for one, the exact two-sided Mann-Whitney p): the interval runs from the k-th smallest to the k-th largest of the
    m x n pairwise differences, k the largest with P(U < k) <= alpha / 2 (Moses; Hollander and Wolfe, Nonparametric
    Statistical Methods, 4.3). It excludes 0 exactly when the test rejects at alpha."""
    m, n = len(old), len(new)
    diffs = sorted(y - x for y in new for x in old)
    counts = u_counts(m, n)
    total = sum(counts)
    cdf, k = 0.0, 0
    for u, c in enumerate(counts):
        cdf += c / total
        if cdf > alpha / 2:
            k = u
            break
    below = sum(1 for d in diffs if d < 0) + 0.5 * sum(1 for d in diffs if d == 0)
    u_min = min(below, m * n - below)
    p = min(1.0, 2 * sum(c for u, c in enumerate(counts) if u <= u_min) / total)
    return statistics.median(diffs), ([diffs[k - 1], diffs[-k]] if k >= 1 else None), p


def latency_diff(a: dict[str, Any], b: dict[str, Any], alpha: float = 0.05) -> dict[str, Any] | None:
    """new - old latency (ms) from the two runs' samples: the Hodges-Lehmann shift with its 95 % interval; changed
    when the interval excludes 0 (never with fewer than 4 samples a side: no interval)."""
    if not a.get("samples_ms") or not b.get("samples_ms"):
        return None
    shift, interval, p = shift_interval(a["samples_ms"], b["samples_ms"], alpha)
    return {"old": a["p50"], "new": b["p50"], "diff": shift, "interval": interval, "p": round(p, 4),
            "changed": interval is not None and not interval[0] <= 0.0 <= interval[1], "n": [a["n"], b["n"]]}


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per instance in both reports (host/name), in the new report's order."""
    before = {f"{i['host']}/{i['name']}": i for i in old["instances"] if i.get("health") == 200}
    rows = []
    for inst in new["instances"]:
        key = f"{inst['host']}/{inst['name']}"
        if inst.get("health") != 200 or key not in before:
            continue
        was = before[key]
        cal = {k: ((was["score"].get("calibration") or {}).get(k, {}).get("value"),
                   (inst["score"].get("calibration") or {}).get(k, {}).get("value")) for k in ("choice", "noul", "score")}
        closed = {t["concurrency"]: t["requests_per_s"] for t in was.get("throughput") or []}
        rows.append({
            "instance": key, "model": inst["model"],
            "image": ((was.get("record") or {}).get("image_ref"), (inst.get("record") or {}).get("image_ref")),
            "accuracy": accuracy_diff(was["score"], inst["score"]),
            "latency": {q: latency_diff(was["latency"].get(q) or {}, inst["latency"].get(q) or {}) for q in ("q2", "q4")},
            "calibration": cal,
            "throughput": {t["concurrency"]: (closed.get(t["concurrency"]), t["requests_per_s"])
                           for t in inst.get("throughput") or [] if t["concurrency"] in closed},
        })
    return rows


def _flag(d: dict[str, Any] | None, fmt: str) -> str:
    if not d:
        return "-"
    if d["interval"] is None:
        return f"{fmt.format(d['old'])} -> {fmt.format(d['new'])} ({d['diff']:+.3g}; too few samples for an interval)"
    lo, hi = d["interval"]
    return f"{fmt.format(d['old'])} -> {fmt.format(d['new'])} ({d['diff']:+.3g} [{lo:+.3g}, {hi:+.3g}]){' CHANGED' if d['changed'] else ''}"


def table(rows: list[dict[str, Any]], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    sim = " [SIMULATED]" if old.get("simulated") or new.get("simulated") else ""
    lines = [f"bench-compare{sim}: {old.get('generated')} -> {new.get('generated')} (new - old [95 % interval]; CHANGED: "
             "the interval excludes 0)"]
    for r in rows:
        lines += [f"{r['instance']} ({r['model']}): image {r['image'][0]} -> {r['image'][1]}",
                  f"  accuracy      {_flag(r['accuracy'], '{:.3f}')}",
                  *(f"  {q} p50 ms     {_flag(r['latency'][q], '{:.0f}')}" for q in ("q2", "q4")),
                  "  calibration   " + "; ".join(f"{k} {'-' if a is None else f'{a:.3f}'} -> {'-' if b is None else f'{b:.3f}'}"
                                                 for k, (a, b) in r["calibration"].items()) + " (no interval: not flagged)",
                  *(f"  closed loop c={c}: {a:.1f} -> {b:.1f} req/s (not flagged)" for c, (a, b) in r["throughput"].items())]
    return lines


def plot(rows: list[dict[str, Any]], path: str, simulated: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.6 * len(rows) + 2.2), dpi=110, sharey=True)
    ys = list(range(len(rows)))
    for ax, what, label in ((left, "accuracy", "accuracy, new - old"), (right, "q4", "4-question p50, new - old (ms)")):
        for y, r in zip(ys, rows, strict=True):
            d = r["accuracy"] if what == "accuracy" else r["latency"]["q4"]
            if not d or d["interval"] is None:
                continue
            lo, hi = d["interval"]
            colour = "tab:red" if d["changed"] else "tab:grey"
            ax.errorbar([d["diff"]], [y], xerr=[[d["diff"] - lo], [hi - d["diff"]]], fmt="o", color=colour, capsize=4)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
    left.set_yticks(ys, [r["instance"] for r in rows])
    left.invert_yaxis()
    title = "bench-compare: differences with their 95 % intervals (red: interval excludes 0, CHANGED)"
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
    args = ap.parse_args(argv)
    old, new = json.loads(args.old.read_text()), json.loads(args.new.read_text())
    rows = compare(old, new)
    print("\n".join(table(rows, old, new)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot, bool(old.get("simulated") or new.get("simulated")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
