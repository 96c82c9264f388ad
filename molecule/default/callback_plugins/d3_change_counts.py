"""Test tooling, not part of the collection: molecule's check and converge steps (both run converge.yml, which sits
beside this directory, so Ansible loads it for them) each write which tasks changed on which host, so the verify step
can compare a fresh host's `--check` with its real run task by task (tests/test_site.py, docs/converge.md "Check mode
on a fresh host"; issue 35.7).

Written to $MOLECULE_EPHEMERAL_DIRECTORY/change-counts/<playbook>-<check|run>.json at the end of the playbook:
{"recap": {host: changed}, "tasks": {host: {"role : task": number of changed results}}}. Outside molecule (no
MOLECULE_EPHEMERAL_DIRECTORY) it writes nothing."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ansible import context
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: d3_change_counts
type: aggregate
short_description: per-task change counts of a molecule step (test tooling)
description: writes which tasks changed on which host, for molecule's verify step
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "d3_change_counts"
    CALLBACK_NEEDS_ENABLED = False  # on wherever it is loaded: only beside molecule's playbooks

    def __init__(self) -> None:
        super().__init__()
        self._playbook = ""
        self._changed: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = Path(playbook._file_name).stem
        path, check = self._path(), self._path("check")
        if path != check and path.exists() and check.exists() and path.stat().st_mtime > check.stat().st_mtime:
            # a second `molecule converge` after the first: the run to compare with the check is the first one
            self._playbook = ""
            return
        # a run that ends before its stats leaves no file of an earlier run behind
        path.unlink(missing_ok=True)

    def _path(self, mode: str = "") -> Path:
        mode = mode or ("check" if context.CLIARGS.get("check") else "run")
        return Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")) / "change-counts" / f"{self._playbook}-{mode}.json"

    def v2_runner_on_ok(self, result: Any) -> None:
        if result._result.get("changed"):
            # "role : task" as the run prints it (roles by their short name: the repository's or the collection's)
            self._changed[result._host.get_name()][result._task.get_name(include_role_fqcn=False)] += 1

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if "MOLECULE_EPHEMERAL_DIRECTORY" not in os.environ or not self._playbook:
            return
        path = self._path()
        path.parent.mkdir(parents=True, exist_ok=True)
        recap = {host: stats.summarize(host)["changed"] for host in sorted(stats.processed)}
        tasks = {host: dict(sorted(self._changed[host].items())) for host in recap}
        path.write_text(json.dumps({"recap": recap, "tasks": tasks}, indent=1) + "\n")
