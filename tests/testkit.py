"""The one helper module for the tests outside the lab (tests/*.py): the venv's Ansible commands with the repository's
ansible.cfg, and a module's main() run in-process. The lab tests have theirs in tests/lab/labkit.py."""

from __future__ import annotations

import importlib.util
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


def load_file(name: str, path: Path) -> Any:
    """The Python file at ``path`` (a tool, a lab stand-in: not on any import path) imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(module)
    return module


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


def aliased_run(tmp: Path, play: str, hosts: dict[str, dict[str, Any]], **env: str) -> dict[str, dict[str, Any]]:
    """One ansible-playbook run of `play` over local aliases of this machine (each alias: its own host variables, e.g.
    one bad input each), instead of one run per case. Per alias: `failed` (the names of the tasks that failed on it),
    `text` (every message and output it got, loop items included) and `changed` (the names of the tasks that changed).
    The whole output: key `_stdout`."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp / "hosts.json").write_text(json.dumps({"all": {"hosts": {a: {**local, **v} for a, v in hosts.items()}}}))
    (tmp / "play.yml").write_text(play)
    proc = ansible_playbook(str(tmp / "play.yml"), "-i", str(tmp / "hosts.json"), "--forks", "20", timeout=300,
                            ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_ROLES_PATH=str(ROOT / "roles"), **env)  # fmt: skip
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    out: dict[str, dict[str, Any]] = {a: {"failed": [], "text": "", "changed": []} for a in hosts}
    for play_result in report["plays"]:
        for task in play_result["tasks"]:
            for alias, res in task["hosts"].items():
                texts = [res, *(res.get("results") or [])]
                out[alias]["text"] += " ".join(str(r.get(k, "")) for r in texts for k in ("msg", "stdout", "stderr")) + " "
                if res.get("failed"):
                    out[alias]["failed"].append(task["task"]["name"])
                if res.get("changed"):
                    out[alias]["changed"].append(task["task"]["name"])
    out["_stdout"] = {"text": proc.stdout + proc.stderr}
    return out
