#!/usr/bin/env python3
"""Print what a `make test` run cost: each part's wall time (build/timing.tsv, written by the Makefile's `timed`)
and the slowest tests of every pytest run (build/junit-*.xml). `.ci/run` calls it at the end, pass or fail.

    python tools/ci_report.py [--build build] [--slowest 25]

The unit suite's time (part `unit`) is the machine's yardstick: compare timings only at a similar unit time."""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def parts(timing: Path) -> list[tuple[str, int, int]]:
    """(part, seconds, exit status) per line of the timing file, in the order the parts ended."""
    rows = []
    for line in timing.read_text().splitlines() if timing.is_file() else []:
        name, seconds, status = line.split("\t")
        rows.append((name, int(seconds), int(status)))
    return rows


def slowest(build: Path, count: int) -> list[tuple[float, str, str]]:
    """(seconds, test id, run) of the slowest test cases over every JUnit file, slowest first."""
    cases = []
    for junit in sorted(build.glob("junit-*.xml")):
        run = junit.stem.removeprefix("junit-")
        for case in ET.parse(junit).iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), test_id, run))
    return sorted(cases, key=lambda c: -c[0])[:count]


def mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def report(build: Path, count: int) -> str:
    rows = parts(build / "timing.tsv")
    out = ["", "== make test: wall time by part (unit beside lab + ee; then lab-fleet beside lint, lab-alone, molecule) =="]
    if not rows:
        out.append(f"(no {build / 'timing.tsv'}: make test did not start)")
    for name, seconds, status in rows:
        out.append(f"{name:<10} {mmss(seconds):>6}  {'ok' if status == 0 else f'FAILED (exit {status})'}")
    cases = slowest(build, count)
    if cases:
        out += ["", f"== the {len(cases)} slowest tests =="]
        out += [f"{seconds:7.1f} s  {run:<9} {test_id}" for seconds, test_id, run in cases]
    figures = build / "lab-figures.jsonl"
    lines = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()] if figures.is_file() else []
    if lines:
        out += ["", f"== the lab's figures ({figures.name}: drills, failover) =="]
        out += [f"{f.get('drill', '-')!s:>3} {f['name']}: {f['figure']} ({f.get('lab_s', '?')} s)" for f in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, default=Path(__file__).resolve().parents[1] / "build")
    parser.add_argument("--slowest", type=int, default=25)
    args = parser.parse_args(argv)
    print(report(args.build, args.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
