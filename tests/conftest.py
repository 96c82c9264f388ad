"""Shared pytest fixtures: the repository root, the catalog and the planner module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
sys.path.insert(0, str(ROOT / "tests"))

import tiers  # noqa: E402  (tests/ on sys.path first)

tiers.install()


@pytest.fixture(scope="session", autouse=True)
def _test_doubles_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tier guard's test doubles are executables under this session's temporary directory only."""
    tiers.set_doubles_root(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def catalog_vars() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tiers.mark_lab_items(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """The running test's markers, for the guard, over its setup, call and teardown."""
    with tiers.running(item):
        yield
