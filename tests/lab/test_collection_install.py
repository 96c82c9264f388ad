"""The collection as a user installs it (issue 35.5, docs/install.md): `ansible-galaxy collection build` packs the
roles, playbooks and plugins, `ansible-galaxy collection install --offline` installs the tarball, and from an empty
directory (no ansible.cfg, no checkout on any path) `d3fleet.fleet.plan` plans the lab inventory and
`d3fleet.fleet.site` runs against a converged lab host, changing nothing.

Cost: the build and install (about 3 s), plan.yml (about 10 s), one site.yml run on one converged host (76 s without
pipelining and the preload callback on a loaded machine, 2026-12-04; see the durations of a run for the figure with them)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import labkit
import pytest
from labkit import LAB_INVENTORY, ROOT

COLLECTION = ROOT / "collections/ansible_collections/d3fleet/fleet"


def bare_env(collections: Path) -> dict[str, str]:
    """The environment of a user with only the installed collection: no ANSIBLE_* setting of this checkout (its
    ansible.cfg, its collections path), the venv's ansible first on PATH, and the two speed settings docs/install.md
    tells users to copy (SSH pipelining; the installed collection's preload callback), set the way a user's own
    configuration would set them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1", "PATH": labkit.ANSIBLE_ENV["PATH"],
            "ANSIBLE_PIPELINING": "true", "ANSIBLE_CALLBACKS_ENABLED": "d3fleet.fleet.preload"}  # fmt: skip


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(args)}: rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(an empty working directory, its environment) after the build and the install from the tarball."""
    work = tmp_path_factory.mktemp("collection")
    built, collections, empty = work / "built", work / "collections", work / "empty"
    empty.mkdir()
    env = bare_env(collections)
    run([labkit.venv_tool("ansible-galaxy"), "collection", "build", "--output-path", str(built), str(COLLECTION)], empty, env)
    (tarball,) = built.glob("d3fleet-fleet-*.tar.gz")
    run([labkit.venv_tool("ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections), str(tarball)], empty, env)
    listed = run([labkit.venv_tool("ansible-galaxy"), "collection", "list", "d3fleet.fleet"], empty, env)
    # the installed copy is the only one Ansible sees (not this checkout's collections/)
    assert str(collections / "ansible_collections") in listed and str(ROOT) not in listed, listed
    for part in ("roles/d3_units/tasks/main.yml", "playbooks/site.yml", "playbooks/rollout.yml", "plugins/filter/d3_planner.py"):
        assert (collections / "ansible_collections/d3fleet/fleet" / part).is_file(), f"the tarball lacks {part}"
    return empty, env


def test_the_installed_collection_plans_the_lab_by_name(installed: tuple[Path, dict[str, str]], host_names: list[str]) -> None:
    empty, env = installed
    out = run([labkit.venv_tool("ansible-playbook"), "d3fleet.fleet.plan", "-i", str(LAB_INVENTORY)], empty, env)
    for host in host_names:
        assert labkit.recap(out, host)["failed"] == 0 and f"ok: [{host}]" in out, f"plan.yml did not plan {host}:\n{out[-3000:]}"
    assert list(empty.iterdir()) == [], "plan.yml wrote into the working directory"


def test_the_installed_collections_site_changes_nothing_on_a_converged_host(
    installed: tuple[Path, dict[str, str]], converged: list[str]
) -> None:
    empty, env = installed
    host = converged[0]
    out = run([labkit.venv_tool("ansible-playbook"), "d3fleet.fleet.site", "-i", str(LAB_INVENTORY), "-l", host], empty, env)
    assert labkit.recap_changed(out, host) == 0, out[-4000:]
    # the roles ran from the installed collection (the play's role names carry its name)
    assert "d3fleet.fleet.d3_units : " in out, out[-3000:]
