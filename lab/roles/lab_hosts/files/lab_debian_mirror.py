#!/usr/bin/env python3
"""STAND-IN (lab only): find this machine's Debian archive and security URIs in its own apt sources.

The lab host images are debootstrapped from the same archive the machine itself uses, so no host name
is hard-coded. Reads /etc/apt/sources.list and /etc/apt/sources.list.d/*.{list,sources} (deb822) and
prints JSON {"archive": URI, "security": URI} for the suite given as the first argument (e.g. bookworm).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

Entry = tuple[str, list[str]]  # (uri, suites)


def one_line_entries(text: str) -> list[Entry]:
    entries: list[Entry] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            entries.append((words[0], [words[1]]))
    return entries


def deb822_entries(text: str) -> list[Entry]:
    entries: list[Entry] = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
            continue
        for uri in fields.get("uris", "").split():
            entries.append((uri, fields.get("suites", "").split()))
    return entries


def read_entries(root: Path) -> list[Entry]:
    entries: list[Entry] = []
    main = root / "etc/apt/sources.list"
    if main.is_file():
        entries += one_line_entries(main.read_text())
    parts = root / "etc/apt/sources.list.d"
    for path in sorted(parts.glob("*.list")) if parts.is_dir() else []:
        entries += one_line_entries(path.read_text())
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        entries += deb822_entries(path.read_text())
    return entries


def find_mirrors(entries: list[Entry], suite: str) -> dict[str, str]:
    archive = next((uri for uri, suites in entries if suite in suites), "")
    security = next((uri for uri, suites in entries if f"{suite}-security" in suites), "")
    if not archive:
        raise SystemExit(f"no apt source for suite {suite!r} found")
    if not security:  # conventional sibling path of the archive
        security = archive.rstrip("/").removesuffix("/debian") + "/debian-security"
    return {"archive": archive.rstrip("/"), "security": security.rstrip("/")}


def main(argv: list[str]) -> int:
    suite = argv[1]
    root = Path(argv[2]) if len(argv) > 2 else Path("/")
    print(json.dumps(find_mirrors(read_entries(root), suite)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
