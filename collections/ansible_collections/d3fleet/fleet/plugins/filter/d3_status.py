"""Fleet status: what runs on a host against what its inventory wants (drift), as rows and a table.

A row's ``drift`` lists how the host differs from the inventory; ``unknown`` lists what status could not decide
(the wanted image digest could not be resolved): playbooks/status.yml exits non-zero on either kind of unknown
unless told otherwise (d3_status_fail_on_unknown)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_labels as label
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table


def _digest(image_name: str) -> str:
    return image_name.split("@", 1)[1] if "@" in image_name else ""


def _health(probe: dict[str, Any] | None, unit: dict[str, Any]) -> str:
    if probe is None:
        return f"unit {unit['ActiveState']}" if unit.get("ActiveState") else "-"
    if probe.get("health") != 200:
        return f"down ({probe.get('health', '?')})"
    if probe.get("decision") != 200:
        return f"no decision ({probe.get('decision', '?')})"
    if probe.get("problems"):
        return "bad answer: " + "; ".join(probe["problems"])
    return "ready"


def _restarts(unit: dict[str, Any]) -> int | None:
    value = str(unit.get("NRestarts", ""))
    return int(value) if value.isdigit() else None


def status_rows(
    plan: dict[str, Any],
    host: str,
    containers: list[dict[str, Any]],
    probe: list[dict[str, Any]],
    wanted_digest: str,
    context: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per planned, running or recorded instance, with its drift reasons (empty = as the inventory wants).

    ``probe`` is the d3_smoke role's probe output (d3_smoke_probe: name, health, decision, elapsed_ms, problems).
    ``context`` (all optional): ``digest_error`` (why the wanted digest is unknown, when it is ''), ``gpus`` (the
    GPU indices nvidia-smi lists now; None = not read), ``deployed`` (the deployment record's instances: name ->
    {model, revision, port, gpus, unit}), ``units`` (unit -> systemd properties ActiveState, NRestarts) and
    ``plan_error`` (why the inventory's plan failed: its instances are then the record's)."""
    ctx = context or {}
    deployed: dict[str, dict[str, Any]] = ctx.get("deployed") or {}
    units: dict[str, dict[str, Any]] = ctx.get("units") or {}
    present = ctx.get("gpus")
    running = {c["Labels"][label.INSTANCE]: c for c in containers if c.get("Labels", {}).get(label.INSTANCE)}
    probe_by = {p["name"]: p for p in probe}
    planned = {i["name"]: i for i in plan.get("instances") or []}
    rows = []

    def gpu_drift(gpus: list[int]) -> list[str]:
        if present is None:
            return []
        lost = [g for g in gpus if g not in present]
        if not lost:
            return []
        listed = ", ".join(str(g) for g in present) or "none"
        return [f"GPU {', '.join(str(g) for g in lost)} missing (nvidia-smi lists {listed})"]

    for inst in plan.get("instances") or []:
        ctr = running.get(inst["name"])
        unit = units.get(inst.get("unit", inst["name"]), {})
        drift: list[str] = []
        unknown: list[str] = []
        digest = _digest((ctr or {}).get("Image", ""))
        revision = (ctr or {}).get("Labels", {}).get(label.REVISION, "")
        if ctr is None:
            drift.append("not running")
        else:
            if ctr.get("State") != "running":
                drift.append(f"container {ctr.get('State')}")
            if wanted_digest and digest != wanted_digest:
                drift.append(f"image {digest[:19] or '?'} != wanted {wanted_digest[:19]}")
            if inst["revision"] and revision != inst["revision"]:
                drift.append(f"revision {revision[:12]} != wanted {inst['revision'][:12]}")
        if not wanted_digest and ctx.get("digest_error"):
            unknown.append(f"wanted image digest unknown: {ctx['digest_error']}")
        drift += gpu_drift(list(inst.get("gpus") or []))
        p = probe_by.get(inst["name"], {})
        rows.append(
            {
                "host": host,
                "instance": inst["name"],
                "model": inst["model"],
                "digest": digest,
                "revision": revision,
                "health": _health(p, unit),
                "smoke_ms": p.get("elapsed_ms"),
                "restarts": _restarts(unit),
                "gpus": list(inst.get("gpus") or []),
                "drift": drift,
                "unknown": unknown,
            }
        )
    # recorded (deployed) instances the plan does not have: the plan failed, or the inventory dropped them
    for name, rec in sorted(deployed.items()):
        if name in planned:
            continue
        ctr = running.get(name)
        unit = units.get(rec.get("unit", name), {})
        why = f"not in the plan ({ctx['plan_error']})" if ctx.get("plan_error") else "not in the inventory"
        drift = [why] + ([] if ctr else ["not running"]) + gpu_drift(list(rec.get("gpus") or []))
        rows.append(
            {
                "host": host,
                "instance": name,
                "model": rec.get("model", "?"),
                "digest": _digest((ctr or {}).get("Image", "")),
                "revision": (ctr or {}).get("Labels", {}).get(label.REVISION, ""),
                "health": _health(None, unit),
                "smoke_ms": None,
                "restarts": _restarts(unit),
                "gpus": list(rec.get("gpus") or []),
                "drift": drift,
                "unknown": [],
            }
        )
    for name, ctr in sorted(running.items()):
        if name not in planned and name not in deployed:
            unit = units.get(name, {})
            rows.append(
                {
                    "host": host,
                    "instance": name,
                    "model": ctr["Labels"].get(label.MODEL, "?"),
                    "digest": _digest(ctr.get("Image", "")),
                    "revision": ctr["Labels"].get(label.REVISION, ""),
                    "health": "-",
                    "smoke_ms": None,
                    "restarts": _restarts(unit),
                    "gpus": [],
                    "drift": ["not in the inventory"],
                    "unknown": [],
                }
            )
    return rows


