# d3fleet.fleet.d3_fleet_plan: the whole fleet's plan in one pass (playbooks/plan.yml, action d3fleet.fleet.fleet_plan).
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's plan in one pass: every GPU host's plan (the per-host planner, d3_planner.d3_plan, called once per
host), the fleet placement of d3_fleet_models (d3_fleet.d3_fleet_place, once), the image and unit input checks, each
host's problems, its labelled report and a fleet summary. ``playbooks/plan.yml`` calls it once for the whole
inventory (the action plugin ``d3fleet.fleet.fleet_plan`` gathers each host's variables) instead of running the
roles' tasks per host: Ansible's cost is per host and task (a worker process each), the planner's under a
millisecond per host. The variable -> planner option mapping is ``roles/d3/tasks/main.yml``'s (a test keeps the two
equal: tests/test_fleet_plan.py)."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

try:
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_fleet import DIGITS, d3_fleet_place
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import input_problems
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_metrics import metrics_rules, metrics_scrape
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_planner import d3_plan, host_gpus
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_render import plan_report
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_rollout import drain_problems, rollout_batches
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_router import router_backends
except ImportError:  # the unit tests import the filters as plain modules
    from d3_fleet import DIGITS, d3_fleet_place  # type: ignore[no-redef]
    from d3_inputs import input_problems  # type: ignore[no-redef]
    from d3_metrics import metrics_rules, metrics_scrape  # type: ignore[no-redef]
    from d3_planner import d3_plan, host_gpus  # type: ignore[no-redef]
    from d3_render import plan_report  # type: ignore[no-redef]
    from d3_rollout import drain_problems, rollout_batches  # type: ignore[no-redef]
    from d3_router import router_backends  # type: ignore[no-redef]

# the variables a host's plan reads (the action plugin templates these and no other)
PLAN_VARS = (
    "d3_models", "d3_fleet_models", "d3_host_labels", "d3_gpu_count", "d3_gpu_memory_mib", "d3_gpu_name",
    "d3_preflight_gpus", "d3_port_base", "d3_listen_address", "d3_hf_home", "d3_image_name", "d3_model_revisions",
    "d3_model_revisions_override", "d3_allow_non_l4", "d3_allow_cuda_graphs", "d3_require_pinned_revisions",
    "d3_vram_overhead_mib", "d3_min_concurrency", "d3_gpu_share_cap", "d3_cuda_compat", "d3_units_api_key",
    "d3_allow_unauthenticated", "d3_container_capabilities", "d3_image_digest", "d3_image_registry_mirrors",
    "d3_image_registry_username", "d3_image_registry_password", "d3_image_slice_count", "d3_image_slice_number",
    "d3_image_anonymous_pull_warn_hosts", "d3_units_image_ref", "d3_units_cdi_unit", "d3_units_wait_ready",
    "d3_units_start_timeout_s", "d3_units_restart_sec", "d3_units_api_key_secret", "d3_units_api_key_fingerprint_file",
)  # fmt: skip

# what the views of the fleet read: every GPU host (the router's input, as roles/d3_router/tasks/fleet.yml collects it;
# the remaps; the rollout), each router (roles/d3_router/tasks/preflight.yml), each monitor (d3_metrics' preflight),
# and the firewall's variables, templated once the host's plan is known (their defaults read d3_host_plan)
VIEW_VARS = (
    "ansible_host", "d3_router_backend_address", "d3_router_backend_port_offset", "d3_weights_hf_endpoint",
    "d3_rollout_serial", "d3_rollout_max_unavailable", "d3_rollout_min_up",
)  # fmt: skip
FIREWALL_VARS = ("d3_firewall_enabled", "d3_firewall_ports", "d3_firewall_allowed_clients", "d3_firewall_monitors",
                 "d3_firewall_monitor_ports")  # fmt: skip
ROUTER_VARS = ("ansible_host", "d3_router_backend_address", "d3_router_ports", "d3_router_listen_address",
               "d3_router_port", "d3_router_metrics_port", "d3_router_health_port", "d3_router_metrics_allowed",
               "d3_router_allowed_paths")  # fmt: skip
MONITOR_VARS = ("ansible_host", "d3_router_backend_address", "d3_metrics_scrape_interval",
                "d3_metrics_evaluation_interval", "d3_metrics_node_exporter_port", "d3_metrics_alertmanager",
                "d3_metrics_rules_file", "d3_metrics_runbook_url")  # fmt: skip
