"""The d3_weights role's cache decisions: where each model's snapshot and completion marker live, which models must
be downloaded, and the environment of the ``hf download`` command.

The Hugging Face cache (huggingface_hub) keeps a repository ``org/name`` under ``HF_HOME/hub/models--org--name/`` and a
revision's files under its ``snapshots/<revision>/``. A snapshot directory can exist while a download was
interrupted, so the role writes its own marker, ``HF_HOME/d3-complete/models--org--name/<revision>.json``, only after
``hf download`` succeeded: a model is cached completely when both exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def weights_locations(models: list[Mapping[str, Any]], hf_home: str) -> list[dict[str, str]]:
    """Per model ({repo, revision}): {repo, revision, snapshot, marker_dir, marker} under ``hf_home``."""
    out = []
    for model in models:
        key = "models--" + model["repo"].replace("/", "--")
        out.append({
            "repo": model["repo"],
            "revision": model["revision"],
            "snapshot": f"{hf_home}/hub/{key}/snapshots/{model['revision']}",
            "marker_dir": f"{hf_home}/d3-complete/{key}",
            "marker": f"{hf_home}/d3-complete/{key}/{model['revision']}.json",
        })  # fmt: skip
    return out


def weights_missing(locations: list[Mapping[str, Any]], cache: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The locations not cached completely, from the role's cache read (``snapshots``: the number of entries of each
    snapshot directory, -1 when it is missing; ``markers``: whether each completion marker exists)."""
    return [m for m in locations if cache["snapshots"][m["snapshot"]] < 0 or not cache["markers"][m["marker"]]]


def weights_env(hf_home: str, endpoint: str, token_file: str) -> dict[str, str]:
    """The environment of ``hf download``: the cache, no telemetry, update check or progress bars; with a mirror
    (``endpoint``), HF_ENDPOINT and no Xet (a mirror serves plain HTTP downloads); with a token file, HF_TOKEN_PATH (the
    token itself never reaches the command line or the environment)."""
    env = {"HF_HOME": hf_home, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if endpoint:
        env.update({"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_XET": "1"})
    if token_file:
        env["HF_TOKEN_PATH"] = token_file
    return env


class FilterModule:
    """Ansible filters: d3_weights_locations, d3_weights_missing, d3_weights_env."""

    def filters(self) -> dict[str, Any]:
        return {"d3_weights_locations": weights_locations, "d3_weights_missing": weights_missing, "d3_weights_env": weights_env}
