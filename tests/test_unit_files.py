"""Rendered units checked by the real tools: the Quadlet generator of Debian 13's podman 5.4 (dry run and
generation) and `systemd-analyze verify` for the classic unit and for what Quadlet generates.

The two tool checks (marked lab) run in a container made from the lab's Debian 13 host image plus podman (built
on first use); the comparison of the two styles needs only plan.yml (unit suite)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testkit import ansible_playbook

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
    # the printed plan read back exactly (printed_podman_runs)
    return ansible_playbook("playbooks/plan.yml", "-i", str(tmp / "hosts.yml"), "-e", f"d3_units_render_dir={tmp / 'out'}",
                            ANSIBLE_CALLBACK_RESULT_FORMAT="json")  # fmt: skip


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


def printed_podman_runs(stdout: str) -> dict[str, list[str]]:
    """The `podman run` lines plan.yml printed (its "Show the plan" task), split as a shell splits them, by unit."""
    runs: dict[str, list[str]] = {}
    show = stdout.split("TASK [d3_units : Show the plan]", 1)[1].split("TASK [", 1)[0]
    for block in re.findall(r"^ok: \[[^\]]+\] => (\{.*?^\})", show, flags=re.M | re.S):
        for line in json.loads(block)["msg"]:
            if line.startswith("  podman run "):
                words = shlex.split(line)
                runs[words[words.index("--name") + 1]] = words[2:]
    return runs


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
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
    return tmp / "out", printed_podman_runs(proc.stdout)


@pytest.fixture(scope="module")
def rendered(plan_run: tuple[Path, dict[str, list[str]]]) -> Path:
    return plan_run[0]


# What podman's Quadlet generator turns each [Container] key into (pkg/systemd/quadlet/quadlet.go), and the options
# it adds on its own (and the classic unit's own, `podman generate systemd --new` style): not instance facts.
QUADLET_OPTION = {"ContainerName": "--name", "Pull": "--pull", "AddDevice": "--device", "Network": "--network",
                  "ShmSize": "--shm-size", "Volume": "-v", "Environment": "-e", "Secret": "--secret", "Label": "--label",
                  "DropCapability": "--cap-drop", "AddCapability": "--cap-add"}
LONG_NAMES = {"--env": "-e", "--volume": "-v", "--net": "--network"}
RUNTIME_OPTIONS = {"--cidfile", "--replace", "--rm", "--cgroups", "--sdnotify", "-d", "--detach"}


def quadlet_as_podman_args(text: str) -> list[str]:
    """A .container file's [Container] section as the `podman run` arguments it stands for."""
    section = text.split("[Container]\n", 1)[1].split("\n[", 1)[0]
    options: list[str] = []
    image, exec_args = "", []
    for line in filter(None, section.splitlines()):
        key, value = line.split("=", 1)
        if key == "Image":
            image = value
        elif key == "Exec":
            exec_args = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]
        elif key == "SecurityLabelDisable":
            assert value == "true"
            options += ["--security-opt", "label=disable"]
        elif key == "NoNewPrivileges":
            assert value == "true"
            options += ["--security-opt", "no-new-privileges"]
        else:
            word = shlex.split(value)[0] if key == "Environment" else value
            options += [QUADLET_OPTION[key], word.replace("%%", "%").replace("$$", "$")]
    return [*options, image, *exec_args]


def normalized(args: list[str], image: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(option, value) pairs, sorted, without the runtime's own options; then the image and vLLM's arguments."""
    cut = args.index(image)
    pairs, i = [], 0
    while i < cut:
        word = args[i]
        if "=" in word and word.startswith("--"):
            name, value = word.split("=", 1)
            i += 1
        elif word in RUNTIME_OPTIONS:
            name, value = word, ""
            i += 1
        else:
            name, value = word, args[i + 1]
            i += 2
        if name not in RUNTIME_OPTIONS:
            pairs.append((LONG_NAMES.get(name, name), value))
    return sorted(pairs), args[cut:]


HELPERS = ROOT / "roles" / "d3_units" / "files"
# what the d3_units role installs beside the units (ExecStartPost= of instances that share a GPU)
INSTALL_HELPERS = "install -D -m 0755 /helpers/d3-wait-ready /usr/local/libexec/d3-fleet/d3-wait-ready; "


def in_container(image: str, units: Path, script: str) -> subprocess.CompletedProcess[str]:
    return podman(
        "run", "--rm", "--network", "none", "-v", f"{units}:/units:ro", "-v", f"{HELPERS}:/helpers:ro",
        image, "sh", "-c", INSTALL_HELPERS + script,
    )  # fmt: skip


@pytest.mark.lab
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


@pytest.mark.playbook
def test_plan_line_quadlet_and_classic_unit_carry_the_same_container(plan_run: tuple[Path, dict[str, list[str]]]) -> None:
    """For every catalog model: the `podman run` line plan.yml prints, the Quadlet file and the classic unit carry
    the same arguments, environment, devices, volumes, labels and secret (one renderer, d3_render.py)."""
    rendered, printed = plan_run
    units = {p.stem: p for p in rendered.glob("*/*.container")}
    assert sorted(printed) == sorted(units) == sorted(["d3-27b", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"])
    for name, path in units.items():
        line = printed[name]
        image = next(w for w in line if w.startswith("docker.io/vllm/"))
        quadlet = quadlet_as_podman_args(path.read_text())
        service = path.with_suffix(".service").read_text()
        exec_start = service.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0].replace("\\\n\t", " ")
        classic = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(exec_start)][2:]  # podman run
        want = normalized(line, image)
        assert normalized(quadlet, image) == want, name
        assert normalized(classic, image) == want, name
        assert ("-v", "/var/lib/d3/huggingface:/root/.cache/huggingface:ro") in want[0]
        assert ("-e", "HF_HOME=/root/.cache/huggingface") in want[0]
        assert ("--label", f"io.d3-fleet.instance={name}") in want[0]
        assert any(p[0] == "--device" for p in want[0])
        assert ("--security-opt", "no-new-privileges") in want[0] and ("--cap-drop", "all") in want[0]
        secret = ("--secret", "d3-api-key,type=env,target=VLLM_API_KEY")
        assert (secret in want[0]) == (name != "d3-27b"), name  # the key is set on l4-small only
    # the whole line, as a reader of plan.yml sees it, for the 27B
    assert printed["d3-27b"][:8] == ["--name", "d3-27b", "--pull", "never", "--device", "nvidia.com/gpu=0", "--device",
                                     "nvidia.com/gpu=1"]
