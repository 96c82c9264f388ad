# d3fleet.fleet.preload: import the collection's filter plugins once, in the controller, before Ansible forks.
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: preload
type: aggregate
short_description: Load the collection's filters and ansible-core's filter and test table once, before Ansible forks
description:
  - Prints nothing and changes no result. When Ansible loads it (at the start of a run, in the controller process),
    it imports every filter plugin of C(d3fleet.fleet) (and the module_utils they import), so that the worker
    process Ansible forks for each task and host inherits them instead of loading them again.
  - Why - a lookup of one filter by name loads the collection's filter files one after the other until one has it
    (C(ansible/plugins/loader.py), C(Jinja2Loader.get_with_context)), in the worker, and the filter files import
    each other and the collection's module_utils through ansible-core's collection loader, which compiles their
    source in every process (C(ansible/utils/collection_loader/_collection_finder.py),
    C(_AnsibleCollectionPkgLoaderBase.get_code); no bytecode cache; the files the plugin loader opens itself go
    through C(spec_from_file_location), which uses one where Python may write it). Both reuse a module already in
    C(sys.modules) (C(PluginLoader._load_module_source)). In a C(site.yml) run on the lab about a fifth of the
    controller's CPU went there (py-spy, docs/testing.md).
  - It also has ansible-core build its table of the filters and tests found outside collections (C(ansible.builtin)'s
    and those of the configured plugin paths; C(Jinja2Loader._ensure_non_collection_wrappers), built on the first
    lookup of any filter or test and kept until a plugin directory is added, which clears it) by asking each loader
    to list its plugins. Built in each worker, that table (and the plugin files it imports) took about an eighth of
    the controller's CPU samples in a play of C(assert) tasks (py-spy; docs/testing.md has the measurements); built
    here, every worker inherits it. The controller has already added the playbook's and its roles' plugin directories when it loads
    callbacks (C(PlaybookExecutor.run) calls C(Playbook.load), then C(load_callbacks)), so the table is the one a worker
    would build; a directory added later clears it, and the workers build it again as they did without this plugin.
    A plugin file that fails there (an exception, C(SystemExit)) leaves no table behind; each worker then builds it and
    the task reports the error as before.
  - So every filter and test file outside collections (ansible.builtin's, the configured and the playbook's plugin
    directories) is imported once in the controller at the start of each run. A file with import-time side effects
    (printing, opening a socket, seeding a random generator) has them there, once, instead of in each worker that
    looks a filter or test up. A run that must avoid that leaves this callback out of C(callbacks_enabled).
  - A filter file that fails to import (an exception, or C(SystemExit)) is left alone here; the task that uses it
    reports the error as usual. A run that never calls a C(d3fleet.fleet) filter pays the import once, about
    0.1 s of the controller's CPU.
  - Enabled through C(callbacks_enabled); an C(ANSIBLE_CALLBACKS_ENABLED) environment variable replaces that list, so
    a setting that must keep this plugin names it too (the Makefile's lab build does).
author: d3-fleet
version_added: 1.0.0
requirements:
  - enabled in ansible.cfg (C(callbacks_enabled = d3fleet.fleet.preload); the project's ansible.cfg does)
"""

EXAMPLES = r"""
# ansible.cfg
#   [defaults]
#   callbacks_enabled = d3fleet.fleet.preload
"""

import importlib
import pkgutil
import sys

from ansible.plugins.callback import CallbackBase

FILTERS = "ansible_collections.d3fleet.fleet.plugins.filter"


def preload(package: str = FILTERS) -> list[str]:
    """Import every module of ``package`` (a collection's plugin package); the names imported, in the package's order
    (pkgutil's: by name). A module that fails to import is skipped: Ansible reports it where a task uses it."""
    done = []
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__, prefix=package + "."):
        try:
            importlib.import_module(info.name)
        except (Exception, SystemExit):  # the task that uses the filter reports it, with Ansible's own message
            continue
        done.append(info.name)
    return done


def jinja_plugin_tables(loaders: tuple | None = None) -> int:
    """Have ansible-core build its tables of non-collection filters and tests (listing a loader's plugins builds it);
    the number of entries listed. A loader that fails (an exception or SystemExit from a plugin file) is put back as
    it was: its table cleared (no partial table for the workers to inherit) and the plugin modules the attempt left in
    sys.modules removed, so each worker builds the table again and the task that needs it reports the error, as without
    this plugin."""
    if loaders is None:
        from ansible.plugins.loader import filter_loader, test_loader

        loaders = (filter_loader, test_loader)
    listed = 0
    for loader in loaders:
        before = set(sys.modules)
        try:
            listed += sum(1 for _ in loader.all())
        except (Exception, SystemExit):
            loader._clear_caches()
            for name in set(sys.modules) - before:
                if name.startswith(loader.package + "."):
                    del sys.modules[name]
    return listed


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "d3fleet.fleet.preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.preloaded = preload()
        self.jinja_plugins = jinja_plugin_tables()
