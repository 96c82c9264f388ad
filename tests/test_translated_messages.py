"""A task that decides from the text of a command's error (``'No such file' not in reg.stderr``) runs it in the C
locale when the command's messages are translated (GNU coreutils and findutils use gettext): under a host's own
locale (/etc/default/locale, or LANG sent over SSH) the text would differ and the task would fail where it should
not (the d3_state reads of a missing lease, drain record directory or deployment record)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TRANSLATED = {"cat", "find", "ls", "rm", "stat", "mkdir", "test", "readlink"}  # coreutils and findutils
TEXT_OF_STDERR = re.compile(r"'[^']+'\s+(?:not\s+)?in\s+[\w.]+\.stderr")


def tasks(node: object) -> list[dict]:
    out = []
    if isinstance(node, list):
        for item in node:
            out += tasks(item)
    elif isinstance(node, dict):
        if "name" in node:
            out.append(node)
        for key in ("block", "rescue", "always", "tasks"):
            out += tasks(node.get(key))
    return out


def deciding_tasks() -> list[tuple[str, dict]]:
    found = []
    for path in sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"), *ROOT.glob("playbooks/tasks/*.yml")]):
        for task in tasks(yaml.safe_load(path.read_text())):
            if TEXT_OF_STDERR.search(str(task.get("failed_when", ""))):
                found.append((f"{path.relative_to(ROOT)}: {task['name']}", task))
    return found


def program(task: dict) -> str:
    for key in ("ansible.builtin.command", "command"):
        args = task.get(key)
        if isinstance(args, dict) and args.get("argv"):
            return str(args["argv"][0])
        if isinstance(args, dict) and args.get("cmd"):
            return str(args["cmd"]).split()[0]
        if isinstance(args, str):
            return args.split()[0]
    return ""


def test_every_task_that_reads_a_translated_error_runs_in_the_c_locale() -> None:
    found = deciding_tasks()
    translated = [(where, task) for where, task in found if program(task) in TRANSLATED]
    # the three d3_state reads at least (a missing file is not an error there)
    assert len(translated) >= 3, [w for w, _ in found]
    wrong = [where for where, task in translated if (task.get("environment") or {}).get("LC_ALL") != "C"]
    assert wrong == [], f"set environment: {{LC_ALL: C}} on: {wrong}"
