"""What site.yml leaves on a host: units of the style podman's version calls for, containers on the digest the
lab registry serves for the fleet's tag (the same on both hosts) with their CDI devices, offline weights, and
instances whose decisions pass the smoke check's own filter."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import testinfra
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "collections"))  # the filters' module_utils imports, and the container label keys
from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_labels  # noqa: E402

# the hosts molecule.yml's verifier runs on (the digest must be the same on all of them)
HOSTS = ("podman://d3-mol-trixie", "podman://d3-mol-bookworm")
LAB_REGISTRY = "127.0.0.1:5000"  # the lab registry, as this machine reaches it (hosts: lab-registry:5000)

EXPECTED = {
    "d3-mol-trixie": {"d3-27b": ([0, 1], 8000), "d3-edge": ([2], 8001)},
    "d3-mol-bookworm": {"d3-mini": ([0], 8000), "d3-lite": ([0], 8100)},
}
SMOKE = yaml.safe_load((ROOT / "roles/d3_smoke/defaults/main.yml").read_text())
PODMAN_DEFAULTS = yaml.safe_load((ROOT / "roles/podman/defaults/main.yml").read_text())
FLEET_VARS = yaml.safe_load((ROOT / "inventories/lab/group_vars/l4-nodes/lab.yml").read_text())


def expected(host: Any) -> dict[str, tuple[list[int], int]]:
    """instance -> (GPUs, port) the plan gives this host's d3_models (molecule/default/host_vars/)."""
    return EXPECTED[host.check_output("hostname")]


