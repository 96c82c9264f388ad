"""tools/demo_timing.py: the parts of a timed `make demo` (tools/demo_timing.sh), cold and warm side by side."""

from __future__ import annotations

import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import demo_timing

# what make demo prints (make -j2 venv lab-images: pip and the image build interleaved), each line with its time
COLD = """# date: 2026-12-02 14:00:00 UTC
# machine: box: 2 cores
# load before: 0.10 0.20 0.30 (1, 5, 15 min)
0.0\tmake -j2 venv lab-images
0.1\ttest -x .venv/bin/python || python3 -m venv .venv
2.0\t.venv/bin/pip install -q --disable-pip-version-check \\
2.0\t  $(grep -E -i '^(ansible-core|Jinja2|PyYAML)==' requirements.txt)
12.0\ttouch .venv/.installed-core
12.1\t.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
12.2\tansible-playbook lab/lab.yml --tags images
13.0\tPLAY Bring up the lab services and host images on this machine
20.0\t  localhost  lab_base          changed 4      7 tasks     7.0 s
50.0\t  localhost  lab_simulator     changed 2      7 tasks    30.0 s
55.0\ttouch .venv/.installed
70.0\t  localhost  lab_hosts         changed 5     14 tasks    20.0 s
71.0\t  localhost  play tasks        ok             5 tasks    58.0 s
71.5\tRECAP
71.6\t  localhost       ok=88  changed=33  unreachable=0  failures=0  skipped=9  rescued=0  ignored=0
72.0\tmake lab LAB_HOSTS=2
72.1\tansible-playbook lab/lab.yml -e lab_hosts_count=2
73.0\tPLAY Bring up the lab services and host images on this machine
80.0\t  localhost  lab_base          ok             7 tasks     7.0 s
90.0\tPLAY Provision the lab hosts (inside the containers)
120.0\t  d3-lab-host1    lab_hosts         changed 10    19 tasks    30.0 s
121.0\t  d3-lab-host2    lab_hosts         changed 10    19 tasks    31.0 s
121.5\tRECAP
121.6\t  d3-lab-host1    ok=19  changed=10  unreachable=0  failures=0  skipped=2  rescued=0  ignored=0
121.7\t  d3-lab-host2    ok=19  changed=10  unreachable=0  failures=0  skipped=2  rescued=0  ignored=0
121.8\tmake[1]: Leaving directory '/x'
122.0\tansible-playbook site.yml -i inventories/lab -l 'l4-nodes:d3-routers'
123.0\tPLAY Converge D3 decision models on L4 hosts
130.0\t  d3-lab-host1  d3_preflight      ok            11 tasks     7.0 s
130.0\t  d3-lab-host2  d3_preflight      ok            11 tasks     6.5 s
131.0\t  d3-lab-host1  d3                ok             4 tasks     1.0 s
131.0\t  d3-lab-host2  d3                ok             4 tasks     1.0 s
140.0\t  d3-lab-host1  d3_preflight      ok            29 tasks     9.0 s
140.0\t  d3-lab-host2  d3_preflight      ok            29 tasks     9.5 s
200.0\t  d3-lab-host1  nvidia_toolkit    FAILED        29 tasks    60.0 s
201.0\tPLAY Route each D3 model to its replicas (HAProxy)
230.0\t  d3-lab-router1  d3_router         changed 9     25 tasks    29.0 s
230.5\tRECAP
230.6\t  d3-lab-host1    ok=181  changed=30  unreachable=0  failures=0  skipped=69  rescued=0  ignored=0
231.0\t
231.1\tNext (examples/demo-next-steps.sh; `. .venv/bin/activate` first):
231.2\tansible-playbook playbooks/status.yml -i inventories/lab
# load after: 1.00 2.00 3.00 (1, 5, 15 min)
231.5\t# end rc=0
"""

WARM = """# date: 2026-12-02 15:00:00 UTC
0.0\tmake -j2 venv lab-images
0.5\tansible-playbook lab/lab.yml --tags images
1.0\tPLAY Bring up the lab services and host images on this machine
5.0\t  localhost  lab_base          ok             7 tasks     4.0 s
9.0\tRECAP
9.1\t  localhost       ok=40  changed=0  unreachable=0  failures=0  skipped=9  rescued=0  ignored=0
10.0\tansible-playbook site.yml -i inventories/lab -l 'l4-nodes:d3-routers'
11.0\tPLAY Converge D3 decision models on L4 hosts
20.0\t  d3-lab-host1  d3_preflight      ok            11 tasks     9.0 s
25.0\t  d3-lab-host1  d3_monitor_only   ok             1 task      5.0 s
26.0\tRECAP
26.1\t  d3-lab-host1    ok=181  changed=30  unreachable=0  failures=0  skipped=69  rescued=0  ignored=0
30.0\t# end rc=2
"""


