"""The one-pass fleet plan (filter d3fleet.fleet.d3_fleet_plan, what playbooks/plan.yml runs once for the whole
inventory): every host planned by the per-host planner, refusals per host with the host's plan so far, the image and
unit input checks, the role d3 argument spec, "did you mean", and the fleet summary. No Ansible, no podman."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_fleet_plan import (
    BOOL_OPTION_VARS,
    OPTION_VARS,
    PLAN_VARS,
    FilterModule,
    declared_gpus,
    did_you_mean,
    fleet_place_options,
    fleet_plan,
    hub_warning,
    image_checks,
    image_problems,
    plan_option_vars,
    plan_options,
    spec_problems,
    summary,
    truthy,
    unit_problems,
)
from d3_planner import d3_plan
from l4 import l4_gpus
from testkit import ansible_playbook

ROOT = Path(__file__).resolve().parents[1]
VARS = yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())
CATALOG, COMMON = VARS["d3_catalog"], VARS["d3_catalog_common"]
D3_SPEC = yaml.safe_load((ROOT / "roles/d3/meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
IMAGE = "docker.io/vllm/vllm-openai:nightly"
THREE = [{"model": "d3-flash"}, {"model": "d3-mini"}, {"model": "d3-edge"}]


def host(**extra: Any) -> dict[str, Any]:
    return {"d3_gpu_count": 4, "d3_models": THREE, "d3_image_name": IMAGE, "d3_image_anonymous_pull_warn_hosts": 3, **extra}


def test_the_option_mapping_has_one_place() -> None:
    """roles/d3/tasks/main.yml names no planner option: it looks up the variables d3_plan_option_vars names and passes
    them through d3_plan_options / d3_fleet_place_options, the functions plan.yml's one pass uses (OPTION_VARS)."""
    text = (ROOT / "roles/d3/tasks/main.yml").read_text()
    assert re.findall(r"'(\w+)': d3_\w+", text) == []  # no 'option': variable pair left in the role
    assert "d3fleet.fleet.d3_plan_options(" in text and "d3fleet.fleet.d3_fleet_place_options" in text
    assert "d3fleet.fleet.d3_plan_option_vars" in text
    names = plan_option_vars()
    assert set(OPTION_VARS.values()) | set(BOOL_OPTION_VARS.values()) <= set(names) <= set(PLAN_VARS)
    assert fleet_place_options({"d3_allow_non_l4": "yes", "d3_gpu_share_cap": 0.9, "d3_port_base": 9000}) == {
        "allow_non_l4": True, "allow_cuda_graphs": False, "vram_overhead_mib": None, "min_concurrency": None,
        "gpu_share_cap": 0.9, "cuda_compat": False}  # fmt: skip
    assert plan_options({}, ["10.0.0.1"])["host_addresses"] == ["10.0.0.1"]