# playbooks/rollout.yml's defaults when the inventory sets none
ROLLOUT_DEFAULTS = {"d3_rollout_serial": [1, "25%", "100%"], "d3_rollout_max_unavailable": 1, "d3_rollout_min_up": 1}

# the variables a host sets from Ansible Vault that this run cannot decrypt (no vault password: a plan needs only
# to know that they are set), listed under this key of the host's variables
VAULTED = "_vaulted"

# planner option <- inventory variable (revisions and the bools apart): the one mapping, for plan.yml's one pass and
# for roles/d3/tasks/main.yml (filters d3_plan_option_vars, d3_plan_options, d3_fleet_place_options)
OPTION_VARS = {
    "port_base": "d3_port_base",
    "listen_address": "d3_listen_address",
    "hf_home": "d3_hf_home",
    "image": "d3_image_name",
    "vram_overhead_mib": "d3_vram_overhead_mib",
    "min_concurrency": "d3_min_concurrency",
    "gpu_share_cap": "d3_gpu_share_cap",
}
BOOL_OPTION_VARS = {
    "allow_non_l4": "d3_allow_non_l4",
    "allow_cuda_graphs": "d3_allow_cuda_graphs",
    "require_revisions": "d3_require_pinned_revisions",
    "cuda_compat": "d3_cuda_compat",
    "allow_unauthenticated": "d3_allow_unauthenticated",
}
HUB_REGISTRIES = ("docker.io", "registry-1.docker.io", "index.docker.io")
# the d3_image role's input checks (image_checks; roles/d3_image/tasks/validate.yml and lookup.yml call the filter)
IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9.-]*(:[0-9]+)?/[a-z0-9._/-]+:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")
MIRROR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:_/-]*\Z")
UNKNOWN_MODEL_RE = re.compile(r"unknown model '([^']*)'")
UNKNOWN_VARIANT_RE = re.compile(r"(\S+) has no variant '([^']*)'(?!:)")
# the inventory groups the playbooks read (site.yml, plan.yml, the router and monitor roles)
KNOWN_GROUPS = ("l4-nodes", "d3-routers", "d3-monitors")


def as_json(value: Any) -> str:
    """A value as the role's messages showed it (Ansible's to_json)."""
    return json.dumps(value, default=str, ensure_ascii=False)


def truthy(value: Any) -> bool:
    """Ansible's `| bool`: true, yes, on, 1 (any case) are true."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y", "t")
    return bool(value)


def did_you_mean(word: Any, names: Any) -> str:
    """' (did you mean NAME?)' for the closest of ``names`` (difflib), '' when none is close."""
    close = difflib.get_close_matches(str(word), [str(n) for n in names], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def suggest(errors: list[str], catalog: dict[str, Any]) -> list[str]:
    """The planner's refusals with a "did you mean" after a misspelt model (size) or variant name."""
    out = []
    for line in errors:
        found = UNKNOWN_MODEL_RE.search(line)
        if found:
            line = line.replace(found.group(0), found.group(0) + did_you_mean(found.group(1), catalog), 1)
        found = UNKNOWN_VARIANT_RE.search(line)
        if found and isinstance(catalog.get(found.group(1)), dict):
            variants = catalog[found.group(1)].get("variants") or {}
            line = line.replace(found.group(0), found.group(0) + did_you_mean(found.group(2), variants), 1)
        out.append(line)
    return out


def group_problems(groups: Any) -> list[str]:
    """An inventory group whose name is close to one the playbooks read, while that one is missing: a typo."""
    names = [str(g) for g in groups or []]
    problems = []
    for known in KNOWN_GROUPS:
        close = difflib.get_close_matches(known, [g for g in names if g not in KNOWN_GROUPS], n=1, cutoff=0.8)
        if known not in names and close:
            problems.append(
                f"inventory group {close[0]!r}: no play reads it (did you mean {known!r}?). Fix: rename the group to "
                f"{known} in the inventory (the playbooks run on l4-nodes, d3-routers and d3-monitors)"
            )
    return problems


