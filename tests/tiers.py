"""The test tiers, enforced (tests/conftest.py installs this): make check runs `-m "not lab and not playbook"`, the
tests that start neither Ansible nor podman. Every test under tests/lab/ is marked `lab`; a test that starts an Ansible
command without the `playbook` (or `lab`) marker, or podman/skopeo without `lab`, fails naming the command and the
marker to add, before the process starts.

A test double (a fake podman or nvidia-smi a test wrote and put on its PATH) is an executable under the session's
pytest temporary directory (every test's tmp_path is under it; conftest.py's autouse fixture records it): nothing else
under /tmp, so a clone, and its .venv, under /tmp is guarded like one anywhere else."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ANSIBLE_COMMANDS = frozenset({"ansible", "ansible-playbook", "ansible-doc", "ansible-inventory", "ansible-galaxy", "ansible-vault",
                              "ansible-lint", "ansible-runner", "ansible-builder", "ansible-navigator", "molecule"})
LAB_COMMANDS = frozenset({"podman", "skopeo", "buildah"})
LAB_DIR = Path(__file__).resolve().parent / "lab"
_running: dict[str, Any] = {"markers": None, "id": "", "doubles": None}


def set_doubles_root(path: Path) -> None:
    """Where the tests' doubles live: the session's pytest temporary directory (tmp_path_factory.getbasetemp())."""
    _running["doubles"] = os.path.realpath(path) + os.sep


def _commands(args: Any, path: str | None = None) -> list[str]:
    """The command names a Popen argument may start: argv[0], and every word of a shell string; a test double (an
    executable under the session's pytest temporary directory, e.g. a fake podman on a test's PATH) is left out."""
    if isinstance(args, str | bytes | os.PathLike):
        words = os.fsdecode(args).replace(";", " ").replace("|", " ").replace("&", " ").split()
    else:
        words = [os.fsdecode(a) for a in list(args)[:1]]
    doubles = _running["doubles"]
    found = []
    for word in words:
        exe = word if os.sep in word else shutil.which(word, path=path)
        if not (exe and doubles and os.path.realpath(exe).startswith(doubles)):
            found.append(os.path.basename(word))
    return found


def tier_problem(args: Any, markers: set[str], path: str | None = None) -> str | None:
    """Why a test with these markers may not start this command (None: it may)."""
    for name in _commands(args, path):
        if name in LAB_COMMANDS and "lab" not in markers:
            return f"starts {name} without the lab marker: mark it @pytest.mark.lab (or move it under tests/lab/)"
        if name in ANSIBLE_COMMANDS and not markers & {"lab", "playbook"}:
            return f"starts {name} without the playbook marker: mark it @pytest.mark.playbook"
    return None


_real_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    markers = _running["markers"]
    if markers is not None:
        problem = tier_problem(args, markers, (kwargs.get("env") or os.environ).get("PATH"))
        if problem:
            raise pytest.fail.Exception(f"{_running['id']} {problem}")
    _real_popen_init(self, args, *rest, **kwargs)


def install() -> None:
    subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]


def mark_lab_items(items: list[pytest.Item]) -> None:
    for item in items:
        if LAB_DIR in item.path.parents:
            item.add_marker(pytest.mark.lab)


@contextlib.contextmanager
def running(item: pytest.Item) -> Iterator[None]:
    _running["markers"], _running["id"] = {m.name for m in item.iter_markers()}, item.nodeid
    try:
        yield
    finally:
        _running["markers"] = None