@pytest.mark.playbook
def test_the_d3_role_plans_with_the_one_mapping(tmp_path: Path) -> None:
    """The role's options reach the planner: a port base, a bool given as 'yes', an unset share cap (the default)."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"d3_gpu_count": 2, "d3_models": [{"model": "d3-edge"}, {"model": "d3-lite"}], "d3_port_base": 9100,
                 "d3_allow_non_l4": "yes", "d3_require_pinned_revisions": False},
        "tasks": [{"ansible.builtin.include_role": {"name": "d3"}},
                  {"ansible.builtin.assert": {"that": ["d3_host_plan.errors == []",
                                                       "d3_host_plan.instances | map(attribute='port') | list == [9100, 9101]"]}}],
    }]))  # fmt: skip
    proc = ansible_playbook(str(play), "-i", "localhost,")
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_plan_options_from_variables() -> None:
    v = {"d3_port_base": 9000, "d3_allow_non_l4": "yes", "d3_model_revisions": {"d3": "a" * 40},
         "d3_units_api_key": "k", "d3_container_capabilities": ["SYS_NICE"]}  # fmt: skip
    opts = plan_options(v)
    assert opts["port_base"] == 9000 and opts["listen_address"] is None
    assert opts["allow_non_l4"] is True and opts["allow_cuda_graphs"] is False
    assert opts["revisions"] == {"d3": "a" * 40}
    assert opts["api_key_set"] is True and opts["capabilities"] == ["SYS_NICE"] and opts["host_addresses"] is None
    override = plan_options({**v, "d3_model_revisions_override": {"d3": "b" * 40}})
    assert override["revisions"] == {"d3": "b" * 40}
    assert plan_options({})["revisions"] == {} and plan_options({})["api_key_set"] is False
    assert plan_options({})["capabilities"] == []


@pytest.mark.parametrize(("value", "want"), [("yes", True), (" True ", True), ("on", True), ("1", True), ("y", True),
                                             ("t", True), ("no", False), ("false", False), ("", False), (1, True),
                                             (0, False), (True, True)])  # fmt: skip
def test_truthy_is_ansible_s_bool(value: Any, want: bool) -> None:
    assert truthy(value) is want


def test_declared_gpus() -> None:
    assert declared_gpus({"d3_gpu_count": 2}, COMMON) == l4_gpus(2)
    a10 = declared_gpus({"d3_gpu_count": 1, "d3_gpu_memory_mib": 22000, "d3_gpu_name": "NVIDIA A10G"}, COMMON)
    assert a10 == [{"index": 0, "name": "NVIDIA A10G", "memory_total_mib": 22000}]
    assert declared_gpus({}, COMMON) is None
    assert declared_gpus({"d3_preflight_gpus": l4_gpus(1)}, COMMON) == l4_gpus(1)


def test_each_host_is_planned_as_the_per_host_planner_plans_it() -> None:
    fleet = fleet_plan({"l4-b": host(), "l4-a": host(d3_models=[{"model": "d3"}], d3_gpu_count=2)}, CATALOG, COMMON)
    alone = d3_plan(THREE, CATALOG, COMMON, l4_gpus(4), "l4-b", plan_options(host()))
    assert fleet["hosts"]["l4-b"]["plan"] == alone
    assert fleet["plans"] == {"l4-a": fleet["hosts"]["l4-a"]["plan"], "l4-b": alone}
    assert fleet["problems"] == {} and fleet["probe"] == [] and fleet["warnings"] == []
    report = fleet["hosts"]["l4-a"]["report"]
    assert report[0] == "== l4-a: 1 instance(s) on 2 GPU(s)"
    assert report[1].startswith("  d3-27b: d3 (vllm-sr/d3@UNPINNED) on GPU 0,1, port 8000")
    lines = fleet["lines"]
    assert lines.index("== l4-a: 1 instance(s) on 2 GPU(s)") < lines.index("== l4-b: 3 instance(s) on 4 GPU(s)")
    assert lines[-len(fleet["summary"]):] == fleet["summary"]
    assert fleet["hosts"]["l4-a"]["image"] == IMAGE


def test_the_summary_counts_hosts_gpus_instances_replicas_and_kv_tokens() -> None:
    fleet = fleet_plan({f"l4-{i}": host() for i in range(3)}, CATALOG, COMMON)
    kv = {i["model"]: i["kv_cache"]["gpu_kv_cache_tokens"] for i in fleet["hosts"]["l4-0"]["plan"]["instances"]}
    assert fleet["summary"][0] == "fleet: 3 host(s), 12 GPU(s), 9 instance(s)"
    assert fleet["summary"][1].split() == ["model", "replicas", "KV", "tokens", "(sum", "of", "the", "instances'", "GPU",
                                           "KV", "cache,", "predicted)"]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in fleet["summary"][2:]}
    assert rows == {m: ["3", f"{3 * kv[m]:,}"] for m in ("d3-edge", "d3-flash", "d3-mini")}
    assert list(rows) == sorted(rows)


def test_summary_of_a_refused_fleet_says_how_many_hosts_are_refused() -> None:
    fleet = fleet_plan({"l4-a": host(), "l4-b": host(d3_models=[{"model": "d3-xl"}])}, CATALOG, COMMON)
    assert fleet["summary"][0] == "fleet: 2 host(s), 8 GPU(s), 3 instance(s), 1 host(s) refused"
    assert summary({}) == ["fleet: 0 host(s), 0 GPU(s), 0 instance(s)",
                           "  model  replicas  KV tokens (sum of the instances' GPU KV cache, predicted)"]  # fmt: skip


def test_a_refused_host_gets_its_problems_and_plan_so_far_and_no_report_lines() -> None:
    bad = [{"model": "d3-falsh"}, {"model": "d3-flash", "gpus": [0]}, {"model": "d3-mini", "gpus": [0]}]
    fleet = fleet_plan({"l4-a": host(), "l4-z": host(d3_models=bad)}, CATALOG, COMMON)
    lines = fleet["problems"]["l4-z"]
    assert lines[0] == ("host l4-z: d3_models[0]: unknown model 'd3-falsh' (did you mean 'd3-flash'?). Fix: set "
                        "d3_models[0].model to one of: " + ", ".join(sorted(CATALOG)))  # fmt: skip
    assert lines[1].startswith("host l4-z: d3_models[2] (d3-mini): VRAM over budget on GPU 0")
    assert lines[2] == "plan so far (nothing is changed until every problem is fixed):"
    assert lines[3].startswith("d3-flash: d3-flash on GPU 0, port 8000")
    assert fleet["hosts"]["l4-z"]["report"] == ["== l4-z: 0 instance(s) on 4 GPU(s)"]
    assert "== l4-z: 0 instance(s) on 4 GPU(s)" not in fleet["lines"]
    assert "l4-a" not in fleet["problems"]


def test_a_refusal_without_a_partial_plan_has_no_plan_so_far_line() -> None:
    fleet = fleet_plan({"l4-a": host(d3_image_name="vllm/vllm-openai:nightly")}, CATALOG, COMMON)
    assert fleet["problems"]["l4-a"][0].startswith('l4-a: d3_image_name = "vllm/vllm-openai:nightly" is not')
    assert len(fleet["problems"]["l4-a"]) == 1


def test_did_you_mean() -> None:
    assert did_you_mean("d3-mnii", CATALOG) == " (did you mean 'd3-mini'?)"
    assert did_you_mean("llama", CATALOG) == ""
    assert did_you_mean(None, ["d3"]) == ""


def test_a_host_without_declared_gpus_is_left_to_the_probe() -> None:
    fleet = fleet_plan({"l4-a": host(), "l4-probe": {"d3_models": THREE}}, CATALOG, COMMON)
    assert fleet["probe"] == ["l4-probe"] and "l4-probe" not in fleet["hosts"]
    assert fleet["summary"][0].startswith("fleet: 1 host(s)")


def test_an_empty_fleet() -> None:
    fleet = fleet_plan({}, CATALOG, COMMON)
    assert fleet["hosts"] == {} and fleet["lines"] == summary({}) and fleet["warnings"] == []


def test_fleet_replicas_are_placed_once_and_planned_on_their_hosts() -> None:
    replicas = [{"model": "d3-mini", "replicas": 2}]
    hosts = {h: host(d3_gpu_count=1, d3_models=[], d3_fleet_models=replicas) for h in ("l4-a", "l4-b")}
    fleet = fleet_plan(hosts, CATALOG, COMMON)
    assert [i["model"] for h in ("l4-a", "l4-b") for i in fleet["hosts"][h]["plan"]["instances"]] == ["d3-mini"] * 2
    assert fleet["lines"][0] == "fleet placement (d3_fleet_models):"
    assert fleet["lines"][1:1 + len(fleet["placement"]["table"])] == fleet["placement"]["table"]


def test_a_limit_run_places_replicas_over_the_whole_group() -> None:
    """Only l4-a is planned (a --limit), yet the replica lands where a full run puts it: the group's other hosts
    count, with their variables from ``others``."""
    replicas = [{"model": "d3-mini", "replicas": 1}]
    both = {h: {"d3_gpu_count": 1, "d3_image_name": IMAGE, "d3_fleet_models": replicas} for h in ("l4-a", "l4-b")}
    full = fleet_plan(both, CATALOG, COMMON)
    where = next(h for h in both if full["hosts"][h]["plan"]["instances"])
    other = "l4-b" if where == "l4-a" else "l4-a"
    limited = fleet_plan({other: both[other]}, CATALOG, COMMON, group=["l4-a", "l4-b"], others={where: both[where]})
    assert limited["hosts"][other]["plan"]["instances"] == []
    alone = fleet_plan({other: both[other]}, CATALOG, COMMON)
    assert len(alone["hosts"][other]["plan"]["instances"]) == 1


def test_a_refused_placement_is_listed_under_the_first_host_and_named_on_the_others() -> None:
    replicas = [{"model": "d3", "replicas": 3}]
    hosts = {h: {"d3_gpu_count": 2, "d3_image_name": IMAGE, "d3_fleet_models": replicas} for h in ("l4-a", "l4-b")}
    fleet = fleet_plan(hosts, CATALOG, COMMON)
    errors = fleet["placement"]["errors"]
    assert errors and fleet["problems"]["l4-a"][: len(errors) + 1] == [*errors, "fleet placed so far:"]
    assert fleet["problems"]["l4-b"][0] == (
        f"d3_fleet_models: the fleet placement is refused ({len(errors)} problem(s), listed under l4-a)")
    assert "fleet placement (d3_fleet_models):" not in fleet["lines"]


def test_the_role_s_argument_spec_is_validated() -> None:
    problems = spec_problems("l4-a", {"d3_models": [{"model": "d3-edge", "gpu": 0}], "d3_gpu_count": 1}, {"d3": D3_SPEC})
    assert len(problems) == 1
    assert problems[0].startswith("host l4-a: role d3's arguments (meta/argument_specs.yml): d3_models.gpu. Supported")
    assert spec_problems("l4-a", {"d3_gpu_count": 1}, {"d3": D3_SPEC}) == []
    assert spec_problems("l4-a", {"d3_gpu_count": 1}, None) == []
    fleet = fleet_plan({"l4-a": host(d3_gpu_count="four")}, CATALOG, COMMON, specs={"d3": D3_SPEC})
    assert "d3_gpu_count" in fleet["problems"]["l4-a"][0] and "role d3's arguments" in fleet["problems"]["l4-a"][0]


GOOD_IMAGE = {"d3_image_name": IMAGE, "d3_image_digest": "", "d3_image_registry_mirrors": [],
              "d3_image_registry_username": "", "d3_image_registry_password": "", "d3_image_slice_count": 1,
              "d3_image_slice_number": 0}  # fmt: skip
DIGEST = "sha256:" + "ab" * 32


def test_a_good_image_passes_every_check() -> None:
    assert image_checks(GOOD_IMAGE, "h") == {k: [] for k in ("name", "digest", "mirrors", "login", "slices", "pinned")}
    assert image_problems("h", {**GOOD_IMAGE, "d3_image_name": "localhost/vllm:dev", "d3_image_digest": DIGEST}) == []
    assert image_problems("h", {**GOOD_IMAGE, "d3_image_name": "reg:5000/vllm/vllm-openai:v1"}) == []
    assert image_checks("not a mapping", "h")["name"][0].startswith("h: d3_image_name = null is not")


@pytest.mark.parametrize(("change", "check", "says"), [
    ({"d3_image_name": "vllm/vllm-openai:nightly"}, "name",
     'h: d3_image_name = "vllm/vllm-openai:nightly" is not a fully qualified image reference with a tag. Set it to '
     "registry/repository:tag, e.g. docker.io/vllm/vllm-openai:nightly; pin a digest with d3_image_digest, not in the name."),
    ({"d3_image_name": "docker.io/vllm/vllm-openai"}, "name", "d3_image_name = \"docker.io/vllm/vllm-openai\" is not"),
    ({"d3_image_name": "docker.io/vllm/vllm-openai:nightly\n"}, "name", "is not a fully qualified"),
    ({"d3_image_name": 5}, "name", "d3_image_name = 5 is not"),
    ({"d3_image_digest": "sha256:abc"}, "digest",
     "h: d3_image_digest = \"sha256:abc\" is not a manifest digest. Set it to sha256:<64 hex> (skopeo inspect --format "
     "'{{.Digest}}' docker://docker.io/vllm/vllm-openai:nightly) or to \"\" to resolve the tag."),
    ({"d3_image_digest": DIGEST + "\n"}, "digest", "is not a manifest digest"),
    ({"d3_image_registry_mirrors": [{"prefix": "docker.io"}]}, "mirrors",
     'h: d3_image_registry_mirrors entry {"prefix": "docker.io"} is invalid. Each entry needs prefix (e.g. docker.io) '
     "and location (e.g. mirror.example.com:5000), and optionally insecure: true/false."),
    ({"d3_image_registry_mirrors": [{"location": "m:5000"}]}, "mirrors", "is invalid"),
    ({"d3_image_registry_mirrors": [{"prefix": "docker.io", "location": "m:5000", "insecure": "yes"}]}, "mirrors", "is invalid"),
    ({"d3_image_registry_mirrors": ["docker.io"]}, "mirrors", 'entry "docker.io" is invalid'),
    ({"d3_image_registry_username": "bot"}, "login",
     "h: set both d3_image_registry_username and d3_image_registry_password (vaulted), or neither for anonymous pulls."),
    ({"d3_image_registry_password": "pw"}, "login", "set both"),
    ({"d3_image_slice_count": 0}, "slices",
     "h: d3_image_slice_count = 0 and d3_image_slice_number = 0: the count is the number of slices of this fleet run "
     "(the job template's job_slice_count; 1 = not sliced), the number this slice's position, 1 to the count (0 = not given)."),
    ({"d3_image_slice_count": "two"}, "slices", 'd3_image_slice_count = "two"'),
    ({"d3_image_slice_count": 2, "d3_image_slice_number": "x"}, "slices", 'd3_image_slice_number = "x"'),
    ({"d3_image_slice_count": 2, "d3_image_slice_number": 3, "d3_image_digest": DIGEST}, "slices", "1 to the count"),
    ({"d3_image_slice_count": 2, "d3_image_slice_number": 1}, "pinned",
     "h: this run is one of 2 slices (d3_image_slice_count) and d3_image_digest is empty: every slice would resolve "
     "docker.io/vllm/vllm-openai:nightly by itself, and a tag that moves between two slices puts the fleet on two "
     "digests. Pin one digest for all slices: set d3_image_digest (an extra var of the job template, or the inventory) "
     "to the output of skopeo inspect --no-tags --format '{{.Digest}}' docker://docker.io/vllm/vllm-openai:nightly (or "
     "the digest playbooks/status.yml prints, or a first unsliced workflow node that resolves it and passes it on with "
     "ansible.builtin.set_stats)."),
])  # fmt: skip
def test_each_bad_image_input_is_refused_by_its_check(change: dict[str, Any], check: str, says: str) -> None:
    checks = image_checks({**GOOD_IMAGE, **change}, "h")
    assert [k for k, v in checks.items() if v] == [check]
    assert says in checks[check][0]
    assert image_problems("h", {**GOOD_IMAGE, **change}) == checks[check]


def test_the_slice_defaults_pass() -> None:
    assert image_checks({"d3_image_name": IMAGE}, "h")["slices"] == []
    assert image_checks({"d3_image_name": IMAGE, "d3_image_slice_count": 2, "d3_image_slice_number": 2,
                         "d3_image_digest": DIGEST}, "h")["slices"] == []  # fmt: skip


HUB = {"d3_image_name": IMAGE, "d3_image_anonymous_pull_warn_hosts": 3}


def test_the_docker_hub_warning() -> None:
    four = ["a", "b", "c", "d"]
    warning = hub_warning(four, HUB)
    assert warning.startswith(f"WARNING: 4 hosts will pull {IMAGE} from Docker Hub anonymously, which rate-limits")
    assert warning.endswith("or pin d3_image_digest and pre-load the image.")
    assert hub_warning(four[:3], HUB) == ""
    assert hub_warning(four, {**HUB, "d3_image_registry_username": "bot"}) == ""
    assert hub_warning(four, {**HUB, "d3_image_registry_mirrors": [{"prefix": "docker.io/vllm", "location": "m"}]}) == ""
    assert hub_warning(four, {**HUB, "d3_image_registry_mirrors": [{"prefix": "quay.io", "location": "m"}]}) == warning
    assert hub_warning(four, {**HUB, "d3_image_registry_mirrors": ["docker.io"]}) == warning
    assert hub_warning(four, {**HUB, "d3_image_name": "registry-1.docker.io/vllm/vllm-openai:n"}) != ""
    assert hub_warning(four, {**HUB, "d3_image_name": "quay.io/vllm/vllm-openai:n"}) == ""
    assert hub_warning(["a"], {"d3_image_name": IMAGE}) != ""  # no threshold given: 0
    fleet = fleet_plan({h: host(d3_image_anonymous_pull_warn_hosts=3) for h in four}, CATALOG, COMMON)
    assert fleet["warnings"] == [warning] and fleet["lines"][0] == warning


def test_unit_inputs_are_checked() -> None:
    assert unit_problems("h", {"d3_units_api_key": "abc"}) == []
    assert unit_problems("h", {}) == []
    spaced = unit_problems("h", {"d3_units_api_key": "a b"})
    assert spaced == ["host h: d3_units_api_key contains whitespace or a control character (not shown: it is a secret). "
                      "Fix: use a key of printable characters without spaces, e.g. `openssl rand -hex 32`."]  # fmt: skip
    assert unit_problems("h", {"d3_units_api_key": 5}) == spaced
    assert unit_problems("h", {"d3_units_api_key": "a\x7f"}) == spaced
    bad = unit_problems("h", {"d3_units_cdi_unit": "x y", "d3_units_restart_sec": "ten"})
    assert len(bad) == 2 and "d3_units_cdi_unit" in bad[0] and "d3_units_restart_sec" in bad[1]
    fleet = fleet_plan({"l4-a": host(d3_units_api_key="a b")}, CATALOG, COMMON)
    assert fleet["problems"]["l4-a"] == [spaced[0].replace("host h:", "host l4-a:")]


def test_an_api_key_names_the_secret_in_the_podman_line() -> None:
    keyed = fleet_plan({"l4-a": host(d3_units_api_key="k", d3_allow_unauthenticated=True)}, CATALOG, COMMON)
    assert any("--secret d3-api-key" in line for line in keyed["hosts"]["l4-a"]["report"])
    named = fleet_plan({"l4-a": host(d3_units_api_key="k", d3_units_api_key_secret="mine")}, CATALOG, COMMON)
    assert any("--secret mine" in line for line in named["hosts"]["l4-a"]["report"])
    plain = fleet_plan({"l4-a": host()}, CATALOG, COMMON)
    assert not any("--secret" in line for line in plain["hosts"]["l4-a"]["report"])
    ref = fleet_plan({"l4-a": host(d3_units_image_ref="reg.example/v@" + DIGEST)}, CATALOG, COMMON)
    assert ref["hosts"]["l4-a"]["image"] == "reg.example/v@" + DIGEST


def test_a_d3_models_that_is_not_a_list_is_refused_by_the_planner() -> None:
    fleet = fleet_plan({"l4-a": host(d3_models="d3-mini")}, CATALOG, COMMON)
    assert fleet["problems"]["l4-a"][0] == "host l4-a: d3_models: expected a list, got str. Fix: write a YAML list"


def test_the_filters() -> None:
    assert FilterModule().filters() == {"d3_fleet_plan": fleet_plan, "d3_image_checks": image_checks,
                                        "d3_image_hub_warning": hub_warning, "d3_plan_options": plan_options,
                                        "d3_plan_option_vars": plan_option_vars,
                                        "d3_fleet_place_options": fleet_place_options}  # fmt: skip


def test_a_gpu_listed_twice_does_not_hide_a_port_clash() -> None:
    """Issue 35: both problems in the same run (the unplaced instance's fixed port is still checked)."""
    models = [{"model": "d3-edge", "gpus": [0, 0], "port": 8100}, {"model": "d3-lite", "port": 8100}]
    errors = fleet_plan({"l4-a": host(d3_models=models)}, CATALOG, COMMON)["problems"]["l4-a"]
    assert errors[0].startswith("host l4-a: d3_models[0] (d3-edge): GPU [0] listed twice in d3_models[0].gpus")
    assert errors[1] == ("host l4-a: d3_models[1] (d3-lite): port 8100 collides with instance d3-edge. "
                         "Fix: give each instance its own port")  # fmt: skip
    # the unplaced instance gets no port of its own and is not in the plan so far
    assert not any(line.startswith("d3-edge:") for line in errors)


# ---- the rest of the inventory: routers, monitors, firewall, disk, remaps, rollout (issue 35 item 2) -------------
from d3_fleet_plan import (  # noqa: E402
    FIREWALL_VARS,
    ROLLOUT_DEFAULTS,
    fleet_views,
    host_lines,
    remap_lines,
    rollout_lines,
    router_fleet,
    with_views,
)

SERVE = {"d3_listen_address": "0.0.0.0", "d3_units_api_key": "k"}
FLEET = {
    "l4-a": host(**SERVE, ansible_host="10.0.0.1", d3_models=[{"model": "d3-mini"}, {"model": "d3-edge"}], d3_gpu_count=1),
    "l4-b": host(**SERVE, ansible_host="10.0.0.2", d3_models=[{"model": "d3-mini"}], d3_gpu_count=1),
}
ROUTERS = {"router-1": {"ansible_host": "10.0.0.9", "d3_router_port": 8000, "d3_router_metrics_port": 8405,
                        "d3_router_health_port": 8406, "d3_router_listen_address": "0.0.0.0",
                        "d3_router_ports": {"d3-mini": 9100}}}  # fmt: skip
MONITORS = {"mon-1": {"ansible_host": "10.0.0.8", "d3_metrics_runbook_url": "https://wiki.example/runbook.md"}}


def views(fleet_vars: dict[str, Any] = FLEET, routers: Any = ROUTERS, monitors: Any = MONITORS,
          group: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    plan = fleet_plan(fleet_vars, CATALOG, COMMON)
    return plan, fleet_views(plan, fleet_vars, group if group is not None else sorted(fleet_vars), routers, monitors)


def test_the_router_fleet_input_is_the_router_role_s() -> None:
    text = (ROOT / "roles/d3_router/tasks/fleet.yml").read_text()
    keys = set(re.findall(r"'(\w+)': hostvars\[h\]", text))
    plan = fleet_plan(FLEET, CATALOG, COMMON)
    got = router_fleet({**FLEET, "l4-a": {**FLEET["l4-a"], "d3_allow_unauthenticated": "yes"}}, plan["plans"], ["l4-a", "l4-c"])
    assert set(got["l4-a"]) == keys
    assert got["l4-a"] == {"plan": plan["plans"]["l4-a"], "backend_address": None, "backend_port_offset": None,
                           "ansible_host": "10.0.0.1", "api_key": True, "allow_unauthenticated": True}  # fmt: skip
    assert got["l4-c"] == {"plan": None, "backend_address": None, "backend_port_offset": None, "ansible_host": None,
                           "api_key": False, "allow_unauthenticated": False}  # fmt: skip
    offset = router_fleet({"l4-a": {"d3_router_backend_address": "192.0.2.7", "d3_router_backend_port_offset": 10000}}, {}, ["l4-a"])
    assert offset["l4-a"]["backend_address"] == "192.0.2.7" and offset["l4-a"]["backend_port_offset"] == 10000


def test_routers_monitors_remaps_and_rollout_are_planned() -> None:
    _, seen = views()
    assert seen["problems"] == {}
    assert seen["lines"][0] == ("== router-1 (d3-routers): fleet endpoint port 8000 (/v1/systemone, /v1/models, /health), "
                                "metrics port 8405")  # fmt: skip
    assert seen["lines"][1] == "  d3-edge (d3-edge, fleet endpoint only): backend be_d3-edge, 1 server(s): l4-a 10.0.0.1:8001"
    assert seen["lines"][2] == ("  d3-mini (d3-mini, port 9100): backend be_d3-mini, 2 server(s): l4-a 10.0.0.1:8000, "
                                "l4-b 10.0.0.2:8000")  # fmt: skip
    assert seen["lines"][3].startswith("== mon-1 (d3-monitors): ") and seen["lines"][3].endswith(" alert rule(s)")
    assert "(d3-alertmanager 1, d3-node 4, d3-prometheus 1, d3-router 1, d3-vllm 3)" in seen["lines"][3]
    assert seen["lines"][4] == ("== remaps: images from their registries (no d3_image_registry_mirrors); weights from "
                                "huggingface.co (no d3_weights_hf_endpoint)")  # fmt: skip
    assert seen["lines"][5] == ('== rollout (d3_rollout_serial [1, "25%", "100%"], d3_rollout_max_unavailable 1): '
                                "batch 1: l4-a | batch 2: l4-b")  # fmt: skip
    assert seen["lines"][6:] == ["  drain check: passes"]
    assert seen["hosts"]["l4-a"][0].startswith("  disk: 10.8 GB of weights for 2 repositories into /var/lib/d3/huggingface")


def test_a_router_or_monitor_that_cannot_be_configured_is_refused_under_its_name() -> None:
    _, seen = views(routers={"router-1": {**ROUTERS["router-1"], "d3_router_ports": "9100"}},
                    monitors={"mon-1": {"d3_metrics_scrape_interval": "soon"}})  # fmt: skip
    assert seen["problems"]["router-1"][0] == "router-1: the router cannot be configured:"
    assert "d3_router_ports" in seen["problems"]["router-1"][1]
    assert seen["problems"]["mon-1"][0] == "mon-1: the monitor cannot be configured:"
    assert any("scrape_interval" in line for line in seen["problems"]["mon-1"][1:])
    assert not any(line.startswith(("== router-1", "== mon-1")) for line in seen["lines"])


def test_without_every_l4_host_planned_no_router_view() -> None:
    _, seen = views(group=["l4-a", "l4-b", "l4-c"])
    assert seen["lines"] == ["(routers, monitors and the rollout are planned when every l4-nodes host is planned without "
                             "a problem)"]  # fmt: skip
    assert sorted(seen["hosts"]) == ["l4-a", "l4-b"]
    _, empty = views(group=[])
    assert empty["lines"] == seen["lines"]


def test_the_rollout_refusal_is_said_by_the_plan() -> None:
    hosts = {f"l4-{i}": host(d3_models=[{"model": "d3-mini"}], d3_gpu_count=1) for i in range(1, 5)}
    plan = fleet_plan(hosts, CATALOG, COMMON)
    order = sorted(hosts)
    lines = rollout_lines(order, plan["plans"], {})
    assert lines[0] == ('== rollout (d3_rollout_serial [1, "25%", "100%"], d3_rollout_max_unavailable 1): batch 1: l4-1 | '
                        "batch 2: l4-2 | batch 3: l4-3, l4-4")  # fmt: skip
    assert lines[1] == ("  rollout.yml would refuse, before staging pulls anything: batch 3 (l4-3, l4-4) would drain 2 of "
                        "the 4 replicas of d3-mini at once (on l4-3, l4-4; d3_rollout_max_unavailable = 1). Fix: a "
                        "smaller d3_rollout_serial (e.g. 1), or place the replicas on hosts that fall in different batches.")  # fmt: skip
    assert rollout_lines(order, plan["plans"], {"d3_rollout_serial": 1})[1:] == ["  drain check: passes"]
    two = rollout_lines(order, plan["plans"], {"d3_rollout_max_unavailable": 2, "d3_rollout_min_up": 2})
    assert two[1:] == ["  drain check: passes"] and "d3_rollout_max_unavailable 2" in two[0]
    assert ROLLOUT_DEFAULTS == {"d3_rollout_serial": [1, "25%", "100%"], "d3_rollout_max_unavailable": 1, "d3_rollout_min_up": 1}


def test_remaps() -> None:
    v = {"d3_image_registry_mirrors": [{"prefix": "docker.io", "location": "m:5000"}, {"prefix": "quay.io", "location": "q"}, "x"],
         "d3_weights_hf_endpoint": "https://hf.example"}  # fmt: skip
    assert remap_lines(v) == ["== remaps: images docker.io -> m:5000; quay.io -> q; weights from https://hf.example "
                              "(d3_weights_hf_endpoint)"]  # fmt: skip


def test_host_lines_disk_and_firewall() -> None:
    plan = fleet_plan({"l4-a": host(d3_models=[{"model": "d3-mini"}])}, CATALOG, COMMON)["plans"]["l4-a"]
    assert host_lines(plan, {}) == ["  disk: 9.4 GB of weights for 1 repository into /var/lib/d3/huggingface (d3_hf_home), "
                                    "plus the image (preflight measures the free space)"]  # fmt: skip
    off = host_lines(plan, {"d3_firewall_enabled": False})
    assert off[1] == "  firewall: off (d3_firewall_enabled: false): the host's own rules decide who reaches the model ports"
    on = host_lines(plan, {"d3_firewall_enabled": "true", "d3_firewall_ports": [8000], "d3_firewall_allowed_clients": ["10.0.0.9"],
                           "d3_firewall_monitors": [], "d3_firewall_monitor_ports": []})  # fmt: skip
    assert on[1] == ("  firewall: on (d3_firewall_enabled): model ports 8000 from 10.0.0.9 (d3_allowed_clients); monitor ports "
                     "none and the model ports from none (d3_firewall_monitors)")  # fmt: skip
    bare = host_lines(plan, {"d3_firewall_enabled": True})
    assert bare[1].startswith("  firewall: on (d3_firewall_enabled): model ports  from none (d3_allowed_clients)")
    assert set(FIREWALL_VARS) == {"d3_firewall_enabled", "d3_firewall_ports", "d3_firewall_allowed_clients",
                                  "d3_firewall_monitors", "d3_firewall_monitor_ports"}  # fmt: skip


def test_with_views_puts_each_host_s_lines_in_its_block_and_merges_problems() -> None:
    plan, seen = views()
    both = with_views(plan, {**seen, "problems": {"router-1": ["r"], "l4-a": ["x"]}})
    a = both["lines"].index("== l4-a: 2 instance(s) on 1 GPU(s)")
    b = both["lines"].index("== l4-b: 1 instance(s) on 1 GPU(s)")
    assert both["lines"][a + 1:b][-len(seen["hosts"]["l4-a"]):] == seen["hosts"]["l4-a"]
    assert both["lines"][-len(plan["summary"]):] == plan["summary"]
    assert both["lines"][: len(plan["head"])] == plan["head"]
    assert both["problems"] == {"router-1": ["r"], "l4-a": ["x"]}
    refused = fleet_plan({"l4-a": host(d3_models=[{"model": "d3-xl"}])}, CATALOG, COMMON)
    merged = with_views(refused, {"hosts": {}, "lines": [], "problems": {"l4-a": ["more"]}})
    assert merged["problems"]["l4-a"][-1] == "more" and merged["problems"]["l4-a"][0].startswith("host l4-a: d3_models[0]")


def test_a_misspelt_group_is_refused_with_did_you_mean() -> None:
    fleet = fleet_plan({"l4-a": host()}, CATALOG, COMMON, groups=["all", "ungrouped", "l4-nodes", "d3-router"], anchor="r-1")
    assert fleet["problems"]["r-1"] == [
        "inventory group 'd3-router': no play reads it (did you mean 'd3-routers'?). Fix: rename the group to d3-routers "
        "in the inventory (the playbooks run on l4-nodes, d3-routers and d3-monitors)"]  # fmt: skip
    assert fleet_plan({"l4-a": host()}, CATALOG, COMMON, groups=["l4-nodes", "d3-routers", "d3-router"])["problems"] == {}
    first = fleet_plan({"l4-a": host(d3_models=[{"model": "d3-xl"}])}, CATALOG, COMMON, groups=["l4-node"])
    assert first["problems"]["l4-a"][0].startswith("inventory group 'l4-node': no play reads it (did you mean 'l4-nodes'?)")
    assert first["problems"]["l4-a"][1].startswith("host l4-a: d3_models[0]: unknown model")


def test_a_misspelt_variant_gets_did_you_mean() -> None:
    fleet = fleet_plan({"l4-a": host(d3_models=[{"model": "d3", "variant": "fp9"}])}, CATALOG, COMMON)
    assert "d3 has no variant 'fp9' (did you mean 'fp8'?)" in fleet["problems"]["l4-a"][0]
    far = fleet_plan({"l4-a": host(d3_models=[{"model": "d3", "variant": "zzzzzz"}])}, CATALOG, COMMON)
    assert "d3 has no variant 'zzzzzz'. Fix" in far["problems"]["l4-a"][0]


def test_a_vaulted_key_counts_as_set_and_is_not_checked() -> None:
    vaulted = host(**{"d3_listen_address": "0.0.0.0", "_vaulted": ["d3_units_api_key"]})
    fleet = fleet_plan({"l4-a": vaulted}, CATALOG, COMMON)
    assert fleet["problems"] == {}
    assert any("--secret d3-api-key" in line for line in fleet["hosts"]["l4-a"]["report"])
    assert fleet_plan({"l4-a": host(d3_listen_address="0.0.0.0")}, CATALOG, COMMON)["problems"]


# ---- the wiring: each filter gets the variables its role gives it (mutation testing's survivors) ------------------
import d3_fleet_plan  # noqa: E402


def test_fleet_hosts_is_the_placement_input() -> None:
    got = d3_fleet_plan.fleet_hosts(["a", "b"], {"a": {"d3_gpu_count": 2, "d3_gpu_memory_mib": 20000, "d3_host_labels": ["big"],
                                                       "d3_models": [{"model": "d3"}]}})  # fmt: skip
    assert got == {"a": {"gpus": 2, "gpu_memory_mib": 20000, "labels": ["big"], "models": [{"model": "d3"}]},
                   "b": {"gpus": None, "gpu_memory_mib": None, "labels": [], "models": []}}  # fmt: skip


def test_the_placement_gets_the_fleet_s_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(d3_fleet_plan, "d3_fleet_place", lambda *a: seen.append(a) or {"hosts": {"l4-a": [{"model": "d3-edge"}]},
                                                                                        "table": ["t"], "errors": []})  # fmt: skip
    v = host(d3_gpu_count=1, d3_models=[], d3_fleet_models=[{"model": "d3-edge", "replicas": 1}], d3_allow_non_l4="yes",
             d3_allow_cuda_graphs=True, d3_vram_overhead_mib=600, d3_min_concurrency=2, d3_gpu_share_cap=0.9,
             d3_cuda_compat="1")  # fmt: skip
    fleet = fleet_plan({"l4-a": v}, CATALOG, COMMON, group=["l4-a", "l4-b"], others={"l4-b": {"d3_gpu_count": 3}})
    (models, catalog, common, hosts, options), = seen
    assert models == [{"model": "d3-edge", "replicas": 1}] and catalog is CATALOG and common is COMMON
    assert hosts["l4-b"]["gpus"] == 3 and hosts["l4-a"]["gpus"] == 1
    assert options == {"allow_non_l4": True, "allow_cuda_graphs": True, "vram_overhead_mib": 600, "min_concurrency": 2,
                       "gpu_share_cap": 0.9, "cuda_compat": True}  # fmt: skip
    assert [i["model"] for i in fleet["hosts"]["l4-a"]["plan"]["instances"]] == ["d3-edge"]
    assert fleet["lines"][:2] == ["fleet placement (d3_fleet_models):", "t"]
    assert fleet["placement"]["table"] == ["t"]
    plain = fleet_plan({"l4-a": host()}, CATALOG, COMMON)
    assert plain["placement"] == {"hosts": {}, "table": [], "errors": []} and len(seen) == 1


def test_a_host_refused_by_the_argument_spec_is_not_planned() -> None:
    fleet = fleet_plan({"l4-a": host(d3_gpu_count="four")}, CATALOG, COMMON, specs={"d3": D3_SPEC})
    invalid = fleet["problems"]["l4-a"]
    assert fleet["hosts"]["l4-a"] == {"plan": {"host": "l4-a", "instances": [], "gpus": [], "errors": invalid, "partial": []},
                                      "problems": invalid, "report": [], "image": None}  # fmt: skip
    assert fleet["plans"]["l4-a"]["errors"] == invalid and invalid[0].startswith("host l4-a: role d3's arguments")


def test_the_monitor_and_router_filters_get_their_role_s_options(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list[Any]] = {"scrape": [], "rules": [], "router": []}
    scraped = {"targets": [], "models": ["m"], "errors": []}
    monkeypatch.setattr(d3_fleet_plan, "metrics_scrape", lambda *a: calls["scrape"].append(a) or scraped)
    monkeypatch.setattr(d3_fleet_plan, "metrics_rules", lambda *a: calls["rules"].append(a) or {"rules": {}, "errors": []})
    routed = {"models": [], "errors": [], "endpoint": {}, "metrics": {}}
    monkeypatch.setattr(d3_fleet_plan, "router_backends", lambda *a: calls["router"].append(a) or routed)
    monitor = {"ansible_host": "10.0.0.8", "d3_router_backend_address": "10.9.0.8", "d3_metrics_scrape_interval": "5s",
               "d3_metrics_evaluation_interval": "6s", "d3_metrics_node_exporter_port": 9111, "d3_metrics_alertmanager": "127.0.0.1:9999",
               "d3_metrics_rules_file": "/r.yml", "d3_metrics_runbook_url": "https://wiki.example/runbook.md"}  # fmt: skip
    # every port away from every default (endpoint 8000, metrics 8405, health 8406): a port read from the wrong
    # variable, or a default where the inventory's value belongs, shows
    router = {"ansible_host": "10.0.0.9", "d3_router_backend_address": "10.9.0.9", "d3_router_ports": {"d3-mini": 9100},
              "d3_router_listen_address": "0.0.0.0", "d3_router_port": 8001, "d3_router_metrics_port": 8408,
              "d3_router_metrics_allowed": ["10.0.0.8"], "d3_router_allowed_paths": ["/x"],
              "d3_router_health_port": 8407}  # fmt: skip
    plan = fleet_plan(FLEET, CATALOG, COMMON)
    fleet_views(plan, FLEET, ["l4-a", "l4-b"], {"router-1": router}, {"mon-1": monitor})
    (fleet, name, ports, listen, options), = calls["router"]
    assert fleet == router_fleet(FLEET, plan["plans"], ["l4-a", "l4-b"]) and name == "router-1"
    assert ports == {"d3-mini": 9100} and listen == "0.0.0.0"
    assert options == {"endpoint_port": 8001, "metrics_port": 8408, "health_port": 8407, "metrics_allowed": ["10.0.0.8"],
                       "allowed_paths": ["/x"]}  # fmt: skip
    (fleet, name, routers, others, options), = calls["scrape"]
    assert name == "mon-1" and routers == {"router-1": {"ansible_host": "10.0.0.9", "backend_address": "10.9.0.9",
                                                         "metrics_port": 8408}}  # fmt: skip
    assert others == {"mon-1": {"ansible_host": "10.0.0.8", "backend_address": "10.9.0.8"}}
    assert options == {"scrape_interval": "5s", "evaluation_interval": "6s", "node_exporter_port": 9111,
                       "alertmanager": "127.0.0.1:9999", "rules_file": "/r.yml"}  # fmt: skip
    assert calls["rules"] == [(["m"], {"runbook_url": "https://wiki.example/runbook.md"})]


def test_the_unit_inputs_checked_are_the_unit_role_s(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(d3_fleet_plan, "input_problems", lambda checks, host: seen.append((checks, host)) or [])
    names = ["d3_units_image_ref", "d3_units_cdi_unit", "d3_units_wait_ready", "d3_units_start_timeout_s",
             "d3_units_restart_sec", "d3_units_api_key_secret", "d3_units_api_key_fingerprint_file"]  # fmt: skip
    assert unit_problems("h", {n: f"v-{n}" for n in names}) == []
    kinds = ["text", "unit", "path", "seconds", "seconds", "secret_name", "path"]
    assert seen == [([{"name": n, "kind": k, "value": f"v-{n}"} for n, k in zip(names, kinds, strict=True)], "h")]
    validate = (ROOT / "roles/d3_units/tasks/validate.yml").read_text()
    assert re.findall(r"'name': '(\w+)', 'kind': '(\w+)'", validate) == list(zip(names, kinds, strict=True))
