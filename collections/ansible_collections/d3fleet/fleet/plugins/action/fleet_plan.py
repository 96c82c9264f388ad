# d3fleet.fleet.fleet_plan: the whole fleet's plan in one task (the module's documentation: plugins/modules/fleet_plan.py).
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wiring only: gather each host's variables as a task on that host would see them, then hand them to the filter
d3fleet.fleet.d3_fleet_plan (where every decision is), once."""

from __future__ import annotations

import os
from typing import Any

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.d3fleet.fleet.plugins.filter.d3_fleet_plan import (
    FIREWALL_VARS,
    MONITOR_VARS,
    PLAN_VARS,
    ROUTER_VARS,
    VAULTED,
    VIEW_VARS,
    fleet_plan,
    fleet_views,
    truthy,
    with_views,
)

# the roles whose defaults and vars a per-host plan reads (plan.yml imports none of their tasks), and the one whose
# argument spec (main entry point) Ansible validated when plan.yml imported it
ROLES = ("d3", "d3_image", "d3_units", "d3_router", "d3_metrics", "d3_firewall", "d3_weights")
VALIDATED = ("d3",)
COLLECTION_ROLES = os.path.join(os.path.dirname(__file__), "..", "..", "roles")


def role_files(name: str, search: list[str], load: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A role's defaults/main.yml, vars/main.yml (read by Ansible's loader: their templates stay templates) and
    meta/argument_specs.yml, from the first directory of ``search`` that has the role."""
    for base in search:
        path = os.path.join(base, name)
        if os.path.isdir(os.path.join(path, "tasks")):
            found = []
            for part in ("defaults/main.yml", "vars/main.yml", "meta/argument_specs.yml"):
                file = os.path.join(path, part)
                found.append((load(file) or {}) if os.path.isfile(file) else {})
            return found[0], found[1], found[2]
    raise AnsibleActionFail(f"role {name} not found in {', '.join(search)}")


class ActionModule(ActionBase):
    _requires_connection = False
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        play_hosts = list(self._task.args.get("hosts") or [])
        group = list(self._task.args.get("group") or [])
        hosts = [h for h in play_hosts if h in group]  # the GPU hosts of the play
        hostvars = task_vars["hostvars"]
        manager, inventory = hostvars._variable_manager, hostvars._inventory
        play = self._task.get_play()
        base = task_vars.get("playbook_dir", ".")
        search = [os.path.join(base, "roles"), os.path.join(base, "..", "roles"), *C.DEFAULT_ROLES_PATH, COLLECTION_ROLES]
        defaults: dict[str, Any] = {}
        role_vars: dict[str, Any] = {}
        specs: dict[str, Any] = {}
        for name in ROLES:
            d, v, spec = role_files(name, search, lambda f: self._loader.load_from_file(f, trusted_as_template=True))
            defaults.update(d)
            role_vars.update(v)
            if name in VALIDATED:
                specs[name] = spec["argument_specs"]["main"]["options"]
        checked = set(PLAN_VARS).union(VIEW_VARS, ("d3_firewall_enabled",), *specs.values())
        extra = dict(manager.extra_vars)
        groups = task_vars.get("groups", {})
        routers = [h for h in play_hosts if h in groups.get("d3-routers", [])]
        monitors = [h for h in play_hosts if h in groups.get("d3-monitors", [])]
        merged_of: dict[str, dict[str, Any]] = {}

        def read(host: str, names: Any, more: dict[str, Any] | None = None) -> dict[str, Any]:
            if host not in merged_of:
                seen = manager.get_vars(play=play, host=inventory.get_host(host), task=self._task, include_hostvars=False)
                merged_of[host] = {**defaults, **seen, **role_vars, **extra}
            merged = {**merged_of[host], **(more or {})}
            templar = self._templar.copy_with_new_env(available_variables=merged)
            out: dict[str, Any] = {}
            for name in (n for n in names if n in merged):
                try:
                    out[name] = templar.template(merged[name])
                except AnsibleError as exc:  # a vaulted value without the vault password: set, not read
                    if "vault" not in str(exc).lower():
                        raise
                    out.setdefault(VAULTED, []).append(name)
            return out

        gathered = {h: read(h, checked if h in hosts else ("d3_gpu_count", "d3_gpu_memory_mib", "d3_host_labels", "d3_models"))
                    for h in sorted(set(hosts) | set(group))}  # fmt: skip
        catalog = self._templar.copy_with_new_env(available_variables={**defaults, **role_vars})
        plan = fleet_plan({h: gathered[h] for h in hosts}, catalog.template(role_vars["d3_catalog"]),
                          catalog.template(role_vars["d3_catalog_common"]), group, others=gathered, specs=specs,
                          groups=list(task_vars.get("groups", {})), anchor=play_hosts[0] if play_hosts else "")
        for host in (h for h in group if h in hosts):
            entry = plan["hosts"].get(host)
            # the firewall's defaults read the host's plan: templated once it is known, and only when it is on
            if entry is not None and not entry["problems"] and truthy(gathered[host].get("d3_firewall_enabled", False)):
                gathered[host].update(read(host, FIREWALL_VARS, {"d3_host_plan": entry["plan"]}))
        views = fleet_views(plan, gathered, [h for h in group if h in hosts] if set(group) <= set(hosts) else group,
                            {r: read(r, ROUTER_VARS) for r in routers}, {m: read(m, MONITOR_VARS) for m in monitors})
        result.update(changed=False, fleet=with_views(plan, views))
        return result
