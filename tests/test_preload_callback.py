"""The callback d3fleet.fleet.preload: every filter file of the collection imported in the controller before Ansible
forks its workers (a worker compiles a collection's Python otherwise: the plugin's DOCUMENTATION says where). What it
saves is measured in docs/testing.md, not asserted here. What a real run imports is checked in a fresh Python and through
ansible-playbook (the playbook tier); the plugin's own logic in this process (the quick tier, and mutation)."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testkit import ansible_playbook

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "collections/ansible_collections/d3fleet/fleet"
CALLBACKS = COLLECTION / "plugins/callback"
FILTERS = "ansible_collections.d3fleet.fleet.plugins.filter"
sys.path.insert(0, str(CALLBACKS))

import preload  # noqa: E402  (the callback, imported flat like the filters: the in-process checks, and mutation)


def fresh_python(code: str) -> object:
    """Run ``code`` in a new interpreter with the collection root and the callback directory first on sys.path; what it
    prints last, as JSON."""
    prelude = f"import json, sys\nsys.path[:0] = {[str(ROOT / 'collections'), str(CALLBACKS)]!r}\n"
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def filter_modules() -> list[str]:
    return sorted(f"{FILTERS}.{p.stem}" for p in (COLLECTION / "plugins/filter").glob("*.py") if p.stem != "__init__")


# the playbook tier: a new interpreter reads the collection from the tree on disk, so it cannot see a mutant (mutation
# runs leave this tier out); the in-process checks below run in the quick tier and under mutation
@pytest.mark.playbook
def test_the_callback_imports_every_filter_file_of_the_collection_in_the_controller() -> None:
    """Constructing the callback (what Ansible does in the controller at the start of a run) leaves every filter file
    in sys.modules under the name Ansible's plugin loader looks for, and the module_utils they import with them."""
    got = fresh_python(
        "import preload\n"
        f"before = sorted(n for n in sys.modules if n.startswith({FILTERS!r} + '.'))\n"
        "from ansible.plugins.loader import filter_loader, test_loader\n"
        "tables = [len(filter_loader._cached_non_collection_wrappers), len(test_loader._cached_non_collection_wrappers)]\n"
        "cb = preload.CallbackModule()\n"
        "mods = sorted(n for n in sys.modules if n.startswith('ansible_collections.d3fleet.fleet.plugins.'))\n"
        "built = [sorted(filter_loader._cached_non_collection_wrappers), sorted(test_loader._cached_non_collection_wrappers)]\n"
        "print(json.dumps([before, cb.preloaded, mods, tables, built, cb.jinja_plugins]))\n"
    )
    before, preloaded, modules, tables, built, listed = got  # type: ignore[misc]
    # ansible-core's tables of non-collection filters and tests: empty before, built by the callback (what a worker
    # would otherwise build on its first lookup of a filter or test)
    assert tables == [0, 0]
    assert {"bool", "ansible.builtin.bool", "to_json", "regex_replace"} <= set(built[0])
    assert {"match", "ansible.builtin.match", "version", "file"} <= set(built[1])
    assert listed == len(built[0]) + len(built[1])
    assert before == []
    assert preloaded == filter_modules() and len(preloaded) >= 10
    assert set(filter_modules()) <= set(modules)
    assert "ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats" in modules  # d3_bench.py's import


