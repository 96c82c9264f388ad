#!/usr/bin/python
"""Ansible module: draw the bench report's plots on the controller with matplotlib."""

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_plot
short_description: Draw a bench report's plots (latency vs load, one-at-a-time latency, accuracy, reliability)
description:
  - Runs on the controller (C(delegate_to) V(localhost)) and needs matplotlib there (requirements.txt pins it).
  - Writes C(<prefix>-latency-vs-concurrency.<format>) - the closed loop, 4-question p50 at each measured
    concurrency (the x axis shows exactly the measured levels), p99 only where its n allows a distribution-free 95 %
    interval (368).
  - C(<prefix>-one-at-a-time.<format>) - 2- and 4-question p50 one request at a time per instance, with the
    published configurations (O(published) C(latency), the field report's d3 27B) beside them, where they belong.
  - C(<prefix>-accuracy-vs-latency.<format>) - two panels - accuracy on the suite with its 95 % Wilson interval
    against the 4-question p50, and the published accuracies on their own questions, each panel against its own
    suite only.
  - C(<prefix>-reliability.<format>) - the confidence of the answer given, in bins, against the accuracy observed
    in each (with its interval), the diagonal being perfect calibration.
  - C(<prefix>-load.<format>) (when the report has an open-loop pass) - against the offered request rate only,
    as points (no line between levels), p50 latency from the schedule (filled; a triangle pointing up where it is a
    lower bound, requests never sent being censored) and from the send (hollow) and the goodput; a level the
    generator could not drive is a grey x with no figure.
  - Legends sit outside the axes. When the report is simulated (the lab's simulator) every plot says SIMULATED in
    its title and across its area.
options:
  report:
    description: The bench report (the d3fleet.fleet.d3_bench_report filter's output).
    type: dict
    required: true
  published:
    description: Published figures - C(source), C(latency) (items with C(config), C(q2_ms), C(q4_ms)) and
      C(accuracy) (items with C(model), C(correct), C(total), C(q4_ms)).
    type: dict
    default: {}
  dest:
    description: Directory for the plots (created when missing).
    type: path
    required: true
  format:
    description: Image format.
    type: str
    choices: [png, svg]
    default: png
  prefix:
    description: File name prefix.
    type: str
    default: bench
author: d3-fleet
requirements: [matplotlib]
"""

EXAMPLES = r"""
- name: Draw the plots
  d3fleet.fleet.bench_plot:
    report: "{{ d3_bench_report }}"
    published: "{{ d3_bench_published }}"
    dest: bench/
  delegate_to: localhost
  become: false
  run_once: true
"""

RETURN = r"""
plots:
  description: Paths of the files written.
  type: list
  elements: str
  returned: success
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import min_n, wilson

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    HAS_MPL, MPL_ERROR = True, None
except ImportError:
    HAS_MPL, MPL_ERROR = False, traceback.format_exc()

SIM_MARK = "SIMULATED (lab stand-in): not a property of D3"
NAMES = ("latency-vs-concurrency", "one-at-a-time", "accuracy-vs-latency", "reliability", "load")


def _who(inst: dict) -> str:
    return f"{inst['host']}/{inst['name']} ({inst['model']})"


def _z95_wilson(k: int, n: int) -> tuple[float, float]:
    return wilson(k, n) or (0.0, 0.0)


def _finish(fig, axes: list, title: str, report: dict, path: str) -> None:
    """Title (and the SIMULATED mark), grids, legends outside the axes on the right, saved and closed."""
    sim = report.get("simulated")
    fig.suptitle(f"{title}\n{SIM_MARK}" if sim else title, fontsize=10, color="darkred" if sim else "black")
    if sim:
        fig.text(0.5, 0.5, "SIMULATED", fontsize=54, color="red", alpha=0.12, ha="center", va="center", rotation=25)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            # outside the axes: on the right of a single plot, under each of several side by side
            where = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0)} if len(axes) == 1 else {
                "loc": "upper left", "bbox_to_anchor": (0.0, -0.3)}
            ax.legend(fontsize=7, borderaxespad=0.0, **where)
    fig.tight_layout(rect=(0, 0, 1, 0.94))  # room for the two-line title
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def _healthy(report: dict) -> list[dict]:
    return [i for i in report.get("instances") or [] if i.get("health", 200) == 200]


def latency_vs_concurrency(report: dict, published: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    levels: set[int] = set()
    for inst in _healthy(report):
        rows = sorted((t for t in inst.get("throughput") or [] if t.get("p50") is not None), key=lambda t: t["concurrency"])
        if not rows:
            continue
        xs = [t["concurrency"] for t in rows]
        levels.update(xs)
        (line,) = ax.plot(xs, [t["p50"] for t in rows], marker="o", label=f"{_who(inst)} p50")
        tail = [t for t in rows if (t.get("n") or 0) >= min_n(99) and t.get("p99") is not None]
        if tail:
            ax.plot([t["concurrency"] for t in tail], [t["p99"] for t in tail], linestyle="--", marker="x",
                    color=line.get_color(), alpha=0.6, label=f"{_who(inst)} p99 (n >= {min_n(99)})")
    if levels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.minorticks_off()
    ax.set_xlabel("concurrency (requests in flight, closed loop): the measured levels")
    ax.set_ylabel("4-question request latency (ms)")
    _finish(fig, [ax], "Latency vs concurrency per instance (4-question requests)", report, path)


def one_at_a_time(report: dict, published: dict, path: str) -> None:
    rows = [(_who(i), (i.get("latency") or {}).get("q2", {}).get("p50"), (i.get("latency") or {}).get("q4", {}).get("p50"), False)
            for i in _healthy(report)]
    src = published.get("source", "published")
    rows += [(f"{p['config']} [published: {src}]", p.get("q2_ms"), p.get("q4_ms"), True) for p in published.get("latency") or []]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.6), dpi=110)
    ys = list(range(len(rows)))
    for offset, key, label in ((-0.2, 1, "2 questions"), (0.2, 2, "4 questions")):
        vals = [r[key] or 0 for r in rows]
        bars = ax.barh([y + offset for y in ys], vals, height=0.38, label=f"{label}, p50", color=f"C{key - 1}")
        for bar, r in zip(bars, rows, strict=True):
            if r[3]:
                bar.set_hatch("//")
                bar.set_alpha(0.5)
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("latency, one request at a time (ms); hatched: published, not measured here")
    _finish(fig, [ax], "One request at a time: measured p50 and the published configurations", report, path)