def test_parts_runs_and_steps() -> None:
    t = demo_timing.parse(COLD.splitlines())
    assert t.header["date"] == "2026-12-02 14:00:00 UTC"
    assert t.header["load after"].startswith("1.00 2.00 3.00")
    assert t.parts == [("venv: ansible-core (pip)", 2.0, 12.0), ("venv: requirements.txt (pip)", 12.1, 55.0)]
    assert [(r.label, r.start, r.end, r.plays) for r in t.runs] == [
        ("lab images (make lab-images)", 12.2, 71.6, 1),
        ("lab (make lab)", 72.1, 121.7, 2),
        ("converge (site.yml)", 122.0, 230.6, 2),
    ]  # the status.yml line of the next steps is no run: it printed no PLAY line
    images, lab, converge = t.runs
    # the play's own tasks ("play tasks") are no part; lines arriving while pip runs are counted all the same
    assert [(s.play, s.name, s.secs) for s in images.steps] == [
        (1, "lab_base", 7.0), (1, "lab_simulator", 30.0), (1, "lab_hosts", 20.0)]
    # a step's figure is its slowest host's
    assert [(s.play, s.name, s.secs) for s in lab.steps] == [(1, "lab_base", 7.0), (2, "lab_hosts", 31.0)]
    # a step named again later in the play is a step of its own; a failed step still counts
    assert [(s.play, s.name, s.secs) for s in converge.steps] == [
        (1, "d3_preflight", 7.0), (1, "d3", 1.0), (1, "d3_preflight", 9.5), (1, "nvidia_toolkit", 60.0),
        (2, "d3_router", 29.0)]
    assert (t.total, t.rc) == (231.5, 0)


def test_rows_keys_tell_repeated_steps_apart() -> None:
    keys = [key for key, _, _ in demo_timing.rows(demo_timing.parse(COLD.splitlines()))]
    assert "converge (site.yml)/1/d3_preflight/1" in keys
    assert "converge (site.yml)/1/d3_preflight/2" in keys
    assert keys[0] == "venv: ansible-core (pip)"
    assert keys[-1] == "total"


def test_report_puts_the_warm_run_beside_the_cold_one(tmp_path: Path) -> None:
    (tmp_path / "cold.log").write_text(COLD)
    (tmp_path / "warm.log").write_text(WARM)
    text = demo_timing.report([tmp_path / "cold.log", tmp_path / "warm.log"])
    lines = text.splitlines()
    assert lines[0] == ("cold: 2026-12-02 14:00:00 UTC, box: 2 cores; load before: 0.10 0.20 0.30 (1, 5, 15 min); "
                        "after: 1.00 2.00 3.00 (1, 5, 15 min)")
    assert lines[1].startswith("warm: 2026-12-02 15:00:00 UTC, ?; load before: ?")
    total = next(line for line in lines if line.startswith("make demo (rc=0)"))
    assert total.split()[3:] == ["231.5", "s", "=", "3", "min", "51.5", "s", "30.0", "s"]
    # the warm run has no pip: "-" in its column; its own step (not in the cold run) is added at the end of its run
    pip = next(line for line in lines if line.startswith("venv: ansible-core (pip)"))
    assert pip.split()[-3:] == ["10.0", "s", "-"]
    first = next(line for line in lines if line.strip().startswith("play 1: lab_base"))
    assert first.split()[-4:] == ["7.0", "s", "4.0", "s"]
    assert any(line.strip().startswith("play 1: d3_monitor_only") and line.endswith("5.0 s") for line in lines)


def test_fmt() -> None:
    assert demo_timing.fmt(None) == "-"
    assert demo_timing.fmt(float("nan")) == "?"
    assert demo_timing.fmt(59.94) == "59.9 s"
    assert demo_timing.fmt(61.0) == "61.0 s = 1 min 01.0 s"


def test_stamp_tees_and_times_every_line(tmp_path: Path) -> None:
    ticks = iter([100.0, 100.5, 103.25, 104.0])
    rc = tmp_path / "rc"
    rc.write_text("2\n")
    sink = io.StringIO()
    demo_timing.stamp(tmp_path / "out" / "cold.log", rc, source=io.StringIO("one\ntwo\n"), sink=sink,
                      clock=lambda: next(ticks))
    assert sink.getvalue() == "one\ntwo\n"
    lines = (tmp_path / "out" / "cold.log").read_text().splitlines()
    assert lines[0].startswith("# date: ") and lines[1].startswith("# machine: ") and lines[2].startswith("# load before: ")
    assert lines[3:5] == ["0.5\tone", "3.2\ttwo"]
    assert lines[5].startswith("# load after: ")
    assert lines[6] == "4.0\t# end rc=2"
    t = demo_timing.parse(lines)
    assert (t.total, t.rc) == (4.0, 2)


def test_stamp_without_an_rc_file_says_minus_one(tmp_path: Path) -> None:
    demo_timing.stamp(tmp_path / "w.log", tmp_path / "missing", source=io.StringIO(""), sink=io.StringIO())
    assert demo_timing.parse((tmp_path / "w.log").read_text().splitlines()).rc == -1
