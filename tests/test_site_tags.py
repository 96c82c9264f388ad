"""site.yml's tags: every role can be run alone, and a partial run still runs the read-only preflight, the plan and
the disk check first (tag `always`), so bad input is refused before any change whatever the tags."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def listed_tasks(*args: str) -> list[tuple[str, set[str]]]:
    proc = ansible_playbook("site.yml", "-i", "inventories/example", "--list-tasks", *args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^\s{6}d3fleet\.fleet\.(\S+) : (.*)\tTAGS: \[(.*)\]$", line)
        if m and not m.group(2).startswith("Validating arguments"):
            tasks.append((m.group(1), {t.strip() for t in m.group(3).split(",") if t.strip()}))
    return tasks


def test_every_role_has_its_tag_and_the_checks_always_run() -> None:
    roles: dict[str, set[str]] = {}
    for role, tags in listed_tasks():  # a role imported by two plays (d3_router's fleet.yml by the monitor) has both tags
        roles.setdefault(role, set()).update(tags)
    assert set(roles) == {"d3_preflight", "d3", "nvidia_toolkit", "podman", "d3_image", "d3_weights", "d3_firewall",
                          "d3_units", "d3_smoke", "d3_state", "d3_router", "d3_metrics"}  # fmt: skip
    assert "always" in roles["d3_preflight"] and "always" in roles["d3"]
    assert "router" in roles["d3_router"] and "metrics" in roles["d3_metrics"]
    for role in ("nvidia_toolkit", "podman", "d3_image", "d3_weights", "d3_firewall", "d3_units", "d3_smoke", "d3_state",
                 "d3_router", "d3_metrics"):
        assert "always" not in roles[role], role


@pytest.mark.parametrize(
    ("tags", "runs", "skips"),
    [
        ("smoke", {"d3_preflight", "d3", "d3_smoke"}, {"nvidia_toolkit", "podman", "d3_weights", "d3_units", "d3_state"}),
        ("units", {"d3_preflight", "d3", "podman", "d3_image", "d3_units"}, {"nvidia_toolkit", "d3_weights", "d3_smoke"}),
        ("weights", {"d3_preflight", "d3", "d3_weights"}, {"nvidia_toolkit", "podman", "d3_units", "d3_smoke"}),
        # the router reads every l4 host's plan: the plan still runs first
        ("router", {"d3_preflight", "d3", "d3_router"}, {"nvidia_toolkit", "podman", "d3_units", "d3_smoke", "d3_state"}),
    ],
)
def test_a_partial_run_still_checks_first(tags: str, runs: set[str], skips: set[str]) -> None:
    tasks = listed_tasks("--tags", tags)
    roles = [role for role, _ in tasks]
    assert runs <= set(roles) and not skips & set(roles), roles
    # the checks come before the first task of the tagged role
    first = next(i for i, r in enumerate(roles) if r not in {"d3_preflight", "d3"})
    assert roles[:first].count("d3") >= 1 and "d3_preflight" in roles[:first]


@pytest.mark.parametrize("tags", ["toolkit", "firewall", "weights", "smoke"])
def test_a_partial_run_validates_every_role_s_arguments(tmp_path: Path, tags: str) -> None:
    """A tag run that skips the image role still validates every role's arguments (those tasks run under any tag):
    no argument-spec default may need a fact of a role that did not run (d3_units' image once did)."""
    play = tmp_path / "specs.yml"
    roles = ["d3_preflight", "d3", "nvidia_toolkit", "podman", "d3_image", "d3_weights", "d3_units", "d3_smoke",
             "d3_state", "d3_router"]  # fmt: skip
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("all:\n  children:\n    l4-nodes:\n      hosts:\n        h1: {ansible_connection: local}\n")
    # only the argument-spec validation of each role: a play that imports every role with a tag none of them has
    play.write_text("- hosts: l4-nodes\n  gather_facts: false\n  tasks:\n" + "".join(
        f"    - ansible.builtin.import_role: {{name: {r}}}\n      tags: [{tags}_not_this]\n" for r in roles))
    proc = ansible_playbook(str(play), "-i", str(hosts), "--tags", tags, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Validating arguments against arg spec" in proc.stdout
    for role in roles:  # each role's own validation task ran, not only one of them
        assert f"TASK [{role} : Validating arguments against arg spec" in proc.stdout, role


def test_every_tagged_include_applies_its_tags_to_the_included_tasks() -> None:
    """An include_role's or include_tasks' own tags select the include only: its tasks run under `--tags` only with
    `apply: {tags: ...}` (site.yml --tags router once skipped the drain restore, --tags units the silences)."""
    import yaml

    site = yaml.safe_load((ROOT / "collections/ansible_collections/d3fleet/fleet/playbooks/site.yml").read_text())
    missing = []
    for play in site:
        for task in play.get("tasks", []) + play.get("pre_tasks", []) + play.get("post_tasks", []):
            for key in ("ansible.builtin.include_role", "ansible.builtin.include_tasks"):
                if key in task and task.get("tags"):
                    args = task[key] if isinstance(task[key], dict) else {}
                    if set(task["tags"]) - {"always"} - set((args.get("apply") or {}).get("tags") or []):
                        missing.append(task["name"])
    assert missing == [], missing
