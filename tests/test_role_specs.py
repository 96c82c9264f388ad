"""Every role's meta/argument_specs.yml documents exactly its defaults/main.yml.

For each role under roles/ (parametrised, so a new role is checked without editing this file):
- meta/main.yml, meta/argument_specs.yml and defaults/main.yml exist;
- every variable in defaults/main.yml is an option of some entry point;
- every option with a `default:` is in defaults/main.yml with an equal value (Jinja strings are compared
  literally, no option is skipped); an option without `default:` is not in defaults (required or unset);
- a default matches the option's declared `type` and `choices` (the one skip: the type of a Jinja-expression
  default, which only exists once rendered);
- private variables (leading underscore) are neither defaults nor options, public ones carry the role prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str, "bool": bool, "int": int, "float": (int, float), "list": list, "dict": dict, "path": str,
}


def _load(path: Path) -> Any:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _options(role: Path) -> dict[str, dict[str, Any]]:
    specs = (_load(role / "meta/argument_specs.yml") or {}).get("argument_specs") or {}
    assert specs, f"{role.name}: meta/argument_specs.yml has no argument_specs entry point"
    options: dict[str, dict[str, Any]] = {}
    for entry, spec in specs.items():
        for name, option in ((spec or {}).get("options") or {}).items():
            assert name not in options or options[name] == option, f"{role.name}: {name} differs between entry points ({entry})"
            options[name] = option or {}
    return options


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_meta_main_exists(role: Path) -> None:
    galaxy = (_load(role / "meta/main.yml") or {}).get("galaxy_info") or {}
    for key in ("author", "description", "license", "min_ansible_version", "platforms"):
        assert galaxy.get(key), f"{role.name}: meta/main.yml galaxy_info lacks {key}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_argument_specs_match_defaults(role: Path) -> None:
    defaults = _load(role / "defaults/main.yml") or {}
    options = _options(role)
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"{role.name}: defaults/main.yml has variables missing from meta/argument_specs.yml: {undocumented}"
    for name, option in options.items():
        if "default" in option:
            assert name in defaults, f"{role.name}: {name} has default {option['default']!r} in argument_specs but not in defaults"
            assert option["default"] == defaults[name], (
                f"{role.name}: {name}: argument_specs default {option['default']!r} != defaults/main.yml {defaults[name]!r}"
            )
        else:
            assert name not in defaults, (
                f"{role.name}: {name} = {defaults[name]!r} in defaults/main.yml but argument_specs gives no default"
            )


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_defaults_match_type_and_choices(role: Path) -> None:
    for name, option in _options(role).items():
        if "default" not in option or option["default"] is None:
            continue
        value = option["default"]
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            continue  # a Jinja default gets its type when rendered; its text is still compared with defaults/main.yml
        wanted = TYPES.get(option.get("type", "str"))
        if wanted is not None:
            ok = isinstance(value, wanted) and not (wanted is int and isinstance(value, bool))
            assert ok, f"{role.name}: {name}: default {value!r} is not of type {option.get('type', 'str')}"
        if "choices" in option:
            assert value in option["choices"], f"{role.name}: {name}: default {value!r} not in choices {option['choices']}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_variable_names_carry_the_role_prefix(role: Path) -> None:
    names = set(_options(role)) | set(_load(role / "defaults/main.yml") or {})
    private = sorted(n for n in names if n.startswith("_"))
    assert not private, f"{role.name}: private variables must not be documented or defaulted: {private}"
    unprefixed = sorted(n for n in names if not n.startswith(f"{role.name}_"))
    assert not unprefixed, f"{role.name}: public variables must start with {role.name}_: {unprefixed}"
