"""Fleet-level placement of D3 replicas (Ansible filter plugin ``d3_fleet_place``).

``d3_fleet_models`` says how many replicas of each model the fleet runs; this places them on the hosts of the group
and returns, per host, the ``d3_models`` items to add to the host's own ``d3_models``. The per-host planner
(``d3_plan``) then gives each instance its GPUs, port and VRAM budget as for any other instance. Pure functions: the
inputs are the inventory's (declared GPU counts, labels, each host's own ``d3_models``), never facts, so that a
``--limit`` run places every replica where a full run does.

How a replica finds its host (rendezvous, or highest-random-weight, hashing):

- Every host ``h`` gets a score from ``sha256``: for an item with ``spread`` (the default: at most one replica per
  host) the item ranks the hosts once, by ``sha256(f"{name}/{h}")``, and its replicas take the best-ranked hosts
  (the classic rendezvous choice of k hosts for k copies); without ``spread`` each replica ``r`` (1, 2, ...) is an
  instance of its own (named ``name-r``, all serving the model name ``name``: ``served_name``) and ranks the
  hosts by ``sha256(f"{name}/{r}/{h}")``. A score depends on
  nothing else: not on the other hosts, not on the replica count, not on the order of the inputs (Python's
  ``hash()`` is salted per process and is never used).
- The replicas are placed one after another in a fixed order: replica 1 of every item, then replica 2 of every
  item, ... (within a round the larger tensor-parallel size first, then by name). Each goes to its best-ranked host
  that meets its constraints (``hosts``, ``label``), still has the GPUs it needs (the catalog's tensor-parallel
  size: the host's declared GPUs minus those its own ``d3_models`` and the replicas already placed take), whose GPU
  memory holds it, where its port and instance name are free and, with ``spread``, that runs no replica of the item
  yet. A spread item's replica numbers follow the rank of its hosts; what identifies its replicas is the host set.

Why that moves little (the test suite checks each point over random fleets):

- Adding a replica (N -> N+1) moves no replica of the item: its first N replicas keep their scores and come before
  the new one in the order, so each meets the hosts in the same state as before; the new one takes the next host.
  With GPUs to spare nothing else moves either.
- Adding a host moves no replica between the existing hosts, since their ranking among themselves stays as it was.
  What does move is what the new host now outranks: a spread item whose top hosts it enters moves one replica onto
  it (from the host that drops out of its top N), an unspread replica moves onto it when it ranks the new host first
  (about 1 in hosts of them). Both move onto the new host and nowhere else; that is the share of the load the new
  host should carry. No stateless placement can do better: a function of the host set alone that never moved a
  replica onto an added host would have to give a replica both host a (a added to {b}) and host b (b added to {a})
  in {a, b}. Keeping every running replica where it is needs the running state, which the planner does not read.
- Removing a host, or a host losing room (its own ``d3_models`` grew, ``d3_gpu_count`` shrank, its label went away),
  moves the replicas that no longer fit there, each to its next-ranked host that has room: a replica whose host
  lost capacity moves.
- Where GPUs run short, moves cascade: a replica that takes the last free GPUs of a host sends a later replica (in
  the order above, possibly of another item) that wanted that host to its next choice. When every replica gets its
  first choice (GPUs to spare), no cascade happens. When a replica finds no host at all, the placement is refused
  (``errors``), naming the model, the count wanted and placed, and the state of every host it could have used.

GPU capacity is counted in whole GPUs (a replica takes its tensor-parallel size, a host's own instance its ``gpus``
list or its tensor-parallel size), which is conservative: the per-host planner may still let small instances share a
GPU. VRAM per GPU, ports and start order stay the per-host planner's job; here the replica is only checked to fit
each distinct GPU memory size of the fleet once (through the planner, on its own).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

try:  # under Ansible: the collection's own modules
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import control_free, env_problems, shown
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_planner import NAME_RE, d3_plan, host_gpus, split_args
except ImportError:  # the unit tests import the filters as top-level modules
    from d3_inputs import control_free, env_problems, shown  # type: ignore[no-redef]
    from d3_planner import NAME_RE, d3_plan, host_gpus, split_args  # type: ignore[no-redef]
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table

FLEET_KEYS = {"model", "replicas", "name", "hosts", "label", "spread", "port", "variant", "extra_args", "env"}
# keys of a fleet item that each placed replica carries as a d3_models item
PASS_KEYS = ("variant", "port", "extra_args", "env")
HOST_KEYS = {"gpus", "gpu_memory_mib", "labels", "models"}
# planner options that decide whether an instance fits on its own (the rest are host matters)
CHECK_OPTIONS = ("allow_non_l4", "allow_cuda_graphs", "vram_overhead_mib", "min_concurrency", "gpu_share_cap", "cuda_compat")
CHECK_HOST = "d3-fleet-check"
DIGITS = re.compile(r"\A[0-9]+\Z")


def score(name: str, replica: int | None, host: str) -> int:
    """The rendezvous weight of ``host`` for replica ``replica`` of ``name`` (None: for every replica of a spread
    item): stable across runs and machines."""
    key = f"{name}/{host}" if replica is None else f"{name}/{replica}/{host}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest(), "big")


def _count(value: Any) -> int | None:
    """A whole number given as an int or as digits (inventory values may arrive as strings), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and DIGITS.match(value):
        return int(value)
    return None