def plan_options(v: dict[str, Any], host_addresses: list[str] | None = None) -> dict[str, Any]:
    """The planner options of one host from its variables (None: unset, the planner's default applies); the filter
    d3_plan_options (roles/d3/tasks/main.yml passes the host's addresses from facts; plan.yml gathers none, so its
    bind check is site.yml's)."""
    opts: dict[str, Any] = {key: v.get(var) for key, var in OPTION_VARS.items()}
    opts.update({key: truthy(v.get(var, False)) for key, var in BOOL_OPTION_VARS.items()})
    override = v.get("d3_model_revisions_override") or {}
    opts["revisions"] = override if len(override) > 0 else v.get("d3_model_revisions") or {}
    opts["api_key_set"] = opts_key(v)
    opts["capabilities"] = v.get("d3_container_capabilities") or []
    opts["host_addresses"] = host_addresses
    return opts


# the planner options the fleet placement (d3_fleet_place) takes
FLEET_OPTIONS = ("allow_non_l4", "allow_cuda_graphs", "vram_overhead_mib", "min_concurrency", "gpu_share_cap", "cuda_compat")


def fleet_place_options(v: dict[str, Any]) -> dict[str, Any]:
    """d3_fleet_place's options from a host's variables (filter d3_fleet_place_options)."""
    opts = plan_options(v)
    return {key: opts[key] for key in FLEET_OPTIONS}


def plan_option_vars(_input: Any = None) -> list[str]:
    """The variables plan_options reads (filter d3_plan_option_vars: the role looks these up and passes them)."""
    return [*OPTION_VARS.values(), *BOOL_OPTION_VARS.values(), "d3_model_revisions_override", "d3_model_revisions",
            "d3_units_api_key", "d3_container_capabilities"]  # fmt: skip