def status_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ("host", "instance", "model", "digest", "revision", "health", "2q ms", "restarts", "drift")
    lines = []
    for r in rows:
        reasons = list(r["drift"]) + [f"unknown: {u}" for u in r.get("unknown") or []]
        lines.append(
            (
                r["host"],
                r["instance"],
                r["model"],
                r["digest"][:19],
                (r["revision"] or "")[:12],
                r["health"],
                "-" if r["smoke_ms"] is None else str(round(r["smoke_ms"])),
                "-" if r.get("restarts") is None else str(r["restarts"]),
                "; ".join(reasons) or "none",
            )
        )
    return table(header, lines)


def status_drains(records: list[dict[str, Any]], rows: list[dict[str, Any]], router: str) -> list[str]:
    """One line per drain a rollout recorded on ``router`` and did not give back (it was interrupted): the server,
    its host and instance, since when, and what HAProxy shows for it now (``rows``: ``show stat``, {backend, server,
    status}); empty when there is none."""
    status = {(r.get("backend"), r.get("server")): r.get("status") or "?" for r in rows}
    lines = []
    for rec in records:
        now = status.get((rec["backend"], rec["server"]), "not in the router's configuration")
        lines.append(
            f"router {router}: {rec['backend']}/{rec['server']} (host {rec.get('host', '?')}, instance "
            f"{rec.get('instance', '?')}) left by an interrupted rollout"
            + (f" ({rec['owner']}, which no longer runs)" if rec.get("owner") else "")
            + f", drained since {rec.get('since', '?')}, now "
            f"{now}. The next rollout.yml or site.yml gives it back."
        )
    return lines


# Prometheus' timestamps (docs/querying/api.md): RFC 3339, nanoseconds, Z or an offset; Go's zero time is "never"
RFC3339 = re.compile(r"\A(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)\Z")


