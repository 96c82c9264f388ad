"""Shared fixtures for the lab tests (tests/lab/, all @pytest.mark.lab); the helpers are in labkit.py.

The lab is a STAND-IN for a real L4 fleet; these fixtures read what `make lab` generated (inventories/lab/) and
talk to the lab hosts the way a fleet is reached: SSH as `fleet`. A missing lab part fails, it does not skip.

Order: the tests that share the converged fleet (`converged`, one site.yml run per session) restore what they
change; test_rollout moves the fleet to other image tags, so its module runs last."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import labkit
import pytest
from labkit import LabHost, Run

SshRunner = Callable[..., subprocess.CompletedProcess[str]]
LAST_MODULES = ("test_rollout.py",)  # they leave the fleet on another tag: after everything that shares `converged`


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name in LAST_MODULES)  # stable: keeps the order within each group


@pytest.fixture(scope="session")
def lab_inventory() -> dict:
    return labkit.lab_inventory()


@pytest.fixture(scope="session")
def lab_hosts(lab_inventory: dict) -> list[LabHost]:
    hosts = labkit.lab_host_list()
    assert hosts, "the lab inventory lists no host: run `make lab`"
    return hosts


@pytest.fixture(scope="session")
def host_names(lab_hosts: list[LabHost]) -> list[str]:
    return sorted(h.name for h in lab_hosts)


@pytest.fixture(scope="session")
def lab_ssh() -> SshRunner:
    """Run a shell command on a lab host over SSH as the fleet user: lab_ssh(host, "cmd")."""
    return labkit.ssh


@pytest.fixture(scope="session")
def converge_run(host_names: list[str]) -> Run:
    """ONE site.yml converge of the whole lab fleet (on the default tag, nightly) per session, shared by every test
    that needs a converged fleet; those tests restore what they change."""
    assert len(host_names) >= 2, "the lab needs at least 2 hosts (make lab)"
    run = labkit.run_playbook("site.yml", limit=labkit.LAB_GROUP)
    assert run.status == "successful", run.failure_text()
    return run


@pytest.fixture
def converged(converge_run: Run, host_names: list[str]) -> list[str]:
    """The converged lab hosts (sorted names)."""
    return host_names
