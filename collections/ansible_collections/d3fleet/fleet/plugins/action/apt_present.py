# d3fleet.fleet.apt_present: apt's state=present, asked only when a package is missing (documentation:
# plugins/modules/apt_present.py).
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wiring only: one read over the connection (dpkg-query and apt's automatic marks; no module, no privilege
escalation), then ansible.builtin.apt with state=present when the read finds a package apt would act on. The command and the decision are
the helpers d3_host.dpkg_status_command and d3_host.apt_missing (unit-tested, tests/contracts/dpkg/)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.d3fleet.fleet.plugins.filter.d3_host import apt_missing, apt_simulate_command, apt_simulated, dpkg_status_command

ARGUMENT_SPEC = {
    "name": {"type": "list", "elements": "str", "required": True},
    "state": {"type": "str", "choices": ["present"], "default": "present"},
    "install_recommends": {"type": "bool"},
    "update_cache": {"type": "bool"},
    "cache_valid_time": {"type": "int"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            command = dpkg_status_command(args["name"])
        except ValueError as exc:
            raise AnsibleActionFail(str(exc)) from exc
        if command is None:  # a version, an architecture or a pattern in a name: apt alone knows what it means
            missing = list(args["name"])
        else:
            # a read (check mode too); dpkg-query's rc 1 is "some package not found", anything else leaves it to apt
            read = self._low_level_execute_command(command, sudoable=False)
            missing = apt_missing(read.get("stdout", ""), args["name"]) if read.get("rc") in (0, 1) else list(args["name"])
        if not missing:
            result.update(changed=False, missing=[], msg=f"installed: {' '.join(args['name'])} (dpkg-query; apt not asked)")
            return result
        apt_args = {k: v for k, v in args.items() if v is not None}
        result.update(self._execute_module(module_name="ansible.builtin.apt", module_args=apt_args,
                                           task_vars=task_vars))  # fmt: skip
        result["missing"] = missing
        if result.get("failed") and self._task.check_mode and command is not None and (args["update_cache"] or args["cache_valid_time"]):
            # apt's check mode does not refresh the package lists the real run refreshes first (a fresh host has
            # none): ask apt-get's simulation over fresh lists in a temporary directory instead
            sim = self._low_level_execute_command(apt_simulate_command(missing), sudoable=True)
            if sim.get("rc") != 0:
                return {**result, "msg": f"check mode: apt-get cannot install {' '.join(missing)} even from fresh package lists: "
                                         f"{(sim.get('stderr') or sim.get('stdout') or '').strip()[-2000:]}"}  # fmt: skip
            installs = apt_simulated(sim.get("stdout", ""))
            msg = f"check mode: the apt lists are not current; after apt-get update, apt would install {' '.join(installs)}"
            return {"changed": True, "missing": missing, "simulated": installs, "msg": msg}
        return result