def accuracy_vs_latency(report: dict, published: dict, path: str) -> None:
    fig, (ax, pub) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110, sharey=True)
    suite = report.get("suite") or {}
    for inst in _healthy(report):
        q4 = (inst.get("latency") or {}).get("q4") or {}
        score = inst.get("score") or {}
        if q4.get("p50") is None or not score.get("total"):
            continue
        acc = score["correct"] / score["total"]
        lo, hi = score.get("interval") or _z95_wilson(score["correct"], score["total"])
        ax.errorbar([q4["p50"]], [acc], yerr=[[acc - lo], [hi - acc]], fmt="o", capsize=4,
                    label=f"{_who(inst)}: {score['correct']}/{score['total']}")
    ax.set_xlabel("4-question latency, p50, one request at a time (ms)")
    ax.set_ylabel("accuracy [95 % Wilson interval]")
    ax.set_title(f"measured: suite {suite.get('name')}, {suite.get('questions')} questions", fontsize=9)
    ax.set_ylim(-0.02, 1.05)
    src = published.get("source", "published")
    for p in published.get("accuracy") or []:
        acc = p["correct"] / p["total"]
        lo, hi = _z95_wilson(p["correct"], p["total"])
        pub.errorbar([p["q4_ms"]], [acc], yerr=[[acc - lo], [hi - acc]], fmt="s", mfc="none", capsize=4,
                     label=f"{p['model']} {p['correct']}/{p['total']}")
    pub.set_xlabel("4-question latency (ms), as published")
    pub.set_title(f"published ({src}): its own questions, another suite", fontsize=9)
    _finish(fig, [ax, pub], "Accuracy vs 4-question latency, each against its own suite", report, path)


