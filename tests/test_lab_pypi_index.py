"""The lab PyPI's index script (lab/roles/lab_pypi/files/lab_pypi_index.py, a LAB STAND-IN) on its inputs, without
PyPI: what it asks pip for (a fake pip on the command line, recording its arguments) and what it refuses before it
asks. Serving and hashes against real PyPI: tests/lab/test_lab_pypi.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import testkit

ROOT = Path(__file__).resolve().parents[1]
INDEX = testkit.load_file("lab_pypi_index_script", ROOT / "lab/roles/lab_pypi/files/lab_pypi_index.py")
PIN = "filelock==4.3.1 --hash=sha256:79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487\n"

# a fake pip: records its argv, writes one wheel where --dest says
FAKE_PIP = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open({log!r}, "a") as fh:
    fh.write(json.dumps(args) + "\\n")
dest = Path(args[args.index("--dest") + 1])
(dest / "filelock-4.3.1-py3-none-any.whl").write_bytes(b"PK")
"""


def argv(tmp_path: Path, pip: Path, requirements: Path) -> list[str]:
    return ["--pip", str(pip), "--cache", str(tmp_path / "cache"), "--root", str(tmp_path / "root"),
            "--python-version", "3.11", "--python-version", "3.13", "--platform", "manylinux2014_x86_64",
            "--requirement", str(requirements)]  # fmt: skip


@pytest.fixture
def fake_pip(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "pip.log"
    pip = tmp_path / "pip"
    pip.write_text(FAKE_PIP.format(python=sys.executable, log=str(log)))
    pip.chmod(0o755)
    return pip, log


def test_pip_downloads_the_pinned_file_in_hash_checking_mode_once_per_version(tmp_path: Path, fake_pip, monkeypatch) -> None:
    pip, log = fake_pip
    pins = tmp_path / "hub-requirements.txt"
    pins.write_text("# pinned\n" + PIN)
    monkeypatch.setattr(INDEX, "requires_python", lambda wheel: ">=3.10")  # the fake wheel is no zip
    assert INDEX.main(argv(tmp_path, pip, pins)) == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2
    for call, version in zip(calls, ("3.11", "3.13"), strict=True):
        assert call[0] == "download" and "--require-hashes" in call and "--only-binary=:all:" in call
        assert call[call.index("--python-version") + 1] == version and call[call.index("--abi") + 1] == "cp" + version.replace(".", "")
        assert call[-2:] == ["--requirement", str(pins)]
    assert INDEX.main(argv(tmp_path, pip, pins)) == 0
    assert len(log.read_text().splitlines()) == 2  # cached: pip not asked again
    pins.write_text(PIN)  # another file (here: its comment gone) is another cache
    assert INDEX.main(argv(tmp_path, pip, pins)) == 0
    assert len(log.read_text().splitlines()) == 4


def test_a_line_with_an_environment_marker_is_refused_before_pip_runs(tmp_path: Path, fake_pip) -> None:
    pip, log = fake_pip
    pins = tmp_path / "hub-requirements.txt"
    pins.write_text("# a comment; with a semicolon\n" + PIN.replace(" --hash", ' ; python_version == "3.13" --hash'))
    with pytest.raises(SystemExit) as refused:
        INDEX.main(argv(tmp_path, pip, pins))
    assert str(refused.value) == (f"{pins}: environment markers are not supported (pip would evaluate them for the "
                                  f'Python running it, not for --python-version): filelock==4.3.1 ; python_version == "3.13"')  # fmt: skip
    assert not log.exists()
