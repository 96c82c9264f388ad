"""Mutation testing (make mutation): mutmut on every Python file of the d3fleet.fleet collection: its filters, its
modules and their module_utils.

mutmut names a mutant after its file's path (``src.`` stripped) and activates it only in a function whose
``__module__`` is that name, so each file is staged under .venv/mutation/src/ at the path of the name the tests
import it by:

- the filters and modules flat (``import d3_planner``: tests/conftest.py puts plugins/filter on sys.path; ``import
  decision``);
- the module_utils at their package path, src/ansible_collections/d3fleet/fleet/plugins/module_utils/ (the filters,
  the modules and the tests import them as ``ansible_collections.d3fleet.fleet.plugins.module_utils.X``; mutmut puts
  src/ on sys.path, where that namespace package finds them).

A filter or module some code imports by its package path (``from ansible_collections.d3fleet.fleet.plugins.filter
import d3_bench``) gets the flat module itself: the stage's copy of tests/conftest.py gets an import hook that maps
those names to the flat modules (one module object, whose functions are the mutated ones). Files left out by --only
are importable, not mutated: filters and modules in lib/, module_utils in collections/ (both on the tests' path).

Each mutant runs only the unit tests that call the mutated function (mutmut's stats), under ``-m "not lab and not
playbook"``, among the test files that import a mutated file or a file of the collection that imports one. Then this
prints the score per file and every surviving mutant's diff, and exits 1 when a file scores below MIN_SCORE.

    python tools/mutation.py            # stage, run, report
    python tools/mutation.py --report   # report the last run again
    python tools/mutation.py --only d3_router,smoke   # only these files (stems), e.g. after changing them
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# inside .venv/: git, ruff, yamllint and ansible-lint already ignore it (the stage holds copies of tests/ and roles/)
STAGE = Path(os.environ.get("MUTATION_STAGE") or ROOT / ".venv" / "mutation")  # MUTATION_STAGE: runs side by side
COLLECTION = ROOT / "collections/ansible_collections/d3fleet/fleet/plugins"
MODULES = COLLECTION / "modules"
UTILS = COLLECTION / "module_utils"
UTILS_PATH = Path("ansible_collections/d3fleet/fleet/plugins/module_utils")  # where the module_utils are imported from
# the callbacks flat too (``import fleet``: tests/test_output_callback.py puts plugins/callback on sys.path)
ALL_SOURCES = (sorted((COLLECTION / "filter").glob("*.py")) + sorted(MODULES.glob("*.py")) + sorted(UTILS.glob("*.py"))
               + sorted((COLLECTION / "callback").glob("*.py")))
SOURCES = list(ALL_SOURCES)
MIN_SCORE = 90.0
KILLED = {"killed", "timeout", "caught by type check"}


def staged(path: Path) -> Path:
    """Where a source is staged under src/ (or lib/): the path of the module name it is imported by."""
    return UTILS_PATH / path.name if path.parent == UTILS else Path(path.name)


def importer(stems: set[str]) -> re.Pattern[str]:
    """Matches an import of one of these modules: flat (``import d3_planner``, ``from d3_inputs import``,
    ``import_module("decision")``) or by the collection's package path (``...plugins.module_utils.d3_http``,
    ``from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench``)."""
    names = "|".join(re.escape(s) for s in sorted(stems))
    return re.compile(
        rf"^\s*(?:from ({names}) import|import ({names})\b)|import_module\(\"({names})\"\)"
        rf"|d3fleet\.fleet\.plugins\.\w+(?:\.|\s+import\s+)({names})\b",
        re.M,
    )


def test_files() -> list[str]:
    """The unit test files that import a mutated file, or a file of the collection that imports one (a module_utils
    is reached through its filters and modules): the others test playbooks and roles."""
    stems = {p.stem for p in SOURCES}
    while True:  # the collection's files that import a mutated one, directly or not
        uses = importer(stems)
        more = {p.stem for p in ALL_SOURCES if p.stem not in stems and uses.search(p.read_text())}
        if not more:
            break
        stems |= more
    found = []
    for path in sorted(ROOT.glob("tests/test_*.py")) + sorted(ROOT.glob("tests/contracts/test_*.py")):
        if uses.search(path.read_text()):
            found.append(str(path.relative_to(ROOT)))
    return found


# appended to the stage's copy of tests/conftest.py: the package path of a filter or module is its flat module
ALIAS_HOOK = '''

# ---- added by tools/mutation.py (the stage only) -----------------------------------------------------------------
import importlib as _importlib
import sys as _sys
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util


class _FlatModules(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """ansible_collections.d3fleet.fleet.plugins.filter.X (or .modules.X) is the module X the tests import flat, the
    staged (mutated) copy: one module object, whatever name imports it."""

    PREFIXES = ("ansible_collections.d3fleet.fleet.plugins.filter.", "ansible_collections.d3fleet.fleet.plugins.modules.")

    def find_spec(self, name, path=None, target=None):
        if name.startswith(self.PREFIXES) and name.count(".") == 5:
            return _importlib_util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return _importlib.import_module(spec.name.rpartition(".")[2])

    def exec_module(self, module):
        pass


_sys.meta_path.insert(0, _FlatModules())
'''


# with ansible.cfg and molecule/ (tests/test_preload_callback.py checks both enable the preload callback)
FRONT_DOOR = ["README.md", "Makefile", "site.yml", "playbooks", "inventories", "examples", "ansible.cfg", "molecule"]


def stage(tests: list[str]) -> None:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    (STAGE / "lib").mkdir()
    # the package path's directories exist (namespace packages), empty but for the module_utils left out by --only:
    # the tests' own sys.path entries for plugins/filter and plugins/modules find nothing there and import the
    # staged src/ (mutated) or lib/ copies
    for kind in ("filter", "modules", "module_utils", "callback"):
        (STAGE / "collections" / UTILS_PATH.parent / kind).mkdir(parents=True)
    for path in SOURCES:
        (STAGE / "src" / staged(path)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, STAGE / "src" / staged(path))
    for path in ALL_SOURCES:  # with --only: the other sources, importable but not mutated
        if path not in SOURCES:
            shutil.copy2(path, STAGE / ("collections" if path.parent == UTILS else "lib") / staged(path))
    shutil.copytree(ROOT / "tests", STAGE / "tests", ignore=shutil.ignore_patterns("lab", "__pycache__"))
    with (STAGE / "tests/conftest.py").open("a") as conftest:
        conftest.write(ALIAS_HOOK)
    shutil.copytree(ROOT / "roles", STAGE / "roles")
    shutil.copytree(ROOT / "docs", STAGE / "docs")  # test_metrics checks the runbook has each alert's entry
    # tests/doccommands.py (test_readme_commands, selected with the planner) reads the front door's commands and
    # checks what they name against the tree: README.md, the example inventory and scripts, the playbooks, Makefile
    for name in FRONT_DOOR:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, STAGE / name)
    # tests/test_bench_review2.py loads tools/bench_compare.py by its path (testkit.load_file)
    shutil.copytree(ROOT / "tools", STAGE / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    # the lab's vLLM simulator: test_bench_simulator runs the bench against it; the lab HF mirror's config.json
    # builder: test_capacity_second_opinion compares the planner with the simulator on it
    shutil.copytree(ROOT / "lab/simulator", STAGE / "lab/simulator", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "lab/hf", STAGE / "lab/hf", ignore=shutil.ignore_patterns("__pycache__"))
    # what the lab looks like (lab/vars/lab.yml): test_capacity_review plans the lab inventory's shared GPUs
    shutil.copytree(ROOT / "lab/vars", STAGE / "lab/vars")
    # left out: a test of a selected file that reads the whole repository (the stage holds only what the tests of
    # the mutated files read) and imports no mutated module, so no mutant can change its outcome
    deselect = ["--deselect", "tests/test_readme_commands.py::test_every_variable_the_docs_name_is_in_the_code"]
    args = ", ".join(json.dumps(a) for a in ["-m", "not lab and not playbook", "-p", "no:cacheprovider", "-W", "ignore",
                                             *deselect])
    (STAGE / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f'also_copy = {json.dumps(["roles", "lib", "collections", "lab", "docs", "tools", *FRONT_DOOR])}\n'
        f"pytest_add_cli_args = [{args}]\n"
        f"pytest_add_cli_args_test_selection = [{', '.join(json.dumps(t) for t in tests)}]\n"
        "use_git_change_detection = false\n"
        "\n[tool.pytest.ini_options]\n"
        'markers = ["lab: needs the lab", "playbook: runs ansible-playbook"]\n'
        'pythonpath = ["lib", "collections"]\n'
    )


def run() -> float:
    tests = test_files()
    stage(tests)
    print(f"mutation: {len(SOURCES)} files, tests: {' '.join(tests)}", flush=True)
    start = time.monotonic()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    mutmut = Path(sys.executable).parent / "mutmut"
    cpus = str(os.cpu_count() or 2)
    done = subprocess.run([str(mutmut), "run", "--max-children", cpus], cwd=STAGE, env=env, check=False,
                          stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        sys.exit(f"mutmut run failed ({done.returncode}); run it in {STAGE} to see why")
    return time.monotonic() - start


def function_sources(path: Path) -> dict[str, list[str]]:
    """Each (mutated or original) function's lines, without its def line, in mutmut's mutated file."""
    lines = path.read_text().splitlines()
    found = {}
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            found[node.name] = lines[node.body[0].lineno - 1 : node.end_lineno]
    return found


def report(elapsed: float | None) -> int:
    from mutmut.stats import status_by_exit_code

    rows = []
    survivors: list[tuple[str, str]] = []
    for path in SOURCES:
        meta = STAGE / "mutants/src" / staged(path).with_suffix(".py.meta")
        if not meta.is_file():
            sys.exit(f"no mutmut results for {path.name}: run make mutation")
        status = {k: status_by_exit_code[c] for k, c in json.loads(meta.read_text())["exit_code_by_key"].items()}
        killed = sum(1 for s in status.values() if s in KILLED)
        alive = sorted((k, s) for k, s in status.items() if s not in KILLED and s != "skipped")
        survivors += alive
        score = 100.0 * killed / (killed + len(alive)) if killed + len(alive) else 100.0
        rows.append((str(path.relative_to(ROOT)), len(status), killed, len(alive), score))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'file'.ljust(width)}  mutants  killed  not killed  score")
    for name, total, killed, alive, score in rows:
        print(f"{name.ljust(width)}  {total:7}  {killed:6}  {alive:10}  {score:5.1f}%")
    if elapsed is not None:
        print(f"\nmutmut run took {elapsed / 60:.1f} min on {os.cpu_count()} cores")
    print(f"\nmutants not killed ({len(survivors)}):")
    functions: dict[str, dict[str, list[str]]] = {}
    for name, state in survivors:
        module, _, mutant = name.rpartition(".")  # module (dotted for a module_utils) . mangled function name
        if module not in functions:
            functions[module] = function_sources(STAGE / "mutants/src" / (module.replace(".", "/") + ".py"))
        orig = functions[module].get(mutant.partition("__mutmut_")[0] + "__mutmut_orig", [])
        changed = difflib.unified_diff(orig, functions[module].get(mutant, []), lineterm="", n=0)
        print(f"  {name} ({state})")
        for line in changed:
            if line[:1] in "+-" and not line.startswith(("+++", "---")):
                print(f"      {line[0]} {line[1:].strip()[:150]}")
    low = [r[0] for r in rows if r[4] < MIN_SCORE]
    if low:
        print(f"\nbelow {MIN_SCORE:.0f}%: {', '.join(low)}")
        return 1
    return 0


def main() -> int:
    global SOURCES
    args = sys.argv[1:]
    if "--only" in args:
        wanted = set(args[args.index("--only") + 1].split(","))
        unknown = wanted - {p.stem for p in SOURCES}
        if unknown:
            sys.exit(f"--only: no source named {', '.join(sorted(unknown))} (known: {', '.join(p.stem for p in SOURCES)})")
        SOURCES = [p for p in SOURCES if p.stem in wanted]
    if "--report" in args:
        return report(None)
    return report(run())


if __name__ == "__main__":
    sys.exit(main())
