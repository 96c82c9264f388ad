"""Every filter, module and callback of the d3fleet.fleet collection has documentation that ansible-doc renders.

The filters are found by importing every plugins/filter/*.py and asking its FilterModule for its names, so a filter
added to any file (or a new file) without a sidecar plugins/filter/<name>.yml fails here; the modules are every
plugins/modules/*.py. Each needs a short_description, EXAMPLES and RETURN, and a filter's options must name its
Python parameters (the first one is ``_input``). ansible-doc runs four times in all, in parallel (2 to 4 s).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from testkit import BIN, ansible_env

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "collections/ansible_collections/d3fleet/fleet"
FQCN = "d3fleet.fleet"


def _load_filters() -> tuple[dict[str, tuple[Path, Callable[..., Any]]], dict[str, list[str]], list[str]]:
    """name -> (file, function) of every exported filter; names exported by several files; files that fail to import."""
    if str(ROOT / "collections") not in sys.path:  # a filter may import ansible_collections.d3fleet.fleet...
        sys.path.insert(0, str(ROOT / "collections"))
    found: dict[str, tuple[Path, Callable[..., Any]]] = {}
    twice: dict[str, list[str]] = {}
    broken: list[str] = []
    for path in sorted((COLLECTION / "plugins/filter").glob("*.py")):
        if path.name == "__init__.py":
            continue
        spec = importlib.util.spec_from_file_location(f"_d3fleet_doc_filter_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
            exported = module.FilterModule().filters()
        except Exception as exc:
            broken.append(f"{path.name}: {type(exc).__name__}: {exc}")
            continue
        for name, function in exported.items():
            if name in found:
                twice.setdefault(name, [found[name][0].name]).append(path.name)
            found[name] = (path, function)
    return found, twice, broken


FILTERS, FILTERS_TWICE, BROKEN_FILES = _load_filters()
MODULES = sorted(p.stem for p in (COLLECTION / "plugins/modules").glob("*.py") if p.name != "__init__.py")
CALLBACKS = sorted(p.stem for p in (COLLECTION / "plugins/callback").glob("*.py") if p.name != "__init__.py")


def _ansible_doc(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "ansible-doc"), *args],
        cwd=ROOT,
        env=ansible_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _json(proc: subprocess.Popen[str]) -> tuple[dict[str, Any] | None, str]:
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        return None, err
    return json.loads(out), err


def _retry_without_undocumented(kind: str, names: list[str], listed: dict[str, str]) -> dict[str, Any]:
    """ansible-doc prints nothing for any name when one of them has no documentation: ask again without the names
    its list calls UNDOCUMENTED, then (if that still fails) each name alone, so that failures name the plugins."""
    data: dict[str, Any] = {
        n: {"error": f"ansible-doc -t {kind} -l {FQCN} calls it UNDOCUMENTED"} for n in names if listed.get(n) == "UNDOCUMENTED"
    }
    rest = [n for n in names if n not in data]
    if rest:
        again, _ = _json(_ansible_doc("-t", kind, "--json", *rest))
        if again is None:
            alone = {n: _ansible_doc("-t", kind, "--json", n) for n in rest}
            again = {}
            for n, proc in alone.items():
                one, err = _json(proc)
                again[n] = (one or {}).get(n) or {"error": err.strip()}
        data.update(again)
    return data


@pytest.fixture(scope="module")
def docs() -> dict[str, Any]:
    """ansible-doc's JSON for every filter, module and callback (one call each) and the collection's filter list, the four
    calls run in parallel (the module list only when the modules' call fails)."""
    names = {"filter": [f"{FQCN}.{n}" for n in sorted(FILTERS)], "module": [f"{FQCN}.{n}" for n in MODULES],
             "callback": [f"{FQCN}.{n}" for n in CALLBACKS]}
    procs = {kind: _ansible_doc("-t", kind, "--json", *names[kind]) for kind in names}
    filter_list = _ansible_doc("-t", "filter", "-l", FQCN, "--json")
    result: dict[str, Any] = {}
    listed, err = _json(filter_list)
    result["filter_list"] = listed if listed is not None else {"error": err.strip()}
    for kind, proc in procs.items():
        data, _ = _json(proc)
        if data is None:
            if kind == "module":
                listed, err = _json(_ansible_doc("-t", "module", "-l", FQCN, "--json"))
                result["module_list"] = listed if listed is not None else {"error": err.strip()}
            data = _retry_without_undocumented(kind, names[kind], result.get(f"{kind}_list") or {})
        result[kind] = data
    return result


def _check_doc(kind: str, name: str, entry: dict[str, Any] | None) -> dict[str, Any]:
    assert entry is not None, f"ansible-doc -t {kind} does not know {FQCN}.{name}"
    assert "error" not in entry, f"{FQCN}.{name} has no {kind} documentation: {entry['error']}"
    doc = entry.get("doc") or {}
    assert str(Path(doc.get("filename", ""))).startswith(str(COLLECTION)), (
        f"{FQCN}.{name}: ansible-doc read {doc.get('filename')}, not this repository's collection"
    )
    assert str(doc.get("short_description") or "").strip(), f"{FQCN}.{name}: no short_description"
    assert str(entry.get("examples") or "").strip(), f"{FQCN}.{name}: no EXAMPLES"
    assert entry.get("return"), f"{FQCN}.{name}: no RETURN"
    return doc


def test_filter_files_import_and_names_are_unique() -> None:
    assert FILTERS, "no filter found under plugins/filter"
    assert not BROKEN_FILES, f"filter files that do not import: {BROKEN_FILES}"
    assert not FILTERS_TWICE, f"filter names exported by more than one file: {FILTERS_TWICE}"


@pytest.mark.playbook
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_has_docs(docs: dict[str, Any], name: str) -> None:
    doc = _check_doc("filter", name, docs["filter"].get(f"{FQCN}.{name}"))
    assert doc.get("name") == name, f"{FQCN}.{name}: its sidecar names itself {doc.get('name')!r}"
    assert doc.get("description"), f"{FQCN}.{name}: no description"


@pytest.mark.playbook
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_options_are_its_parameters(docs: dict[str, Any], name: str) -> None:
    """The sidecar's options are the function's parameters: the piped value as ``_input``, then the others."""
    entry = docs["filter"].get(f"{FQCN}.{name}") or {}
    if "doc" not in entry:
        pytest.skip("no documentation (test_filter_has_docs fails)")
    try:
        params = list(inspect.signature(FILTERS[name][1]).parameters.values())
    except (TypeError, ValueError):
        pytest.skip("no Python signature to compare")
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        pytest.skip("takes *args or **kwargs")
    wanted = ["_input", *(p.name for p in params[1:])]
    documented = list(entry["doc"].get("options") or {})
    assert sorted(documented) == sorted(wanted), (
        f"{FQCN}.{name} ({FILTERS[name][0].name}): the sidecar documents {sorted(documented)}, the function takes {wanted}"
    )


@pytest.mark.playbook
@pytest.mark.parametrize("name", MODULES)
def test_module_has_docs(docs: dict[str, Any], name: str) -> None:
    _check_doc("module", name, docs["module"].get(f"{FQCN}.{name}"))


@pytest.mark.playbook
@pytest.mark.parametrize("name", CALLBACKS)
def test_callback_has_docs(docs: dict[str, Any], name: str) -> None:
    """A callback (plugins/callback/) needs a description and examples; it returns nothing."""
    entry = docs["callback"].get(f"{FQCN}.{name}")
    assert entry is not None and "error" not in entry, f"ansible-doc -t callback: no documentation for {FQCN}.{name}"
    doc = entry["doc"]
    assert str(Path(doc.get("filename", ""))).startswith(str(COLLECTION)), f"{FQCN}.{name}: read {doc.get('filename')}"
    assert doc.get("short_description") and doc.get("description") and str(entry.get("examples") or "").strip()
    # the documented type is the one the plugin declares (fleet: stdout; preload: aggregate)
    declared = re.search(r'^    CALLBACK_TYPE = "(\w+)"$', (COLLECTION / f"plugins/callback/{name}.py").read_text(), re.M)
    assert declared and doc.get("type") == declared.group(1) and doc.get("name") == name, (doc.get("type"), declared)


@pytest.mark.playbook
def test_ansible_doc_lists_every_filter_documented(docs: dict[str, Any]) -> None:
    listed = docs["filter_list"]
    assert "error" not in listed, listed.get("error")
    missing = sorted(n for n in FILTERS if f"{FQCN}.{n}" not in listed)
    undocumented = sorted(n for n in FILTERS if listed.get(f"{FQCN}.{n}") == "UNDOCUMENTED")
    assert not missing, f"ansible-doc -t filter -l {FQCN} does not list {missing}"
    assert not undocumented, f"ansible-doc -t filter -l {FQCN} lists {undocumented} as UNDOCUMENTED"
