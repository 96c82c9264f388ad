"""Rollout batches, replica availability, drains, progress, failures and downtimes (filters ``d3_rollout_batches``,
``d3_rollout_drain_problems``, ``d3_rollout_waves``, ``d3_rollout_slice_problems``, ``d3_rollout_drain_check``, ``d3_rollout_drain_plan``,
``d3_rollout_drain_records``, ``d3_rollout_restore_plan``, ``d3_rollout_progress``, ``d3_rollout_failure_cause``,
``d3_rollout_downtimes``, ``d3_rollout_rows``, ``d3_rollout_summary``, ``d3_systemctl_show``).

Pure functions. A rollout restarts hosts in batches (the restart play's ``serial``), and each host in waves
(``d3_rollout_waves``); behind a router, a wave's instances are drained at once, and the hosts of a batch run in
parallel, so a batch must never drain all of a model's replicas at once nor more than ``d3_rollout_max_unavailable``
of them. These filters let the rollout check that for every batch before the first
restart, from the same batches Ansible will make.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table


def _batch_size(value: Any, total: int) -> int:
    """One ``serial`` item as Ansible reads it (ansible.utils.helpers.pct_to_int): "N%" of all the play's hosts,
    rounded down but at least 1; anything else as an int."""
    if isinstance(value, str) and value.endswith("%"):
        return int((int(value[:-1]) / 100.0) * total) or 1
    return int(value)


def rollout_batches(hosts: list[str], serial: Any) -> list[list[str]]:
    """The batches Ansible's PlaybookExecutor._get_serialized_batches makes of ``hosts`` (in play order) for ``serial``
    (a scalar or a list; the last item repeats; a size <= 0, or no serial, is one batch of every host left)."""
    serial_list = serial if isinstance(serial, list) else [serial]
    if not serial_list:
        serial_list = [-1]
    left = list(hosts)
    total = len(left)
    batches: list[list[str]] = []
    item = 0
    while left:
        size = _batch_size(serial_list[item], total)
        if size <= 0:
            batches.append(left)
            break
        batches.append(left[:size])
        left = left[size:]
        item = min(item + 1, len(serial_list) - 1)
    return batches


def _whole(value: Any) -> bool:
    return not isinstance(value, bool) and str(value).isdigit() and int(value) >= 1


def _wave_cap(total: int, others: int, min_up: int, max_unavailable: int) -> int:
    """How many servers of one backend a host may drain at once (one wave): at most ``max_unavailable`` of the model's
    replicas out together and at least ``min_up`` left serving, the replicas the batch's other hosts drain counted
    out; never below 1 (a replica must restart some time: the check before each drain refuses what would starve)."""
    return max(1, min(max_unavailable - others, total - min_up - others))


def drain_problems(batches: list[list[str]], replicas: dict[str, list[str]], max_unavailable: int, min_up: Any = 1) -> list[str]:
    """Refusals for batches that would drain too many replicas of one model at once.

    ``replicas``: host -> the served model names of its instances (one entry per instance). A model with two or more
    replicas in the fleet must keep one serving through every batch, and at most ``max_unavailable`` of its replicas
    may be out at once. A host restarts its instances in waves (``d3_rollout_waves``): of its own replicas of a model it
    drains at most ``_wave_cap`` at once, so two replicas on one host (``spread: false``) go one at a time and are not
    refused; the hosts of one batch run in parallel, so their waves add up. A model with one replica cannot stay
    available through its restart; that is not refused (clients see that instance's restart), and the rollout says so
    elsewhere."""
    if not _whole(max_unavailable):
        return [f"d3_rollout_max_unavailable is {max_unavailable!r}: it must be a whole number, at least 1 (a replica must "
                "restart some time). Fix the -e value or the inventory."]
    if not _whole(min_up):
        return [f"d3_rollout_min_up is {min_up!r}: it must be a whole number, at least 1. Fix the -e value or the inventory."]
    totals: dict[str, int] = {}
    for models in replicas.values():
        for model in models:
            totals[model] = totals.get(model, 0) + 1
    problems = []
    for number, batch in enumerate(batches, start=1):
        counts: dict[str, dict[str, int]] = {}
        for host in batch:
            for model in replicas.get(host, []):
                per_host = counts.setdefault(model, {})
                per_host[host] = per_host.get(host, 0) + 1
        for model, hosts in sorted(counts.items()):
            total = totals[model]
            if total < 2:
                continue
            in_batch = sum(hosts.values())
            at_once = sum(min(n, _wave_cap(total, in_batch - n, int(min_up), int(max_unavailable))) for n in hosts.values())
            if at_once >= total or at_once > int(max_unavailable):
                problems.append(
                    f"batch {number} ({', '.join(batch)}) would drain {at_once} of the {total} replicas of {model} at once "
                    f"(on {', '.join(sorted(hosts))}; d3_rollout_max_unavailable = {max_unavailable}). Fix: a smaller "
                    "d3_rollout_serial (e.g. 1), or place the replicas on hosts that fall in different batches."
                )
    return problems


def rollout_waves(instances: list[dict[str, Any]], host: str, view: Any, batch: list[str], min_up: Any = 1,
                  max_unavailable: Any = 1) -> list[list[str]]:
    """The waves one host restarts in, each drained, restarted, smoke-tested and given back before the next: lists
    of instance names, in the plan's order.

    ``instances``: the host's plan (``d3_host_plan.instances``: name, ``start_after`` - the instances sharing a GPU
    that this one starts after, as the unit's ``After=``); ``view``: the routers' view of the hosts this rollout
    restarts (host -> instance -> {backend, server}; ``{}`` without routers); ``batch``: the hosts restarting now
    (``ansible_play_batch``). A wave holds at most ``_wave_cap`` servers of one backend (two ``spread: false``
    replicas of a model on this host, with the default ``d3_rollout_max_unavailable`` 1: one at a time), counted from
    the servers ``view`` knows (a ``--limit`` leaves others out: the waves only get smaller). An instance never
    restarts in an earlier wave than one it starts after: within a wave systemd starts them in that order (``After=``,
    the earlier one's ``ExecStartPost`` waits for its readiness), and a later wave finds them running. Instances
    outside the routers (no backend) go in the first wave their order allows; without routers that is one wave. A host
    that plans nothing gets one empty wave: the units role still removes what is no longer planned."""
    if not _whole(min_up):
        raise ValueError(f"d3_rollout_min_up is {min_up!r}: it must be a whole number, at least 1. Fix the -e value or "
                         "the inventory.")  # fmt: skip
    if not _whole(max_unavailable):
        raise ValueError(f"d3_rollout_max_unavailable is {max_unavailable!r}: it must be a whole number, at least 1. Fix "
                         "the -e value or the inventory.")  # fmt: skip
    view = view or {}
    mine = view.get(host) or {}
    totals: dict[str, int] = {}
    others: dict[str, int] = {}
    for name, servers in view.items():
        for server in servers.values():
            backend = server.get("backend")
            totals[backend] = totals.get(backend, 0) + 1
            if name != host and name in batch:
                others[backend] = others.get(backend, 0) + 1
    waves: list[list[str]] = []
    counts: list[dict[str, int]] = []
    placed: dict[str, int] = {}
    for inst in instances:
        name = inst["name"]
        backend = (mine.get(name) or {}).get("backend")
        wave = max([placed[o] for o in inst.get("start_after") or [] if o in placed], default=0)
        while True:
            if wave == len(waves):
                waves.append([])
                counts.append({})
            if backend is None:
                break
            cap = _wave_cap(totals[backend], others.get(backend, 0), int(min_up), int(max_unavailable))
            if counts[wave].get(backend, 0) < cap:
                counts[wave][backend] = counts[wave].get(backend, 0) + 1
                break
            wave += 1
        waves[wave].append(name)
        placed[name] = wave
    return waves or [[]]


def systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """``systemctl show --property=Id,... A.service B.service`` (one block per unit, blocks separated by an empty line,
    lines ``Name=value``) -> {unit name without ``.service``: {property: value}}. A block without ``Id`` is skipped."""
    out: dict[str, dict[str, str]] = {}
    for block in (text or "").split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in props:
            unit = props["Id"]
            out[unit[: -len(".service")] if unit.endswith(".service") else unit] = props
    return out


def _unit_windows(times: list[dict[str, Any]], smoke_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per started or restarted instance: {item, s} - a restarted one's seconds from its unit's stop to ready, a new
    one's from its start to ready; s None when the smoke test has no ready time for it."""
    ready = {row["instance"]: float(row["ready_monotonic"]) for row in smoke_results}
    out = []
    for result in times:
        item = result["item"]
        show = dict(line.split("=", 1) for line in str(result.get("stdout") or "").splitlines() if "=" in line)
        at = ready.get(item["name"])
        key = "InactiveExitTimestampMonotonic" if item.get("new") else "ActiveExitTimestampMonotonic"
        out.append({"item": item, "s": None if at is None else round(at - float(show.get(key) or 0) / 1e6, 1)})
    return out


def rollout_downtimes(times: list[dict[str, Any]], smoke_results: list[dict[str, Any]]) -> list[str]:
    """One line per instance the rollout started or restarted, from the looped ``systemctl show
    --property=ActiveExitTimestampMonotonic,InactiveExitTimestampMonotonic`` results (``item``: a d3_units_restarted
    entry {name, unit, new, reason}; ``stdout``) and the smoke test's ``ready_monotonic`` (seconds, the host's
    monotonic clock; systemd's monotonic timestamps are microseconds on the same clock). A restarted instance was down
    from its unit's stop to ready; a new one was not serving before, so its time from start to ready is shown."""
    out = []
    for window in _unit_windows(times, smoke_results):
        item, seconds = window["item"], window["s"]
        if seconds is None:
            out.append(f"{item['unit']}: {'new' if item.get('new') else 'restarted'}; no ready time from the smoke test")
        elif item.get("new"):
            out.append(f"{item['unit']}: new, ready {seconds} s after its start (no downtime: it was not serving)")
        else:
            out.append(f"{item['unit']}: down {seconds} s (unit stop to ready; {item.get('reason')}; smoke passed)")
    return out


def slice_problems(slice_count: Any, slice_number: Any, routers_seen: list[str], routers_declared: Any) -> list[str]:
    """Refusals for a sliced rollout (AWX job slicing: each slice holds only its own hosts) that could restart hosts
    without draining them in a router it does not see. ``routers_seen``: the slice's ``groups['d3-routers']``;
    ``routers_declared``: ``d3_rollout_routers``, every router of the fleet (None when not set). An unsliced run
    (count <= 1) is never refused here: it sees the whole inventory."""
    count = int(slice_count or 1)
    if count <= 1:
        return []
    where = f"this rollout is slice {slice_number} of {count} (d3_image_slice_count / d3_image_slice_number)"
    if not isinstance(routers_declared, list) or not all(isinstance(r, str) and r for r in routers_declared):
        return [f"{where} and d3_rollout_routers is {json.dumps(routers_declared)}: a slice holds only its own hosts, "
                "so a slice that sees no router would restart its hosts without draining them. Set d3_rollout_routers "
                "on the job template to the list of every router of the fleet ([] when it has none)."]  # fmt: skip
    seen = set(routers_seen or [])
    problems = []
    missing = [r for r in routers_declared if r not in seen]
    if missing:
        problems.append(f"{where} does not see the routers {', '.join(missing)} (d3_rollout_routers; its group "
                        f"d3-routers holds {', '.join(sorted(seen)) or 'none'}): it could not drain its hosts in them. "
                        "Put every router in every slice's inventory or run the rollout unsliced.")  # fmt: skip
    extra = sorted(seen - set(routers_declared))
    if extra:
        problems.append(f"{where} sees the routers {', '.join(extra)}, which d3_rollout_routers does not list: add them "
                        "to d3_rollout_routers.")  # fmt: skip
    return problems


_EDGE_ROWS = ("FRONTEND", "BACKEND")


def _word(status: str) -> str:
    return str(status or "").split(" ")[0]


def _model(server: dict[str, Any]) -> str:
    backend = str(server.get("backend", ""))
    return str(server.get("model") or (backend[3:] if backend.startswith("be_") else backend))


def _listed(servers: Any) -> list[dict[str, Any]]:
    """Servers as a list of {backend, server, ...}: a list as given, or the routers' view of one host (instance ->
    {backend, server}) with each entry's ``instance`` added."""
    if isinstance(servers, dict):
        return [{**value, "instance": name} for name, value in servers.items()]
    return list(servers or [])


def drain_check(stats: dict[str, list[dict[str, Any]]], servers: Any, batch: Any, min_up: Any = 1) -> list[str]:
    """Refusals for draining ``servers`` (one host's {backend, server}) now. ``stats``: router -> its ``show stat`` rows
    ({backend, server, scur, status}, the module haproxy_runtime's ``stat``); ``batch``: every server the current batch
    drains (this host's included). In every router, each backend of ``servers`` that has two or more servers must keep
    at least ``min_up`` others UP outside the batch (a DOWN, NOLB, DRAIN or MAINT server takes no new request). A
    backend with one server (a model with one replica) is not refused: its restart cannot be hidden from clients."""
    if not _whole(min_up):
        return [f"d3_rollout_min_up is {min_up!r}: it must be a whole number, at least 1. Fix the -e value or the inventory."]
    servers, batch = _listed(servers), _listed(batch)
    leaving = {(s.get("backend"), s.get("server")) for s in [*batch, *servers]}
    problems = []
    for router in sorted(stats):
        rows = [r for r in stats[router] if r.get("server") not in _EDGE_ROWS]
        done: set[str] = set()
        for server in servers:
            backend = server.get("backend")
            if backend in done:
                continue
            done.add(backend)
            members = [r for r in rows if r.get("backend") == backend]
            if len(members) < 2:
                continue
            others = [r for r in members if (r.get("backend"), r.get("server")) not in leaving]
            up = [r for r in others if _word(r.get("status", "")) == "UP"]
            if len(up) < int(min_up):
                mine = ", ".join(s["server"] for s in servers if s.get("backend") == backend)
                shown = ", ".join(f"{r['server']} ({r.get('status') or '?'})" for r in others) or "none outside this batch"
                problems.append(
                    f"router {router}: draining {mine} would leave model {_model(server)} (backend {backend}) with "
                    f"{len(up)} UP server(s), fewer than d3_rollout_min_up = {min_up}; its other servers: {shown}. The "
                    "rollout stops before draining: bring those servers up (status.yml shows why they are not), or "
                    "wait for their health checks."
                )
    return problems


def drain_plan(stats: dict[str, list[dict[str, Any]]], servers: Any) -> list[dict[str, Any]]:
    """Per router: which of ``servers`` the rollout drains, and which it leaves as it found them. A server an operator
    put in maintenance (MAINT) or drain (DRAIN) is left: the rollout neither drains nor gives it back. Each entry:
    {router, drain: [{backend, server, ..., scur}], kept: ["backend/server (STATUS)"], inflight} - the server's own
    keys (``instance``...) kept, ``scur``: its current sessions when ``show stat`` was read before the drain;
    ``inflight``: their sum. ``servers``: a list, or one host's entry of the routers' view (instance -> server)."""
    servers = _listed(servers)
    plan = []
    for router in sorted(stats):
        rows = {(r.get("backend"), r.get("server")): r for r in stats[router]}
        drain, kept = [], []
        for server in servers:
            row = rows.get((server.get("backend"), server.get("server")), {})
            word = _word(row.get("status", ""))
            if word.startswith("MAINT") or word == "DRAIN":
                kept.append(f"{server['backend']}/{server['server']} ({row['status']})")
            else:
                drain.append({**server, "scur": int(row.get("scur") or 0)})
        plan.append({"router": router, "drain": drain, "kept": kept, "inflight": sum(d["scur"] for d in drain)})
    return plan


# haproxy.service states in which HAProxy serves nobody (systemctl is-active; "unknown": no such unit)
_STOPPED = ("inactive", "failed", "unknown")


def routers_live(results: Any, services: Any = None, holders: Any = None, vip: Any = "") -> dict[str, Any]:
    """Which routers a rollout step drains and waits on, from the loop results of a ``show stat`` read delegated to
    each router with ``ignore_unreachable`` and ``failed_when: false`` (item: the router); for the routers reached
    whose read failed, ``systemctl is-active haproxy.service`` there (``services``, same shape); and, when some router
    was unreachable, whether each router that answered holds the virtual address ``vip`` (``holders``: non-empty
    stdout). A router answers when its read returned ``stat``. One whose HAProxy is stopped (inactive, failed, no
    unit) serves nobody: left out. One the controller cannot reach is left out only when a router that answered holds
    the virtual address (keepalived moved it: the unreachable one is down or a BACKUP); without a virtual address, or
    with nobody that answered holding it, it may still serve clients (SSH cut off, HAProxy healthy): an error, as is
    a read that failed while HAProxy runs or is starting, reloading or stopping (a wrong socket; a restart that keeps
    the address). Returns ``stats`` {router: rows} of those that answer, ``down`` {router: why}, ``errors`` {router:
    why}, ``unread`` (the routers reached whose read failed: where to ask systemctl), ``unreachable`` (where to look
    for the address), ``line``: what to say about ``down`` ('' when every router answers)."""
    active = {str(r.get("item")): str(r.get("stdout") or "").strip() for r in services or [] if not r.get("unreachable")}
    holder = sorted(str(r.get("item")) for r in holders or [] if not r.get("unreachable") and str(r.get("stdout") or "").strip())
    stats: dict[str, Any] = {}
    down: dict[str, str] = {}
    errors: dict[str, str] = {}
    unread: list[str] = []
    unreachable: list[str] = []
    for result in results or []:
        router = str(result.get("item"))
        why = " ".join(str(result.get("msg") or "no answer").split())[:300]
        if not result.get("unreachable") and isinstance(result.get("stat"), list):
            stats[router] = result["stat"]
        elif result.get("unreachable"):
            unreachable.append(router)
            if vip and holder:
                down[router] = f"unreachable ({why}); {', '.join(holder)} holds the virtual address {vip}"
            else:
                errors[router] = (f"unreachable ({why}) and no router that answers holds "
                                  + (f"the virtual address {vip}" if vip else "a virtual address (d3_router_vip)")
                                  + ": it may still serve clients this rollout cannot drain")  # fmt: skip
        else:
            unread.append(router)
            state = active.get(router, "active")
            if state in _STOPPED:
                down[router] = f"HAProxy not running (haproxy.service {state})"
            elif state == "active":
                errors[router] = why
            else:
                errors[router] = f"haproxy.service is {state} ({why}): read again once it settles"
    line = "; ".join(f"{router}: {why}" for router, why in sorted(down.items()))
    if line:
        line = (f"Routers not serving, left out of this step: {line}. A drain of this rollout they still hold is given "
                "back at the rollout's end if they answer by then; else status.yml reports it.")
    return {"stats": stats, "down": down, "errors": errors, "unread": unread, "unreachable": unreachable, "line": line}


def drain_detail(plan: list[dict[str, Any]]) -> str:
    """What a drain did, for the progress line: per router, each server drained with the requests it had in flight
    (``show stat`` scur, read just before the drain), then the servers left as found."""
    parts = []
    for entry in plan:
        drained = ", ".join(f"{d['backend']}/{d['server']} {d.get('scur', 0)} in flight" for d in entry.get("drain") or [])
        kept = ", ".join(entry.get("kept") or [])
        parts.append(f"{entry['router']}: {drained or 'nothing drained'}" + (f"; left as found: {kept}" if kept else ""))
    return "; ".join(parts) or "no router"


def drain_records(text: str) -> list[dict[str, Any]]:
    """The drain records a router holds (``find DIR -name '*.json' -exec cat {} +``: the JSON objects written by the
    d3_state role's drains_record.yml, one after the other, with or without a newline between them). What is not a
    record {backend, server, ...} is skipped, up to the next line."""
    decoder = json.JSONDecoder()
    out = []
    text = str(text or "")
    at = 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        try:
            record, at = decoder.raw_decode(text, at)
        except ValueError:
            newline = text.find("\n", at)
            at = len(text) if newline < 0 else newline + 1
            continue
        if isinstance(record, dict) and isinstance(record.get("backend"), str) and isinstance(record.get("server"), str):
            out.append(record)
    return sorted(out, key=lambda r: (r["backend"], r["server"]))


def drain_files(drain: Any, host: str = "", since: str = "", owner: str = "") -> list[dict[str, str]]:
    """The drain records of one router's servers as the module d3fleet.fleet.state_files writes them (or, with only
    ``drain``, names them to remove): one file ``BACKEND--SERVER.json`` per server {backend, server, instance}, its
    content the JSON record drain_records reads back (host, instance, since, by, owner)."""
    out = []
    for d in drain or []:
        record = {"backend": d["backend"], "server": d["server"], "host": host, "instance": d.get("instance") or "",
                  "since": since, "by": "playbooks/rollout.yml", "owner": owner}  # fmt: skip
        out.append({"name": f"{d['backend']}--{d['server']}.json", "content": json.dumps(record) + "\n"})
    return out


def restore_plan(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The recorded drains (left by an interrupted rollout) to give back: every record whose server the router still
    lists and that is not in maintenance (MAINT: an operator's, set after the record; it stays)."""
    status = {(r.get("backend"), r.get("server")): str(r.get("status") or "") for r in rows}
    return [
        {"backend": r["backend"], "server": r["server"]}
        for r in records
        if (r["backend"], r["server"]) in status and not _word(status[(r["backend"], r["server"])]).startswith("MAINT")
    ]


def progress(batches: list[list[str]], host: str, phase: str, detail: str = "") -> str:
    """Where a rollout is, for one host: ``batch i of n, HOST: PHASE (detail)`` (``?`` for a host in no batch)."""
    number = next((str(i) for i, batch in enumerate(batches, start=1) if host in batch), "?")
    return f"batch {number} of {len(batches)}, {host}: {phase}" + (f" ({detail})" if detail else "")


def batch_line(batches: list[list[str]], play_batch: list[str]) -> str:
    """``batch i of n: hosts a, b`` for the hosts Ansible runs now (``ansible_play_batch``)."""
    number = next((str(i) for i, batch in enumerate(batches, start=1) if play_batch and play_batch[0] in batch), "?")
    return f"batch {number} of {len(batches)}: hosts {', '.join(play_batch)}"


_LOG_MSG = re.compile(r'time="[^"]*"\s+level=\w+\s+msg="((?:[^"\\]|\\.)*)"')


def _unwrap(text: str) -> str:
    """A skopeo/podman log line (``time="..." level=fatal msg="..."``) as its message, unescaped."""
    return _LOG_MSG.sub(lambda m: m.group(1).replace('\\"', '"').replace("\\\\", "\\"), text)


def failure_cause(result: Any, fallbacks: Any = ()) -> str:
    """The upstream cause of a failed task, on one line, never empty: the result's ``msg`` (unless it is only
    Ansible's "non-zero return code"), the last line of its ``stderr``, the same for each failed loop item, then
    ``fallbacks`` (e.g. the image lookup's error); a log line of skopeo or podman reads as its message."""
    result = result if isinstance(result, dict) else {}
    parts: list[str] = []

    def add(one: dict[str, Any]) -> None:
        msg = str(one.get("msg") or "").strip()
        if msg and msg != "non-zero return code":
            parts.append(msg)
        lines = [line for line in str(one.get("stderr") or "").splitlines() if line.strip()]
        if lines:
            parts.append(lines[-1])

    add(result)
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            add(item)
    parts.extend(str(f) for f in (fallbacks or []) if f and str(f).strip())
    seen: list[str] = []
    for part in (" ".join(_unwrap(p).split()) for p in parts):
        if part not in seen:
            seen.append(part)
    return " ".join(seen) or "the failed task gave no reason (run again with -v to see its whole result)"


def rollout_rows(times: list[dict[str, Any]], smoke_results: list[dict[str, Any]], context: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary rows of one host's restarted instances: {host, instance, before, after, unit_s, router_s,
    replicas}. ``context``: {host, before, after (image refs), drained_at, back_at (epoch seconds when the router
    drain was set and when every router had it back UP; none without routers), servers: the routers' view
    (host -> instance -> {backend, server})}. ``replicas``: the servers of the instance's backend (0 without
    routers); ``router_s``: from drain to back, the window the routers sent the instance no request."""
    view = context.get("servers") or {}
    mine = view.get(context["host"]) or {}
    drained, back = context.get("drained_at"), context.get("back_at")
    router_s = round(float(back) - float(drained), 1) if drained is not None and back is not None and mine else None
    rows = []
    for window in _unit_windows(times, smoke_results):
        name = window["item"]["name"]
        backend = (mine.get(name) or {}).get("backend")
        replicas = sum(1 for inst in view.values() for s in inst.values() if backend and s.get("backend") == backend)
        rows.append({"host": context["host"], "instance": name, "before": context.get("before") or "",
                     "after": context.get("after") or "", "new": bool(window["item"].get("new")),
                     "unit_s": window["s"], "router_s": router_s if backend else None, "replicas": replicas})  # fmt: skip
    return rows


def _short(ref: str) -> str:
    digest = ref.split("@", 1)[1] if "@" in ref else ref
    return digest[:19] if digest.startswith("sha256:") else (digest or "-")


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value} s"


def summary(rows: list[dict[str, Any]], pin: dict[str, Any]) -> list[str]:
    """The rollout's closing table (one row per restarted instance) and how to keep the digest. ``pin``: {inventory,
    image_name, digest}. "clients could see": behind a router, a model with other replicas lost nothing (they
    served); a model with one replica was out from its drain to its return in the router; without a router, clients
    saw the unit's stop to ready."""
    body = []
    for r in sorted(rows, key=lambda r: (r["host"], r["instance"])):
        if r.get("new"):
            clients = "- (new instance)"
        elif r.get("router_s") is None:
            clients = f"{_seconds(r.get('unit_s'))} (no router: stop to ready)"
        elif int(r.get("replicas") or 0) >= 2:
            clients = f"0 s ({int(r['replicas']) - 1} other replica(s) served; out of the router {r['router_s']} s)"
        else:
            clients = f"{r['router_s']} s (one replica: drain to back in the router)"
        body.append([r["host"], r["instance"], _short(r.get("before") or ""), _short(r.get("after") or ""),
                     _seconds(r.get("unit_s")), clients])  # fmt: skip
    lines = table(["host", "instance", "digest before", "digest after", "unit down", "clients could see"], body)
    digest = str(pin.get("digest") or "")
    if digest:
        lines += ["", f"Keep this digest for later runs (pin it): ansible-playbook site.yml -i {pin.get('inventory')} "
                      f"-e d3_image_name={pin.get('image_name')} -e d3_image_digest={digest}",
                  "  (or set d3_image_digest in the inventory's group_vars, when the inventory is not generated as "
                  "inventories/lab is by make lab)"]  # fmt: skip
    return lines


class FilterModule:
    """Ansible filters: the d3_rollout_* filters and d3_systemctl_show."""

    def filters(self) -> dict[str, Any]:
        return {"d3_rollout_batches": rollout_batches, "d3_rollout_drain_problems": drain_problems,
                "d3_rollout_waves": rollout_waves,
                "d3_rollout_slice_problems": slice_problems, "d3_rollout_drain_check": drain_check,
                "d3_rollout_drain_plan": drain_plan, "d3_rollout_drain_detail": drain_detail,
                "d3_rollout_drain_records": drain_records, "d3_rollout_drain_files": drain_files,
                "d3_rollout_restore_plan": restore_plan, "d3_rollout_routers_live": routers_live, "d3_rollout_progress": progress,
                "d3_rollout_batch_line": batch_line, "d3_rollout_failure_cause": failure_cause,
                "d3_rollout_downtimes": rollout_downtimes, "d3_rollout_rows": rollout_rows,
                "d3_rollout_summary": summary, "d3_systemctl_show": systemctl_show}  # fmt: skip
