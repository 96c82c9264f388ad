"""roles/d3_weights/files/hub-requirements.txt (tools/hub_requirements.py): pip's hash-checking mode needs every
requirement pinned with == and a sha256 for every file; it pins the huggingface_hub version the role installs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^[a-z0-9-]+==[0-9A-Za-z.+!-]+( ; python_version == \"3\.1[13]\")? (--hash=sha256:[0-9a-f]{64} ?)+\Z")


def test_every_requirement_is_pinned_with_hashes() -> None:
    lines = [x for x in (ROOT / "roles/d3_weights/files/hub-requirements.txt").read_text().splitlines() if x and not x.startswith("#")]
    assert len(lines) >= 10
    bad = [x for x in lines if not LINE.match(x.rstrip())]
    assert not bad, bad


def test_the_pinned_hub_is_the_roles_version() -> None:
    version = yaml.safe_load((ROOT / "roles/d3_weights/defaults/main.yml").read_text())["d3_weights_hub_version"]
    text = (ROOT / "roles/d3_weights/files/hub-requirements.txt").read_text()
    assert f"\nhuggingface-hub=={version} --hash=sha256:" in text
