"""The lab commands the front door shows (README.md's tour and the next steps `make demo` ends with,
examples/demo-next-steps.sh), run as written on the converged lab (tests/doccommands.py reads them from the docs):
the curl through the router, status.yml and plan.yml, in a shell that has run the README's setup lines (the venv, the
fleet-shaped output). The converge (site.yml) and the rollouts are not run a second time: the session's converge_run
and test_rollout.py run the same playbooks with the same limit and image (checked here), which would cost 2 and 1.3
more minutes. The lab is a STAND-IN (lab/README.md)."""

from __future__ import annotations

import json
import shlex

import doccommands
import pytest
from doccommands import shown, tier
from labkit import IMAGE, LAB_GROUP, ROOT, ROUTER_GROUP, Run, registry_digest

pytestmark = pytest.mark.lab

LAB = sorted({c for _, c in shown() if tier(c) == "lab"})
HERE = [c for c in LAB if c.startswith("curl ") or shlex.split(c)[1] in ("playbooks/status.yml", "playbooks/plan.yml")]


def test_the_other_lab_commands_are_what_the_session_runs() -> None:
    """site.yml with the limit of the session's converge (conftest.converge_run); the rollouts to tags the lab
    registry holds, nightly-next as test_rollout.py runs it."""
    rollout_source = (ROOT / "tests/lab/test_rollout.py").read_text()
    others = [shlex.split(c) for c in LAB if c not in HERE]
    assert sorted(argv[1] for argv in others) == ["playbooks/rollout.yml", "playbooks/rollout.yml", "site.yml"]
    for argv in others:
        assert argv[:4] == ["ansible-playbook", argv[1], "-i", "inventories/lab"]
        if argv[1] == "site.yml":
            assert argv[4:] == ["-l", f"{LAB_GROUP}:{ROUTER_GROUP}"]
            continue
        assert argv[4] == "-e" and argv[5].startswith(f"d3_image_name={IMAGE}:") and len(argv) == 6
        tag = argv[5].rsplit(":", 1)[1]
        assert registry_digest(tag).startswith("sha256:"), f"the lab registry has no tag {tag}"
        assert tag == "nightly" or f'"d3_image_name": f"{{IMAGE}}:{tag}"' in rollout_source


@pytest.mark.parametrize("command", HERE)
def test_lab_command_works_as_written(converge_run: Run, command: str) -> None:
    proc = doccommands.run(command, timeout=600)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    if command.startswith("curl "):
        answer = json.loads(proc.stdout)
        assert answer["model"] == "d3-mini" and set(answer["answers"]) == {"team", "urgent", "tone"}
    else:  # the fleet-shaped output (docs/output.md): one line per host and step, the recap
        assert "RECAP" in proc.stdout and "TASK [" not in proc.stdout
