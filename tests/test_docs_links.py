"""README.md and docs/*.md: every relative link resolves, and every #anchor names a heading of its target.

Needs neither Ansible nor podman: plain Markdown parsing with the standard library. Anchors follow GitHub's
heading ids: lower case, punctuation other than `-` and `_` dropped, spaces as `-`, repeats suffixed -1, -2, ..."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """Every link and image target outside code (fenced blocks and `code spans`)."""
    return [m.group(1) for line in prose_lines(page.read_text(encoding="utf-8"))
            for m in LINK.finditer(CODE_SPAN.sub("", line))]


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if SCHEME.match(target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.name}: {target}: no heading with the id {anchor!r} in {dest.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert broken(page) == []


def test_readme_links_every_doc() -> None:
    """The README is the front door: every file of docs/ is reachable from it."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if not SCHEME.match(t)}
    assert [str(d.relative_to(ROOT)) for d in DOCS if d.resolve() not in linked] == []


def test_the_checker_sees_what_it_checks(tmp_path: Path) -> None:
    """Not vacuous: links are found, code is skipped, and a bad path or anchor is reported."""
    assert len(links(ROOT / "README.md")) >= 10
    assert {"tests", "two-commands"} <= anchors(ROOT / "README.md")
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Job slicing and limits\n\n## Router (d3_router)\n\n## Tests\n\n## Tests\n")
    page.write_text(
        "# Page\n\n[ok](other.md#job-slicing-and-limits) [ok](other.md#router-d3_router) [ok](other.md#tests-1)\n"
        "[self](#page) [web](https://example.com/x.md) `[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nope) ![img](nope.png) [self](#nope)\n")
    assert broken(page) == [
        "page.md: missing.md: no such file",
        "page.md: other.md#nope: no heading with the id 'nope' in other.md",
        "page.md: nope.png: no such file",
        "page.md: #nope: no heading with the id 'nope' in page.md",
    ]
