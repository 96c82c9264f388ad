"""Every command the front door shows works as written on a fresh checkout: README.md's ```sh blocks, the example
inventory's comments and the next steps `make demo` ends with (tests/doccommands.py reads them, so these tests follow
the docs). The example's commands run here (playbook tier: they contact no host); the lab's in
tests/lab/test_readme_commands_lab.py."""

from __future__ import annotations

import json
import re

import doccommands
import pytest
from doccommands import NEXT_STEPS, NOT_RUN, README, ROOT, shown, tier


def test_every_shown_command_has_a_tier() -> None:
    """A command added to the docs is run by one of the tiers, or listed in NOT_RUN with its reason."""
    unknown = [(where, c) for where, c in shown() if tier(c) == "unknown"]
    assert not unknown, f"shown commands no test runs (give them a tier in tests/doccommands.py): {unknown}"
    assert {c for _, c in shown()} >= {"make plan", "ansible-playbook playbooks/plan.yml -i inventories/example"}


def test_the_parser_reads_commands_comments_and_continuations() -> None:
    text = "x\n```sh\n# a comment\nmake plan   # plans\nansible-playbook a.yml \\\n  -e 'x=#1'\n\n```\n```yaml\nno: 1\n```\n"
    assert doccommands.readme_commands(text) == ["make plan", "ansible-playbook a.yml -e 'x=#1'"]
    yml = "---\n# Copy it, then\n#   ansible-playbook playbooks/plan.yml -i inv   # preview\n# make sure\nall: {}\n"
    assert doccommands.comment_commands(yml) == ["ansible-playbook playbooks/plan.yml -i inv"]
    assert doccommands._strip_comment("echo '#1' \"a # b\" x#y # z") == "echo '#1' \"a # b\" x#y"


@pytest.mark.parametrize(("command", "expected"), [
    (". .venv/bin/activate", "setup"), ("export ANSIBLE_STDOUT_CALLBACK=x.y.z", "setup"), ("make demo", "skip"),
    ("make plan", "playbook"), ("ansible-playbook playbooks/plan.yml -i inventories/example -l l4-b", "playbook"),
    ("ansible-playbook playbooks/status.yml -i inventories/lab", "lab"),
    ("curl -sS http://127.0.0.1:19104/v1/systemone -d @f", "lab"), ("curl -sS https://example.org/", "unknown"),
    ("make plan INVENTORY=inventories/lab", "unknown"), ("rm -rf /", "unknown"),
])  # fmt: skip
def test_tiers(command: str, expected: str) -> None:
    assert tier(command) == expected


def test_the_demo_ends_with_its_next_steps_and_the_readme_shows_them() -> None:
    """`make demo` prints examples/demo-next-steps.sh at its end; the README's tour shows the same commands."""
    steps = [c for w, c in shown() if w == str(NEXT_STEPS.relative_to(ROOT))]
    assert [tier(c) for c in steps] == ["lab"] * 4
    readme = [c for w, c in shown() if w == "README.md"]
    assert [c for c in steps if c not in readme] == []
    assert {"nightly-next", "nightly"} == {c.rsplit(":", 1)[1] for c in steps if "rollout.yml" in c}
    demo = re.search(r"^demo: venv\n(?:\t.*\n)+", (ROOT / "Makefile").read_text(), flags=re.M)
    assert demo and "cat examples/demo-next-steps.sh" in demo.group(0).splitlines()[-1]
    assert "demo: export ANSIBLE_STDOUT_CALLBACK ?= d3fleet.fleet.fleet" in (ROOT / "Makefile").read_text()


def test_the_request_file_is_the_contract_request() -> None:
    """examples/decision-request.json (the README's curl body) is tests/contracts/'s POST /v1/systemone request."""
    contract = json.loads(doccommands.CONTRACT_REQUEST.read_text())
    contract.pop("_source")
    assert json.loads(doccommands.REQUEST.read_text()) == contract
    assert all(f"-d @{doccommands.REQUEST.relative_to(ROOT)}" in c for _, c in shown() if c.startswith("curl "))


def test_not_run_commands_are_shown() -> None:
    """NOT_RUN lists only commands the docs show (a stale entry would hide nothing but mislead)."""
    assert set(NOT_RUN) - {c for _, c in shown()} <= {"make check", "make lab-down"}
    assert "make demo" in README.read_text()


@pytest.mark.playbook
@pytest.mark.parametrize("command", sorted({c for _, c in shown() if tier(c) == "playbook"}))
def test_example_command_works_as_written(command: str) -> None:
    """Each example-inventory command exits 0 on a fresh checkout (no vault, no host contacted)."""
    proc = doccommands.run(command, timeout=300)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    assert "l4-a" in proc.stdout and "l4-b" in proc.stdout
