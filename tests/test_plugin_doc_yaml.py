"""The DOCUMENTATION, EXAMPLES and RETURN strings of every module and plugin of the collection parse as YAML mappings.

ansible-doc (tests/test_collection_docs.py, the playbook tier) and ansible-lint find a broken block only in the
slower tiers; twice a colon followed by a space inside a plain scalar turned a sentence into a mapping key and the
whole documentation unparsable (d3_image's lookup task, then bench_load's DOCUMENTATION). This reads the same strings
with PyYAML, the parser both use, without starting Ansible: the quick tier catches it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "collections/ansible_collections/d3fleet/fleet/plugins"
BLOCKS = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def doc_blocks(path: Path) -> dict[str, str]:
    """The module-level string assignments named in BLOCKS (what ansible-doc reads without importing the file)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in BLOCKS:
                    out[target.id] = node.value.value
    return out


FILES = sorted(p for p in PLUGINS.rglob("*.py") if doc_blocks(p))


def test_the_collection_has_documented_plugins() -> None:
    assert len(FILES) >= 5, FILES
    assert any(p.name == "bench_load.py" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PLUGINS)))
def test_every_documentation_block_parses(path: Path) -> None:
    for name, text in doc_blocks(path).items():
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail(f"{path.relative_to(ROOT)}: {name} is not valid YAML: {exc}")
        # EXAMPLES is a list of tasks or a mapping; the other two are mappings (an empty RETURN may be None)
        if name == "DOCUMENTATION":
            assert isinstance(data, dict) and data, f"{path.relative_to(ROOT)}: DOCUMENTATION is not a mapping"
        if name == "RETURN" and data is not None:
            assert isinstance(data, dict), f"{path.relative_to(ROOT)}: RETURN is not a mapping"


def test_a_colon_in_a_sentence_is_caught(tmp_path: Path) -> None:
    """The check fails on the mistake it exists for (a sentence with ': ' in a plain scalar)."""
    bad = tmp_path / "bad.py"
    doc = "module: x\ndescription:\n  - so do requests that\n    failed (timeouts, errors: no answer)\n"
    bad.write_text(f'DOCUMENTATION = r"""\n{doc}"""\n')
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(doc_blocks(bad)["DOCUMENTATION"])


def prose_problems(node: object, where: str = "") -> list[str]:
    """Where a description, notes or details entry is not text: a list item such as ``- Run it as root (C(become)):
    the files are root's.`` parses as a one-key mapping, and ansible-doc's text view then fails on the whole plugin
    (its --json view, tests/test_collection_docs.py, does not)."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "notes", "details", "short_description"):
                items = value if isinstance(value, list) else [value]
                out += [f"{where}.{key}: {item!r}" for item in items if not isinstance(item, str)]
            else:
                out += prose_problems(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out += prose_problems(item, f"{where}[{i}]")
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PLUGINS)))
def test_every_description_and_note_is_text(path: Path) -> None:
    for name in ("DOCUMENTATION", "RETURN"):
        text = doc_blocks(path).get(name)
        if text:
            assert prose_problems(yaml.safe_load(text), name) == [], path.relative_to(ROOT)


def test_a_note_that_parses_as_a_mapping_is_caught() -> None:
    doc = yaml.safe_load("module: x\nnotes:\n  - Run it as root (C(become)): the files are root's.\noptions:\n  a:\n    description: ok\n")
    assert prose_problems(doc, "DOCUMENTATION") == ["DOCUMENTATION.notes: {'Run it as root (C(become))': \"the files are root's.\"}"]


SIDECARS = sorted((PLUGINS / "filter").glob("*.yml"))


@pytest.mark.parametrize("path", SIDECARS, ids=lambda p: p.name)
def test_every_filter_description_and_note_is_text(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert prose_problems({k: data.get(k) for k in ("DOCUMENTATION", "RETURN")}) == [], path.name
