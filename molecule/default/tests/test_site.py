"""What site.yml leaves on a host: units of the right style, containers on the fleet digest with their CDI
devices, offline weights, and instances that answer decision requests."""

from __future__ import annotations

import json
from typing import Any

import pytest

EXPECTED = {
    "d3-mol-trixie": {"style": "quadlet", "instances": {"d3-27b": ([0, 1], 8000), "d3-edge": ([2], 8001)}},
    "d3-mol-bookworm": {"style": "classic", "instances": {"d3-mini": ([0], 8000), "d3-lite": ([0], 8100)}},
}


def expected(host: Any) -> dict[str, Any]:
    return EXPECTED[host.check_output("hostname")]


def inspect(host: Any, name: str) -> dict[str, Any]:
    return json.loads(host.check_output(f"podman inspect {name}"))[0]


def test_units_have_the_style_of_the_podman_version(host: Any) -> None:
    exp = expected(host)
    for name in exp["instances"]:
        quadlet = host.file(f"/etc/containers/systemd/{name}.container")
        classic = host.file(f"/etc/systemd/system/{name}.service")
        if exp["style"] == "quadlet":
            assert quadlet.exists and not classic.exists
            assert quadlet.contains("^AddDevice=nvidia.com/gpu=")
            # generated units cannot be enabled; their [Install] section links them
            assert host.run(f"systemctl is-enabled {name}.service").stdout.strip() == "generated"
            assert host.file(f"/run/systemd/generator/multi-user.target.wants/{name}.service").exists
        else:
            assert classic.exists and not quadlet.exists
            assert classic.contains("--device nvidia.com/gpu=")
            assert host.run(f"systemctl is-enabled {name}.service").stdout.strip() == "enabled"
        assert host.service(f"{name}.service").is_running


def test_containers_run_the_pinned_digest_with_their_gpus(host: Any) -> None:
    digests = set()
    for name, (gpus, _port) in expected(host)["instances"].items():
        info = inspect(host, name)
        assert "@sha256:" in info["ImageName"]
        digests.add(info["ImageName"])
        devices = sorted(d["PathInContainer"] for d in info["HostConfig"]["Devices"] if d["PathInContainer"].startswith("/dev/nvidia"))
        assert [f"/dev/nvidia{i}" for i in gpus] == [d for d in devices if d[len("/dev/nvidia"):].isdigit()]
        smi = host.check_output(f"podman exec {name} nvidia-smi -L")
        assert len(smi.splitlines()) == len(gpus) and "NVIDIA L4" in smi
    assert len(digests) == 1


def test_weights_are_offline_and_read_only(host: Any) -> None:
    for name in expected(host)["instances"]:
        env = host.check_output(f"podman exec {name} cat /proc/1/environ").split("\x00")
        assert "HF_HUB_OFFLINE=1" in env
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
        mounts = {m["Destination"]: m for m in inspect(host, name)["Mounts"]}
        assert mounts["/root/.cache/huggingface"]["RW"] is False
        model = inspect(host, name)["Config"]["Labels"]["io.d3-fleet.model"]
        revision = inspect(host, name)["Config"]["Labels"]["io.d3-fleet.revision"]
        snapshot = host.file(f"/var/lib/d3/huggingface/hub/models--vllm-sr--{model}/snapshots/{revision}")
        assert snapshot.is_directory
        assert host.file(f"{snapshot.path}/config.json").exists


@pytest.mark.parametrize("question_type", ["choice", "noul", "score"])
def test_instances_answer_decisions(host: Any, question_type: str) -> None:
    questions = {
        "choice": {"q": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "shipping": None}}},
        "noul": {"q": {"type": "noul", "instructions": "Is it urgent?"}},
        "score": {"q": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]}},
    }[question_type]
    for name, (_gpus, port) in expected(host)["instances"].items():
        body = json.dumps({"model": name, "state": "My card was charged twice.", "questions": questions})
        out = host.check_output(f"curl -sf -H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:{port}/v1/systemone")
        answer = json.loads(out)["answers"]["q"]
        assert answer["type"] == question_type
        assert abs(sum(answer["probabilities"].values()) - 1.0) < 1e-6
        assert 0.0 <= answer["confidence"] <= 1.0
