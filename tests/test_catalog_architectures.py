"""The catalog's architecture numbers (roles/d3/vars/main.yml, `architecture:` per size) are the ones the sourced
fixture tests/contracts/d3-architectures.json records, key for key: one fact, one source, checked both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).parent / "contracts" / "d3-architectures.json"


@pytest.fixture(scope="module")
def fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_every_catalog_size_has_an_entry_and_no_entry_lacks_a_size(catalog_vars: dict[str, Any], fixture: dict[str, Any]) -> None:
    assert set(fixture["models"]) == set(catalog_vars["d3_catalog"])
    for model, spec in fixture["models"].items():
        assert spec["instance_name"] == catalog_vars["d3_catalog"][model]["instance_name"]
        assert spec["hf_repo"] == catalog_vars["d3_catalog"][model]["hf_repo"]


@pytest.mark.parametrize("model", ["d3", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"])
def test_the_catalog_architecture_equals_the_fixture(catalog_vars: dict[str, Any], fixture: dict[str, Any], model: str) -> None:
    arch = catalog_vars["d3_catalog"][model]["architecture"]
    config = fixture["models"][model]["config"]
    text = config["text_config"]
    assert arch["text"] == {k: text[k] for k in arch["text"]}
    assert arch["vision"] == {k: config["vision_config"][k] for k in arch["vision"]}
    # the catalog's interval gives the fixture's layer_types (which layers keep a KV cache)
    interval = arch["text"]["full_attention_interval"]
    expected = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(arch["text"]["num_hidden_layers"])]
    assert text["layer_types"] == expected
    # every number memory depends on is in the catalog
    needed = {"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim", "mamba_ssm_dtype", "dtype", "vocab_size"}
    assert needed <= set(arch["text"])


def test_every_entry_names_its_sources_and_every_source_id_exists(fixture: dict[str, Any]) -> None:
    ids = set(fixture["source_ids"])
    for model, spec in fixture["models"].items():
        assert spec["sources"], model
        for keys, refs in spec["sources"].items():
            assert refs, (model, keys)
            for ref in refs:
                assert ref.split(" ", 1)[0] in ids, (model, keys, ref)
        assert isinstance(spec["unconfirmed"], list)
