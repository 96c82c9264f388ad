"""The container labels a D3 instance carries (set by the planner's d3_host_plan, read by status and units_read):
the one place their keys are written. Templates and tasks that cannot import this file name it in a comment."""

from __future__ import annotations

PREFIX = "io.d3-fleet."
INSTANCE = PREFIX + "instance"  # the instance name: marks a container (and its unit file) as one of the fleet's
MODEL = PREFIX + "model"  # the catalog model it serves
REVISION = PREFIX + "revision"  # the Hugging Face revision it serves ("unpinned" without one)
