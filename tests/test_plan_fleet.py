"""playbooks/plan.yml over a whole inventory in one run (issue 35 items 2 and 3; issue 33 item 5): the six-host example
(inventories/six-hosts: six GPU hosts, two routers, a monitor, the API key from Ansible Vault, a registry and a Hugging
Face mirror) with every host, router and monitor by name; the rollout's drain check said before anything is pulled;
and a refused fleet through the fleet callback, one problem per line under its host, with "did you mean"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
SIX = ROOT / "inventories/six-hosts"
FLEET_CALLBACK = {"ANSIBLE_STDOUT_CALLBACK": "d3fleet.fleet.fleet"}


def vault(tmp: Path) -> list[str]:
    """The example vault's password (its file says it: an example) in a file only this test reads."""
    said = re.search(r'vault password is "([^"]+)"', (SIX / "group_vars/all/vault.yml").read_text())
    assert said, "the example vault file names its example password"
    path = tmp / "vault-password"
    path.write_text(said.group(1) + "\n")
    path.chmod(0o600)
    return ["--vault-password-file", str(path)]


@pytest.fixture(scope="module")
def six(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """One plan of the example (with its example vault password: the checks across groups compare the keys), as JSON."""
    tmp = tmp_path_factory.mktemp("six")
    out = tmp / "plan.json"
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(SIX), *vault(tmp), "-e", f"d3_plan_output={out}", **FLEET_CALLBACK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_the_example_plans_every_host_router_and_monitor_by_name(six: tuple[str, dict]) -> None:
    out, plan = six
    lines = out.splitlines()
    hosts = [f"l4-0{i}" for i in range(1, 7)]
    for host in hosts:
        assert any(line.startswith(f"== {host}: ") for line in lines), host
    assert sorted(plan) == hosts
    for router in ("router-1", "router-2"):
        assert f"== {router} (d3-routers): fleet endpoint port 8000 (/v1/systemone, /v1/models, /health), metrics port 8405" in lines
    assert any(line.startswith("== monitor-1 (d3-monitors): 31 scrape target(s) "
                               "(d3-alertmanager 1, d3-node 9, d3-prometheus 1, d3-router 2, d3-vllm 18)")
               for line in lines)  # fmt: skip
    assert "  d3-mini (d3-mini, fleet endpoint only): backend be_d3-mini, 8 server(s): l4-05 10.0.1.15:8000, " \
           "l4-05 10.0.1.15:8001, l4-05 10.0.1.15:8002, l4-05 10.0.1.15:8003, l4-06 10.0.1.16:8000, l4-06 10.0.1.16:8001, " \
           "l4-06 10.0.1.16:8002, l4-06 10.0.1.16:8003" in lines  # fmt: skip
    assert ("== remaps: images docker.io -> registry-mirror.example.internal:5000; weights from "
            "https://hf-mirror.example.internal (d3_weights_hf_endpoint)") in lines  # fmt: skip
    rollout = lines.index("== rollout (d3_rollout_serial [1, 2], d3_rollout_max_unavailable 2): batch 1: l4-01 | "
                          "batch 2: l4-02, l4-03 | batch 3: l4-04, l4-05 | batch 4: l4-06")  # fmt: skip
    assert lines[rollout + 1] == "  drain check: passes"
    assert "fleet: 6 host(s), 24 GPU(s), 18 instance(s)" in lines
    kv = {m: sum(i["kv_cache"]["gpu_kv_cache_tokens"] for p in plan.values() for i in p["instances"] if i["model"] == m)
          for m in ("d3", "d3-flash", "d3-lite", "d3-mini")}  # fmt: skip
    start = lines.index("fleet: 6 host(s), 24 GPU(s), 18 instance(s)") + 2
    rows = {line.split()[0]: line.split()[1:] for line in lines[start : start + 4]}
    assert rows == {"d3": ["4", f"{kv['d3']:,}"], "d3-flash": ["2", f"{kv['d3-flash']:,}"],
                    "d3-lite": ["4", f"{kv['d3-lite']:,}"], "d3-mini": ["8", f"{kv['d3-mini']:,}"]}  # fmt: skip
    # the vaulted key is set: every instance requires it
    assert all("--secret d3-api-key,type=env,target=VLLM_API_KEY" in line for line in lines if line.strip().startswith("podman run"))
    assert "firewall: on (d3_firewall_enabled): model ports 8000, 8001 from 10.0.1.2, 10.0.1.3" in out


def test_the_plan_s_rollout_defaults_are_rollout_yml_s() -> None:
    from d3_fleet_plan import ROLLOUT_DEFAULTS

    rollout_yml = (ROOT / "playbooks/rollout.yml").read_text()
    serial, unavailable, up = ROLLOUT_DEFAULTS.values()
    assert f"d3_rollout_serial | default({serial!r})".replace('"', "'") in rollout_yml
    assert f"d3_rollout_max_unavailable | default({unavailable}), d3_rollout_min_up | default({up})" in rollout_yml


def test_the_example_s_vault_file_is_yaml_that_yamllint_passes() -> None:
    vault = (SIX / "group_vars/all/vault.yml").read_text()
    assert vault.startswith("---\n") and "$ANSIBLE_VAULT;1.1;AES256" in vault
    assert "vault_d3_units_api_key" in yaml.safe_load((SIX / "group_vars/all/main.yml").read_text())["d3_units_api_key"]


def test_the_default_batches_are_refused_by_the_plan_before_anything_is_pulled(tmp_path: Path) -> None:
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(SIX), *vault(tmp_path), "-e", '{"d3_rollout_serial": [1, "25%", "100%"]}',
                            "-e", "d3_rollout_max_unavailable=1", **FLEET_CALLBACK)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    refusal = ("  rollout.yml would refuse, before staging pulls anything: batch 3 (l4-03, l4-04, l4-05, l4-06) would "
               "drain 2 of the 8 replicas of d3-mini at once (on l4-05, l4-06; d3_rollout_max_unavailable = 1). Fix: a "
               "smaller d3_rollout_serial (e.g. 1), or place the replicas on hosts that fall in different batches.")
    assert refusal in proc.stdout.splitlines()


