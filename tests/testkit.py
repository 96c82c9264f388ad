"""The one helper module for the tests outside the lab (tests/*.py): the venv's Ansible commands with the repository's
ansible.cfg, and a module's main() run in-process. The lab tests have theirs in tests/lab/labkit.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the project's .venv/bin: ansible-playbook, ansible-doc


def ansible_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository's ansible.cfg, no colour, and the venv's commands first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_COLLECTIONS_PATH")}
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.update(extra)
    return env


def ansible(command: str, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the venv's `command` (ansible-playbook, ansible-doc, ...) in the repository root; output captured."""
    return subprocess.run([str(BIN / command), *args], cwd=ROOT, env=ansible_env(**env), capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def ansible_playbook(*args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    return ansible("ansible-playbook", *args, timeout=timeout, **env)


def run_module(module: Any, capsys: pytest.CaptureFixture[str], **args: Any) -> dict[str, Any]:
    """An Ansible module's main() in this process with these arguments: its JSON result (exit_json and fail_json)."""
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)
