#!/usr/bin/python
# d3fleet.fleet.apt_present: documentation only; the action plugin of the same name runs on the controller.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: apt_present
short_description: Debian packages present, asking apt only when one is missing
description:
  - Reads each package's status with one C(dpkg-query) command over the connection (no Python module, no privilege
    escalation). When every package is C(installed), reports no change and does not run apt.
  - Otherwise runs M(ansible.builtin.apt) with O(name), C(state=present) and the other options as given, and returns
    its result. Every name is passed, as a plain apt task would; RV(missing) names those the read did not find.
  - The same outcome as M(ansible.builtin.apt) C(state=present) for real package names, for a fraction of its cost
    on a host where they are installed (apt opens its whole cache on every call). A virtual package name is never
    C(installed) in dpkg's database, so apt is always asked for it.
  - With every package installed, O(update_cache) does not refresh the package lists; they are refreshed only when
    apt runs, to install.
version_added: 1.2.0
author: d3-fleet
options:
  name:
    description:
      - Debian package names (Debian Policy 5.6.1), without version or architecture; anything else is refused before
        any command runs.
    type: list
    elements: str
    required: true
  state:
    description: Only V(present) (written out, the task reads as the apt task it replaces).
    type: str
    choices: [present]
    default: present
  install_recommends:
    description: Passed to M(ansible.builtin.apt) when it runs (unset, apt's own default).
    type: bool
  update_cache:
    description: Passed to M(ansible.builtin.apt) when it runs.
    type: bool
  cache_valid_time:
    description: Passed to M(ansible.builtin.apt) when it runs.
    type: int
attributes:
  check_mode:
    support: full
    details: The C(dpkg-query) read runs in check mode too; apt then runs in check mode.
  diff_mode:
    support: full
    details: As M(ansible.builtin.apt) when it runs.
notes:
  - The status words come from C(dpkg-query -W -f='${Package} ${db:Status-Status}\n'), dpkg 1.17.11 and later
    (tests/contracts/dpkg/dpkg-query-status.yml). An exit status other than 0 or 1 leaves the decision to apt.
seealso:
  - module: ansible.builtin.apt
"""

EXAMPLES = r"""
- name: Install HAProxy and socat
  d3fleet.fleet.apt_present:
    name: [haproxy, socat]
    update_cache: true
    cache_valid_time: 3600
  register: _d3_router_installed
"""

RETURN = r"""
missing:
  description: The packages the read did not find installed (empty when apt was not asked).
  returned: always
  type: list
  elements: str
  sample: [haproxy]
"""