def inspect(host: Any, name: str) -> dict[str, Any]:
    return json.loads(host.check_output(f"podman inspect {name}"))[0]


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@functools.cache
def decision_problems() -> Any:
    """The project's d3_decision_problems filter (d3fleet.fleet collection, plugins/filter/d3_smoke.py), as the smoke check uses it."""
    path = ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter/d3_smoke.py"
    spec = importlib.util.spec_from_file_location("d3_smoke_filters", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["d3_decision_problems"]


@functools.cache
def registry_digest(image: str) -> str:
    """The digest the lab registry serves for the fleet image's tag (docker.io/... is mirrored there)."""
    repo, tag = image.split("/", 1)[1].rsplit(":", 1)
    out = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--no-tags", "--format", "{{.Digest}}", f"docker://{LAB_REGISTRY}/{repo}:{tag}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    digest = out.stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    return digest


def image_digests(host: Any) -> set[str]:
    """The digests the D3 containers on a host run: each container's image reference is by digest, and that digest
    is one of the repo digests of the image the container actually runs (podman image inspect)."""
    digests = set()
    for name in EXPECTED[host.check_output("hostname")]:
        info = inspect(host, name)
        assert "@sha256:" in info["ImageName"], (name, info["ImageName"])
        digest = info["ImageName"].split("@", 1)[1]
        image = json.loads(host.check_output(f"podman image inspect {info['Image']}"))[0]
        assert digest in {ref.split("@", 1)[1] for ref in image["RepoDigests"]}, (name, digest, image["RepoDigests"])
        digests.add(digest)
    return digests


def test_units_have_the_style_of_the_podman_version(host: Any) -> None:
    installed = version(host.check_output("podman version --format '{{.Client.Version}}'"))
    floor = version(str(PODMAN_DEFAULTS["podman_quadlet_min_version"]))
    style = "quadlet" if installed >= floor else "classic"
    for name in expected(host):
        quadlet = host.file(f"/etc/containers/systemd/{name}.container")
        classic = host.file(f"/etc/systemd/system/{name}.service")
        if style == "quadlet":
            assert quadlet.exists and not classic.exists, (name, installed, floor)
            assert quadlet.contains("^AddDevice=nvidia.com/gpu=")
            # generated units cannot be enabled; their [Install] section links them
            assert host.run(f"systemctl is-enabled {name}.service").stdout.strip() == "generated"
            assert host.file(f"/run/systemd/generator/multi-user.target.wants/{name}.service").exists
        else:
            assert classic.exists and not quadlet.exists, (name, installed, floor)
            assert classic.contains("--device nvidia.com/gpu=")
            assert host.run(f"systemctl is-enabled {name}.service").stdout.strip() == "enabled"
        assert host.service(f"{name}.service").is_running


def test_containers_run_the_pinned_digest_with_their_gpus(host: Any) -> None:
    """Every container runs the image by digest: the digest the lab registry serves for the fleet's tag, the same
    on every host of the scenario; with its GPUs and only those."""
    want = registry_digest(FLEET_VARS["d3_image_name"])
    for name, (gpus, _port) in expected(host).items():
        info = inspect(host, name)
        assert info["ImageName"].endswith(f"@{want}"), (name, info["ImageName"], want)
        devices = sorted(d["PathInContainer"] for d in info["HostConfig"]["Devices"] if d["PathInContainer"].startswith("/dev/nvidia"))
        assert [f"/dev/nvidia{i}" for i in gpus] == [d for d in devices if d[len("/dev/nvidia"):].isdigit()]
        smi = host.check_output(f"podman exec {name} nvidia-smi -L")
        assert len(smi.splitlines()) == len(gpus) and "NVIDIA L4" in smi
    assert image_digests(host) == {want}
    # across the scenario's hosts: one digest
    assert {d for h in HOSTS for d in image_digests(testinfra.get_host(h))} == {want}


def test_weights_are_offline_and_read_only(host: Any) -> None:
    for name in expected(host):
        env = host.check_output(f"podman exec {name} cat /proc/1/environ").split("\x00")
        assert "HF_HUB_OFFLINE=1" in env
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
        mounts = {m["Destination"]: m for m in inspect(host, name)["Mounts"]}
        assert mounts["/root/.cache/huggingface"]["RW"] is False
        model = inspect(host, name)["Config"]["Labels"][d3_labels.MODEL]
        revision = inspect(host, name)["Config"]["Labels"][d3_labels.REVISION]
        snapshot = host.file(f"/var/lib/d3/huggingface/hub/models--vllm-sr--{model}/snapshots/{revision}")
        assert snapshot.is_directory
        assert host.file(f"{snapshot.path}/config.json").exists
    # the cache is root-only (weights of private repositories), and the containers run hardened (issue 11)
    assert host.file("/var/lib/d3/huggingface").mode == 0o700
    for name in expected(host):
        config = inspect(host, name)
        assert config["HostConfig"]["CapDrop"] and not config["HostConfig"]["CapAdd"], config["HostConfig"]
        assert "no-new-privileges" in " ".join(config["HostConfig"]["SecurityOpt"] or []), config["HostConfig"]


def test_instances_answer_decisions_the_smoke_check_accepts(host: Any) -> None:
    """Each instance answers the smoke check's questions (roles/d3_smoke/defaults/main.yml, with the extra one) in
    a shape d3_decision_problems accepts, picking the expected choice."""
    questions = {**SMOKE["d3_smoke_questions"], **SMOKE["d3_smoke_extra_question"]}
    check = decision_problems()
    for name, (_gpus, port) in expected(host).items():
        body = json.dumps({"model": name, "state": SMOKE["d3_smoke_state"], "questions": questions})
        url = f"http://127.0.0.1:{port}/v1/systemone"
        out = host.run(f"curl -sf -H 'Content-Type: application/json' --data-binary @- {url} <<'EOF'\n{body}\nEOF")
        assert out.rc == 0, (name, out.stderr)
        response = json.loads(out.stdout)
        assert check(response, questions, SMOKE["d3_smoke_expected_choice"]) == [], (name, response)
        assert sorted(response["answers"]) == sorted(questions), (name, response)


def documented_check_differences() -> set[str]:
    """The tasks docs/converge.md names as changing a different number of times under --check than in the real run on
    a fresh host (the list between its two `check-differences` markers)."""
    text = (ROOT / "docs/converge.md").read_text()
    parts = text.split("<!-- check-differences -->")
    assert len(parts) == 3, "docs/converge.md: the list of check-mode differences needs its two markers"
    return set(re.findall(r"^- `([^`]+)`", parts[1], flags=re.M))


def test_a_fresh_hosts_check_predicts_the_runs_changes_or_the_docs_list_the_task() -> None:
    """Issue 35.7: molecule's check step (--check --diff on the fresh hosts) against its converge step, task by task
    (callback_plugins/d3_change_counts.py wrote both). Every task whose change count differs is listed in
    docs/converge.md, and every task listed there differs on at least one host (the list cannot go stale)."""
    out = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "change-counts"
    check = json.loads((out / "converge-check.json").read_text())
    run = json.loads((out / "converge-run.json").read_text())
    assert set(check["recap"]) == set(run["recap"]) == set(EXPECTED), (check["recap"], run["recap"])
    differ: dict[str, list[str]] = {}
    for host in sorted(EXPECTED):
        counts = check["tasks"][host], run["tasks"][host]
        for task in sorted(counts[0].keys() | counts[1].keys()):
            if counts[0].get(task, 0) != counts[1].get(task, 0):
                differ.setdefault(task, []).append(f"{host}: check {counts[0].get(task, 0)}, run {counts[1].get(task, 0)}")
        print(f"{host}: changed={check['recap'][host]} under --check, changed={run['recap'][host]} in the real run")
    for task, where in differ.items():
        print(f"  {task}: {'; '.join(where)}")
    documented = documented_check_differences()
    assert not differ.keys() - documented, f"differ and are not listed in docs/converge.md: {sorted(differ.keys() - documented)}"
    assert not documented - differ.keys(), f"listed in docs/converge.md, do not differ: {sorted(documented - differ.keys())}"
