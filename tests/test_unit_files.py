"""Rendered units checked by the real tools: the Quadlet generator of Debian 13's podman 5.4 (dry run and
generation) and `systemd-analyze verify` for the classic unit and for what Quadlet generates.

The two tool checks (marked lab) run in a container made from the lab's Debian 13 host image plus podman (built
on first use); the comparison of the two styles needs only plan.yml (unit suite)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

BASE = "localhost/d3-lab-host-trixie:latest"
IMAGE = "localhost/d3-unitcheck-trixie:latest"
SHA = "89abcdef0123456789abcdef0123456789abcdef"
MODELS = ["d3", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"]


def render_units(tmp: Path, hosts: dict[str, dict]) -> subprocess.CompletedProcess[str]:
    """plan.yml over an inventory of unreachable hosts, rendering both unit styles into tmp/out."""
    unreachable = {"ansible_host": "192.0.2.1", "ansible_port": 1}
    inventory = {"all": {"children": {"l4-nodes": {"hosts": {h: {**unreachable, **v} for h, v in hosts.items()}}}}}
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "playbooks/plan.yml", "-i", str(tmp / "hosts.yml"), "-e", f"d3_units_render_dir={tmp / 'out'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def podman(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def unitcheck_image() -> str:
    if podman("image", "exists", IMAGE).returncode == 0:
        return IMAGE
    assert podman("image", "exists", BASE).returncode == 0, f"{BASE} is missing: run `make lab-images`"
    podman("rm", "-f", "d3-unitcheck-build")
    build = podman(
        "run", "--name", "d3-unitcheck-build", "--network", "slirp4netns", BASE, "sh", "-c",
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman"
        " >/dev/null && rm -rf /var/lib/apt/lists/*",
        timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    assert podman("commit", "-q", "d3-unitcheck-build", IMAGE).returncode == 0
    podman("rm", "-f", "d3-unitcheck-build")
    return IMAGE


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All six sizes rendered by plan.yml: the 27B on a 2 x L4 host, the five others sharing a 4 x L4 host."""
    tmp = tmp_path_factory.mktemp("units")
    hosts = {
        "l4-big": {"d3_gpu_count": 2, "d3_models": [{"model": "d3"}], "d3_model_revisions": {"d3": SHA}},
        "l4-small": {
            "d3_gpu_count": 4,
            "d3_models": [{"model": m} for m in MODELS[1:]],
            "d3_model_revisions": dict.fromkeys(MODELS[1:], SHA),
            "d3_units_api_key": "not-a-real-key",
        },
    }
    proc = render_units(tmp, hosts)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return tmp / "out"


HELPERS = ROOT / "roles" / "d3_units" / "files"
# what the d3_units role installs beside the units (ExecStartPost= of instances that share a GPU)
INSTALL_HELPERS = "install -D -m 0755 /helpers/d3-wait-ready /usr/local/libexec/d3-fleet/d3-wait-ready; "


def in_container(image: str, units: Path, script: str) -> subprocess.CompletedProcess[str]:
    return podman(
        "run", "--rm", "--network", "none", "-v", f"{units}:/units:ro", "-v", f"{HELPERS}:/helpers:ro",
        image, "sh", "-c", INSTALL_HELPERS + script,
    )  # fmt: skip


@pytest.mark.lab
def test_quadlet_generator_accepts_every_container_file(unitcheck_image: str, rendered: Path) -> None:
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
    small = out.split("---d3-mini.service---", 1)[1].split("---", 1)[0]
    assert "--secret d3-api-key,type=env,target=VLLM_API_KEY" in small
    assert "not-a-real-key" not in out


@pytest.mark.lab
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


def test_classic_unit_runs_the_same_command(rendered: Path) -> None:
    """The classic unit carries the same image, devices, args, env and read-only cache as the Quadlet file."""
    service = (rendered / "l4-big" / "d3-27b.service").read_text()
    container = (rendered / "l4-big" / "d3-27b.container").read_text()
    exec_line = container.split("\nExec=", 1)[1].splitlines()[0]
    assert exec_line in service.replace("\\\n\t", "")
    for device in ("nvidia.com/gpu=0", "nvidia.com/gpu=1"):
        assert f"--device {device}" in service and f"AddDevice={device}" in container
    assert "--shm-size 10g" in service and "ShmSize=10g" in container
    assert "-v /var/lib/d3/huggingface:/root/.cache/huggingface:ro" in service
    assert "-e HF_HUB_OFFLINE=1" in service and "Environment=HF_HUB_OFFLINE=1" in container
    assert "Restart=on-failure" in service and "Restart=on-failure" in container
    assert "TimeoutStartSec=900" in service and "TimeoutStartSec=900" in container
    assert service.startswith("#\n# Ansible managed") and container.startswith("#\n# Ansible managed")
