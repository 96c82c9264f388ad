#!/usr/bin/python
# d3fleet.fleet.fleet_plan: documentation only; the action plugin of the same name runs on the controller.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_plan
short_description: Plan every host of the fleet in one task, on the controller, contacting no host
description:
  - Gathers each host's variables as a task on that host would see them (inventory, group and host vars, play vars,
    extra vars, and the defaults and vars of the roles C(d3), C(d3_image) and C(d3_units)) and plans them all at once
    with the filter P(d3fleet.fleet.d3_fleet_plan#filter) - the per-host planner, the fleet placement, the image and
    unit input checks, a labelled report per host and a fleet summary.
  - Run it once (C(run_once)); C(playbooks/plan.yml) does. Changes nothing.
version_added: 1.1.0
author: d3-fleet
options:
  hosts:
    description: The hosts to plan (the play's, C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  group:
    description: Every host of C(l4-nodes), so that a C(--limit) run places fleet replicas as a full run does.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  action:
    support: full
"""

EXAMPLES = r"""
- name: Plan every host of the play at once
  d3fleet.fleet.fleet_plan:
    hosts: "{{ ansible_play_hosts_all }}"
    group: "{{ groups['l4-nodes'] }}"
  run_once: true
  register: _d3_fleet_plan
"""

RETURN = r"""
fleet:
  description: The filter P(d3fleet.fleet.d3_fleet_plan#filter)'s result - C(hosts) (per host its plan, problems and
    report), C(plans), C(problems) (per refused host its lines), C(probe) (hosts without declared GPUs), C(placement),
    C(lines) (the report to print) and C(summary).
  returned: always
  type: dict
"""
