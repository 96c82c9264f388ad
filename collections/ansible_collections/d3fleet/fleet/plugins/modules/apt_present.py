#!/usr/bin/python
# d3fleet.fleet.apt_present: documentation only; the action plugin of the same name runs on the controller.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: apt_present
short_description: Debian packages present, asking apt only when one is missing
description:
  - Reads, with one shell command over the connection (no Python module, no privilege escalation), the native
    architecture, each package's status from C(dpkg-query) and apt's record of automatically installed packages.
    When every package is C(installed) for the native architecture or C(all), without the reinstall-required flag,
    and not marked automatically installed, reports no change and does not run apt.
  - Otherwise runs M(ansible.builtin.apt) with O(name), C(state=present) and the other options as given, and returns
    its result. Every name is passed, as a plain apt task would; RV(missing) names those the read found apt would act
    on (an automatically installed package is one, as apt C(state=present) marks it manually installed).
  - A name with a version, an architecture or a pattern (anything but a plain package name, Debian Policy 5.6.1) is
    not read; apt runs with it. A virtual package name is never C(installed) in dpkg's database, so apt always runs.
  - With every package installed, O(update_cache) does not refresh the package lists; they are refreshed only when
    apt runs. Another package on the host with the reinstall-required flag makes apt refuse to run; this read does not
    look at other packages, so a converged host reports no change.
version_added: 1.2.0
author: d3-fleet
options:
  name:
    description:
      - Package names as M(ansible.builtin.apt) takes them; only plain names (Debian Policy 5.6.1) reach the read.
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
    details: >-
      The C(dpkg-query) read runs in check mode too; apt then runs in check mode. apt's check mode does not refresh the
      package lists, so on a host whose lists lack a package (a fresh host has none) it fails where the real run
      would refresh them first and install. There, when O(update_cache) or O(cache_valid_time) is set, the action
      asks C(apt-get -s install) over fresh lists read into a temporary directory (the host's lists and caches are not
      touched) and reports the packages apt would install as a change, or fails with apt-get's reason
      (tests/contracts/dpkg/apt-get-simulate.yml).
  diff_mode:
    support: full
    details: As M(ansible.builtin.apt) when it runs.
notes:
  - The read is C(dpkg --print-architecture), C(dpkg-query -W -f='${Package} ${Architecture} ${db:Status-Eflag}
    ${db:Status-Status}\n') (dpkg 1.17.11 and later) and the C(Auto-Installed) stanzas of C(/var/lib/apt/extended_states)
    for the names asked (tests/contracts/dpkg/dpkg-query-status.yml). An exit status other than 0 or 1 leaves the
    decision to apt.
  - Unlike M(ansible.builtin.apt), no C(async), no C(module_defaults) for apt, and only the options below.
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
simulated:
  description: Check mode, lists refreshed into a temporary directory (see O(cache_valid_time)) only, the packages
    C(apt-get -s install) would install, dependencies included, in its order.
  returned: when check mode simulated the install
  type: list
  elements: str
  sample: [liblua5.3-0, haproxy, socat]
"""