def test_a_file_that_fails_to_import_is_left_to_the_task_that_uses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken file (an exception, SystemExit) is skipped (the task that calls its filter gets Ansible's own error),
    the files after it still load, in the package's order."""
    pkg = tmp_path / "d3preload_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a_broken.py").write_text("raise ImportError('a broken filter file')\n")
    (pkg / "b_good.py").write_text("VALUE = 1\n")
    (pkg / "c_exits.py").write_text("raise SystemExit(3)\n")  # would end ansible-playbook with no message
    (pkg / "d_good.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        names = preload.preload("d3preload_pkg")
        loaded = sorted(n for n in sys.modules if n.startswith("d3preload_pkg."))
        assert names == loaded == ["d3preload_pkg.b_good", "d3preload_pkg.d_good"]
        assert sys.modules["d3preload_pkg.d_good"].VALUE == 2
    finally:
        for name in [n for n in sys.modules if n == "d3preload_pkg" or n.startswith("d3preload_pkg.")]:
            del sys.modules[name]


def test_constructing_the_callback_preloads_the_collections_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ansible does in the controller (it constructs each enabled callback) runs the preload of the collection's
    filter package and keeps its names, then has ansible-core build its filter and test tables; the default package is
    the collection's filters."""
    calls: list[str] = []

    def fake(package: str = preload.FILTERS) -> list[str]:
        calls.append(package)
        return [package + ".x"]

    def tables(loaders: tuple | None = None) -> int:
        calls.append(f"tables {loaders}")
        return 7

    assert preload.FILTERS == FILTERS
    monkeypatch.setattr(preload, "preload", fake)
    monkeypatch.setattr(preload, "jinja_plugin_tables", tables)
    cb = preload.CallbackModule()
    assert calls == [FILTERS, "tables None"] and cb.preloaded == [FILTERS + ".x"] and cb.jinja_plugins == 7
    # Ansible's own arguments reach CallbackBase, positional or by name (its display)
    display = type("Display", (), {"verbosity": 0})()
    assert preload.CallbackModule(display)._display is display
    assert preload.CallbackModule(display=display)._display is display


def test_each_loader_lists_its_plugins_once_and_one_that_fails_is_put_back_as_it_was() -> None:
    """Listing builds the table; a loader whose plugin file raises or exits part way (a broken plugin path) keeps no
    partial table and no half-imported plugin module (each worker builds it again and reports the error, as without
    the callback), and does not stop the others, nor the run."""

    class Loader:
        package = "d3preload_fake.filter"

        def __init__(self, names: list[str], fail: BaseException | None = None) -> None:
            self.names, self.fail, self.calls, self.table = names, fail, 0, {}

        def all(self):
            self.calls += 1
            for name in self.names:
                self.table[name] = sys.modules[f"{self.package}.{name}"] = object()
                yield name
            if self.fail is not None:
                sys.modules["d3preload_fake.dependency"] = object()  # what the broken file imported first: kept
                raise self.fail

        def _clear_caches(self) -> None:
            self.table = {}

    kept = "d3preload_fake.filter.loaded_before"
    sys.modules[kept] = object()
    try:
        first = Loader(["a", "b"])
        raising, exiting = Loader(["c"], RuntimeError("a broken filter file")), Loader(["d"], SystemExit(0))
        last = Loader(["e", "f", "g"])
        assert preload.jinja_plugin_tables((first, raising, exiting, last)) == 5
        assert [first.calls, raising.calls, exiting.calls, last.calls] == [1, 1, 1, 1]
        assert [sorted(first.table), raising.table, exiting.table, sorted(last.table)] == [["a", "b"], {}, {}, ["e", "f", "g"]]
        loaded = sorted(n for n in sys.modules if n.startswith("d3preload_fake."))
        assert loaded == ["d3preload_fake.dependency"] + [f"d3preload_fake.filter.{n}" for n in ("a", "b", "e", "f", "g", "loaded_before")]
        assert preload.jinja_plugin_tables(()) == 0
        # by default ansible-core's own filter and test loaders (their tables: the fresh-interpreter test above)
        assert preload.jinja_plugin_tables() > 100
    finally:
        for name in [n for n in sys.modules if n.startswith("d3preload_fake.")]:
            del sys.modules[name]


def test_it_is_an_aggregate_callback_that_must_be_enabled_and_the_project_enables_it() -> None:
    """Opt-in (it is not a stdout callback and does nothing unless enabled), and enabled where this project runs
    Ansible: ansible.cfg (the lab, the tests, AWX and the EE read it) and molecule's generated configuration."""
    c = preload.CallbackModule
    got = [c.CALLBACK_TYPE, c.CALLBACK_NAME, c.CALLBACK_NEEDS_ENABLED, c.CALLBACK_VERSION]
    assert got == ["aggregate", "d3fleet.fleet.preload", True, 2.0]
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert "d3fleet.fleet.preload" in [c.strip() for c in cfg["defaults"]["callbacks_enabled"].split(",")]
    molecule = yaml.safe_load((ROOT / "molecule/default/molecule.yml").read_text())
    assert molecule["provisioner"]["config_options"]["defaults"]["callbacks_enabled"] == "d3fleet.fleet.preload"


PROBE = """
import os
import sys

IMPORTED_IN = os.getpid()


def loaded(_input):
    return sorted(n for n in sys.modules if n.startswith("FILTERS."))


def imported_elsewhere(_input):
    return os.getpid() != IMPORTED_IN


class FilterModule:
    def filters(self):
        return {"d3_preload_probe": loaded, "d3_preload_imported_elsewhere": imported_elsewhere}
""".replace("FILTERS", FILTERS)


@pytest.mark.playbook
def test_a_worker_finds_every_filter_file_imported_before_it_calls_one(tmp_path: Path) -> None:
    """Through ansible-playbook with the project's ansible.cfg: a task whose only filter is a probe outside the
    collection (it loads none of the collection's files) sees every d3fleet filter file in its worker's sys.modules,
    inherited from the controller, and the probe's own file imported in another process than the worker (the
    controller, building ansible-core's filter table); with the callback list replaced by another
    (ANSIBLE_CALLBACKS_ENABLED), none of the collection's files and the probe imported in the worker itself."""
    (tmp_path / "filter_plugins").mkdir()
    (tmp_path / "filter_plugins/probe.py").write_text(PROBE)
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug: {msg: \"{{ [0 | d3_preload_probe, 0 | d3_preload_imported_elsewhere] }}\"}\n"
    )

    def worker_saw(filter_plugins: str = str(tmp_path / "filter_plugins"), **env: str) -> list[str]:
        proc = ansible_playbook(str(tmp_path / "play.yml"), "-i", "localhost,", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
                                ANSIBLE_FILTER_PLUGINS=filter_plugins, **env)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        # the json callback's report (ansible.posix.timer prints its line after it)
        report, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
        return report["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]

    assert worker_saw() == [filter_modules(), True]
    assert worker_saw(ANSIBLE_CALLBACKS_ENABLED="ansible.posix.timer") == [[], False]
    # a filter_plugins directory beside the playbook (ansible-playbook adds it before it loads the playbook,
    # cli/playbook.py) is in the table the callback builds, as in the one a worker would build
    assert worker_saw(filter_plugins="/nonexistent") == [filter_modules(), True]
