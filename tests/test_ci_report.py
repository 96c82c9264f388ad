"""tools/ci_report.py: the part times and the slowest tests `.ci/run` prints at the end of every run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import ci_report

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.lab.test_a" name="test_slow" time="120.5"/>
<testcase classname="tests.lab.test_a" name="test_fast" time="0.2"/>
<testcase classname="tests.lab.test_b" name="test_mid[x]" time="30"/>
</testsuite></testsuites>"""


def test_parts_and_the_slowest_tests_across_runs(tmp_path: Path) -> None:
    (tmp_path / "timing.tsv").write_text("lint\t65\t0\nlab\t250\t0\nunit\t131\t0\nlab-tests\t901\t2\n")
    (tmp_path / "junit-lab-tests.xml").write_text(JUNIT)
    (tmp_path / "junit-unit.xml").write_text(JUNIT.replace("tests.lab", "tests").replace("120.5", "45"))
    text = ci_report.report(tmp_path, 3)
    assert "lint         1:05  ok" in text
    assert "lab-tests   15:01  FAILED (exit 2)" in text
    lines = text.split("== the 3 slowest tests ==\n")[1].splitlines()
    assert lines == [
        "  120.5 s  lab-tests tests.lab.test_a::test_slow",
        "   45.0 s  unit      tests.test_a::test_slow",
        "   30.0 s  lab-tests tests.lab.test_b::test_mid[x]",
    ]


def test_a_run_that_did_not_start_says_so(tmp_path: Path) -> None:
    assert "make test did not start" in ci_report.report(tmp_path, 25)
    assert "slowest" not in ci_report.report(tmp_path, 25)


def test_the_lab_figures_follow_the_slowest_tests(tmp_path: Path) -> None:
    assert "lab's figures" not in ci_report.report(tmp_path, 25)
    (tmp_path / "lab-figures.jsonl").write_text(
        '{"drill": 8, "name": "controller killed", "figure": "moved after 3.7 s", "lab_s": 250}\n\n'
        '{"drill": "pair", "name": "failover", "figure": "0 late"}\n'
    )
    text = ci_report.report(tmp_path, 25)
    assert text.split("== the lab's figures (lab-figures.jsonl: drills, failover) ==\n")[1].splitlines() == [
        "  8 controller killed: moved after 3.7 s (250 s)",
        "pair failover: 0 late (? s)",
    ]