def _when(value: Any) -> str:
    """A Prometheus timestamp in UTC to the second (2026-12-01T23:07:44Z), ``never`` for Go's zero time, ``?`` else."""
    m = RFC3339.match(value) if isinstance(value, str) else None
    if not m:
        return "?"
    if m.group(1).startswith("0001-"):
        return "never"
    moment = datetime.fromisoformat(m.group(1) + m.group(2))  # Python >= 3.11 reads Z
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _data(response: Any, key: str) -> list[dict[str, Any]] | None:
    """``data[key]`` of a successful Prometheus API answer (tests/contracts/prometheus/api-v1.json), else None."""
    if not isinstance(response, dict) or response.get("status") != "success" or not isinstance(response.get("data"), dict):
        return None
    rows = response["data"].get(key)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None


def _error(response: Any) -> str:
    if isinstance(response, dict) and response.get("error"):
        return f"{response.get('errorType', 'error')}: {response['error']}"
    return "no answer" if response is None else "not a Prometheus API answer"


def status_monitor(targets: Any, alerts: Any, monitor: str) -> list[str]:
    """What the monitor sees (Prometheus' ``/api/v1/targets?state=active`` and ``/api/v1/alerts`` answers, as
    ``uri`` returns their JSON, None when it got none): each planned instance's last scrape (job ``d3-vllm``: health,
    when in UTC, the scrape's error), every other target that is not UP, and the alerts firing (pending ones counted)."""
    lines: list[str] = []
    active = _data(targets, "activeTargets")
    if active is None:
        lines.append(f"monitor {monitor}: Prometheus' /api/v1/targets failed ({_error(targets)})")
    else:
        labels = [(t, t.get("labels") if isinstance(t.get("labels"), dict) else {}) for t in active]
        rows = sorted(
            (str(lab.get("host", "?")), str(lab.get("instance", "?")), str(lab.get("model", "")), str(t.get("health", "?")),
             _when(t.get("lastScrape")), str(t.get("lastError") or ""))
            for t, lab in labels if lab.get("job") == "d3-vllm"
        )  # fmt: skip
        lines.append(f"monitor {monitor}: last scrape of each instance (UTC)")
        lines += table(("host", "instance", "model", "health", "last scrape", "error"), rows)
        others = sorted(f"{lab.get('job', '?')} {lab.get('host', '?')} ({t.get('health', '?')}: {t.get('lastError') or 'no error'})"
                        for t, lab in labels if lab.get("job") != "d3-vllm" and t.get("health") != "up")  # fmt: skip
        lines.append(f"monitor {monitor}: other targets not up: " + ("; ".join(others) if others else "none"))
    fired = _data(alerts, "alerts")
    if fired is None:
        lines.append(f"monitor {monitor}: Prometheus' /api/v1/alerts failed ({_error(alerts)})")
        return lines
    firing = []
    for alert in fired:
        lab = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
        notes = alert.get("annotations") if isinstance(alert.get("annotations"), dict) else {}
        if alert.get("state") == "firing":
            where = " ".join(f"{k} {lab[k]}" for k in ("host", "instance", "model", "proxy", "gpu") if lab.get(k))
            firing.append(f"monitor {monitor}: FIRING {lab.get('alertname', '?')} ({lab.get('severity', '?')}) "
                          f"{where or 'fleet'} since {_when(alert.get('activeAt'))}: {notes.get('summary', '')} "
                          f"[{notes.get('runbook_url', 'no runbook')}]")  # fmt: skip
    pending = sum(1 for a in fired if a.get("state") == "pending")
    lines += sorted(firing) or [f"monitor {monitor}: no alert firing"]
    if pending:
        lines.append(f"monitor {monitor}: {pending} alert(s) pending (not yet held for their for:)")
    return lines


class FilterModule:
    """Ansible filters: d3_status_rows, d3_status_table, d3_status_drains, d3_status_monitor."""

    def filters(self) -> dict[str, Any]:
        return {"d3_status_rows": status_rows, "d3_status_table": status_table, "d3_status_drains": status_drains,
                "d3_status_monitor": status_monitor}  # fmt: skip
