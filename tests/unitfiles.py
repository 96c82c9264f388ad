"""Units as plan.yml renders them, shared by the unit-file tests: tests/test_unit_files.py (plan.yml's line, Quadlet
file and classic unit carry the same container) and tests/lab/test_unit_files_lab.py (the real Quadlet generator and
systemd-analyze accept them)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import yaml
from testkit import ROOT, ansible_playbook

SHA = "89abcdef0123456789abcdef0123456789abcdef"
MODELS = ["d3", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"]
HELPERS = ROOT / "roles" / "d3_units" / "files"  # what the d3_units role installs beside the units


def render_units(tmp: Path, hosts: dict[str, dict]) -> subprocess.CompletedProcess[str]:
    """plan.yml over an inventory of unreachable hosts, rendering both unit styles into tmp/out."""
    unreachable = {"ansible_host": "192.0.2.1", "ansible_port": 1}
    inventory = {"all": {"children": {"l4-nodes": {"hosts": {h: {**unreachable, **v} for h, v in hosts.items()}}}}}
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    # the printed plan read back exactly (printed_podman_runs)
    return ansible_playbook("playbooks/plan.yml", "-i", str(tmp / "hosts.yml"), "-e", f"d3_units_render_dir={tmp / 'out'}",
                            ANSIBLE_CALLBACK_RESULT_FORMAT="json")  # fmt: skip


def printed_podman_runs(stdout: str) -> dict[str, list[str]]:
    """The `podman run` lines plan.yml printed (its "Show the fleet plan" task), split as a shell splits them, by unit."""
    runs: dict[str, list[str]] = {}
    show = stdout.split("TASK [Show the fleet plan", 1)[1].split("TASK [", 1)[0]
    for block in re.findall(r"^ok: \[[^\]]+\] => (\{.*?^\})", show, flags=re.M | re.S):
        for line in json.loads(block)["msg"]:
            if line.lstrip().startswith("podman run "):
                words = shlex.split(line)
                runs[words[words.index("--name") + 1]] = words[2:]
    return runs


def plan_units(tmp: Path) -> tuple[Path, dict[str, list[str]]]:
    """All six sizes rendered by plan.yml into tmp/out: the 27B on a 2 x L4 host, the five others sharing a 4 x L4
    host; and the `podman run` line plan.yml printed for each."""
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
