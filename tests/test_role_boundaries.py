"""Roles talk through documented outputs only: no role and no playbook reads a private variable (leading
underscore) that another role defines (register, set_fact, vars, loop_var). Public outputs are documented in the
owning role's meta/argument_specs.yml or the docs contract tables (docs/converge.md "Role outputs", docs/design.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
PRIVATE = re.compile(r"(?<![\w.])(_[a-z][a-z0-9_]*)")
DEFINES = [
    re.compile(r"^\s*register:\s*(_[a-z0-9_]+)\s*$", re.M),
    re.compile(r"^\s*loop_var:\s*(_[a-z0-9_]+)\s*$", re.M),
    re.compile(r"^\s+(_[a-z0-9_]+):", re.M),  # set_fact / vars keys
]


def defined_by(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in files:
        text = path.read_text()
        for pattern in DEFINES:
            names |= set(pattern.findall(text))
    return names


def role_files(role: Path) -> list[Path]:
    return sorted(p for p in role.rglob("*") if p.suffix in (".yml", ".j2") and p.is_file())


OWNERS = {name: role.name for role in ROLES for name in defined_by(role_files(role))}
PLAYBOOKS = [*sorted((ROOT / "playbooks").glob("*.yml")), ROOT / "site.yml"]


def foreign_reads(path: Path, own: set[str], me: str | None) -> list[str]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    found = []
    for name in sorted(set(PRIVATE.findall(text)) - own):
        owner = OWNERS.get(name)
        if owner is not None and owner != me:
            found.append(f"{path.name} reads {name}, private to role {owner}")
    return found


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_a_role_reads_no_other_role_s_private_variables(role: Path) -> None:
    own = defined_by(role_files(role))
    problems = [p for f in role_files(role) for p in foreign_reads(f, own, role.name)]
    assert problems == []


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_a_playbook_reads_no_role_s_private_variables(playbook: Path) -> None:
    assert foreign_reads(playbook, defined_by([playbook]), None) == []


def test_the_check_sees_a_foreign_read(tmp_path: Path) -> None:
    """The old rollout.yml read the d3_units and d3_smoke roles' private results: the check must see that."""
    assert {"_d3_units_rendered", "_d3_smoke_instance"} <= set(OWNERS)
    play = tmp_path / "rollout.yml"
    play.write_text("- hosts: all\n  tasks:\n    - ansible.builtin.debug:\n"
                    "        msg: \"{{ _d3_units_rendered.results | select('changed') }} {{ _mine }}\"\n"
                    "      vars:\n        _mine: 1\n")  # fmt: skip
    assert foreign_reads(play, defined_by([play]), None) == ["rollout.yml reads _d3_units_rendered, private to role d3_units"]