def declared_gpus(v: dict[str, Any], common: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The host's GPUs from the inventory (d3_gpu_count) or a preflight that read them; None: read nvidia-smi."""
    if v.get("d3_gpu_count") is not None:
        memory = v.get("d3_gpu_memory_mib")
        return host_gpus(v["d3_gpu_count"], memory if memory is not None else common["l4_memory_mib"],
                         v.get("d3_gpu_name") or "NVIDIA L4")  # fmt: skip
    return v.get("d3_preflight_gpus")


IMAGE_CHECKS = ("name", "digest", "mirrors", "login", "slices", "pinned")


def image_checks(_input: dict[str, Any], host: str = "") -> dict[str, list[str]]:
    """The d3_image role's input refusals by check (each a task of roles/d3_image/tasks/validate.yml, which calls
    this filter): ``name``, ``digest``, ``mirrors``, ``login``, ``slices``, ``pinned`` (a sliced run needs a pinned
    digest); an empty list passes."""
    v = _input if isinstance(_input, dict) else {}
    checks: dict[str, list[str]] = {k: [] for k in IMAGE_CHECKS}
    name = v.get("d3_image_name")
    first = str(name).split("/")[0]
    if not isinstance(name, str) or not IMAGE_RE.match(name) or not (re.search("[.:]", first) or first == "localhost"):
        checks["name"].append(
            f"{host}: d3_image_name = {as_json(name)} is not a fully qualified image reference with a tag. Set it to "
            "registry/repository:tag, e.g. docker.io/vllm/vllm-openai:nightly; pin a digest with d3_image_digest, "
            "not in the name."
        )
    digest = str(v.get("d3_image_digest") or "")
    if digest and not DIGEST_RE.match(digest):
        checks["digest"].append(
            f"{host}: d3_image_digest = {as_json(v.get('d3_image_digest'))} is not a manifest digest. Set it to "
            f"sha256:<64 hex> (skopeo inspect --format '{{{{.Digest}}}}' docker://{name}) or to \"\" to resolve the tag."
        )
    for item in v.get("d3_image_registry_mirrors") or []:
        good = isinstance(item, dict) and all(MIRROR_RE.match(str(item.get(k, ""))) for k in ("prefix", "location"))
        if not good or not isinstance(item.get("insecure", False), bool):
            checks["mirrors"].append(
                f"{host}: d3_image_registry_mirrors entry {as_json(item)} is invalid. Each entry needs prefix (e.g. "
                "docker.io) and location (e.g. mirror.example.com:5000), and optionally insecure: true/false."
            )
    if bool(v.get("d3_image_registry_username")) != bool(v.get("d3_image_registry_password")):
        checks["login"].append(
            f"{host}: set both d3_image_registry_username and d3_image_registry_password (vaulted), or neither for "
            "anonymous pulls."
        )
    count, number = v.get("d3_image_slice_count", 1), v.get("d3_image_slice_number", 0)
    if not (DIGITS.match(str(count)) and DIGITS.match(str(number))) or int(count) < 1 or int(number) > int(count):
        checks["slices"].append(
            f"{host}: d3_image_slice_count = {as_json(count)} and d3_image_slice_number = {as_json(number)}: the count "
            "is the number of slices of this fleet run (the job template's job_slice_count; 1 = not sliced), the number "
            "this slice's position, 1 to the count (0 = not given)."
        )
    elif int(count) > 1 and not digest:
        checks["pinned"].append(
            f"{host}: this run is one of {count} slices (d3_image_slice_count) and d3_image_digest is empty: every "
            f"slice would resolve {name} by itself, and a tag that moves between two slices puts the fleet on two "
            "digests. Pin one digest for all slices: set d3_image_digest (an extra var of the job template, or the "
            "inventory) to the output of skopeo inspect --no-tags --format '{{.Digest}}' docker://" + str(name) + " (or "
            "the digest playbooks/status.yml prints, or a first unsliced workflow node that resolves it and passes it on "
            "with ansible.builtin.set_stats)."
        )
    return checks


def image_problems(host: str, v: dict[str, Any]) -> list[str]:
    """Every d3_image input refusal of one host, in the role's order."""
    checks = image_checks(v, host)
    return [line for key in IMAGE_CHECKS for line in checks[key]]


def hub_warning(_input: list[str], v: dict[str, Any]) -> str:
    """The anonymous Docker Hub warning for a fleet of hosts ``_input`` (one line, '' when it does not apply)."""
    hosts = list(_input)
    name = str(v.get("d3_image_name") or "")
    mirrors = v.get("d3_image_registry_mirrors") or []
    hub = [m for m in mirrors if isinstance(m, dict) and str(m.get("prefix", "")).startswith(HUB_REGISTRIES)]
    if name.split("/")[0] not in HUB_REGISTRIES or v.get("d3_image_registry_username") or hub:
        return ""
    if len(hosts) <= int(v.get("d3_image_anonymous_pull_warn_hosts", 0) or 0):
        return ""
    return (
        f"WARNING: {len(hosts)} hosts will pull {name} from Docker Hub anonymously, which rate-limits anonymous pulls "
        "per source address per hour (HTTP 429 part-way through a run when the hosts share a NAT address). Fix: set "
        "d3_image_registry_username / d3_image_registry_password (vaulted), or a pull-through mirror with "
        "d3_image_registry_mirrors (prefix docker.io), or pin d3_image_digest and pre-load the image."
    )


def unit_problems(host: str, v: dict[str, Any]) -> list[str]:
    """The d3_units role's input refusals (roles/d3_units/tasks/validate.yml): the text that reaches a unit file."""
    checks = [
        ("d3_units_image_ref", "text"), ("d3_units_cdi_unit", "unit"), ("d3_units_wait_ready", "path"),
        ("d3_units_start_timeout_s", "seconds"), ("d3_units_restart_sec", "seconds"),
        ("d3_units_api_key_secret", "secret_name"), ("d3_units_api_key_fingerprint_file", "path"),
    ]  # fmt: skip
    problems = input_problems([{"name": n, "kind": k, "value": v.get(n)} for n, k in checks if n in v], host)
    key = v.get("d3_units_api_key", "")
    if not isinstance(key, str) or re.search(r"[\x00-\x20\x7f]", key):  # (a vaulted key not decrypted: not here)
        problems.append(
            f"host {host}: d3_units_api_key contains whitespace or a control character (not shown: it is a secret). "
            "Fix: use a key of printable characters without spaces, e.g. `openssl rand -hex 32`."
        )
    return problems


def spec_problems(host: str, v: dict[str, Any], specs: dict[str, Any] | None) -> list[str]:
    """What Ansible's role argument validation refuses (``specs``: role name -> its main entry point's options, as
    in meta/argument_specs.yml), for the variables the host sets; one line per error, naming host and variable."""
    problems = []
    for role, options in sorted((specs or {}).items()):
        given = {name: v[name] for name in options if name in v}
        errors = ArgumentSpecValidator(options).validate(given).error_messages
        problems += [f"host {host}: role {role}'s arguments (meta/argument_specs.yml): {e}" for e in errors]
    return problems


def fleet_hosts(names: list[str], hostvars: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """d3_fleet_place's input: each host's declared GPUs, labels and own d3_models (roles/d3/tasks/main.yml)."""
    return {h: {"gpus": hostvars.get(h, {}).get("d3_gpu_count"), "gpu_memory_mib": hostvars.get(h, {}).get("d3_gpu_memory_mib"),
                "labels": hostvars.get(h, {}).get("d3_host_labels") or [], "models": hostvars.get(h, {}).get("d3_models") or []}
            for h in names}  # fmt: skip


def fleet_plan(
    _input: dict[str, dict[str, Any]],
    catalog: dict[str, Any],
    common: dict[str, Any],
    group: list[str] | None = None,
    others: dict[str, dict[str, Any]] | None = None,
    specs: dict[str, Any] | None = None,
    groups: Any = None,
    anchor: str = "",
) -> dict[str, Any]:
    """Plan every host of ``_input`` (name -> its variables, as a task on that host sees them) in one pass.

    ``group``: every host of l4-nodes (a --limit run places fleet replicas as a full run does), ``others`` their
    variables (default ``_input``); ``specs``: the argument specs to validate each host's variables against (role
    name -> options); ``groups``: the inventory's group names (a misspelt group is refused, under ``anchor``, the
    play's first host, or else the first planned one). Returns ``{hosts,
    probe, placement, problems, report, summary, warnings}``: ``hosts`` maps each planned host to ``{plan, problems,
    report}``; ``probe`` lists the hosts whose GPUs must be read from nvidia-smi (not planned here); ``problems``
    maps each refused host to its lines (the problem lines, then its plan so far)."""
    hostvars = _input
    names = sorted(hostvars)
    first = names[0] if names else ""
    ref = hostvars.get(first, {})
    fleet_models = ref.get("d3_fleet_models") or []
    placement: dict[str, Any] = {"hosts": {}, "table": [], "errors": []}
    if fleet_models:
        every = sorted(set(names) | set(group or []))
        placement = d3_fleet_place(fleet_models, catalog, common, fleet_hosts(every, {**(others or {}), **hostvars}),
                                   fleet_place_options(ref))  # fmt: skip
    fleet_errors = placement["errors"]
    hosts: dict[str, Any] = {}
    probe: list[str] = []
    problems: dict[str, list[str]] = {}
    for host in names:
        v = hostvars[host]
        invalid = spec_problems(host, v, specs)
        if invalid:  # as Ansible's role argument validation: the host stops before its plan
            hosts[host] = {"plan": {"host": host, "instances": [], "gpus": [], "errors": invalid, "partial": []},
                           "problems": invalid, "report": [], "image": None}  # fmt: skip
            problems[host] = invalid
            continue
        gpus = declared_gpus(v, common)
        if gpus is None:
            probe.append(host)
            continue
        models = list(v.get("d3_models") or []) if isinstance(v.get("d3_models") or [], list) else v.get("d3_models")
        if fleet_models and isinstance(models, list):
            models += placement["hosts"].get(host, [])
        plan = d3_plan(models, catalog, common, gpus, host, plan_options(v))
        own = suggest(plan["errors"], catalog) + image_problems(host, v) + unit_problems(host, v)
        if fleet_errors and host == first:
            own = [*fleet_errors, "fleet placed so far:", *placement["table"], *own]
        elif fleet_errors:
            own = [f"d3_fleet_models: the fleet placement is refused ({len(fleet_errors)} problem(s), listed under {first})", *own]
        secret = (v.get("d3_units_api_key_secret") or "d3-api-key") if opts_key(v) else ""
        image = v.get("d3_units_image_ref") or v.get("d3_image_name")
        report = [f"== {host}: {len(plan['instances'])} instance(s) on {len(plan['gpus'])} GPU(s)"]
        report += [f"  {line}" for line in plan_report(plan, image, secret)] if not own else []
        hosts[host] = {"plan": plan, "problems": own, "report": report, "image": image}
        if own:
            partial = ["plan so far (nothing is changed until every problem is fixed):"] + plan["partial"] if plan["partial"] else []
            problems[host] = own + partial
    misnamed = group_problems(groups)
    if misnamed and (anchor or first):
        problems[anchor or first] = misnamed + problems.get(anchor or first, [])
    warning = hub_warning(names, ref) if names else ""
    good = [h for h in names if h in hosts and not hosts[h]["problems"]]
    placed = ["fleet placement (d3_fleet_models):", *placement["table"]] if fleet_models and not fleet_errors else []
    head = ([warning] if warning else []) + placed
    return {
        "head": head,
        "lines": head + [line for h in good for line in hosts[h]["report"]] + summary(hosts),
        "plans": {h: hosts[h]["plan"] for h in names if h in hosts},
        "hosts": hosts,
        "probe": probe,
        "placement": placement,
        "problems": problems,
        "summary": summary(hosts),
        "warnings": [warning] if warning else [],
    }


def opts_key(v: dict[str, Any]) -> bool:
    """Whether the host has an API key: a value, or one in Ansible Vault that this run did not decrypt."""
    return len(str(v.get("d3_units_api_key") or "")) > 0 or "d3_units_api_key" in v.get(VAULTED, [])


def summary(hosts: dict[str, Any]) -> list[str]:
    """The fleet in a few lines: hosts, GPUs, instances, then per model its replicas and total KV tokens."""
    per_model: dict[str, list[int]] = {}
    gpus = instances = 0
    for entry in hosts.values():
        plan = entry["plan"]
        gpus += len(plan["gpus"])
        for inst in plan["instances"]:
            instances += 1
            row = per_model.setdefault(str(inst["model"]), [0, 0])
            row[0] += 1
            row[1] += int((inst.get("kv_cache") or {}).get("gpu_kv_cache_tokens") or 0)
    refused = sum(1 for e in hosts.values() if e["problems"])
    lines = [f"fleet: {len(hosts)} host(s), {gpus} GPU(s), {instances} instance(s)" + (f", {refused} host(s) refused" if refused else "")]
    width = max([len(m) for m in per_model] + [5])
    lines += [f"  {'model':<{width}}  replicas  KV tokens (sum of the instances' GPU KV cache, predicted)"]
    lines += [f"  {m:<{width}}  {r:>8}  {kv:,}" for m, (r, kv) in sorted(per_model.items())]
    return lines


def router_fleet(hostvars: dict[str, dict[str, Any]], plans: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """d3_router_backends' input for ``names`` (roles/d3_router/tasks/fleet.yml's mapping; a host not planned: None)."""
    return {h: {"plan": plans.get(h), "backend_address": hostvars.get(h, {}).get("d3_router_backend_address"),
                "backend_port_offset": hostvars.get(h, {}).get("d3_router_backend_port_offset"),
                "ansible_host": hostvars.get(h, {}).get("ansible_host"), "api_key": opts_key(hostvars.get(h, {})),
                "allow_unauthenticated": truthy(hostvars.get(h, {}).get("d3_allow_unauthenticated", False))}
            for h in names}  # fmt: skip


def gb(value: int) -> str:
    return f"{value / 1e9:.1f} GB"


def host_lines(plan: dict[str, Any], v: dict[str, Any]) -> list[str]:
    """A planned host's disk and firewall lines (its plan's weights; the firewall role's variables)."""
    repos = {i["hf_repo"]: int(i.get("download_bytes") or 0) for i in plan["instances"]}
    lines = [f"  disk: {gb(sum(repos.values()))} of weights for {len(repos)} repositor{'y' if len(repos) == 1 else 'ies'} "
             f"into {plan['hf_home']} (d3_hf_home), plus the image (preflight measures the free space)"]  # fmt: skip
    if "d3_firewall_enabled" in v:
        if truthy(v["d3_firewall_enabled"]):
            clients = ", ".join(str(c) for c in v.get("d3_firewall_allowed_clients") or []) or "none"
            monitors = ", ".join(str(c) for c in v.get("d3_firewall_monitors") or []) or "none"
            lines.append(f"  firewall: on (d3_firewall_enabled): model ports {', '.join(str(p) for p in v.get('d3_firewall_ports') or [])}"
                         f" from {clients} (d3_allowed_clients); monitor ports "
                         f"{', '.join(str(p) for p in v.get('d3_firewall_monitor_ports') or []) or 'none'} and the model "
                         f"ports from {monitors} (d3_firewall_monitors)")  # fmt: skip
        else:
            lines.append("  firewall: off (d3_firewall_enabled: false): the host's own rules decide who reaches the model ports")
    return lines


def router_lines(router: str, view: dict[str, Any]) -> list[str]:
    """One router's endpoints, ports and backends (d3_router_backends' view)."""
    endpoint, metrics = view.get("endpoint") or {}, view.get("metrics") or {}
    lines = [f"== {router} (d3-routers): fleet endpoint port {endpoint.get('port')} ({', '.join(endpoint.get('paths') or [])}), "
             f"metrics port {metrics.get('port')}"]  # fmt: skip
    for model in view["models"]:
        port = f"port {model['port']}" if model.get("port") else "fleet endpoint only"
        servers = ", ".join(f"{s['host']} {s['address']}:{s['port']}" for s in model["servers"])
        lines.append(f"  {model['served_name']} ({model['model']}, {port}): backend {model['backend']}, "
                     f"{len(model['servers'])} server(s): {servers}")  # fmt: skip
    return lines


def monitor_lines(monitor: str, view: dict[str, Any], rules: dict[str, Any]) -> list[str]:
    """One monitor's scrape targets by job and its alert rules count (d3_metrics_scrape, d3_metrics_rules)."""
    jobs: dict[str, int] = {}
    for target in view["targets"]:
        jobs[target["job"]] = jobs.get(target["job"], 0) + 1
    # the alerts only (d3_metrics_rules writes its recording rules into the same group)
    count = sum(1 for g in (rules.get("rules") or {}).get("groups") or [] for r in g.get("rules") or [] if "alert" in r)
    return [f"== {monitor} (d3-monitors): {len(view['targets'])} scrape target(s) "
            f"({', '.join(f'{j} {n}' for j, n in sorted(jobs.items()))}), {count} alert rule(s)"]  # fmt: skip


def rollout_lines(order: list[str], plans: dict[str, Any], v: dict[str, Any]) -> list[str]:
    """The rollout's batches and their drain check, as playbooks/rollout.yml would compute them from this plan."""
    settings = {k: v.get(k, d) for k, d in ROLLOUT_DEFAULTS.items()}
    batches = rollout_batches(order, settings["d3_rollout_serial"])
    replicas = {h: [i["served_model_name"] for i in plans[h]["instances"]] for h in order}
    refused = drain_problems(batches, replicas, settings["d3_rollout_max_unavailable"], settings["d3_rollout_min_up"])
    listed = " | ".join(f"batch {n}: {', '.join(b)}" for n, b in enumerate(batches, 1))
    lines = [f"== rollout (d3_rollout_serial {as_json(settings['d3_rollout_serial'])}, d3_rollout_max_unavailable "
             f"{settings['d3_rollout_max_unavailable']}): {listed}"]
    lines += [f"  rollout.yml would refuse, before staging pulls anything: {p}" for p in refused] or ["  drain check: passes"]
    return lines


def remap_lines(v: dict[str, Any]) -> list[str]:
    """Where images and weights come from (the first host's view: group settings)."""
    mirrors = [f"{m.get('prefix')} -> {m.get('location')}" for m in v.get("d3_image_registry_mirrors") or [] if isinstance(m, dict)]
    hub = v.get("d3_weights_hf_endpoint") or ""
    return [f"== remaps: images {'; '.join(mirrors) or 'from their registries (no d3_image_registry_mirrors)'}; "
            f"weights from {hub + ' (d3_weights_hf_endpoint)' if hub else 'huggingface.co (no d3_weights_hf_endpoint)'}"]


def fleet_views(
    _input: dict[str, Any],
    hostvars: dict[str, dict[str, Any]],
    group: list[str],
    routers: dict[str, dict[str, Any]] | None = None,
    monitors: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The rest of the inventory from the fleet's plan (``_input``: fleet_plan's result, every l4-nodes host planned):
    per GPU host its disk and firewall lines, per router its endpoints and backends, per monitor its targets and
    rules count, the remaps and the rollout batches with their drain check. Returns ``{hosts, lines, problems}``: each
    planned host's lines, the fleet's, and the routers' and monitors' refusals per host, as their roles word them."""
    plans = {h: e["plan"] for h, e in _input["hosts"].items() if not e["problems"]}
    complete = [h for h in group if h in plans]
    lines: list[str] = []
    problems: dict[str, list[str]] = {}
    per_host = {host: host_lines(plans[host], hostvars.get(host, {})) for host in sorted(plans)}
    if len(complete) < len(group) or not group:
        return {"hosts": per_host, "problems": problems,
                "lines": ["(routers, monitors and the rollout are planned when every l4-nodes host is planned without "
                          "a problem)"]}  # fmt: skip
    fleet = router_fleet(hostvars, plans, group)
    for router, rv in sorted((routers or {}).items()):
        view = router_backends(fleet, router, rv.get("d3_router_ports"), rv.get("d3_router_listen_address"), {
            "endpoint_port": rv.get("d3_router_port"), "metrics_port": rv.get("d3_router_metrics_port"),
            "health_port": rv.get("d3_router_health_port"), "metrics_allowed": rv.get("d3_router_metrics_allowed"),
            "allowed_paths": rv.get("d3_router_allowed_paths")})  # fmt: skip
        if view["errors"]:
            problems[router] = [f"{router}: the router cannot be configured:", *view["errors"]]
        else:
            lines += router_lines(router, view)
    # where the monitors reach a router or monitor host: d3_router_backend_address when set (a NAT, the lab's routers on
    # their VRRP network), else ansible_host (as for the l4-nodes hosts)
    router_addresses = {r: {"ansible_host": rv.get("ansible_host"), "backend_address": rv.get("d3_router_backend_address"),
                            "metrics_port": rv.get("d3_router_metrics_port")} for r, rv in (routers or {}).items()}  # fmt: skip
    others = {m: {"ansible_host": mv.get("ansible_host"), "backend_address": mv.get("d3_router_backend_address")}
              for m, mv in (monitors or {}).items()}  # fmt: skip
    for monitor, mv in sorted((monitors or {}).items()):
        view = metrics_scrape(fleet, monitor, router_addresses, others, {
            "scrape_interval": mv.get("d3_metrics_scrape_interval"), "evaluation_interval": mv.get("d3_metrics_evaluation_interval"),
            "node_exporter_port": mv.get("d3_metrics_node_exporter_port"), "alertmanager": mv.get("d3_metrics_alertmanager"),
            "rules_file": mv.get("d3_metrics_rules_file")})  # fmt: skip
        rules = metrics_rules(view["models"], {"runbook_url": mv.get("d3_metrics_runbook_url")})
        if view["errors"] or rules["errors"]:
            problems[monitor] = [f"{monitor}: the monitor cannot be configured:", *view["errors"], *rules["errors"]]
        else:
            lines += monitor_lines(monitor, view, rules)
    first = hostvars.get(complete[0], {})
    return {"hosts": per_host, "lines": lines + remap_lines(first) + rollout_lines(complete, plans, first), "problems": problems}


def with_views(plan: dict[str, Any], views: dict[str, Any]) -> dict[str, Any]:
    """The fleet plan with the views' lines before its summary and their refusals added to its problems."""
    problems = {h: [*plan["problems"].get(h, []), *views["problems"].get(h, [])] for h in {*plan["problems"], *views["problems"]}}
    blocks = [line for h in sorted(plan["hosts"]) if h in views["hosts"]
              for line in [*plan["hosts"][h]["report"], *views["hosts"][h]]]  # fmt: skip
    return {**plan, "lines": [*plan["head"], *blocks, *views["lines"], *plan["summary"]], "problems": problems}


class FilterModule:
    """Ansible filters: d3_fleet_plan, d3_image_checks, d3_image_hub_warning, d3_plan_options, d3_plan_option_vars,
    d3_fleet_place_options (fleet_views and with_views are the action d3fleet.fleet.fleet_plan's)."""

    def filters(self) -> dict[str, Any]:
        return {"d3_fleet_plan": fleet_plan, "d3_image_checks": image_checks, "d3_image_hub_warning": hub_warning,
                "d3_plan_options": plan_options, "d3_plan_option_vars": plan_option_vars,
                "d3_fleet_place_options": fleet_place_options}
