"""Rendered units checked by the real tools: the Quadlet generator of Debian 13's podman 5.4 (dry run and
generation) and `systemd-analyze verify` for the classic unit and for what Quadlet generates. They run in a container
made from the lab's Debian 13 host image plus podman (labkit.host_image_with_podman, built on first use). The units:
plan.yml's (tests/unitfiles.py)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import labkit
import pytest
from labkit import podman
from unitfiles import HELPERS, SHA, normalized, plan_units

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    return plan_units(tmp_path_factory.mktemp("units"))


@pytest.fixture(scope="module")
def rendered(plan_run: tuple[Path, dict[str, list[str]]]) -> Path:
    return plan_run[0]


@pytest.fixture(scope="module")
def unitcheck_image() -> str:
    """Debian 13's lab host image with podman 5.4 (built once and kept; the NVIDIA stand-in tests share it)."""
    return labkit.host_image_with_podman("trixie")


# what the d3_units role installs beside the units (ExecStartPost= of instances that share a GPU)
INSTALL_HELPERS = "install -D -m 0755 /helpers/d3-wait-ready /usr/local/libexec/d3-fleet/d3-wait-ready; "


def in_container(image: str, units: Path, script: str) -> subprocess.CompletedProcess[str]:
    return podman(
        "run", "--rm", "--network", "none", "-v", f"{units}:/units:ro", "-v", f"{HELPERS}:/helpers:ro",
        image, "sh", "-c", INSTALL_HELPERS + script,
    )  # fmt: skip


def test_quadlet_generator_accepts_every_container_file(unitcheck_image: str, plan_run: tuple[Path, dict[str, list[str]]]) -> None:
    """podman 5.4's Quadlet generator takes every .container file and writes the very container plan.yml prints."""
    rendered, printed = plan_run
    proc = in_container(
        unitcheck_image,
        rendered,
        "cp /units/*/*.container /etc/containers/systemd/ && /usr/libexec/podman/quadlet -dryrun -no-kmsg-log",
    )
    assert proc.returncode == 0, proc.stderr
    assert "rror" not in proc.stderr, proc.stderr
    out = proc.stdout
    for name in ["d3-27b", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"]:
        assert f"---{name}.service---" in out
    section = out.split("---d3-27b.service---", 1)[1].split("---", 1)[0]
    exec_start = next(line for line in section.splitlines() if line.startswith("ExecStart="))
    args = shlex.split(exec_start.removeprefix("ExecStart="))
    assert args[0] == "/usr/bin/podman" and "run" in args
    for expected in (
        ["--device", "nvidia.com/gpu=0"],
        ["--device", "nvidia.com/gpu=1"],
        ["--shm-size", "10g"],
        ["--network", "host"],
        ["-v", "/var/lib/d3/huggingface:/root/.cache/huggingface:ro"],
        ["--env", "HF_HUB_OFFLINE=1"],
        ["--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"],
    ):
        assert any(args[i : i + 2] == expected for i in range(len(args) - 1)), (expected, args)
    tail = args[args.index("docker.io/vllm/vllm-openai:nightly") + 1 :]
    assert tail[:4] == ["--model", "vllm-sr/d3", "--revision", SHA]
    assert "--enforce-eager" in tail and tail[tail.index("--tensor-parallel-size") + 1] == "2"
    assert "WantedBy=multi-user.target" in section
    for name, line in printed.items():
        generated = out.split(f"---{name}.service---", 1)[1].split("---", 1)[0]
        words = shlex.split(next(w for w in generated.splitlines() if w.startswith("ExecStart=")).removeprefix("ExecStart="))
        assert words[:2] == ["/usr/bin/podman", "run"], words
        image = next(w for w in line if w.startswith("docker.io/vllm/"))
        assert normalized(words[2:], image) == normalized(line, image), name
    small = out.split("---d3-mini.service---", 1)[1].split("---", 1)[0]
    assert "--secret d3-api-key,type=env,target=VLLM_API_KEY" in small
    assert "not-a-real-key" not in out


def test_systemd_accepts_classic_and_generated_units(unitcheck_image: str, rendered: Path) -> None:
    script = (
        "set -e; cp /units/*/*.service /etc/systemd/system/;"
        " cp /units/*/*.container /etc/containers/systemd/;"
        " mkdir -p /run/gen && /usr/libexec/podman/quadlet -no-kmsg-log /run/gen;"
        " for u in /etc/systemd/system/d3-*.service /run/gen/d3-*.service; do"
        "   echo \"== $u\"; systemd-analyze verify --man=no \"$u\" 2>&1; done"
    )
    proc = in_container(unitcheck_image, rendered, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verified = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert len(verified) == 12  # 6 classic + 6 generated from Quadlet
    complaints = [line for line in proc.stdout.splitlines() if line and not line.startswith("== ")]
    assert complaints == [], complaints
