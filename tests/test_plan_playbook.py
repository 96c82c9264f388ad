"""playbooks/plan.yml end to end: it contacts no host when GPUs are declared, prints and writes the plan,
and exits non-zero with the planner's message on every refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_plan(
    tmp_path: Path, hostvars: dict[str, Any], *extra: str, hosts: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    # an address nothing answers on: the play must not need the hosts
    unreachable = {"ansible_host": "192.0.2.1", "ansible_port": 1}
    hosts = hosts or {"l4-test": hostvars}
    inventory = {"all": {"children": {"l4-nodes": {"hosts": {h: {**unreachable, **v} for h, v in hosts.items()}}}}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(inventory))
    return ansible_playbook("playbooks/plan.yml", "-i", str(inv), *extra)


def test_plan_writes_json_and_renders_units_without_contacting_hosts(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    render = tmp_path / "units"
    proc = run_plan(
        tmp_path,
        {"d3_gpu_count": 3, "d3_models": [{"model": "d3"}, {"model": "d3-mini"}, {"model": "d3-edge"}]},
        "-e",
        f"d3_plan_output={out}",
        "-e",
        f"d3_units_render_dir={render}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    plan = json.loads(out.read_text())["l4-test"]
    assert [i["name"] for i in plan["instances"]] == ["d3-27b", "d3-mini", "d3-edge"]
    assert plan["instances"][0]["gpus"] == [0, 1]
    assert "d3-27b: d3 (vllm-sr/d3@UNPINNED) on GPU 0,1, port 8000" in text
    assert "--tensor-parallel-size 2 --max-model-len 8192 --gpu-memory-utilization 0.95" in text
    assert "GPU 2 NVIDIA L4: 15792/22560 MiB budgeted (d3-mini 10152 MiB, d3-edge 5640 MiB; MiB as vLLM sees the GPU)" in text
    for unit in ("d3-27b", "d3-mini", "d3-edge"):
        assert (render / "l4-test" / f"{unit}.container").is_file()
        assert (render / "l4-test" / f"{unit}.service").is_file()
    # the preview runs the d3_image role's default tag (site.yml resolves it to a digest)
    assert "Image=docker.io/vllm/vllm-openai:nightly" in (render / "l4-test" / "d3-mini.container").read_text()


REFUSALS = {
    "unknown-model": ([{"model": "d3-xl"}], "unknown model 'd3-xl'"),
    "tp-larger-than-gpus-given": ([{"model": "d3", "gpus": [0]}], "tensor parallel size 2 needs 2 GPU(s)"),
    "gpu-twice": ([{"model": "d3", "gpus": [0, 0]}], "GPU [0] listed twice"),
    "gpu-out-of-range": ([{"model": "d3-mini", "gpus": [5]}], "GPU index [5] out of range"),
    "vram-over-budget": ([{"model": "d3-flash", "gpus": [0]}, {"model": "d3-nano", "gpus": [0]}], "VRAM over budget on GPU 0"),
    "does-not-fit-l4": ([{"model": "d3", "extra_args": ["--tensor-parallel-size=1"]}], "d3 at TP 1 runs out of memory"),
    "port-collision": ([{"model": "d3-edge", "port": 8100}, {"model": "d3-lite", "port": 8100}], "port 8100 collides"),
    "port-range": ([{"model": "d3-edge", "port": 80}], "port 80 is outside 1024-65535"),
    "duplicate-names": ([{"model": "d3-edge"}, {"model": "d3-lite", "name": "d3-edge"}], "also used by d3_models[0]"),
    "fp8-kv-cache": ([{"model": "d3-mini", "extra_args": ["--kv-cache-dtype=fp8"]}], "not supported for encoder attention"),
    "no-enforce-eager": ([{"model": "d3-mini", "extra_args": ["--no-enforce-eager"]}], "d3_allow_cuda_graphs: true"),
    "max-model-len": ([{"model": "d3-mini", "extra_args": ["--max-model-len=524288"]}], "outside 1..262144"),
}


def test_plan_refuses_each_bad_input(tmp_path: Path) -> None:
    """One host per refusal in one run: every host fails with its own message, and the run exits non-zero."""
    hosts: dict[str, Any] = {f"l4-{case}": {"d3_gpu_count": 2, "d3_models": models} for case, (models, _) in REFUSALS.items()}
    hosts["l4-non-l4"] = {"d3_gpu_count": 1, "d3_gpu_name": "NVIDIA A10G", "d3_models": [{"model": "d3-mini"}]}
    hosts["l4-good"] = {"d3_gpu_count": 1, "d3_models": [{"model": "d3-mini"}]}
    # a good plan with an image name that has no registry: refused by the d3_image role's input checks
    hosts["l4-bad-image"] = {**hosts["l4-good"], "d3_image_name": "vllm/vllm-openai:nightly"}
    proc = run_plan(tmp_path, {}, hosts=hosts)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    expected = {f"l4-{case}": message for case, (_, message) in REFUSALS.items()}
    expected["l4-non-l4"] = "is a NVIDIA A10G, not an NVIDIA L4"
    for host, message in expected.items():
        assert f"host {host}: " in out, host
        assert message in out, (host, message)
        assert f"{host} : ok=" in out and f"{host} : " in out
        recap = out.split(f"{host} : ", 1)[1]
        assert "failed=1" in recap.split("ignored=")[0], (host, recap[:120])
    good = out.split("l4-good : ", 1)[1].split("ignored=")[0]
    assert "failed=0" in good
    assert 'l4-bad-image: d3_image_name = "vllm/vllm-openai:nightly" is not a fully qualified image reference' in out
    assert "failed=1" in out.split("l4-bad-image : ", 1)[1].split("ignored=")[0]


def test_a_host_with_three_mistakes_is_refused_with_all_three_and_its_plan_so_far(tmp_path: Path) -> None:
    """Issue 26: every problem of every host in one run, memory in MiB with who uses what, the fix naming where the
    flag goes, and the refused host's partial plan."""
    three = [
        {"model": "d3-ultra"},  # 1. no such model
        {"model": "d3-flash", "gpus": [0]},
        {"model": "d3-mini", "gpus": [0]},  # 2. GPU 0 over its share cap beside d3-flash
        {"model": "d3-edge", "port": 8100},
        {"model": "d3-lite", "port": 8100},  # 3. the same port twice
    ]
    hosts = {"l4-three": {"d3_gpu_count": 2, "d3_models": three},
             "l4-other": {"d3_gpu_count": 1, "d3_models": [{"model": "d3-mini", "extra_args": ["--max-model-len=131072"]}]}}  # fmt: skip
    proc = run_plan(tmp_path, {}, "-e", "d3_min_concurrency=1", hosts=hosts)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "host l4-three: d3_models[0]: unknown model 'd3-ultra'" in out
    # the cap's arithmetic as the planner checks it (the fourth capacity review: the fractions, then their MiB)
    assert ("host l4-three: d3_models[2] (d3-mini): VRAM over budget on GPU 0: its share of 10152 MiB (--gpu-memory-utilization "
            "0.45 x 22560 MiB) on top of d3-flash 20304 MiB (0.9) makes 0.9 + 0.45 = 1.35 of the GPU (30456 MiB), over the "
            "0.92 (20755.2 MiB) that d3_gpu_share_cap allows") in out  # fmt: skip
    assert "Fix: move d3_models[2] to another GPU (its `gpus:`) or host" in out
    assert "host l4-three: d3_models[4] (d3-lite): port 8100 collides with instance d3-edge" in out
    # the refused host's plan so far, in MiB and with the predicted KV cache
    assert "plan so far (nothing is changed until every problem is fixed):" in out
    assert "d3-flash: d3-flash on GPU 0, port 8000, needs 10305 MiB/GPU of its 20304 MiB share" in out
    assert "GPU 0: 20304/22560 MiB in shares (d3-flash 20304 MiB)" in out
    # the other host's own problem in the same run, with the flag's place
    assert "host l4-other: d3_models[0] (d3-mini): d3-mini at TP 1 is refused by vLLM at startup" in out
    assert "Fix: in d3_models[0].extra_args set --max-model-len=" in out
    for host in hosts:
        assert "failed=1" in out.split(f"{host} : ", 1)[1].split("ignored=")[0], host


