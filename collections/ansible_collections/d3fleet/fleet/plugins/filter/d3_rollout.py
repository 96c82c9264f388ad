"""Rollout batches, replica availability and downtimes (filters ``d3_rollout_batches``, ``d3_rollout_drain_problems``,
``d3_rollout_downtimes``, ``d3_systemctl_show``).

Pure functions. A rollout restarts hosts in batches (the restart play's ``serial``); behind a router, every replica of a
model on a host of the current batch is drained at once, so a batch must never hold all of a model's replicas nor more
than ``d3_rollout_max_unavailable`` of them. These filters let the rollout check that for every batch before the first
restart, from the same batches Ansible will make.
"""

from __future__ import annotations

from typing import Any


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


def drain_problems(batches: list[list[str]], replicas: dict[str, list[str]], max_unavailable: int) -> list[str]:
    """Refusals for batches that would drain too many replicas of one model at once.

    ``replicas``: host -> the served model names of its instances (one entry per instance). A model with two or more
    replicas in the fleet must keep one serving through every batch, and at most ``max_unavailable`` of its replicas
    may be in one batch. A model with one replica cannot stay available through its restart; that is not refused
    (clients see that instance's restart), and the rollout says so elsewhere."""
    if isinstance(max_unavailable, bool) or not str(max_unavailable).isdigit() or int(max_unavailable) < 1:
        return [f"d3_rollout_max_unavailable is {max_unavailable!r}: it must be a whole number, at least 1 (a replica must "
                "restart some time). Fix the -e value or the inventory."]
    totals: dict[str, int] = {}
    for models in replicas.values():
        for model in models:
            totals[model] = totals.get(model, 0) + 1
    problems = []
    for number, batch in enumerate(batches, start=1):
        counts: dict[str, list[str]] = {}
        for host in batch:
            for model in replicas.get(host, []):
                counts.setdefault(model, []).append(host)
        for model, hosts in sorted(counts.items()):
            total = totals[model]
            if total < 2:
                continue
            if len(hosts) >= total or len(hosts) > int(max_unavailable):
                problems.append(
                    f"batch {number} ({', '.join(batch)}) would drain {len(hosts)} of the {total} replicas of {model} at once "
                    f"(on {', '.join(sorted(set(hosts)))}; d3_rollout_max_unavailable = {max_unavailable}). Fix: a smaller "
                    "d3_rollout_serial (e.g. 1), or place the replicas on hosts that fall in different batches."
                )
    return problems


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


def rollout_downtimes(times: list[dict[str, Any]], smoke_results: list[dict[str, Any]]) -> list[str]:
    """One line per instance the rollout started or restarted, from the looped ``systemctl show
    --property=ActiveExitTimestampMonotonic,InactiveExitTimestampMonotonic`` results (``item``: a d3_units_restarted
    entry {name, unit, new, reason}; ``stdout``) and the smoke test's ``ready_monotonic`` (seconds, the host's
    monotonic clock; systemd's monotonic timestamps are microseconds on the same clock). A restarted instance was down
    from its unit's stop to ready; a new one was not serving before, so its time from start to ready is shown."""
    ready = {row["instance"]: float(row["ready_monotonic"]) for row in smoke_results}
    out = []
    for result in times:
        item = result["item"]
        show = dict(line.split("=", 1) for line in str(result.get("stdout") or "").splitlines() if "=" in line)
        at = ready.get(item["name"])
        if at is None:
            out.append(f"{item['unit']}: {'new' if item.get('new') else 'restarted'}; no ready time from the smoke test")
        elif item.get("new"):
            started = float(show.get("InactiveExitTimestampMonotonic") or 0) / 1e6
            out.append(f"{item['unit']}: new, ready {round(at - started, 1)} s after its start (no downtime: it was not "
                       "serving)")  # fmt: skip
        else:
            stopped = float(show.get("ActiveExitTimestampMonotonic") or 0) / 1e6
            out.append(f"{item['unit']}: down {round(at - stopped, 1)} s (unit stop to ready; {item.get('reason')}; "
                       "smoke passed)")  # fmt: skip
    return out


class FilterModule:
    """Ansible filters: d3_rollout_batches, d3_rollout_drain_problems, d3_rollout_downtimes, d3_systemctl_show."""

    def filters(self) -> dict[str, Any]:
        return {"d3_rollout_batches": rollout_batches, "d3_rollout_drain_problems": drain_problems,
                "d3_rollout_downtimes": rollout_downtimes, "d3_systemctl_show": systemctl_show}  # fmt: skip
