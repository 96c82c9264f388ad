#!/usr/bin/env python3
"""Time `make demo` by part (tools/demo_timing.sh runs it; stdlib only: it runs before the venv exists).

    make demo 2>&1 | python3 tools/demo_timing.py stamp build/demo-timing/cold.log   # tee, each line with its time
    python3 tools/demo_timing.py report build/demo-timing/cold.log [build/demo-timing/warm.log]

`stamp` writes every line it reads to stdout unchanged and to LOG as "<seconds since start>\\t<line>", headed by
"# key: value" lines (date, machine, load) and ended by "<seconds>\\t# end rc=N" (the status comes from --rc-file).
`report` reads such logs and prints one table: the venv's two pip installs (from make's echoed commands), each
ansible-playbook run (from its echoed command to the end of its RECAP) and, inside each run, every step of the fleet
callback (d3fleet.fleet.fleet: one line per host and step with the step's seconds; a step's figure is its slowest
host's), then make demo's total. A second log (the warm run) gets a column beside the first.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# one host's line at the end of a step: "  d3-lab-host1  nvidia_toolkit    changed 6     29 tasks    57.1 s"
STEP_RE = re.compile(r"^  (?P<host>\S+)\s+(?P<step>play tasks|\S+)\s+(?:ok|changed \d+|FAILED|UNREACHABLE)\s+"
                     r"\d+ tasks?\s+(?P<secs>\d+(?:\.\d+)?) s$")
RUN_RE = re.compile(r"^ansible-playbook (?P<playbook>\S+)(?P<args>.*)$")
RECAP_HOST_RE = re.compile(r"^  \S+\s+ok=\d+")
PIP_CORE_RE = re.compile(r"/pip install .*\\$|/pip install .*ansible-core")
PIP_ALL_RE = re.compile(r"/pip install .*-r requirements\.txt")
TOUCH_CORE_RE = re.compile(r"^touch \S*\.installed-core$")
TOUCH_ALL_RE = re.compile(r"^touch \S*\.installed$")
END_RE = re.compile(r"^# end rc=(?P<rc>-?\d+)$")
# the callback's step for a play's own tasks: its figure spans from the play's first such task to its last, with the
# roles' steps in between, so it is no part of the run (left out)
PLAY_STEP = "play tasks"


@dataclass
class Step:
    play: int
    name: str
    secs: float


@dataclass
class Run:
    label: str
    start: float
    end: float | None = None
    plays: int = 0
    steps: list[Step] = field(default_factory=list)


@dataclass
class Timing:
    header: dict[str, str]
    parts: list[tuple[str, float, float]]  # label, from, to (seconds since the start)
    runs: list[Run]
    total: float | None
    rc: int | None


def run_label(playbook: str, args: str) -> str:
    """A short name for one ansible-playbook run of make demo."""
    if playbook.endswith("lab.yml"):
        return "lab images (make lab-images)" if "--tags images" in args else "lab (make lab)"
    if playbook == "site.yml":
        return "converge (site.yml)"
    return f"ansible-playbook {playbook}"


def parse(lines: list[str]) -> Timing:
    """The parts of one stamped log (lines "<seconds>\\t<text>" and "# key: value" headers)."""
    header: dict[str, str] = {}
    parts: list[tuple[str, float, float]] = []
    runs: list[Run] = []
    open_pip: dict[str, float] = {}
    current: Run | None = None
    play = 0
    in_recap = False
    last_step: tuple[int, str] | None = None
    total: float | None = None
    rc: int | None = None
    for raw in lines:
        raw = raw.rstrip("\n")
        if raw.startswith("# ") and "\t" not in raw:
            key, _, value = raw[2:].partition(": ")
            header[key] = value
            continue
        stamp, sep, text = raw.partition("\t")
        if not sep:
            continue
        try:
            t = float(stamp)
        except ValueError:
            continue
        if m := END_RE.match(text):
            total, rc = t, int(m["rc"])
            continue
        if PIP_ALL_RE.search(text):
            open_pip["all"] = t
        elif PIP_CORE_RE.search(text) and "core" not in open_pip:
            open_pip["core"] = t
        elif TOUCH_CORE_RE.match(text) and "core" in open_pip:
            parts.append(("venv: ansible-core (pip)", open_pip.pop("core"), t))
        elif TOUCH_ALL_RE.match(text) and "all" in open_pip:
            parts.append(("venv: requirements.txt (pip)", open_pip.pop("all"), t))
        if m := RUN_RE.match(text):
            current = Run(run_label(m["playbook"], m["args"]), t)
            runs.append(current)
            play, in_recap, last_step = 0, False, None
            continue
        if current is None:
            continue
        if in_recap:  # the run ends with the last line of its RECAP
            if RECAP_HOST_RE.match(text):
                current.end = t
            else:
                current = None
        elif text.startswith("PLAY "):
            play = current.plays = play + 1
            last_step = None
        elif text == "RECAP":
            in_recap = True
        elif (m := STEP_RE.match(text)) and m["step"] != PLAY_STEP:
            secs = float(m["secs"])
            if last_step == (play, m["step"]):
                current.steps[-1].secs = max(current.steps[-1].secs, secs)
            else:
                current.steps.append(Step(play, m["step"], secs))
                last_step = (play, m["step"])
    # a run that printed no PLAY line is no run: the ansible-playbook lines make demo prints at its end (the next steps)
    return Timing(header, parts, [r for r in runs if r.plays], total, rc)


def rows(timing: Timing) -> list[tuple[str, str, float]]:
    """(key, label, seconds) in the order of the log: pip parts, each run and its steps, the total."""
    out: list[tuple[str, str, float]] = []
    for label, start, end in timing.parts:
        out.append((label, f"{label}  [{start:.0f}-{end:.0f} s]", end - start))
    for run in timing.runs:
        if run.end is None:
            out.append((run.label, f"{run.label}  [{run.start:.0f} s-, unfinished]", float("nan")))
        else:
            out.append((run.label, f"{run.label}  [{run.start:.0f}-{run.end:.0f} s]", run.end - run.start))
        seen: dict[tuple[int, str], int] = {}
        for step in run.steps:
            n = seen[(step.play, step.name)] = seen.get((step.play, step.name), 0) + 1
            key = f"{run.label}/{step.play}/{step.name}/{n}"
            out.append((key, f"    play {step.play}: {step.name}", step.secs))
    if timing.total is not None:
        out.append(("total", f"make demo (rc={timing.rc})", timing.total))
    return out


def fmt(secs: float | None) -> str:
    if secs is None:
        return "-"
    if secs != secs:  # nan
        return "?"
    return f"{secs:.1f} s" if secs < 60 else f"{secs:.1f} s = {int(secs // 60)} min {secs % 60:04.1f} s"


def report(logs: list[Path]) -> str:
    timings = [parse(p.read_text(encoding="utf-8").splitlines()) for p in logs]
    names = [p.stem for p in logs]
    table = [rows(t) for t in timings]
    keys: list[str] = []
    labels: dict[str, str] = {}
    for r in table:
        for key, label, _ in r:
            if key not in labels:
                keys.append(key)
                labels[key] = label
    values = [{key: secs for key, _, secs in r} for r in table]
    width = max([len(labels[k]) for k in keys] + [10])
    lines = []
    for name, t in zip(names, timings, strict=True):
        h = t.header
        lines.append(f"{name}: {h.get('date', '?')}, {h.get('machine', '?')}; load before: {h.get('load before', '?')}; "
                     f"after: {h.get('load after', '?')}")
    lines.append("")
    lines.append(f"{'part':<{width}}  " + "  ".join(f"{n:>22}" for n in names))
    for key in keys:
        lines.append(f"{labels[key]:<{width}}  " + "  ".join(f"{fmt(v.get(key)):>22}" for v in values))
    return "\n".join(lines)


def load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3]) + " (1, 5, 15 min)"
    except OSError:
        return "?"


def machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = int(Path("/proc/meminfo").read_text(encoding="ascii").split()[1])
    except (OSError, ValueError, IndexError):
        mem_kib = 0
    return f"{platform.node()}: {os.cpu_count()} cores ({model}), {mem_kib / 2**20:.0f} GiB, {platform.platform()}"


def stamp(log: Path, rc_file: Path | None, source=sys.stdin, sink=sys.stdout, clock=time.monotonic) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    start = clock()
    with log.open("w", encoding="utf-8") as out:
        out.write(f"# date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
        out.write(f"# machine: {machine()}\n# load before: {load()}\n")
        for line in source:
            sink.write(line)
            sink.flush()
            out.write(f"{clock() - start:.1f}\t{line.rstrip(chr(10))}\n")
            out.flush()
        rc = rc_file.read_text(encoding="ascii").strip() if rc_file and rc_file.exists() else "-1"
        out.write(f"# load after: {load()}\n{clock() - start:.1f}\t# end rc={rc}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stamp", help="tee stdin to stdout and to LOG, each line with its time")
    s.add_argument("log", type=Path)
    s.add_argument("--rc-file", type=Path, help="file holding the command's exit status (written before stdin ends)")
    r = sub.add_parser("report", help="print the parts of one or more stamped logs side by side")
    r.add_argument("logs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "stamp":
        stamp(args.log, args.rc_file)
    else:
        print(report(args.logs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
