"""site.yml on the lab, driven by ansible-runner: converge and idempotence, --check --diff on a converged host,
and hosts that must fail with a clear message before any unit changes. (A refused plan: every row of
docs/refusals.md in one aliased run, test_refusals.py; a refusal is decided in site.yml's read-only head whether
the host is fresh or converged.)

Every test here shares the session's one converge (conftest.converge_run) and restores what it changes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from labkit import Run, d3_containers, host_vars, on_host, registry_digest, run_playbook, running, unit_state

pytestmark = pytest.mark.lab

SMOKE_TABLE_TASK = "Print the fleet smoke table"
DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")
# tasks that run on the controller only (no remote call)
CONTROLLER_ACTIONS = {
    f"ansible.builtin.{a}" for a in ("set_fact", "assert", "debug", "include_tasks", "import_tasks", "validate_argument_spec")
}
SMOKE_HEADER = ["host", "instance", "model", "digest", "health", "2q ms", "4q ms", "field report 2q/4q ms"]


def smoke_rows(run: Run) -> list[dict[str, str]]:
    """The rows of the fleet smoke table the d3_smoke role printed (its runner event, not the text output)."""
    events = [d for d in run.results() if d.get("role") == "d3_smoke" and d["task"] == SMOKE_TABLE_TASK]
    assert len(events) == 1, f"expected one '{SMOKE_TABLE_TASK}' result from the d3_smoke role, got {len(events)}"
    lines = events[0]["res"]["msg"]
    assert isinstance(lines, list) and lines, lines
    header = re.split(r"\s{2,}", lines[0].strip())
    assert header == SMOKE_HEADER, lines[0]
    rows = [dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)) for line in lines[1:]]
    return rows


def test_converge_smoke_table_has_a_ready_row_per_instance(converge_run: Run, converged: list[str]) -> None:
    """Every planned instance on every host is running and has a smoke-table row: ready, on the fleet digest,
    with both timed requests measured; and its decision check ran and passed on that host."""
    digest = registry_digest("nightly")
    rows = smoke_rows(converge_run)
    want: set[tuple[str, str]] = set()
    for host in converged:
        containers = d3_containers(host)
        assert len(containers) == len(host_vars(host)["d3_models"]), (host, sorted(containers))
        assert all(c["State"]["Status"] == "running" for c in containers.values()), host
        want |= {(host, name) for name in containers}
        checks = [d for d in converge_run.results(host) if d.get("role") == "d3_smoke" and d["task"] == "Check the decision's shape"]
        assert len(checks) == len(containers) and not any(d["res"].get("failed") for d in checks), (host, checks)
    assert {(r["host"], r["instance"]) for r in rows} == want
    assert len(rows) == len(want), rows
    for row in rows:
        assert row["health"] == "ready", row
        assert digest.startswith(row["digest"]) and len(row["digest"]) == 19, (row, digest)
        assert row["2q ms"].isdigit() and row["4q ms"].isdigit(), row


def commands_run(run: Run, host: str, words: list[str]) -> list[str]:
    """The commands a run executed on a host (command/shell results, loop items included) that start with words."""
    found = []
    for d in run.results(host):
        for res in d["res"].get("results") or [d["res"]]:
            cmd = res.get("cmd") if isinstance(res, dict) else None
            argv = cmd.split() if isinstance(cmd, str) else list(cmd or [])
            if argv[: len(words)] == words:
                found.append(f"{d.get('role')}: {d['task']}")
    return found


def test_one_probe_per_host_per_run(converge_run: Run, converged: list[str]) -> None:
    """The converge reads nvidia-smi once per host and `podman version` once (after installing podman: preflight
    found none): later roles take d3_preflight's facts."""
    for host in converged:
        assert len(commands_run(converge_run, host, ["nvidia-smi"])) == 1, commands_run(converge_run, host, ["nvidia-smi"])
        reads = commands_run(converge_run, host, ["podman", "version"])
        # a second read only when preflight found podman and the podman role's apt step then changed packages
        installed = "Install the podman packages from the distribution" in converge_run.changed_tasks(host)
        again = reads[0].startswith("d3_preflight:") and installed
        assert len(reads) == 1 + again, (reads, installed)


def running_digests(host: str) -> set[str]:
    """The manifest digests of the image every running D3 container of a host was started from."""
    images = [image for image, _ in running(host).values()]
    assert images, f"{host}: no running D3 container"
    digests = {m.group(1) for m in map(DIGEST.search, images) if m}
    assert len(digests) == len(set(images)), f"{host}: an image not pinned by digest: {images}"
    return digests


