"""site.yml on the lab, driven by ansible-runner: converge and idempotence, --check --diff on a converged host,
and hosts that must fail with a clear message before any unit changes.

Order matters: the first test converges the lab; the others start from that state and restore it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from runner_helpers import host_vars, lab_hosts, on_host, run_playbook, unit_state

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def hosts() -> list[str]:
    found = lab_hosts()
    assert len(found) >= 2, "the lab needs at least 2 hosts (make lab)"
    return found


@pytest.fixture(scope="module")
def converged(hosts: list[str]) -> list[str]:
    first = run_playbook("site.yml", limit="l4-nodes")
    assert first.status == "successful", first.failure_text()
    assert "health" in first.stdout and "ready" in first.stdout  # the smoke table
    return hosts


def test_second_run_changes_nothing(converged: list[str]) -> None:
    again = run_playbook("site.yml", limit="l4-nodes")
    assert again.status == "successful", again.failure_text()
    for host in converged:
        assert again.changed(host) == 0, [e["event_data"]["task"] for e in again.events if e.get("event") == "runner_on_ok"
                                          and e["event_data"].get("host") == host and e["event_data"]["res"].get("changed")]


def test_check_diff_on_converged_host_shows_the_unit_diff_and_changes_nothing(converged: list[str]) -> None:
    host = converged[0]
    models = host_vars(host)["d3_models"]
    changed_models = [dict(models[-1], extra_args=["--max-model-len=4096"]), *models[:-1]]
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host, extravars={"d3_models": changed_models}, cmdline="--check --diff")
    assert run.status == "successful", run.failure_text()
    # the unit diff adds the new flag (a "+" line) and nothing is written
    assert any(line.startswith("+") and "--max-model-len 4096" in line for line in run.stdout.splitlines())
    assert unit_state(host) == before


def test_refused_plan_stops_the_host_before_anything_changes(converged: list[str]) -> None:
    host = converged[0]
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host, extravars={"d3_models": [{"model": "d3", "gpus": [0]}, {"model": "d3-ultra"}]})
    assert run.status == "failed"
    assert run.failed(host) == 1 and run.changed(host) == 0
    text = run.failure_text(host)
    assert f"host {host}: d3_models[0] (d3-27b): tensor parallel size 2 needs 2 GPU(s)" in text
    assert "unknown model 'd3-ultra'" in text
    assert not any(t.startswith(("Install", "Template", "Start")) for t in run.tasks_run(host))
    assert unit_state(host) == before


@pytest.fixture
def old_podman(converged: list[str]) -> Iterator[str]:
    """A lab host whose podman reports 3.4.4 (Ubuntu 22.04's): a STAND-IN shim in /usr/local/bin, removed after."""
    host = converged[-1]
    shim = (
        "#!/bin/sh\n# LAB STAND-IN (test): an old podman, as Ubuntu 22.04 ships\n"
        'case "$*" in\n  *json*) echo \'{"Client": {"Version": "3.4.4"}}\';;\n'
        "  version*) echo 3.4.4;;\n  *) exec /usr/bin/podman \"$@\";;\nesac\n"
    )
    on_host(host, f"cat > /usr/local/bin/podman <<'EOF'\n{shim}EOF\nchmod 0755 /usr/local/bin/podman")
    try:
        yield host
    finally:
        on_host(host, "rm -f /usr/local/bin/podman")


def test_podman_below_4_1_is_refused_before_anything_changes(old_podman: str) -> None:
    host = old_podman
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host)
    assert run.status == "failed"
    assert run.changed(host) == 0
    text = run.failure_text(host)
    assert f"host {host}: podman 3.4.4 (installed) is below 4.1" in text
    assert "--device nvidia.com/gpu=N" in text
    assert unit_state(host) == before


@pytest.fixture
def uuid_only_cdi(converged: list[str]) -> Iterator[str]:
    """A host whose CDI spec names GPUs by UUID only (a real nvidia-ctk --device-name-strategy=uuid setup), so the
    plan's nvidia.com/gpu=<index> devices do not exist. Restored (and the spec regenerated) afterwards."""
    host = converged[0]
    env = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
    on_host(host, f"mkdir -p /etc/nvidia-container-toolkit && echo NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES=uuid > {env}"
                  " && systemctl restart nvidia-cdi-refresh.service")  # fmt: skip
    try:
        yield host
    finally:
        on_host(host, f"rm -f {env} && systemctl restart nvidia-cdi-refresh.service")


def test_missing_cdi_device_stops_the_host_before_units_change(uuid_only_cdi: str) -> None:
    host = uuid_only_cdi
    assert "nvidia.com/gpu=0" not in on_host(host, "nvidia-ctk cdi list 2>/dev/null")
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host)
    assert run.status == "failed"
    text = run.failure_text(host)
    assert "nvidia.com/gpu=0" in text and host in text
    assert not any("d3_units" in t or t.startswith("Template one unit") for t in run.tasks_run(host))
    assert unit_state(host) == before