def item_tp(item: Any, catalog: dict[str, Any]) -> int:
    """Whole GPUs a d3_models item takes: its ``gpus`` list, else its tensor-parallel size (extra_args, variant,
    catalog, as the planner resolves it). 0 for an item the planner will refuse anyway (it reports why)."""
    if not isinstance(item, dict) or item.get("model") not in catalog:
        return 0
    if isinstance(item.get("gpus"), list):
        return len(item["gpus"])
    entry = catalog[item["model"]]
    variants = entry.get("variants") or {}
    wanted = item.get("variant", entry.get("default_variant"))
    if wanted is not None and not isinstance(wanted, str):
        return 0  # the planner refuses it (a variant is named by a string)
    variant = variants.get(wanted) or {}
    tp: Any = variant.get("tensor_parallel_size", entry.get("tensor_parallel_size", 1))
    try:
        for flag, value in split_args(list(item.get("extra_args") or [])):
            if flag == "--tensor-parallel-size":
                tp = value
        return max(int(str(tp)), 1)
    except (TypeError, ValueError):
        return 0


class _Host:
    def __init__(self, name: str, gpus: int, memory_mib: int, labels: list[str], models: list[Any], catalog: dict[str, Any]):
        self.name = name
        self.gpus = gpus
        self.memory_mib = memory_mib
        self.labels = set(labels)
        self.used = sum(item_tp(m, catalog) for m in models)
        self.names: dict[str, str] = {}  # instance name -> who runs it
        self.ports: dict[int, str] = {}
        for pos, m in enumerate(models):
            if isinstance(m, dict) and m.get("model") in catalog:
                self.names[str(m.get("name") or catalog[m["model"]]["instance_name"])] = f"its own d3_models[{pos}]"
                if _count(m.get("port")) is not None:
                    self.ports[int(m["port"])] = f"its own d3_models[{pos}]"
        self.placed: list[dict[str, Any]] = []

    @property
    def free(self) -> int:
        return max(self.gpus - self.used, 0)