def test_a_refused_fleet_prints_one_problem_per_line_under_its_host(tmp_path: Path) -> None:
    hosts = {
        "l4-typo": {"d3_gpu_count": 2, "d3_models": [{"model": "d3-mnii"}, {"model": "d3", "variant": "fp9"}]},
        "l4-twice": {"d3_gpu_count": 2, "d3_models": [{"model": "d3-edge", "gpus": [0, 0], "port": 8100},
                                                      {"model": "d3-lite", "port": 8100}]},
        "l4-good": {"d3_gpu_count": 1, "d3_models": [{"model": "d3-mini"}]},
    }
    unreachable = {"ansible_host": "192.0.2.1", "ansible_port": 1}
    inventory = {"all": {"children": {"l4-nodes": {"hosts": {h: {**unreachable, **v} for h, v in hosts.items()}},
                                      "d3-router": {"hosts": {"router-1": unreachable}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(tmp_path / "hosts.yml"), **FLEET_CALLBACK)
    assert proc.returncode != 0
    lines = proc.stdout.splitlines()
    typo = lines.index("FAILED l4-typo [play tasks] Refuse a plan that cannot work (every problem of every host in one run):")
    assert lines[typo + 1].startswith("  host l4-typo: d3_models[0]: unknown model 'd3-mnii' (did you mean 'd3-mini'?). "
                                      "Fix: set d3_models[0].model to one of: ")  # fmt: skip
    assert lines[typo + 2].startswith("  host l4-typo: d3_models[1] (d3-27b): d3 has no variant 'fp9' (did you mean 'fp8'?). "
                                      "Fix: set d3_models[1].variant to one of: ")  # fmt: skip
    twice = lines.index("FAILED l4-twice [play tasks] Refuse a plan that cannot work (every problem of every host in one run):")
    assert lines[twice + 1] == ("  host l4-twice: d3_models[0] (d3-edge): GPU [0] listed twice in d3_models[0].gpus. "
                                "Fix: list each GPU once")  # fmt: skip
    assert lines[twice + 2] == ("  host l4-twice: d3_models[1] (d3-lite): port 8100 collides with instance d3-edge. "
                                "Fix: give each instance its own port")  # fmt: skip
    # the misspelt group, under the play's first host (the router of the misnamed group), naming the group to set
    assert ("FAILED router-1 [play tasks] Refuse a plan that cannot work (every problem of every host in one run): "
            "inventory group 'd3-router': no play reads it (did you mean 'd3-routers'?). Fix: rename the group to "
            "d3-routers in the inventory (the playbooks run on l4-nodes, d3-routers and d3-monitors)") in lines
    assert not any(line.count("host l4-") > 1 for line in lines)  # no problem list joined into one line
    assert "== l4-good: 1 instance(s) on 1 GPU(s)" in lines