def test_a_second_run_as_two_parallel_slices_changes_nothing(converged: list[str]) -> None:
    """The second run of the fleet, made the way AWX job slicing makes it (job_slice_count 2): two site.yml runs in
    parallel over disjoint limits, each told its slice (d3_image_slice_count / _number as the job template's extra
    vars: AWX passes a slice no variable of its own, tests/contracts/awx/job-slicing.yml) and the digest a first job
    pinned. Nothing changes and nothing restarts; every host stays on the unsliced converge's digest; on a converged
    host each role reads once (one probe of nvidia-smi and podman, one remote call of the unit and smoke roles)."""
    assert len(converged) >= 3, "slicing needs the 3-host lab (make lab LAB_HOSTS=3)"
    before = {host: unit_state(host) for host in converged}
    unsliced = {host: running_digests(host) for host in converged}
    assert all(len(d) == 1 for d in unsliced.values()), unsliced
    pinned = registry_digest("nightly")  # what a first job (or skopeo inspect) pins for every slice
    slices = [converged[:1], converged[1:]]  # disjoint, together the whole fleet

    def run_slice(number: int) -> Run:
        return run_playbook(
            "site.yml", limit=",".join(slices[number - 1]),
            extravars={"d3_image_slice_count": len(slices), "d3_image_slice_number": number, "d3_image_digest": pinned},
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=len(slices)) as pool:
        runs = list(pool.map(run_slice, range(1, len(slices) + 1)))
    for number, run in enumerate(runs, 1):
        assert run.status == "successful", (number, run.failure_text())
        assert sorted(run.stats.get("ok", {})) == sorted(slices[number - 1]), (number, run.stats)
    sliced = {host: running_digests(host) for host in converged}
    assert sliced == unsliced == {host: {pinned} for host in converged}, (sliced, unsliced, pinned)
    for run, hosts in zip(runs, slices, strict=True):
        for host in hosts:
            assert run.changed(host) == 0, run.changed_tasks(host)
            assert unit_state(host) == before[host], host
            # one probe per host on a converged host too: preflight's reading, nothing read again
            assert commands_run(run, host, ["nvidia-smi"]) == ["d3_preflight: Read the GPUs through the NVIDIA driver"]
            assert commands_run(run, host, ["podman", "version"]) == ["d3_preflight: Read the installed podman version"]
            # on a converged host the unit and smoke roles make one remote call each (issue 14): their one read, and
            # the one smoke call; no write, reload or start runs (a skipped task or loop item makes no call)
            remote = [(d["role"], d["task"]) for d in run.results(host)
                      if d.get("role") in ("d3_units", "d3_smoke") and d.get("task_action") not in CONTROLLER_ACTIONS]  # fmt: skip
            assert remote == [
                ("d3_units", "Read the unit files, the instances' state, the API key secret and stale units (one call)"),
                ("d3_smoke", "Wait until every instance serves, then send each the smoke requests"),
            ], remote


def template_results(run: Run, host: str) -> list[dict[str, Any]]:
    """Per-instance results of the d3_units role's unit template task on a host."""
    events = [d for d in run.results(host) if d.get("role") == "d3_units" and d["task"] == "Template one unit per planned instance"]
    assert len(events) == 1, [d["task"] for d in run.results(host)]
    return events[0]["res"]["results"]


def test_check_diff_shows_only_the_edited_unit_and_changes_nothing(converged: list[str]) -> None:
    """--check --diff with one instance's flag edited (models in the same order): exactly that unit differs, by
    exactly that flag; every other unit is unchanged; nothing on the host changes."""
    host = converged[0]
    models = host_vars(host)["d3_models"]
    edited = dict(models[-1], extra_args=[*models[-1].get("extra_args", []), "--max-model-len=4096"])
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host, extravars={"d3_models": [*models[:-1], edited]}, cmdline="--check --diff")
    assert run.status == "successful", run.failure_text()

    results = template_results(run, host)
    assert len(results) == len(models)
    changed = [r for r in results if r.get("changed")]
    assert len(changed) == 1, [(r["item"]["unit"], r.get("changed")) for r in results]
    unit = changed[0]["item"]["unit"]
    assert unit == results[-1]["item"]["unit"], "the changed unit is not the edited (last) instance's"
    diffs = changed[0]["diff"] if isinstance(changed[0]["diff"], list) else [changed[0]["diff"]]
    contents = [d for d in diffs if isinstance(d.get("after"), str) and d.get("before") != d.get("after")]
    assert len(contents) == 1, diffs
    old, new = contents[0]["before"].splitlines(), contents[0]["after"].splitlines()
    removed = [line for line in old if line not in new]
    added = [line for line in new if line not in old]
    assert len(removed) == 1 and len(added) == 1, (removed, added)
    assert re.search(r"--max-model-len \d+", removed[0]) and "--max-model-len 4096" not in removed[0], removed
    assert added[0] == re.sub(r"--max-model-len \d+", "--max-model-len 4096", removed[0]), (removed, added)
    # the only task changes are that unit's template and what follows from it (no other unit, nothing else)
    assert all(d.get("role") in ("d3_units", "d3_smoke", "d3_state") for d in run.results(host) if d["res"].get("changed")), \
        [(d.get("role"), d["task"]) for d in run.results(host) if d["res"].get("changed")]
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
    assert "d3_units" not in run.roles_run(host), run.roles_run(host)
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
        assert "nvidia.com/gpu=0" in on_host(host, "nvidia-ctk cdi list"), "CDI spec not restored"


def test_missing_cdi_device_stops_the_host_before_units_change(uuid_only_cdi: str) -> None:
    host = uuid_only_cdi
    assert "nvidia.com/gpu=0" not in on_host(host, "nvidia-ctk cdi list")
    before = unit_state(host)
    run = run_playbook("site.yml", limit=host)
    assert run.status == "failed"
    text = run.failure_text(host)
    assert "nvidia.com/gpu=0" in text and host in text
    roles = set(run.roles_run(host))
    assert "nvidia_toolkit" in roles, roles  # ansible-runner's role field is read (the refusal comes from there)
    # d3_units ran only its read-only input checks (site.yml's head runs every role's checks before any change)
    units_tasks = {d["task"] for d in run.results(host) if d.get("role") == "d3_units"}
    assert units_tasks <= {"Refuse unit inputs that could inject into a unit file",
                           "Refuse an API key that cannot be a podman secret's data"}, units_tasks  # fmt: skip
    assert unit_state(host) == before, json.dumps(unit_state(host), indent=1)