class _Fleet:
    def __init__(self, models: Any, catalog: dict[str, Any], common: dict[str, Any], hosts: Any, options: dict[str, Any] | None):
        self.raw_models = models
        self.catalog = catalog
        self.common = common
        self.raw_hosts = hosts
        self.options = {k: v for k, v in dict(options or {}).items() if k in CHECK_OPTIONS}
        self.errors: list[str] = []
        self.hosts: dict[str, _Host] = {}
        self.items: list[dict[str, Any]] = []

    # -- inputs --------------------------------------------------------------------------------------
    def read_hosts(self) -> None:
        if not isinstance(self.raw_hosts, dict):
            self.errors.append(f"fleet hosts: expected a mapping of host name to its GPUs, labels and models, got {shown(self.raw_hosts)}")
            return
        default_mib = int(self.common["l4_memory_mib"])
        for name in sorted(self.raw_hosts, key=str):
            spec = self.raw_hosts[name]
            where = f"host {shown(name)}" if not isinstance(name, str) or not control_free(name) or not name else f"host {name}"
            if not isinstance(name, str) or not name or not control_free(name):
                self.errors.append(f"{where}: a host name must be one line of text. Fix the inventory")
                continue
            if not isinstance(spec, dict):
                self.errors.append(f"{where}: expected a mapping with gpus, gpu_memory_mib, labels, models, got {shown(spec)}")
                continue
            unknown = sorted(set(spec) - HOST_KEYS)
            if unknown:
                self.errors.append(f"{where}: unknown key(s) {unknown}; use only {sorted(HOST_KEYS)}")
                continue
            gpus = _count(spec.get("gpus"))
            if spec.get("gpus") is None:
                self.errors.append(
                    f"{where}: d3_gpu_count is not set: fleet placement needs each host's declared GPU count so a --limit "
                    "run places the same way. Fix: set d3_gpu_count for the host in the inventory"
                )
                continue
            if gpus is None:
                self.errors.append(f"{where}: d3_gpu_count = {shown(spec['gpus'])} is not a whole number. Fix the inventory")
                continue
            raw_mib = spec.get("gpu_memory_mib")
            memory = default_mib if raw_mib is None else _count(raw_mib)
            if not memory:
                self.errors.append(f"{where}: d3_gpu_memory_mib = {shown(raw_mib)} is not a positive whole number. Fix the inventory")
                continue
            labels = [] if spec.get("labels") is None else spec["labels"]
            if not isinstance(labels, list) or not all(isinstance(x, str) and x and control_free(x) for x in labels):
                self.errors.append(f"{where}: d3_host_labels = {shown(labels)} is not a list of one-line strings. Fix the inventory")
                continue
            models = [] if spec.get("models") is None else spec["models"]
            if not isinstance(models, list):
                self.errors.append(f"{where}: d3_models = {shown(models)} is not a list. Fix the inventory")
                continue
            self.hosts[name] = _Host(name, gpus, memory, labels, models, self.catalog)

    def read_item(self, pos: int, item: Any) -> dict[str, Any] | None:
        where = f"d3_fleet_models[{pos}]"
        if not isinstance(item, dict):
            self.errors.append(f"{where}: expected a mapping with `model:` and `replicas:`, got {shown(item)}. "
                               "Fix: write `- {model: d3-flash, replicas: 2}`")  # fmt: skip
            return None
        unknown = sorted(set(map(str, item)) - FLEET_KEYS)
        if unknown:
            hint = " (GPU indices are a host's matter: the planner picks them on the host)" if "gpus" in unknown else ""
            self.errors.append(f"{where}: unknown key(s) {unknown}{hint}. Fix: use only {sorted(FLEET_KEYS)}")
            return None
        model = item.get("model")
        if not isinstance(model, str) or model not in self.catalog:
            self.errors.append(
                f"{where}: unknown model {shown(model)}. Fix: set {where}.model to one of: {', '.join(sorted(self.catalog))}"
            )
            return None
        name = item.get("name")
        name = self.catalog[model]["instance_name"] if name is None else name
        if not isinstance(name, str) or not NAME_RE.match(name):
            self.errors.append(f"{where} ({model}): name {shown(name)} is not a valid instance name. "
                               "Fix: use lowercase letters, digits and '-' (at most 63, starting with a letter or digit)")  # fmt: skip
            return None
        label = f"{where} ({name})" if name == model else f"{where} ({name}, model {model})"
        problems: list[str] = []
        replicas = _count(item.get("replicas"))
        if replicas is None or replicas < 1:
            problems.append(f"replicas {shown(item.get('replicas'))} is not a positive whole number. Fix: give `replicas: 1` or more")
        spread = item.get("spread", True)
        if not isinstance(spread, bool):
            problems.append(f"spread {shown(spread)} is not true or false. Fix: write `spread: true` or `spread: false`")
        only = item.get("hosts")
        if only is not None:
            if not isinstance(only, list) or not only or not all(isinstance(h, str) for h in only):
                problems.append(
                    f"hosts {shown(only)} is not a non-empty list of host names. Fix: list hosts of the group, or leave `hosts:` out"
                )
            else:
                group = sorted(map(str, self.raw_hosts)) if isinstance(self.raw_hosts, dict) else []
                missing = sorted({h for h in only if h not in group})
                if missing:
                    problems.append(
                        f"hosts {shown(missing)} not in the fleet (its hosts: {', '.join(group) or 'none'}). Fix: name hosts of the group"
                    )
        tag = item.get("label")
        if tag is not None and (not isinstance(tag, str) or not tag or not control_free(tag)):
            problems.append(f"label {shown(tag)} is not a one-line string. Fix: give a label that hosts carry in d3_host_labels")
        port = item.get("port")
        if port is not None and spread is False:
            problems.append(
                "port with spread: false: two replicas on one host cannot share a port. Fix: remove `port:` or set spread: true"
            )
        if spread is False and replicas and not NAME_RE.match(f"{name}-{replicas}"):
            problems.append(f"name {name!r} is too long for replica names {name}-1..{name}-{replicas}. Fix: give a shorter `name:`")
        for what, problem, fix in env_problems(item.get("env")):
            problems.append(f"{what} {problem}. Fix: {fix}")
        if problems:
            self.errors.extend(f"{label}: {p}" for p in problems)
            return None
        replica_item = {"model": model, "name": name, **{k: item[k] for k in PASS_KEYS if item.get(k) is not None}}
        return {
            "pos": pos,
            "label": label,
            "model": model,
            "name": name,
            "replicas": replicas,
            "spread": spread,
            "hosts": None if only is None else set(only),
            "tag": tag,
            "port": _count(port),
            "item": replica_item,
            "tp": item_tp(replica_item, self.catalog),
        }

    def check_fit(self, fleet_item: dict[str, Any]) -> bool:
        """Plan the replica alone on a host of each GPU memory size of the fleet (the planner's own checks: flags,
        variant, env, port range, VRAM). Hosts whose GPUs it does not fit are left out with the reason; a replica
        that fits none is an error with the planner's messages."""
        sizes = sorted({h.memory_mib for h in self.hosts.values()}) or [int(self.common["l4_memory_mib"])]
        fleet_item["too_small"] = {}
        first: list[str] = []
        for mib in sizes:
            count = max([fleet_item["tp"], 1, *(h.gpus for h in self.hosts.values() if h.memory_mib == mib)])
            options = {**self.options, "listen_address": "127.0.0.1", "require_revisions": False}
            plan = d3_plan([fleet_item["item"]], self.catalog, self.common, host_gpus(count, mib, "NVIDIA L4"), CHECK_HOST, options)
            if plan["errors"]:
                fleet_item["too_small"][mib] = plan["errors"]
                first = first or plan["errors"]
            elif plan["instances"]:
                fleet_item["tp"] = int(plan["instances"][0]["tensor_parallel_size"])
        if len(fleet_item["too_small"]) < len(sizes):
            return True
        where = f"d3_fleet_models[{fleet_item['pos']}]"
        for message in first:
            text = message.removeprefix(f"host {CHECK_HOST}: ").replace("d3_models[0]", where)
            if text.startswith(f"{where} ("):  # the planner's "d3_models[0] (name): ..." -> the fleet item's label
                text = text.split("): ", 1)[-1]
            self.errors.append(f"{fleet_item['label']}: {text}")
        return False

    def check_names(self) -> None:
        """Instance names the items give their replicas must differ: ``name`` with spread, ``name-1`` ... without."""
        owner: dict[str, str] = {}
        for it in list(self.items):
            names = [it["name"]] if it["spread"] else [f"{it['name']}-{r}" for r in range(1, it["replicas"] + 1)]
            clash = sorted(n for n in names if n in owner)
            if clash:
                self.errors.append(
                    f"{it['label']}: instance name(s) {clash} also given by {owner[clash[0]]}. "
                    f"Fix: give d3_fleet_models[{it['pos']}] a distinct `name:`"
                )
                self.items.remove(it)
                continue
            owner.update(dict.fromkeys(names, f"d3_fleet_models[{it['pos']}]"))

    # -- placement -------------------------------------------------------------------------------------
    def why_not(self, it: dict[str, Any], host: _Host, instance: str) -> str | None:
        """Why ``host`` cannot take a replica of ``it`` now (None: it can)."""
        if it["hosts"] is not None and host.name not in it["hosts"]:
            return "not in hosts"
        if it["tag"] is not None and it["tag"] not in host.labels:
            return f"no label {it['tag']!r}"
        if host.memory_mib in it["too_small"]:
            return f"its {host.memory_mib} MiB GPUs do not hold it"
        if it["spread"] and any(p["item"] is it for p in host.placed):
            return "runs one already (spread)"
        if instance in host.names:
            return f"{host.names[instance]} is named {instance}"
        if it["port"] is not None and it["port"] in host.ports:
            return f"port {it['port']} taken by {host.ports[it['port']]}"
        if host.free < it["tp"]:
            return f"{host.free} of {host.gpus} GPU(s) free"
        return None

    def place(self) -> None:
        queue = sorted(
            ((r, it) for it in self.items for r in range(1, it["replicas"] + 1)),
            key=lambda x: (x[0], -x[1]["tp"], x[1]["name"]),
        )
        for replica, it in queue:
            instance = it["name"] if it["spread"] else f"{it['name']}-{replica}"
            key = None if it["spread"] else replica
            ranked = [h for _, _, h in sorted((-score(it["name"], key, h.name), h.name, h) for h in self.hosts.values())]
            host = next((h for h in ranked if self.why_not(it, h, instance) is None), None)
            if host is None:
                it.setdefault("missing", []).append(replica)
                continue
            host.used += it["tp"]
            host.names[instance] = f"replica {replica} of d3_fleet_models[{it['pos']}]"
            if it["port"] is not None:
                host.ports[it["port"]] = f"replica {replica} of d3_fleet_models[{it['pos']}]"
            # replicas on one host (spread: false) are NAME-1, NAME-2 as instances and units, and all serve NAME: one
            # model for clients, one router backend with a server per replica
            served = {} if it["spread"] else {"served_name": it["name"]}
            host.placed.append({"item": it, "replica": replica, "d3_models": {**it["item"], "name": instance, **served}})
        for it in self.items:
            if it.get("missing"):
                self.refuse_shortfall(it)

    def refuse_shortfall(self, it: dict[str, Any]) -> None:
        wanted, placed = it["replicas"], it["replicas"] - len(it["missing"])
        instance = it["name"] if it["spread"] else f"{it['name']}-{it['missing'][0]}"
        reasons = {h.name: self.why_not(it, h, instance) for h in sorted(self.hosts.values(), key=lambda h: h.name)}
        considered = [
            f"{n}: {r or 'has room now'}" for n, r in reasons.items() if r not in ("not in hosts",) and not str(r).startswith("no label")
        ]
        left_out = [n for n, r in reasons.items() if r == "not in hosts" or str(r).startswith("no label")]
        detail = "; ".join(considered) or "no host meets its constraints"
        if left_out:
            detail += f"; left out by its {'hosts' if it['hosts'] is not None else 'label'}"
            detail += f"{' and label' if it['hosts'] is not None and it['tag'] is not None else ''}: {', '.join(left_out)}"
        want = f"hosts with {it['tp']} free GPU{'s' if it['tp'] > 1 else ''}" + (
            f" and no {it['name']} replica yet (spread)" if it["spread"] else ""
        )
        fixes = ["add GPUs or hosts" + (f" labelled {it['tag']!r}" if it["tag"] is not None else ""), "lower replicas"]
        if it["hosts"] is not None or it["tag"] is not None:
            fixes.append("widen hosts/label")
        if it["spread"] and any(r == "runs one already (spread)" for r in reasons.values()):
            fixes.append("set spread: false")
        self.errors.append(
            f"{it['label']}: {wanted} replica{'s' if wanted > 1 else ''} wanted, {placed} placed: {want}: none left "
            # "add GPUs or hosts, or lower replicas": a comma keeps the two fixes apart when the first has an "or" itself
            f"({detail}). Fix: {', '.join(fixes[:-1])}{',' if len(fixes) == 2 else ''} or {fixes[-1]}"
        )

    # -- result ------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.read_hosts()
        host_errors = bool(self.errors)
        if not isinstance(self.raw_models, list):
            self.errors.append(f"d3_fleet_models: expected a list, got {type(self.raw_models).__name__}. Fix: write a YAML list")
            return self.result()
        seen: dict[str, int] = {}
        for pos, raw in enumerate(self.raw_models):
            it = self.read_item(pos, raw)
            if it is None:
                continue
            if it["name"] in seen:
                self.errors.append(
                    f"{it['label']}: name {it['name']!r} is also d3_fleet_models[{seen[it['name']]}]'s. "
                    f"Fix: give d3_fleet_models[{pos}] a distinct `name:`"
                )
                continue
            seen[it["name"]] = pos
            if self.check_fit(it):
                self.items.append(it)
        self.check_names()
        if not host_errors:  # a host whose GPUs are unknown would make every shortfall message wrong
            self.place()
        return self.result()

    def result(self) -> dict[str, Any]:
        hosts = {
            h.name: [p["d3_models"] for p in sorted(h.placed, key=lambda p: (p["item"]["name"], p["replica"]))]
            for h in sorted(self.hosts.values(), key=lambda h: h.name)
        }
        placements = sorted(
            (
                {
                    "model": p["item"]["model"],
                    "name": p["d3_models"]["name"],
                    "replica": p["replica"],
                    "host": h.name,
                    "gpus": p["item"]["tp"],
                }
                for h in self.hosts.values()
                for p in h.placed
            ),
            key=lambda p: (p["name"], p["replica"]),
        )
        rows = [(p["model"], p["name"], str(p["replica"]), p["host"], str(p["gpus"])) for p in placements]
        lines = table(("MODEL", "INSTANCE", "REPLICA", "HOST", "GPUS"), rows)
        return {"hosts": hosts, "placements": placements, "table": lines, "errors": list(self.errors)}


def d3_fleet_place(
    fleet_models: list[dict[str, Any]] | None,
    catalog: dict[str, Any],
    common: dict[str, Any],
    hosts: dict[str, dict[str, Any]],
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Place the fleet's replicas. Returns ``{hosts, placements, table, errors}``: ``hosts`` maps every host to the
    d3_models items placed on it, ``placements`` lists ``{model, name, replica, host, gpus}``; refusals are collected
    in ``errors`` (the replicas that fit are still shown)."""
    return _Fleet([] if fleet_models is None else fleet_models, catalog, common, hosts, options).run()


class FilterModule:
    """Ansible filters: d3_fleet_place."""

    def filters(self) -> dict[str, Any]:
        return {"d3_fleet_place": d3_fleet_place}
