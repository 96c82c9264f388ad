"""The rows of docs/refusals.md through site.yml against one lab host, before anything changes on it (issue 11).

Which rows: every row plan.yml cannot judge (the host's probe, the toolkit, weights, firewall and unit checks that
read the host or the inventory's own unit values: tests/test_refusals_catalog.py leaves them to this run) and three
plan rows (an unknown model, an owned flag carrying a secret, an injection attempt): the other plan rows are judged
by the same role through plan.yml in the unit tier, and where site.yml stops for a plan refusal (its read-only head)
is the same for every plan row.

One run: each row is an inventory alias of the same lab host (`refuse_<id>`, the lab's group variables plus the
row's bad input), so site.yml refuses all of them in parallel. The module runs first in the lab suite
(conftest.FIRST_MODULES), while `make lab` has left the host fresh (not converged). Checked: a non-zero exit; every
alias failed with a message naming the alias (the host) and the variable and holding the catalog's fragment; no
alias changed anything; and the host's packages, /etc/apt, /etc/containers, /etc/systemd, /var/lib/d3, podman
images and secrets are exactly as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from labkit import LAB_INVENTORY, Run, lab_inventory, on_host, run_playbook
from refusals import catalog, plan_yml_judges

# plan rows that site.yml must refuse here too (one of each kind): the rest are judged through plan.yml (unit tier)
PLAN_ROWS_HERE = {"unknown-model", "owned-api-key", "extra-newline"}

pytestmark = pytest.mark.lab

SNAPSHOT = r"""
dpkg-query -W -f '${Package} ${Version}\n'
find /etc/apt /etc/containers /etc/systemd /var/lib/d3 -xdev -printf '%p %y %s %m %T@\n' 2>/dev/null | sort || true
if command -v podman >/dev/null; then podman images --noheading --format '{{.ID}} {{.Repository}}' | sort;
  podman secret ls --noheading --format '{{.Name}}' | sort; else echo no-podman; fi
"""


def snapshot(host: str) -> str:
    """What a change would alter (podman exec: root inside the lab host)."""
    return on_host(host, SNAPSHOT)


def messages(run: Run, host: str) -> str:
    """Every failed task's message on the host, a loop's items' included."""
    out = []
    for failure in run.failures(host):
        res = failure.get("res") or {}
        for item in [res, *(res.get("results") or [])]:
            msg = item.get("msg")
            out.append(" ".join(msg) if isinstance(msg, list) else str(msg or ""))
    return " ".join(out)


def test_every_catalog_refusal_on_a_fresh_host_changes_nothing(tmp_path: Path) -> None:
    inventory = lab_inventory()
    host = sorted(inventory["all"]["children"]["l4-nodes"]["hosts"])[0]
    connection = inventory["all"]["children"]["l4-nodes"]["hosts"][host]
    judged = {r.id for r in plan_yml_judges()}
    rows = [r for r in catalog() if r.id not in judged or r.id in PLAN_ROWS_HERE]
    assert judged >= PLAN_ROWS_HERE and len(rows) >= 15, [r.id for r in rows]
    assert {r.stage for r in rows} == {"preflight", "plan", "inputs"}
    fresh = "no-podman" in snapshot(host)
    print(f"\n{host} {'is fresh (no podman yet)' if fresh else 'was converged before (not fresh)'}")
    before = snapshot(host)

    inv = tmp_path / "inventory"
    shutil.copytree(LAB_INVENTORY, inv)
    aliases = {r.alias: {**connection, "d3_models": [{"model": "d3-edge"}], **r.bad} for r in rows}
    (inv / "refusals.yml").write_text(yaml.safe_dump({"all": {"children": {"l4-nodes": {"hosts": aliases}}}}))
    # 8 forks: all aliases are one host, and sshd drops connections beyond MaxStartups (10 unauthenticated at once)
    run = run_playbook("site.yml", limit="refuse_*", inventory=inv, cmdline="--forks 8")
    assert not run.stats.get("dark"), f"aliases unreachable (ssh): {sorted(run.stats.get('dark', {}))}"

    assert run.status == "failed", run.stdout[-3000:]
    for row in rows:
        text = messages(run, row.alias)
        assert text, f"{row.id}: site.yml did not refuse {row.bad}"
        assert row.alias in text or "Validation of arguments failed" in text, (row.id, text)
        assert row.variable in text and row.says in text, (row.id, text)
        assert "zzsecret" not in text and "zz secret" not in text
        assert run.changed(row.alias) == 0, (row.id, run.changed_tasks(row.alias))
        # refused in the read-only head of site.yml (the roles' input checks run there too): the first role that
        # only changes a host, podman, never ran; the snapshot below proves nothing changed
        assert "podman" not in run.roles_run(row.alias), (row.id, run.tasks_run(row.alias))
    assert snapshot(host) == before
    print(f"{len(rows)} bad inputs refused on {host}, nothing changed")
