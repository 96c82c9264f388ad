"""LAB SPEED AID (lab hosts only, never a fleet host): a bytecode cache for the module payloads Ansible runs.

Every module call runs AnsiballZ: Python imports the module and ``ansible.module_utils`` from a zip Ansible writes
to a new temporary directory (``.../ansible_<module>_payload.zip``). Python's zipimport keeps no bytecode cache, and
CPython's ``zipimporter`` compiles each module twice: ``find_spec`` asks ``get_filename``, which compiles the module
to learn its path (``Lib/zipimport.py``, ``_get_module_code``), then ``exec_module`` compiles it again in
``get_code``. With ansible-core 2.19 that is most of the CPU a module call costs on a lab host (about 0.35 s; the
lab suite makes thousands). This path hook serves those payload zips with a ``zipimporter`` that

- answers ``get_filename`` without compiling (the same path CPython gives: ``<archive>/<path in the zip>``), and
- keeps the compiled code per user under ``~/.cache/d3-lab-ansiballz/<cache tag>.opt-<-O level>/``, keyed by the
  file's path in the zip and checked against the interpreter's bytecode magic number and the whole source text it
  was compiled from: only byte-identical source compiled by this interpreter at this -O level reuses code, and the
  code's file names are set to this payload's path (tracebacks name the zip the module really ran from).

Anything it cannot do exactly (no source in the zip, bytecode beside it, an unsafe cache directory or entry, a cache
file it cannot read or write, any error at all in the cache) falls back to CPython's own ``zipimporter``; with -B
(PYTHONDONTWRITEBYTECODE) it writes nothing. Other paths, other imports and the module's behaviour are CPython's.
Two differences remain: the loader's class, and a module with a syntax error fails at exec_module instead of
find_spec (an import statement raises the same SyntaxError either way). The lab's provisioning installs it (a
``.pth`` line that calls install()), so the roles and the lab inventory do not know it exists;
``tests/test_lab_ansiballz_cache.py`` checks it against CPython's ``zipimporter``.
"""

from __future__ import annotations

import _frozen_importlib_external  # already loaded by every CPython: its MAGIC_NUMBER, without importing importlib
import marshal
import os
import sys
import zipimport

_PAYLOAD = "_payload.zip"
_CODE = type(compile("", "", "exec"))
_MAGIC = _frozen_importlib_external.MAGIC_NUMBER


def _safe(st: os.stat_result) -> bool:
    """This user's, and nobody else may write it (lstat of a symbolic link: mode 0777, refused)."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _cache_dir() -> str | None:
    """This user's cache directory, created 0700; None unless it and its parent are directories this user owns that
    nobody else can write (the code in them runs as this user)."""
    home = os.path.expanduser("~")
    if not home.startswith("/"):
        return None
    parent = os.path.join(home, ".cache", "d3-lab-ansiballz")
    path = os.path.join(parent, f"{sys.implementation.cache_tag or 'none'}.opt-{sys.flags.optimize}")
    try:
        # each level 0700 itself (makedirs gives intermediate directories the umask's mode)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        os.makedirs(path, mode=0o700, exist_ok=True)
        if not all(_safe(os.lstat(part)) for part in (parent, path)):
            return None
    except OSError:
        return None
    return path


def _with_filename(code, filename: str):
    """The code object and every code object nested in it, with co_filename set to filename."""
    consts = tuple(_with_filename(c, filename) if isinstance(c, _CODE) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _read(entry: str, source: bytes):
    """The cached code of this exact source, or None. The entry is checked on the opened file (not by its path: a
    directory swapped after _cache_dir() cannot hand over another user's file)."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if not _safe(os.fstat(fd)):
                return None
            magic, cached_source, code = marshal.load(f)
    except Exception:  # missing, unreadable, not marshal data, not a 3-tuple: compiled (and written) again
        return None
    return code if magic == _MAGIC and cached_source == source and isinstance(code, _CODE) else None


def _write(entry: str, source: bytes, code) -> bool:
    """Write the entry atomically (a new file, then rename); False when it could not (the next call compiles)."""
    tmp = f"{entry}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            marshal.dump((_MAGIC, source, code), f)
        os.replace(tmp, entry)
    except Exception:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        return False
    return True


class CachingZipImporter(zipimport.zipimporter):
    """CPython's zipimporter, with get_filename that does not compile and get_code served from the cache."""

    def _toc(self) -> dict:
        """The zip's table of contents (zipimport's private API: the _files dict up to Python 3.12, _get_files()
        from 3.13)."""
        get_files = getattr(self, "_get_files", None)
        return get_files() if get_files is not None else self._files

    def _source_path(self, fullname: str) -> str | None:
        """The module's source file inside the zip (as zipimport names it), or None when CPython would not compile
        it from source: no source in the zip, or bytecode beside it (zipimport tries .pyc first)."""
        inner = self.prefix + fullname.rpartition(".")[2]
        inner += "/__init__.py" if self.is_package(fullname) else ".py"
        toc = self._toc()
        return inner if inner in toc and inner + "c" not in toc else None

    def get_filename(self, fullname):
        inner = self._source_path(fullname)
        if inner is None:
            return super().get_filename(fullname)
        return self._toc()[inner][0]

    def get_code(self, fullname):
        try:
            code = self._cached_code(fullname)
        except Exception:  # whatever goes wrong in the cache, CPython's own path decides (and raises what it raises)
            code = None
        return code if code is not None else super().get_code(fullname)

    def _cached_code(self, fullname: str):
        """The module's code through the cache, or None to leave it to CPython."""
        inner = self._source_path(fullname)
        cache = _cache_dir() if inner is not None else None
        if cache is None:
            return None
        filename = self._toc()[inner][0]
        source = self.get_data(inner)
        entry = os.path.join(cache, inner.replace("/", "%") + ".code")
        code = _read(entry, source)
        if code is not None:
            return _with_filename(code, filename)
        # what zipimport's _compile_source does
        code = compile(source.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), filename, "exec", dont_inherit=True)
        if not sys.dont_write_bytecode:
            _write(entry, source, code)
        return code


def path_hook(path: str) -> CachingZipImporter:
    """A sys.path_hooks entry: the caching importer for an AnsiballZ payload zip (or a directory in it)."""
    if not (path.endswith(_PAYLOAD) or _PAYLOAD + "/" in path):
        raise ImportError("not an AnsiballZ payload")
    return CachingZipImporter(path)


def install() -> None:
    """Put path_hook first in sys.path_hooks, once."""
    if path_hook not in sys.path_hooks:
        sys.path_hooks.insert(0, path_hook)
