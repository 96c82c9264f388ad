"""Fleet status: what runs on a host against what its inventory wants (drift), as rows and a table."""

from __future__ import annotations

from typing import Any


def _digest(image_name: str) -> str:
    return image_name.split("@", 1)[1] if "@" in image_name else ""


def status_rows(
    plan: dict[str, Any],
    host: str,
    containers: list[dict[str, Any]],
    probe: list[dict[str, Any]],
    wanted_digest: str,
) -> list[dict[str, Any]]:
    """One row per planned or running instance, with a list of drift reasons (empty = as the inventory wants).
    ``probe`` is the d3_smoke role's probe output (d3_smoke_probe: name, health, decision, elapsed_ms, problems)."""
    running = {c["Labels"]["io.d3-fleet.instance"]: c for c in containers if c.get("Labels", {}).get("io.d3-fleet.instance")}
    probe_by = {p["name"]: p for p in probe}
    rows = []
    for inst in plan["instances"]:
        ctr = running.get(inst["name"])
        drift = []
        digest = _digest((ctr or {}).get("Image", ""))
        revision = (ctr or {}).get("Labels", {}).get("io.d3-fleet.revision", "")
        if ctr is None:
            drift.append("not running")
        else:
            if ctr.get("State") != "running":
                drift.append(f"container {ctr.get('State')}")
            if wanted_digest and digest != wanted_digest:
                drift.append(f"image {digest[:19] or '?'} != wanted {wanted_digest[:19]}")
            if inst["revision"] and revision != inst["revision"]:
                drift.append(f"revision {revision[:12]} != wanted {inst['revision'][:12]}")
        p = probe_by.get(inst["name"], {})
        if p.get("health") != 200:
            health = f"down ({p.get('health', '?')})"
        elif p.get("decision") != 200:
            health = f"no decision ({p.get('decision', '?')})"
        elif p.get("problems"):
            health = "bad answer: " + "; ".join(p["problems"])
        else:
            health = "ready"
        rows.append(
            {
                "host": host,
                "instance": inst["name"],
                "model": inst["model"],
                "digest": digest,
                "revision": revision,
                "health": health,
                "smoke_ms": p.get("elapsed_ms"),
                "drift": drift,
            }
        )
    for name, ctr in sorted(running.items()):
        if name not in {i["name"] for i in plan["instances"]}:
            rows.append(
                {
                    "host": host,
                    "instance": name,
                    "model": ctr["Labels"].get("io.d3-fleet.model", "?"),
                    "digest": _digest(ctr.get("Image", "")),
                    "revision": ctr["Labels"].get("io.d3-fleet.revision", ""),
                    "health": "-",
                    "smoke_ms": None,
                    "drift": ["not in the inventory"],
                }
            )
    return rows


def status_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ("host", "instance", "model", "digest", "revision", "health", "2q ms", "drift")
    table = [header]
    for r in rows:
        table.append(
            (
                r["host"],
                r["instance"],
                r["model"],
                r["digest"][:19],
                (r["revision"] or "")[:12],
                r["health"],
                "-" if r["smoke_ms"] is None else str(round(r["smoke_ms"])),
                "; ".join(r["drift"]) or "none",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]


class FilterModule:
    """Ansible filters: d3_status_rows, d3_status_table."""

    def filters(self) -> dict[str, Any]:
        return {"d3_status_rows": status_rows, "d3_status_table": status_table}
