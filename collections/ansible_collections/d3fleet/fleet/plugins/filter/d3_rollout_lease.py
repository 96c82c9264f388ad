"""One rollout at a time: the lease a rollout holds on every router, and whose drains are whose.

``d3_rollout_controller`` (who runs this: the controller's host name, the ansible-playbook process and its start),
``d3_rollout_lease_plan`` (take, renew or refuse the lease on every router), ``d3_rollout_lease_holder`` (the live
holder of a router's lease, for site.yml and status.yml) and ``d3_rollout_drains_owned`` (split a router's drain records
into those of the live holder, which nobody else gives back, and those whose owner is gone).

A lease is a root-only JSON file on each router (the d3_state role's ``d3_state_lease_file``): {owner (the rollout's
identity), controller, pid, pid_start, user, started, expires (epoch seconds), limit}. It is live until ``expires``,
and while the process that took it still runs: a rollout on the same controller whose holder's ansible-playbook is gone
(killed, or ended without giving the lease back) takes it over at once; from another controller only expiry or
``d3_rollout_take_over`` (naming the holder) does. Pure functions but ``controller`` and ``process_alive``, which read
this machine's /proc (the controller's, where filters run).
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from typing import Any


def process_start(pid: int) -> str:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat, clock ticks since boot), '' when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8") as stat:
            text = stat.read()
    except (OSError, ValueError):
        return ""
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else ""


def process_alive(pid: Any, started: Any) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``started`` (not a reused pid)."""
    return bool(started) and process_start(pid) == str(started)


def controller(_: Any = None, user: str = "") -> dict[str, Any]:
    """Who runs this rollout: this machine's host name and the ansible-playbook process (the parent of the worker that
    templates the task), with its start time, and ``user``."""
    pid = os.getppid()
    return {"controller": socket.gethostname(), "pid": pid, "pid_start": process_start(pid), "user": user}


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: Any) -> dict[str, Any] | None:
    """A lease file's content (slurped), None when there is none; {'broken': text} when it is no lease."""
    if text in (None, ""):
        return None
    try:
        lease = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return {"broken": str(text)[:80]}
    if not isinstance(lease, dict) or not isinstance(lease.get("owner"), str) or not lease["owner"]:
        return {"broken": str(text)[:80]}
    return lease


def _gone(lease: dict[str, Any], me: dict[str, Any], now: float) -> str:
    """Why ``lease`` no longer holds (expired, or its process on this controller is gone), '' while it is live."""
    try:
        expires = float(lease.get("expires"))
    except (TypeError, ValueError):
        return "its expiry is unreadable"
    if expires <= now:
        return f"it expired at {_stamp(expires)}"
    if lease.get("controller") == me.get("controller") and not process_alive(lease.get("pid"), lease.get("pid_start")):
        return f"its ansible-playbook (pid {lease.get('pid')} on {lease.get('controller')}) no longer runs"
    return ""


def describe(lease: dict[str, Any]) -> str:
    """``rollout ID (user U on C, pid P, since S, until E)``."""
    try:
        until = _stamp(float(lease.get("expires")))
    except (TypeError, ValueError):
        until = "?"
    return (f"rollout {lease['owner']} ({lease.get('user') or '?'} on {lease.get('controller') or '?'}, pid "
            f"{lease.get('pid') or '?'}, since {lease.get('started') or '?'}, until {until}"
            + (f", --limit {lease['limit']}" if lease.get("limit") else "") + ")")  # fmt: skip


def lease_plan(leases: dict[str, Any], me: dict[str, Any], now: Any, seconds: Any = 3600, take_over: Any = "",
               limit: Any = "") -> dict[str, Any]:  # fmt: skip
    """Take or renew the lease on every router, or refuse.

    ``leases``: {router: the lease file's content, '' or None when there is none}; ``me``: controller() plus ``owner``
    (this rollout's identity) and ``started``; ``now``: epoch seconds; ``seconds``: how long the lease holds (renewed
    at each batch); ``take_over``: the owner of a lease the operator says is stale. Returns {refusals, notes, lease}:
    ``lease`` is the content to write on every router when there is no refusal."""
    now = float(now)
    refusals: list[str] = []
    notes: list[str] = []
    if isinstance(seconds, bool) or not str(seconds).isdigit() or not 60 <= int(seconds) <= 86400:
        refusals.append(f"d3_state_lease_s = {seconds!r} is not whole seconds 60-86400 (how long the rollout's lease "
                        "on the routers holds without renewal; each batch renews it).")  # fmt: skip
        seconds = 3600
    for router in sorted(leases):
        lease = _parse(leases[router])
        if lease is None or lease.get("owner") == me["owner"]:
            continue
        if "broken" in lease:
            refusals.append(f"router {router}: the rollout lease file holds no lease ({lease['broken']!r}): remove it "
                            "on the router if no rollout runs, then run again.")  # fmt: skip
            continue
        why = _gone(lease, me, now)
        if why:
            notes.append(f"router {router}: took over the lease of {describe(lease)}: {why}.")
        elif take_over and take_over == lease["owner"]:
            notes.append(f"router {router}: took over the lease of {describe(lease)}: d3_rollout_take_over names it.")
        else:
            refusals.append(
                f"router {router}: {describe(lease)} holds the routers: one rollout at a time, so this one changes "
                f"nothing. If that rollout no longer runs (its controller died), clear its lease with "
                f"-e d3_rollout_take_over={lease['owner']} (its drains are given back first), or wait until it expires."
            )
    lease = {"owner": me["owner"], "controller": me.get("controller", ""), "pid": me.get("pid", 0),
             "pid_start": me.get("pid_start", ""), "user": me.get("user", ""), "started": me.get("started") or _stamp(now),
             "expires": int(now) + int(seconds), "limit": str(limit or "")}  # fmt: skip
    return {"refusals": refusals, "notes": notes, "lease": lease}


def lease_holder(text: Any, me: dict[str, Any], now: Any) -> dict[str, Any] | None:
    """The live holder of a router's lease ({owner, ..., description}), None when there is none or it is gone."""
    lease = _parse(text)
    if lease is None or _gone(lease, me, float(now)):
        return None
    return {**lease, "description": describe(lease)}


def drains_owned(records: dict[str, list[dict[str, Any]]], leases: dict[str, Any], me: dict[str, Any],
                 now: Any) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Each router's drain records ({router: records}) split by their owner, with the router's lease ({router: its
    content}): ``held``, the records of the rollout that holds the lease now (it gives them back, nobody else);
    ``orphaned``, those whose owner is gone (or records from before owners): give back, report; ``holder``, the live
    holder's description ('' when none); ``kept``, the line that names the live holder and says which of its drains
    stay ('none now' between its drains: a run during a rollout always names it; '' without a live holder)."""
    out = {}
    for router, mine in records.items():
        holder = lease_holder(leases.get(router), me, now)
        owner = holder["owner"] if holder else None
        held = [r for r in mine if owner and r.get("owner") == owner]
        kept = ", ".join(f"{r['backend']}/{r['server']}" for r in held)
        out[router] = {"holder": holder["description"] if holder else "", "held": held,
                       "orphaned": [r for r in mine if not (owner and r.get("owner") == owner)],
                       "kept": f"{router}: {holder['description']} holds the routers: its drains stay ({kept or 'none now'}); "
                               "this run gives none of them back." if holder else ""}  # fmt: skip
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"d3_rollout_controller": controller, "d3_rollout_lease_plan": lease_plan,
                "d3_rollout_lease_holder": lease_holder, "d3_rollout_drains_owned": drains_owned}  # fmt: skip
