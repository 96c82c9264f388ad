#!/usr/bin/env python3
"""LAB STAND-IN for PyPI: a wheelhouse and a PEP 503 "simple" index for the lab hosts.

Lab hosts cannot reach PyPI (this machine's HTTPS egress goes through a TLS-intercepting proxy whose CA only
the machine trusts), so the lab downloads the wheels here and serves them next to the lab apt repository.

    lab_pypi_index.py --pip PIP --cache DIR --root DIR --python-version 3.11 [--python-version 3.13 ...]
                      --platform TAG [--platform TAG ...] --requirement FILE

- For every Python version, `PIP download --only-binary=:all: -r FILE` into CACHE/cp<ver>-<spec hash>/, unless that
  directory is already complete (marker `.complete`, written last). FILE is the fleet's hash-pinned requirements
  (roles/d3_weights/files/hub-requirements.txt: every dependency pinned with its sha256), so the stand-in serves the
  very files PyPI serves for those pins and nothing newer: a release made upstream since the pins were generated
  does not reach the lab (--require-hashes: pip refuses a line without a hash and any file the pins do not name).
  A line with an environment marker is refused: pip evaluates markers for the Python running it, not for
  --python-version (pip 23.2: a `; python_version == "3.13"` line would be ignored when downloading for 3.13), so
  such a file needs one filtered copy per version, which this script does not write.
- Hard-links (or copies) the union of those wheels to ROOT/files/ and writes ROOT/simple/index.html and
  ROOT/simple/<normalized-name>/index.html with `#sha256=` links and `data-requires-python`.
- Removes files and project pages under ROOT that no longer belong to the index (ROOT is owned by this script).
- Prints one JSON object: {"changed": bool, "downloaded": [...versions], "projects": {name: [wheel, ...]}}.
Standard library only.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MARKER = ".complete"


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def spec_hash(requirements: str, platforms: list[str]) -> str:
    """The cache key: the requirements file's text and the platform tags."""
    blob = json.dumps({"requirements": requirements, "platforms": sorted(platforms)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def download(pip: str, dest: Path, version: str, platforms: list[str], requirements: Path) -> bool:
    """Fill DEST with the wheels for one Python version; False when it was complete already."""
    if (dest / MARKER).is_file():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        abi = "cp" + version.replace(".", "")
        cmd = [pip, "download", "--quiet", "--disable-pip-version-check", "--dest", str(tmp), "--only-binary=:all:",
               "--require-hashes",
               "--implementation", "cp", "--python-version", version, "--abi", abi]
        for platform in platforms:
            cmd += ["--platform", platform]
        subprocess.run([*cmd, "--requirement", str(requirements)], check=True, stdout=sys.stderr)
        wheels = sorted(p.name for p in tmp.iterdir() if p.suffix == ".whl")
        if not wheels:
            raise SystemExit(f"pip download for Python {version} produced no wheel")
        (tmp / MARKER).write_text(json.dumps({"requirements": str(requirements), "platforms": platforms, "wheels": wheels},
                                             indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def requires_python(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            return ""
        headers = email.parser.BytesHeaderParser().parsebytes(zf.read(meta))
        return str(headers.get("Requires-Python", "") or "")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return True


def place(src: Path, dest: Path) -> bool:
    """Hard-link SRC to DEST (copy across file systems); False when DEST already holds the same bytes."""
    if dest.is_file() and (os.path.samefile(src, dest) or sha256(src) == sha256(dest)):
        return False
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        tmp.chmod(0o644)
    os.replace(tmp, dest)
    return True


def page(title: str, links: list[str]) -> str:
    body = "\n".join(f"    {link}<br/>" for link in links)
    return (f"<!DOCTYPE html>\n<!-- LAB STAND-IN for PyPI (d3-fleet lab): generated by lab_pypi_index.py -->\n"
            f"<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\"><title>{html.escape(title)}</title></head>\n"
            f"  <body>\n    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n")


def build_index(wheels: dict[str, Path], root: Path) -> tuple[bool, dict[str, list[str]]]:
    files, simple = root / "files", root / "simple"
    files.mkdir(parents=True, exist_ok=True)
    simple.mkdir(parents=True, exist_ok=True)
    changed = False
    projects: dict[str, list[str]] = {}
    for name, src in sorted(wheels.items()):
        changed |= place(src, files / name)
        projects.setdefault(normalize(name.split("-")[0]), []).append(name)
    for stale in files.iterdir():
        if stale.name not in wheels:
            stale.unlink()
            changed = True
    for project, names in projects.items():
        links = []
        for name in names:
            rp = requires_python(files / name)
            attr = f' data-requires-python="{html.escape(rp)}"' if rp else ""
            href = html.escape(f"../../files/{name}#sha256={sha256(files / name)}")
            links.append(f'<a href="{href}"{attr}>{html.escape(name)}</a>')
        changed |= write_if_changed(simple / project / "index.html", page(f"Links for {project}", links))
    root_links = [f'<a href="{html.escape(p)}/">{html.escape(p)}</a>' for p in sorted(projects)]
    changed |= write_if_changed(simple / "index.html", page("Simple index", root_links))
    for stale in simple.iterdir():
        if stale.is_dir() and stale.name not in projects:
            shutil.rmtree(stale)
            changed = True
    return changed, projects


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pip", required=True, help="pip executable used for `pip download`")
    ap.add_argument("--cache", type=Path, required=True, help="wheel cache (one sub-directory per Python version)")
    ap.add_argument("--root", type=Path, required=True, help="served directory: gets files/ and simple/")
    ap.add_argument("--python-version", action="append", required=True, dest="versions")
    ap.add_argument("--platform", action="append", required=True, dest="platforms")
    ap.add_argument("--requirement", type=Path, required=True, help="hash-pinned requirements file (pip -r)")
    args = ap.parse_args(argv)

    text = args.requirement.read_text()
    markers = [line for line in text.splitlines() if ";" in line.split("#", 1)[0]]
    if markers:
        raise SystemExit(f"{args.requirement}: environment markers are not supported (pip would evaluate them for the "
                         f"Python running it, not for --python-version): {markers[0].split('--hash')[0].strip()}")
    digest = spec_hash(text, args.platforms)
    downloaded: list[str] = []
    wheels: dict[str, Path] = {}
    for version in args.versions:
        dest = args.cache / f"cp{version.replace('.', '')}-{digest}"
        if download(args.pip, dest, version, args.platforms, args.requirement):
            downloaded.append(version)
        for wheel in sorted(dest.glob("*.whl")):
            wheels.setdefault(wheel.name, wheel)
    changed, projects = build_index(wheels, args.root)
    print(json.dumps({"changed": changed or bool(downloaded), "downloaded": downloaded, "projects": projects}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