def test_the_fleet_is_refused_before_anything_when_a_router_or_the_monitor_is_left_out(tmp_path: Path) -> None:
    """Issue 35: the key only in group_vars/l4-nodes is refused naming d3-routers; the firewall on without the monitor
    in d3_firewall_monitors is refused naming the variable and the group (d3_fleet_problems; one run, whole inventory,
    before the plan is shown). The key never reaches the output, even at -vvv. Then the layout the example documents
    (the key in group_vars/all, the monitor let in) plans."""
    unreachable = {"ansible_host": "192.0.2.1", "ansible_port": 1}
    inventory = {"all": {"children": {
        "l4-nodes": {"hosts": {"l4-a": {**unreachable, "d3_gpu_count": 1, "d3_models": [{"model": "d3-mini"}]}},
                     "vars": {"d3_units_api_key": "k3y-only-on-l4", "d3_firewall_enabled": True,
                              "d3_allowed_clients": ["10.0.0.10"]}},
        "d3-routers": {"hosts": {"router-1": {"ansible_host": "127.0.0.1"}}},
        "d3-monitors": {"hosts": {"mon-1": {"ansible_host": "10.0.0.20", "d3_metrics_runbook_url": "https://w.example/rb"}}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(tmp_path / "hosts.yml"), "-vvv")
    assert proc.returncode != 0
    assert "k3y-only-on-l4" not in proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "router router-1 cannot authenticate to l4-a" in out
    assert "Fix: set d3_units_api_key in group_vars/all (or group_vars/d3-routers)" in out
    assert "host l4-a: the firewall is on (d3_firewall_enabled)" in out
    assert "in d3_firewall_monitors in group_vars/l4-nodes (or group_vars/all)" in out
    assert "d3-mini: d3-mini on GPU 0" not in out  # stopped before the plan is shown
    l4_vars = inventory["all"]["children"]["l4-nodes"]["vars"]
    inventory["all"]["vars"] = {"d3_units_api_key": l4_vars.pop("d3_units_api_key")}  # group_vars/all
    l4_vars["d3_firewall_monitors"] = ["10.0.0.20"]
    l4_vars["d3_listen_address"] = "0.0.0.0"  # the router and the monitor reach it (plan.yml plans them too)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(tmp_path / "hosts.yml"))
    assert proc.returncode == 0, proc.stdout[-3000:]
