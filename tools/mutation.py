"""Mutation testing (make mutation): mutmut on the d3fleet.fleet collection's filters's modules.

The unit tests import the filters as top-level modules (``import d3_planner``, tests/conftest.py puts
the collection's plugins/filter on sys.path) and the module as ``import decision``; mutmut names a mutant after the file's path,
so the sources are staged flat under .venv/mutation/src/ (mutmut strips ``src.``), next to a copy of tests/ and
roles/. Each mutant runs only the unit tests that call the mutated function (mutmut's stats), under
``-m "not lab"``. Then this prints the score per file and every surviving mutant's diff, and exits 1 when a
file scores below MIN_SCORE.

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
ALL_SOURCES = sorted((COLLECTION / "filter").glob("*.py")) + sorted(MODULES.glob("*.py"))
SOURCES = list(ALL_SOURCES)
MIN_SCORE = 90.0
KILLED = {"killed", "timeout", "caught by type check"}


def test_files() -> list[str]:
    """The unit test files that import one of the mutated modules (the others test playbooks and roles)."""
    names = "|".join(re.escape(p.stem) for p in SOURCES)
    uses = re.compile(rf"^\s*(?:from ({names}) import|import ({names})\b)|import_module\(\"({names})\"\)", re.M)
    found = []
    for path in sorted(ROOT.glob("tests/test_*.py")) + sorted(ROOT.glob("tests/contracts/test_*.py")):
        if uses.search(path.read_text()):
            found.append(str(path.relative_to(ROOT)))
    return found


def stage(tests: list[str]) -> None:
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    (STAGE / "lib").mkdir()
    for path in SOURCES:
        shutil.copy2(path, STAGE / "src" / path.name)
    for path in ALL_SOURCES:  # with --only: the other sources, importable but not mutated
        if path not in SOURCES:
            shutil.copy2(path, STAGE / "lib" / path.name)
    shutil.copytree(ROOT / "tests", STAGE / "tests", ignore=shutil.ignore_patterns("lab", "__pycache__"))
    shutil.copytree(ROOT / "roles", STAGE / "roles")
    # the modules' module_utils, where the tests find them (ROOT/collections on sys.path); only module_utils, so the
    # tests' own sys.path entries for the filters and modules find nothing there and import the (mutated) src/ copies
    utils = "collections/ansible_collections/d3fleet/fleet/plugins/module_utils"
    shutil.copytree(ROOT / utils, STAGE / utils, ignore=shutil.ignore_patterns("__pycache__"))
    args = ", ".join(json.dumps(a) for a in ["-m", "not lab and not playbook", "-p", "no:cacheprovider", "-W", "ignore"])
    (STAGE / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        'also_copy = ["roles", "lib", "collections"]\n'
        f"pytest_add_cli_args = [{args}]\n"
        f"pytest_add_cli_args_test_selection = [{', '.join(json.dumps(t) for t in tests)}]\n"
        "use_git_change_detection = false\n"
        "\n[tool.pytest.ini_options]\n"
        'markers = ["lab: needs the lab", "playbook: runs ansible-playbook"]\n'
        'pythonpath = ["lib"]\n'
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
        meta = STAGE / "mutants/src" / (path.name + ".meta")
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
        module, _, mutant = name.partition(".")
        if module not in functions:
            functions[module] = function_sources(STAGE / "mutants/src" / f"{module}.py")
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
