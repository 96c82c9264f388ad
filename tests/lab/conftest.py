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
# before anything converges the lab, in this order: test_refusals needs a fresh (not converged) host; test_lab_hosts
# re-creates the last host (it comes back fresh), so it must run before the session's one converge, not after it
FIRST_MODULES = ("test_refusals.py", "test_lab_hosts.py")
# after everything that shares `converged`, in this order: test_router checks the routed fleet as converged,
# test_rollout moves the fleet to other tags (its drills put it back on a pinned digest), test_router_tls turns the
# router's TLS on (the next session's converge turns it off)
LAST_MODULES = ("test_router.py", "test_rollout.py", "test_router_tls.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # stable: keeps the order within each group; FIRST_MODULES run while `make lab` has left the hosts fresh
    def group(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        if name in FIRST_MODULES:
            return (0, FIRST_MODULES.index(name))
        return (2, LAST_MODULES.index(name)) if name in LAST_MODULES else (1, 0)

    items.sort(key=group)


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
    run = labkit.run_playbook("site.yml", limit=f"{labkit.LAB_GROUP}:{labkit.ROUTER_GROUP}:d3-monitors")  # the routers and the monitors too
    assert run.status == "successful", run.failure_text()
    return run


@pytest.fixture
def converged(converge_run: Run, host_names: list[str]) -> list[str]:
    """The converged lab hosts (sorted names)."""
    return host_names
