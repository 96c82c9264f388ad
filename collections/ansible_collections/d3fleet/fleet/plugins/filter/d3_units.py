"""The d3_units role's start decision: which instances to start or restart, and whether systemd must reload first.

Plain data in (the role's one read, ``units_read``, and the write tasks' registered results), plain data out; the
role's start.yml only wires it (``d3_units_actions``).

A run interrupted between writing a unit (or replacing the API key secret) and restarting the instance leaves an
instance that runs an older unit than the one on disk; the next run must restart it although its unit file does not
change again. So: restart when the unit or the key changed now, or when the unit file or the key's fingerprint is
newer than the instance's current start (systemd's InactiveExitTimestamp, whole seconds: hence the 1 s of slack; a
normal run writes the unit, reloads and then restarts, so its instance starts after the write), and reload systemd
first whenever a unit file changed since systemd last read it (NeedDaemonReload): Quadlet generates the unit only at
a reload, so a restart without one would start the old unit again; an instance whose unit systemd has not loaded yet
(NeedDaemonReload=yes) is restarted after the reload, even if it started since. The states and modification times
come from the role's one read, taken before this run wrote anything: what this run changes is known from the write
tasks' results.

Instances sharing a GPU start one after another (the unit's ``After=``, the earlier one's ``ExecStartPost`` waiting
for its readiness), but a restart is a stop then a start of one unit: restarted one by one, the first could start
and profile its GPU's memory while another on that GPU still runs and then stops under it (vLLM's memory profiling
fails when the free memory changes while it measures). So an instance that restarts while another instance on one
of its GPUs starts or restarts in the same run is stopped first (``stops``, the later ones first), and then started
with the others, in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUNNING = ("active", "activating", "reloading")  # ActiveState values of an instance that is up or on its way up
SLACK_S = 1.0  # InactiveExitTimestamp has whole seconds; a file written in the start's second is not newer


def changed(result: Any) -> bool:
    """Ansible's ``is changed`` test on a registered result: its ``changed``, else whether any loop item changed."""
    if not isinstance(result, Mapping):
        raise ValueError(f"a registered task result must be a dict, not {type(result).__name__}")
    if "changed" in result:
        return bool(result["changed"])
    return any(isinstance(r, Mapping) and r.get("changed") for r in result.get("results") or [])


def start_epoch(timestamp: Any) -> float:
    """InactiveExitTimestamp as ``systemctl show --timestamp=unix`` prints it ('@1700000000', '' when never) -> seconds;
    0 for anything else (as Jinja's ``float`` filter: the instance counts as started at the epoch)."""
    try:
        return float(str(timestamp).replace("@", ""))
    except ValueError:
        return 0.0


def _mtime(host: Mapping[str, Any], path: str) -> float:
    return float((host.get("files") or {}).get(path, {}).get("mtime", 0))


def units_actions(
    rendered: Mapping[str, Any],
    host: Mapping[str, Any],
    secret: Mapping[str, Any],
    pruned: Mapping[str, Any],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """What start.yml does, decided from plain data.

    ``rendered``: the registered result of the unit template loop (one item per planned instance, ``item`` the plan
    instance with ``name`` and ``unit``); ``host``: the ``units_read`` result (``units``, ``files``); ``secret`` and
    ``pruned``: the registered results of the secret write and of the stale unit removal; ``options``: ``unit_dir``,
    ``suffix`` (``.container`` or ``.service``), ``key_file`` (the API key fingerprint file), ``quadlet`` (bool) and
    ``check_mode`` (bool).

    Returns ``actions`` (per instance, in plan order: name, unit, action start|restart|none, new, reason, enabled,
    state started|restarted, call: whether the systemd call runs), ``reload`` (reload systemd first),
    ``restarted`` (the role's output ``d3_units_restarted``: name, unit, new, reason of every instance started or
    restarted) and ``stops`` (units to stop before any start: restarting beside another instance on their GPU; the
    item's ``gpus``).
    """
    units = host.get("units") or {}
    key_mtime = _mtime(host, options["key_file"])
    secret_changed = changed(secret)
    quadlet = bool(options["quadlet"])
    actions = []
    for result in rendered.get("results") or []:
        instance = result["item"]
        show = units.get(instance["unit"] + ".service") or {}
        started = start_epoch(show.get("InactiveExitTimestamp"))
        unit_mtime = _mtime(host, f"{options['unit_dir']}/{instance['unit']}{options['suffix']}")
        if show.get("ActiveState") not in RUNNING:
            action, reason = "start", "not running"
        elif changed(result):
            action, reason = "restart", "unit changed"
        elif secret_changed:
            action, reason = "restart", "API key changed"
        elif show.get("NeedDaemonReload") == "yes":
            action, reason = "restart", "unit file newer than the loaded unit"
        elif unit_mtime > started + SLACK_S:
            action, reason = "restart", "unit file newer than the running instance"
        elif key_mtime > started + SLACK_S:
            action, reason = "restart", "API key newer than the running instance"
        else:
            action, reason = "none", ""
        # Quadlet units are generated: they cannot be enabled (their [Install] section does it); a classic unit that
        # is not enabled gets the call (enabled: true) even when it need not restart
        enabled = quadlet or show.get("UnitFileState") == "enabled"
        actions.append({
            "name": instance["name"], "unit": instance["unit"], "action": action, "new": action == "start",
            "reason": reason, "enabled": enabled, "state": "restarted" if action == "restart" else "started",
            # a running instance whose unit need not restart is left alone (no call); in check mode a unit that would
            # be written does not exist yet, so there is nothing to start
            "call": (action != "none" or not enabled) and not (options["check_mode"] and changed(result)),
        })  # fmt: skip
    reload = (
        changed(rendered)
        or changed(pruned)
        or any(show.get("NeedDaemonReload") == "yes" for show in units.values())
        or any("newer" in a["reason"] for a in actions)
    )
    restarted = [{k: a[k] for k in ("name", "unit", "new", "reason")} for a in actions if a["action"] != "none"]
    return {"actions": actions, "reload": reload, "restarted": restarted, "stops": _stops(rendered, actions)}


def _stops(rendered: Mapping[str, Any], actions: list[dict[str, Any]]) -> list[str]:
    """The units to stop before any instance starts: each restarting one that shares a GPU with another instance
    starting or restarting now (later ones first); their action's state becomes ``started``."""
    gpus = [set(result["item"].get("gpus") or []) for result in rendered.get("results") or []]
    moving = [i for i, a in enumerate(actions) if a["action"] != "none" and a["call"]]
    stops = []
    for i in reversed(moving):
        if actions[i]["action"] == "restart" and any(j != i and gpus[i] & gpus[j] for j in moving):
            actions[i]["state"] = "started"
            stops.append(actions[i]["unit"])
    return stops


class FilterModule:
    """Ansible filters: d3_units_actions."""

    def filters(self) -> dict[str, Any]:
        return {"d3_units_actions": units_actions}
