"""Old name of the lab test helpers: everything now lives in tests/lab/labkit.py (the one helper module).
Kept so that importers of `runner_helpers` keep working; new code imports from labkit."""

from __future__ import annotations

from labkit import (  # noqa: F401  (re-exported)
    LAB_INVENTORY,
    ROOT,
    Run,
    host_vars,
    lab_hosts,
    on_host,
    run_playbook,
    running,
    unit_state,
)
