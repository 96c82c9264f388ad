"""The lab hosts' AnsiballZ bytecode cache (lab/roles/lab_hosts/files/d3_lab_ansiballz_cache.py, a LAB SPEED AID)
against CPython's own zipimporter: the same file names, the same code, no stale code, and CPython's path whenever the
cache cannot be used safely."""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import traceback
import types
import zipfile
import zipimport
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[1] / "lab" / "roles" / "lab_hosts" / "files" / "d3_lab_ansiballz_cache.py"

MOD_SRC = b"file_seen = __file__\n\ndef boom():\n    def inner():\n        raise ValueError('from inner')\n    inner()\n"
PKG_SRC = b"NAME = 'pkg'\n"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("d3_lab_ansiballz_cache_under_test", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as on a lab host (this machine's CI sets -B)
    for name in ("pkg", "pkg.mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return module


def payload(tmp_path: Path, run: str, mod_src: bytes = MOD_SRC, extra: dict[str, bytes] | None = None) -> Path:
    """An AnsiballZ-like payload zip in its own temporary directory, as Ansible writes one per module call."""
    d = tmp_path / f"ansible_stat_payload_{run}"
    d.mkdir()
    z = d / "ansible_stat_payload.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("pkg/__init__.py", PKG_SRC)
        zf.writestr("pkg/mod.py", mod_src)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return z


def load(importer, fullname: str):
    spec = importer.find_spec(fullname)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def filenames(code) -> set[str]:
    out = {code.co_filename}
    for const in code.co_consts:
        if isinstance(const, type(code)):
            out |= filenames(const)
    return out


def entries(home: Path) -> list[Path]:
    return sorted((home / ".cache" / "d3-lab-ansiballz").rglob("*.code"))


TAG = f"{sys.implementation.cache_tag}.opt-{sys.flags.optimize}"


@pytest.fixture
def compiles(cache, monkeypatch) -> list[str]:
    """The file names compiled from here on, by the hook or by CPython's zipimport."""
    seen: list[str] = []
    real_compile, real_zip_compile = compile, zipimport._compile_source

    def hook_compile(source, filename, *args, **kwargs):
        seen.append(filename)
        return real_compile(source, filename, *args, **kwargs)

    def zip_compile(pathname, source):
        seen.append(pathname)
        return real_zip_compile(pathname, source)

    monkeypatch.setattr(cache, "compile", hook_compile, raising=False)
    monkeypatch.setattr(zipimport, "_compile_source", zip_compile)
    return seen


def test_same_file_names_and_code_as_cpython_and_a_second_payload_is_served_from_the_cache(cache, tmp_path, compiles):
    first = payload(tmp_path, "a")
    ours = cache.path_hook(f"{first}/pkg")
    theirs = zipimport.zipimporter(f"{first}/pkg")
    assert isinstance(ours, cache.CachingZipImporter)
    assert ours.get_filename("pkg.mod") == theirs.get_filename("pkg.mod") == f"{first}/pkg/mod.py"
    code = ours.get_code("pkg.mod")
    assert code == theirs.get_code("pkg.mod")
    assert filenames(code) == {f"{first}/pkg/mod.py"}
    pkg = load(cache.path_hook(str(first)), "pkg")
    assert pkg.__file__ == f"{first}/pkg/__init__.py" and pkg.NAME == "pkg"
    assert [p.name for p in entries(Path(os.environ["HOME"]))] == ["pkg%__init__.py.code", "pkg%mod.py.code"]
    assert {oct(p.stat().st_mode & 0o777) for p in entries(Path(os.environ["HOME"]))} == {"0o600"}

    # the next module call's payload: another directory, the same source; nothing is compiled again, by the hook or
    # by zipimport
    second = payload(tmp_path, "b")
    compiles.clear()
    mod = load(cache.path_hook(f"{second}/pkg"), "pkg.mod")
    assert compiles == []
    assert mod.file_seen == f"{second}/pkg/mod.py"
    with pytest.raises(ValueError) as raised:
        mod.boom()
    frames = traceback.extract_tb(raised.value.__traceback__)
    assert [f.filename for f in frames[-2:]] == [f"{second}/pkg/mod.py"] * 2
    assert frames[-1].name == "inner" and frames[-1].lineno == 5


def test_changed_source_at_the_same_path_is_compiled_again_never_served_stale(cache, tmp_path):
    load(cache.path_hook(f"{payload(tmp_path, 'a')}/pkg"), "pkg.mod")
    changed = MOD_SRC.replace(b"from inner", b"changed") + b"VERSION = 2\n"
    mod = load(cache.path_hook(f"{payload(tmp_path, 'b', changed)}/pkg"), "pkg.mod")
    assert mod.VERSION == 2
    with pytest.raises(ValueError, match="changed"):
        mod.boom()
    # and the entry now holds the new source: the old one compiles again too
    old = load(cache.path_hook(f"{payload(tmp_path, 'c')}/pkg"), "pkg.mod")
    assert not hasattr(old, "VERSION")


def test_a_corrupt_cache_entry_is_compiled_again_and_replaced(cache, tmp_path):
    load(cache.path_hook(f"{payload(tmp_path, 'a')}/pkg"), "pkg.mod")
    entry = next(p for p in entries(Path(os.environ["HOME"])) if p.name == "pkg%mod.py.code")
    entry.write_bytes(b"not marshal data")
    mod = load(cache.path_hook(f"{payload(tmp_path, 'b')}/pkg"), "pkg.mod")
    assert mod.file_seen.endswith("ansible_stat_payload_b/ansible_stat_payload.zip/pkg/mod.py")
    assert entry.read_bytes() != b"not marshal data"


def test_other_paths_are_left_to_cpython(cache, tmp_path):
    plain = tmp_path / "other.zip"
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("pkg/__init__.py", PKG_SRC)
    with pytest.raises(ImportError):
        cache.path_hook(str(plain))
    with pytest.raises(ImportError):
        cache.path_hook(str(tmp_path))


def test_bytecode_in_the_zip_or_an_unsafe_cache_directory_falls_back_to_cpython(cache, tmp_path, monkeypatch):
    # zipimport prefers a .pyc beside the source: the cache leaves that module to CPython
    with_pyc = payload(tmp_path, "a", extra={"pkg/mod.pyc": b"\0" * 16})
    ours = cache.path_hook(f"{with_pyc}/pkg")
    assert ours.get_filename("pkg.mod") == zipimport.zipimporter(f"{with_pyc}/pkg").get_filename("pkg.mod")
    assert ours.get_code("pkg.mod") == zipimport.zipimporter(f"{with_pyc}/pkg").get_code("pkg.mod")
    assert entries(Path(os.environ["HOME"])) == []

    # a cache directory others can write is not used (its code would run as this user)
    home = Path(os.environ["HOME"])
    (home / ".cache" / "d3-lab-ansiballz").mkdir(parents=True)
    (home / ".cache" / "d3-lab-ansiballz").chmod(0o777)
    assert cache._cache_dir() is None
    mod = load(cache.path_hook(f"{payload(tmp_path, 'b')}/pkg"), "pkg.mod")
    assert mod.file_seen.endswith("ansible_stat_payload_b/ansible_stat_payload.zip/pkg/mod.py")
    assert entries(home) == []

    # nor one that is a symbolic link, nor one another user owns
    (home / ".cache" / "d3-lab-ansiballz").chmod(0o700)
    tag_dir = home / ".cache" / "d3-lab-ansiballz" / TAG
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    tag_dir.rmdir()  # created by the call above, which then refused it
    tag_dir.symlink_to(elsewhere)
    assert cache._cache_dir() is None
    tag_dir.unlink()
    tag_dir.write_bytes(b"")  # a file of ours, 0600: not a directory
    tag_dir.chmod(0o600)
    assert cache._cache_dir() is None
    tag_dir.unlink()
    assert cache._cache_dir() == str(tag_dir)
    tag_dir.chmod(0o770)  # group-writable
    assert cache._cache_dir() is None
    tag_dir.chmod(0o700)
    other_uid = os.getuid() + 1
    monkeypatch.setattr(cache.os, "getuid", lambda: other_uid)
    assert cache._cache_dir() is None


def test_each_cache_directory_is_0700_whatever_the_umask(cache, tmp_path):
    old = os.umask(0o002)  # user private groups (pam_umask): makedirs would give the parent 0775, then refuse it
    try:
        assert cache._cache_dir() is not None
    finally:
        os.umask(old)
    home = Path(os.environ["HOME"])
    assert oct((home / ".cache" / "d3-lab-ansiballz").stat().st_mode & 0o777) == "0o700"
    assert oct((home / ".cache" / "d3-lab-ansiballz" / TAG).stat().st_mode & 0o777) == "0o700"


def test_install_puts_the_hook_first_once(cache, monkeypatch):
    monkeypatch.setattr(sys, "path_hooks", list(sys.path_hooks))
    cache.install()
    cache.install()
    assert sys.path_hooks[0] is cache.path_hook
    assert sys.path_hooks.count(cache.path_hook) == 1


def test_an_entry_of_another_optimisation_level_or_interpreter_or_owner_is_not_used(cache, tmp_path, monkeypatch, compiles):
    home = Path(os.environ["HOME"])
    load(cache.path_hook(f"{payload(tmp_path, 'a')}/pkg"), "pkg.mod")
    assert [p.parent.name for p in entries(home)] == [TAG]

    # -O: its own directory (code compiled without -O keeps its asserts)
    optimised = types.SimpleNamespace(flags=types.SimpleNamespace(optimize=sys.flags.optimize + 1),
                                      implementation=sys.implementation, dont_write_bytecode=False)  # fmt: skip
    monkeypatch.setattr(cache, "sys", optimised)
    compiles.clear()
    load(cache.path_hook(f"{payload(tmp_path, 'b')}/pkg"), "pkg.mod")
    assert compiles and compiles[-1].endswith("ansible_stat_payload_b/ansible_stat_payload.zip/pkg/mod.py")
    assert {p.parent.name for p in entries(home)} == {TAG, f"{sys.implementation.cache_tag}.opt-{sys.flags.optimize + 1}"}
    monkeypatch.setattr(cache, "sys", sys)

    # another bytecode magic number (another interpreter with the same cache tag): compiled again, entry replaced
    entry = home / ".cache" / "d3-lab-ansiballz" / TAG / "pkg%mod.py.code"
    _, source, code = marshal.loads(entry.read_bytes())
    entry.write_bytes(marshal.dumps((b"\0\0\r\n", source, code)))
    compiles.clear()
    load(cache.path_hook(f"{payload(tmp_path, 'c')}/pkg"), "pkg.mod")
    assert len(compiles) == 1
    assert marshal.loads(entry.read_bytes())[0] == cache._MAGIC

    # an entry another user owns (checked on the opened file): not used
    real_fstat = os.fstat
    other_uid = os.getuid() + 1

    def fstat(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, other_uid, *tuple(st)[5:]))

    monkeypatch.setattr(cache.os, "fstat", fstat)
    compiles.clear()
    load(cache.path_hook(f"{payload(tmp_path, 'd')}/pkg"), "pkg.mod")
    assert len(compiles) == 1


def test_no_error_in_the_cache_fails_an_import_and_with_dont_write_bytecode_nothing_is_written(cache, tmp_path, monkeypatch):
    home = Path(os.environ["HOME"])
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    mod = load(cache.path_hook(f"{payload(tmp_path, 'a')}/pkg"), "pkg.mod")
    assert mod.file_seen.endswith("ansible_stat_payload_a/ansible_stat_payload.zip/pkg/mod.py")
    assert entries(home) == []
    monkeypatch.setattr(sys, "dont_write_bytecode", False)

    # an error the cache did not foresee (e.g. a file name the file system's encoding cannot hold): CPython's path
    def broken_open(*args, **kwargs):
        raise UnicodeEncodeError("ascii", "\xe9", 0, 1, "ordinal not in range(128)")

    monkeypatch.setattr(cache.os, "open", broken_open)
    mod = load(cache.path_hook(f"{payload(tmp_path, 'b')}/pkg"), "pkg.mod")
    assert mod.file_seen.endswith("ansible_stat_payload_b/ansible_stat_payload.zip/pkg/mod.py")
    assert entries(home) == []
    def broken_read(*args):
        raise RuntimeError("anything")

    monkeypatch.setattr(cache, "_read", broken_read)
    mod = load(cache.path_hook(f"{payload(tmp_path, 'c')}/pkg"), "pkg.mod")
    assert mod.file_seen.endswith("ansible_stat_payload_c/ansible_stat_payload.zip/pkg/mod.py")