def reliability(report: dict, published: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 5), dpi=110)
    ax.plot([0, 1], [0, 1], color="black", linewidth=0.8, linestyle=":", label="perfect calibration")
    for inst in _healthy(report):
        bins = ((inst.get("score") or {}).get("reliability") or {}).get("confidence") or []
        if bins:
            ax.errorbar([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                        yerr=[[b["accuracy"] - b["interval"][0] for b in bins], [b["interval"][1] - b["accuracy"] for b in bins]],
                        fmt="o-", capsize=3, label=f"{_who(inst)} (n={sum(b['n'] for b in bins)})")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("confidence of the answer given (mean per bin of 0.2)")
    ax.set_ylabel("accuracy observed in the bin [95 %]")
    _finish(fig, [ax], "Reliability: confidence against observed accuracy", report, path)


def load(report: dict, published: dict, path: str) -> None:
    """The open loop only, against the OFFERED rate (one x quantity): p50 latency from the schedule (filled) and from
    the send (hollow), and goodput; points, not lines (two levels say nothing of what lies between them); a p50 from
    the schedule that is only a lower bound (it reaches requests never sent, censored) is a filled triangle pointing
    up; a level the generator could not drive is drawn as a grey x and labelled so, without its latency."""
    fig, (lat, good) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for n, inst in enumerate(i for i in _healthy(report) if i.get("rate")):
        colour = f"C{n}"
        rows = sorted(inst["rate"], key=lambda t: t["offered_per_s"])
        ok = [t for t in rows if t.get("driven", True) and t.get("p50") is not None]
        bad = [t for t in rows if t.get("driven") is False]
        exact = [t for t in ok if "p50" not in ((t.get("from_schedule") or {}).get("lower_bound") or [])]
        above = [t for t in ok if t not in exact]
        lat.scatter([t["offered_per_s"] for t in exact], [(t.get("from_schedule") or t)["p50"] for t in exact], marker="o",
                    color=colour, label=f"{_who(inst)} p50 from the schedule")
        if above:
            lat.scatter([t["offered_per_s"] for t in above], [t["from_schedule"]["p50"] for t in above], marker="^",
                        color=colour, label=f"{_who(inst)} p50 from the schedule, a lower bound (requests never sent or failed)")
        lat.scatter([t["offered_per_s"] for t in ok], [t["p50"] for t in ok], marker="o", facecolors="none",
                    edgecolors=colour, label=f"{_who(inst)} p50 from the send")
        good.scatter([t["offered_per_s"] for t in ok], [t.get("goodput_per_s") or 0 for t in ok], marker="o", color=colour,
                     label=f"{_who(inst)} goodput")
        if bad:
            for ax in (lat, good):
                ax.scatter([t["offered_per_s"] for t in bad], [0.0 if ax is good else 1.0 for t in bad], marker="x",
                           color="grey", label=f"{_who(inst)} not driven (the generator's limit): no figure")
    slo = (report.get("settings") or {}).get("slo_ms")
    lat.set_xlabel("offered request rate (req/s, open loop)")
    lat.set_ylabel("4-question latency p50 (ms, log)")
    lat.set_yscale("log")
    good.set_xlabel("offered request rate (req/s, open loop)")
    good.set_ylabel(f"goodput: answers within {slo} ms of the schedule per s")
    _finish(fig, [lat, good], "Open loop (Poisson arrivals): latency from the schedule and from the send", report, path)


DRAW = {"latency-vs-concurrency": latency_vs_concurrency, "one-at-a-time": one_at_a_time,
        "accuracy-vs-latency": accuracy_vs_latency, "reliability": reliability, "load": load}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "report": {"type": "dict", "required": True},
            "published": {"type": "dict", "default": {}},
            "dest": {"type": "path", "required": True},
            "format": {"type": "str", "default": "png", "choices": ["png", "svg"]},
            "prefix": {"type": "str", "default": "bench"},
        },
        supports_check_mode=True,
    )
    if not HAS_MPL:
        module.fail_json(msg=missing_required_lib("matplotlib"), exception=MPL_ERROR)
    p = module.params
    has_rate = any(i.get("rate") for i in p["report"].get("instances") or [])
    names = [n for n in NAMES if n != "load" or has_rate]
    paths = [os.path.join(p["dest"], f"{p['prefix']}-{name}.{p['format']}") for name in names]
    if module.check_mode:
        module.exit_json(changed=True, plots=paths)
    os.makedirs(p["dest"], exist_ok=True)
    for name, path in zip(names, paths, strict=True):
        DRAW[name](p["report"], p["published"], path)
    module.exit_json(changed=True, plots=paths)


if __name__ == "__main__":
    main()
