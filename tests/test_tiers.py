"""The test tiers are enforced by tests/conftest.py: make check (`-m "not lab and not playbook"`) must start neither
Ansible nor podman. These check the guard itself, and that it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tiers import tier_problem


@pytest.mark.parametrize(
    ("args", "markers", "needs"),
    [
        (["/x/.venv/bin/ansible-playbook", "site.yml"], set(), "playbook"),
        (["ansible-doc", "-t", "filter"], {"slow"}, "playbook"),
        ("cd /x && ansible-inventory --list | jq .", set(), "playbook"),
        (["molecule", "test"], set(), "playbook"),
        (["podman", "ps"], {"playbook"}, "lab"),
        ("skopeo inspect docker://x", set(), "lab"),
    ],
)
def test_a_test_without_the_marker_may_not_start_the_command(args: object, markers: set[str], needs: str) -> None:
    problem = tier_problem(args, markers, path="/nonexistent")
    assert problem is not None and f"without the {needs} marker" in problem, problem


@pytest.mark.parametrize(
    ("args", "markers"),
    [
        (["ansible-playbook", "site.yml"], {"playbook"}),
        (["ansible-playbook", "site.yml"], {"lab"}),
        (["podman", "ps"], {"lab"}),
        (["git", "status"], set()),
        (["/usr/bin/python3", "-c", "print('ansible-playbook')"], set()),
        ("echo ansible.cfg", set()),
    ],
)
def test_the_marked_or_unrelated_commands_pass(args: object, markers: set[str]) -> None:
    assert tier_problem(args, markers, path="/nonexistent") is None


def test_a_test_double_under_the_temporary_directory_is_not_the_real_command(tmp_path: Path) -> None:
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho fake\n")
    fake.chmod(0o755)
    assert tier_problem(["podman", "ps"], set(), path=str(tmp_path)) is None
    assert tier_problem([str(fake), "ps"], set(), path="/nonexistent") is None


def test_an_executable_under_tmp_outside_the_tests_own_directories_is_the_real_command() -> None:
    """A clone (and its .venv) under /tmp: its ansible-playbook is the real one, not a test double (issue 35: make
    check was red on a clone under /tmp). Only the session's pytest temporary directory holds doubles."""
    clone = Path(tempfile.mkdtemp(prefix="d3-clone-"))
    try:
        venv_bin = clone / ".venv" / "bin"
        venv_bin.mkdir(parents=True)
        for name in ("ansible-playbook", "podman"):
            (venv_bin / name).write_text("#!/bin/sh\n")
            (venv_bin / name).chmod(0o755)
        assert tier_problem([str(venv_bin / "ansible-playbook"), "site.yml"], set(), path="/nonexistent")
        assert tier_problem(["podman", "ps"], set(), path=str(venv_bin))
        assert tier_problem(f"cd {clone} && {venv_bin}/ansible-playbook x.yml", set(), path="/nonexistent")
    finally:
        shutil.rmtree(clone)


def test_the_guard_stops_an_unmarked_test_that_starts_ansible() -> None:
    """This test has no marker: starting ansible-playbook fails it before the process starts."""
    with pytest.raises(pytest.fail.Exception, match="starts ansible-playbook without the playbook marker"):
        subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--version"], check=False, env=os.environ)


def test_everything_under_tests_lab_is_marked_lab() -> None:
    """Collected on their own, the lab tests all fall under -m lab: none is left for `-m "not lab"`."""
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/lab"]
    every = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    not_lab = subprocess.run([*argv, "-m", "not lab"], cwd=root, capture_output=True, text=True, check=False)
    assert " collected" in every.stdout or "tests collected" in every.stdout, every.stdout[-500:]
    assert "tests/lab/test_simulator.py::" in every.stdout, every.stdout[-500:]
    assert "no tests collected" in not_lab.stdout and "deselected" in not_lab.stdout, not_lab.stdout[-1000:]
