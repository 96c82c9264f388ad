#!/usr/bin/python
"""Ansible module: draw the bench report's plots on the controller with matplotlib."""

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_plot
short_description: Draw a bench report's plots (latency vs concurrency, accuracy vs 4-question latency)
description:
  - Runs on the controller (C(delegate_to) V(localhost)) and needs matplotlib there (requirements.txt pins it).
  - Writes C(<prefix>-latency-vs-concurrency.<format>) - the p50 latency of 4-question requests at each concurrency
    level of the throughput pass, one line per instance (p99 dashed), and C(<prefix>-accuracy-vs-latency.<format>) -
    accuracy on the suite against the 4-question p50 latency (one request at a time), one point per instance.
  - The published figures (O(published), the field report's) are drawn beside the measured ones as hollow stars,
    labelled "published".
  - When the report is simulated (the lab's simulator) every plot says SIMULATED in its title and across its
    area.
options:
  report:
    description: The bench report (the d3fleet.fleet.d3_bench_report filter's output).
    type: dict
    required: true
  published:
    description: Published figures - C(source), C(latency) (items with C(config), C(q4_ms)) and C(accuracy) (items
      with C(model), C(correct), C(total), C(q4_ms)).
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

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    HAS_MPL, MPL_ERROR = True, None
except ImportError:
    HAS_MPL, MPL_ERROR = False, traceback.format_exc()

SIM_MARK = "SIMULATED (lab stand-in): not a property of D3"
MARKERS = ("*", "P", "X", "D", "^", "v", "s", "o")


def _who(inst: dict) -> str:
    return f"{inst['host']}/{inst['name']} ({inst['model']})"


def _decorate(fig, ax, title: str, report: dict) -> None:
    if report.get("simulated"):
        ax.set_title(f"{title}\n{SIM_MARK}", fontsize=10, color="darkred")
        fig.text(0.5, 0.5, "SIMULATED", fontsize=54, color="red", alpha=0.12, ha="center", va="center", rotation=25)
    else:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()


def latency_vs_concurrency(report: dict, published: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for inst in report.get("instances") or []:
        rows = sorted((t for t in inst.get("throughput") or [] if t.get("p50") is not None), key=lambda t: t["concurrency"])
        if not rows:
            continue
        xs = [t["concurrency"] for t in rows]
        (line,) = ax.plot(xs, [t["p50"] for t in rows], marker="o", label=f"{_who(inst)} p50")
        ax.plot(xs, [t["p99"] for t in rows], linestyle="--", color=line.get_color(), alpha=0.6, label=f"{_who(inst)} p99")
    src = published.get("source", "published")
    points = [(p["config"], p["q4_ms"]) for p in published.get("latency") or [] if p.get("q4_ms")]
    points += [(p["model"], p["q4_ms"]) for p in published.get("accuracy") or [] if p.get("q4_ms")]
    for n, (what, ms) in enumerate(points):
        ax.scatter([1], [ms], marker=MARKERS[n % len(MARKERS)], s=120, facecolors="none", edgecolors="black",
                   zorder=5, label=f"published ({src}), one at a time: {what}, {ms} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("4-question request latency (ms)")
    _decorate(fig, ax, "Latency vs concurrency per model (4-question requests)", report)
    fig.savefig(path)
    plt.close(fig)


def accuracy_vs_latency(report: dict, published: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for inst in report.get("instances") or []:
        q4 = (inst.get("latency") or {}).get("q4") or {}
        acc = (inst.get("score") or {}).get("accuracy")
        if q4.get("p50") is None or acc is None:
            continue
        ax.scatter([q4["p50"]], [acc], s=50, label=f"{_who(inst)}: {inst['score']['correct']}/{inst['score']['total']}")
    src = published.get("source", "published")
    for n, p in enumerate(published.get("accuracy") or []):
        ax.scatter([p["q4_ms"]], [p["correct"] / p["total"]], marker=MARKERS[n % len(MARKERS)], s=120, facecolors="none",
                   edgecolors="black", zorder=5,
                   label=f"published ({src}, its own {p['total']} questions): {p['model']} {p['correct']}/{p['total']}")
    ax.set_xlabel("4-question latency, p50, one request at a time (ms)")
    ax.set_ylabel("accuracy on the suite")
    ax.set_ylim(-0.02, 1.05)
    suite = report.get("suite") or {}
    _decorate(fig, ax, f"Accuracy vs 4-question latency (suite {suite.get('name')}, {suite.get('questions')} questions)", report)
    fig.savefig(path)
    plt.close(fig)


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
    paths = [os.path.join(p["dest"], f"{p['prefix']}-{name}.{p['format']}") for name in ("latency-vs-concurrency", "accuracy-vs-latency")]
    if module.check_mode:
        module.exit_json(changed=True, plots=paths)
    os.makedirs(p["dest"], exist_ok=True)
    latency_vs_concurrency(p["report"], p["published"], paths[0])
    accuracy_vs_latency(p["report"], p["published"], paths[1])
    module.exit_json(changed=True, plots=paths)


if __name__ == "__main__":
    main()
