"""Unit tests of the bench plots (module d3fleet.fleet.bench_plot) in-process with matplotlib's Agg backend: what
each plot draws (points, lines, labels, markers, scales, titles, the SIMULATED mark), the files it writes and the
module's arguments, check mode and a missing matplotlib. The figures are read back before they are closed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils._internal import _traceback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules import bench_plot  # noqa: E402
from testkit import run_module  # noqa: E402

plt = pytest.importorskip("matplotlib.pyplot")
from matplotlib.colors import to_rgba  # noqa: E402

SIM = "SIMULATED (lab stand-in): not a property of D3"


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure the module closes, in order (closed after the test)."""
    seen: list[Any] = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", seen.append)
    yield seen
    for fig in seen:
        real_close(fig)


def inst(name: str, **over: Any) -> dict[str, Any]:
    return {"host": "h1", "name": name, "model": f"d3-{name}", **over}


def thr(c: int, p50: float | None, p99: float) -> dict[str, Any]:
    return {"concurrency": c, "p50": p50, "p99": p99}


def finished(fig: Any, title: str, simulated: bool) -> None:
    """The suptitle (with the SIMULATED mark when simulated), grids, and every legend outside its axes."""
    marks = [t for t in fig.texts if t is not fig._suptitle]
    if simulated:
        assert fig._suptitle.get_text() == f"{title}\n{SIM}" and fig._suptitle.get_color() == "darkred"
        (mark,) = marks
        assert (mark.get_text(), mark.get_position(), mark.get_fontsize(), mark.get_color(), mark.get_alpha()) == (
            "SIMULATED", (0.5, 0.5), 54.0, "red", 0.12)
        assert (mark.get_ha(), mark.get_va(), mark.get_rotation()) == ("center", "center", 25.0)
    else:
        assert fig._suptitle.get_text() == title and fig._suptitle.get_color() == "black" and marks == []
    assert fig._suptitle.get_fontsize() == 10.0
    for ax in fig.axes:
        grid = ax.xaxis.get_gridlines()[0]
        assert grid.get_visible() and grid.get_alpha() == 0.3
        legend = ax.get_legend()
        if legend is not None:  # outside the axes: on the right of a single plot, under each of several
            anchor = legend.get_bbox_to_anchor()._bbox
            single = len(fig.axes) == 1
            assert legend._loc == 2 and (anchor.x0, anchor.y0) == pytest.approx((1.02, 1.0) if single else (0.0, -0.3))
            assert {t.get_fontsize() for t in legend.get_texts()} == {7.0}


PUBLISHED = {
    "source": "field report",
    "latency": [{"config": "cfg A", "q4_ms": 490}, {"config": "cfg B", "q2_ms": 240}],
    "accuracy": [{"model": "qw", "correct": 19, "total": 19, "q4_ms": 170}, {"model": "d3", "correct": 17, "total": 20, "q4_ms": 215}],
}


def test_latency_vs_concurrency_shows_only_the_measured_levels_and_a_supported_p99(figures: list[Any], tmp_path: Path) -> None:
    report = {"simulated": False, "instances": [
        inst("big", throughput=[thr(16, 900.0, 1500.0) | {"n": 400}, thr(1, 470.0, 520.0) | {"n": 367},
                                thr(4, None, 0.0), thr(4, 600.0, 800.0) | {"n": 368}]),
        inst("idle", throughput=[thr(1, None, 1.0)]),
        inst("none"),
        inst("down", health=503, throughput=[thr(64, 1.0, 1.0)]),
        inst("small", throughput=[thr(2, 100.0, 150.0)]),
    ]}
    path = tmp_path / "l.png"
    bench_plot.latency_vs_concurrency(report, PUBLISHED, str(path))
    (fig,) = figures
    (ax,) = fig.axes
    assert [(ln.get_label(), ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in ax.get_lines()] == [
        ("h1/big (d3-big) p50", [1, 4, 16], [470.0, 600.0, 900.0]),
        ("h1/big (d3-big) p99 (n >= 368)", [4, 16], [800.0, 1500.0]),  # n = 367 at concurrency 1: no p99
        ("h1/small (d3-small) p50", [2], [100.0]),
    ]
    p50, p99, small = ax.get_lines()
    assert (p99.get_linestyle(), p99.get_alpha(), to_rgba(p99.get_color())) == ("--", 0.6, to_rgba(p50.get_color()))
    assert to_rgba(small.get_color()) != to_rgba(p50.get_color())
    assert len(ax.collections) == 0  # no published point: they are one-at-a-time figures (the one-at-a-time plot)
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "16"]
    assert ax.get_xticks().tolist() == [1, 2, 4, 16]
    finished(fig, "Latency vs concurrency per instance (4-question requests)", simulated=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_vs_concurrency_without_load(figures: list[Any], tmp_path: Path) -> None:
    bench_plot.latency_vs_concurrency({"simulated": True, "instances": [inst("x")]}, {}, str(tmp_path / "l.svg"))
    (fig,) = figures
    assert fig.axes[0].get_lines() == [] and fig.axes[0].get_xscale() == "linear"
    finished(fig, "Latency vs concurrency per instance (4-question requests)", simulated=True)
    assert (tmp_path / "l.svg").read_text().startswith("<?xml")


def test_one_at_a_time_puts_the_published_configs_beside_the_measured(figures: list[Any], tmp_path: Path) -> None:
    report = {"simulated": True, "instances": [inst("big", latency={"q2": {"p50": 240.0}, "q4": {"p50": 470.0}}), inst("bare")]}
    bench_plot.one_at_a_time(report, PUBLISHED, str(tmp_path / "o.png"))
    (fig,) = figures
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "h1/big (d3-big)", "h1/bare (d3-bare)", "cfg A [published: field report]", "cfg B [published: field report]"]
    q2, q4 = ax.containers
    assert [round(b.get_width()) for b in q2] == [240, 0, 0, 240] and [round(b.get_width()) for b in q4] == [470, 0, 490, 0]
    assert [b.get_hatch() for b in q4] == [None, None, "//", "//"] and q4[2].get_alpha() == 0.5
    assert [b.get_y() + b.get_height() / 2 for b in q2] == pytest.approx([-0.2, 0.8, 1.8, 2.8])
    assert ax.yaxis_inverted()
    finished(fig, "One request at a time: measured p50 and the published configurations", simulated=True)


def test_accuracy_each_against_its_own_suite_with_intervals(figures: list[Any], tmp_path: Path) -> None:
    report = {"simulated": False, "suite": {"name": "tickets", "questions": 26}, "instances": [
        inst("big", latency={"q4": {"p50": 470.0}}, score={"correct": 17, "total": 26, "interval": [0.462, 0.806]}),
        inst("slow", latency={"q4": {"p50": None}}, score={"correct": 12, "total": 26}),
        inst("unscored", latency={"q4": {"p50": 300.0}}, score={"correct": 0, "total": 0}),
        inst("bare"),
        inst("zero", latency={"q4": {"p50": 90.0}}, score={"correct": 0, "total": 26}),
    ]}
    bench_plot.accuracy_vs_latency(report, PUBLISHED, str(tmp_path / "a.png"))
    (fig,) = figures
    ax, pub = fig.axes
    big, zero = ax.containers
    assert big.lines[0].get_xydata().tolist() == [[470.0, pytest.approx(17 / 26)]]
    assert big.get_label() == "h1/big (d3-big): 17/26" and zero.get_label() == "h1/zero (d3-zero): 0/26"
    seg = big.lines[2][0].get_segments()[0].tolist()
    assert seg == [[470.0, pytest.approx(0.462)], [470.0, pytest.approx(0.806)]]
    zero_seg = zero.lines[2][0].get_segments()[0].tolist()  # computed when the report has no interval
    assert zero_seg == [[90.0, 0.0], [90.0, pytest.approx(0.1287, abs=1e-4)]]
    qw, d3 = pub.containers
    assert qw.get_label() == "qw 19/19" and d3.lines[0].get_xydata().tolist() == [[215.0, 0.85]]
    assert d3.lines[2][0].get_segments()[0].tolist() == [[215, pytest.approx(0.6396, abs=1e-4)], [215, pytest.approx(0.9476, abs=1e-4)]]
    assert ax.get_title() == "measured: suite tickets, 26 questions"
    assert pub.get_title() == "published (field report): its own questions, another suite"
    assert ax.get_ylim() == (-0.02, 1.05) and ax.get_ylabel() == "accuracy [95 % Wilson interval]"
    finished(fig, "Accuracy vs 4-question latency, each against its own suite", simulated=False)


def test_reliability_bins_against_the_diagonal(figures: list[Any], tmp_path: Path) -> None:
    bins = [{"confidence": 0.5, "accuracy": 0.4, "interval": [0.2, 0.6], "n": 10}, {"confidence": 0.9, "accuracy": 1.0,
                                                                                   "interval": [0.7, 1.0], "n": 6}]
    report = {"simulated": True, "instances": [inst("a", score={"reliability": {"confidence": bins}}), inst("b")]}
    bench_plot.reliability(report, {}, str(tmp_path / "r.png"))
    (fig,) = figures
    (ax,) = fig.axes
    diagonal = ax.get_lines()[0]
    assert diagonal.get_xydata().tolist() == [[0, 0], [1, 1]] and diagonal.get_label() == "perfect calibration"
    (bars,) = ax.containers
    assert bars.get_label() == "h1/a (d3-a) (n=16)" and bars.lines[0].get_xydata().tolist() == [[0.5, 0.4], [0.9, 1.0]]
    assert [s.tolist() for s in bars.lines[2][0].get_segments()] == [[[0.5, 0.2], [0.5, 0.6]], [[0.9, 0.7], [0.9, 1.0]]]
    assert ax.get_xlim() == (0, 1.02) and ax.get_ylim() == (-0.02, 1.05)
    finished(fig, "Reliability: confidence against observed accuracy", simulated=True)


def test_load_open_loop_against_the_offered_rate_only(figures: list[Any], tmp_path: Path) -> None:
    rate = [{"offered_per_s": 60.0, "p50": 90.0, "goodput_per_s": 5.0, "from_schedule": {"p50": 900.0}},
            {"offered_per_s": 4.0, "p50": 80.0, "goodput_per_s": 4.0, "driven": True, "from_schedule": {"p50": 81.0}},
            {"offered_per_s": 2000.0, "p50": 50.0, "driven": False}]
    closed = [{"concurrency": 4, "requests_per_s": 30.0, "p50": 120.0, "goodput_per_s": 30.0}]
    report = {"simulated": False, "settings": {"slo_ms": 250}, "instances": [inst("m", rate=rate, throughput=closed), inst("x")]}
    bench_plot.load(report, {}, str(tmp_path / "load.png"))
    (fig,) = figures
    lat, good = fig.axes
    assert lat.get_lines() == [] and good.get_lines() == []  # points only: nothing joins two levels
    sched, send, no_lat = lat.collections
    assert sched.get_offsets().tolist() == [[4.0, 81.0], [60.0, 900.0]] and sched.get_label() == "h1/m (d3-m) p50 from the schedule"
    assert send.get_offsets().tolist() == [[4.0, 80.0], [60.0, 90.0]] and len(send.get_facecolors()) == 0
    assert no_lat.get_offsets().tolist() == [[2000.0, 1.0]] and "not driven" in no_lat.get_label()
    goodput, no_good = good.collections
    assert goodput.get_offsets().tolist() == [[4.0, 4.0], [60.0, 5.0]] and no_good.get_offsets().tolist() == [[2000.0, 0.0]]
    assert good.get_ylabel() == "goodput: answers within 250 ms of the schedule per s" and lat.get_yscale() == "log"
    assert {lat.get_xlabel(), good.get_xlabel()} == {"offered request rate (req/s, open loop)"}  # one x quantity
    finished(fig, "Open loop (Poisson arrivals): latency from the schedule and from the send", simulated=False)


def test_load_marks_a_censored_p50_as_a_lower_bound(figures: list[Any], tmp_path: Path) -> None:
    rate = [{"offered_per_s": 4.0, "p50": 80.0, "goodput_per_s": 4.0, "from_schedule": {"p50": 81.0, "lower_bound": ["p99"]}},
            {"offered_per_s": 60.0, "p50": 90.0, "goodput_per_s": 5.0, "from_schedule": {"p50": 900.0, "lower_bound": ["p50"]}}]
    bench_plot.load({"simulated": False, "instances": [inst("m", rate=rate)]}, {}, str(tmp_path / "load.png"))
    (fig,) = figures
    sched, above, _send = fig.axes[0].collections
    assert sched.get_offsets().tolist() == [[4.0, 81.0]] and above.get_offsets().tolist() == [[60.0, 900.0]]
    assert above.get_label() == "h1/m (d3-m) p50 from the schedule, a lower bound (requests never sent or failed)"


# --------------------------------------------------------------------------------------------- the module
REPORT = {"simulated": False, "suite": {"name": "s", "questions": 1},
          "instances": [inst("a", throughput=[thr(1, 5.0, 6.0)], latency={"q4": {"p50": 5.0}},
                             score={"accuracy": 1.0, "correct": 1, "total": 1})]}


def test_module_writes_the_plots_into_a_new_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dest = tmp_path / "out" / "plots"
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(dest))
    names = ["latency-vs-concurrency", "one-at-a-time", "accuracy-vs-latency", "reliability"]  # no open loop: no load plot
    paths = [str(dest / f"bench-{n}.png") for n in names]
    assert out["changed"] is True and out["plots"] == paths
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"bench-{n}.png" for n in names)
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in paths)
    # again into the existing directory, as SVG with another prefix, published figures and an open-loop pass
    with_rate = {**REPORT, "instances": [{**REPORT["instances"][0], "rate": [{"offered_per_s": 1.0, "p50": 5.0}]}]}
    out = run_module(bench_plot, capsys, report=with_rate, dest=str(dest), format="svg", prefix="lab", published=PUBLISHED)
    assert out["plots"] == [str(dest / f"lab-{n}.svg") for n in [*names, "load"]]
    assert all(Path(p).read_text().startswith("<?xml") for p in out["plots"])
    assert plt.get_fignums() == []  # every figure closed


def test_module_dest_is_a_path(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    out = run_module(bench_plot, capsys, report=REPORT, dest="~/p")
    assert out["plots"][0] == str(tmp_path / "p" / "bench-latency-vs-concurrency.png") and (tmp_path / "p").is_dir()


def test_module_check_mode_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(tmp_path / "p"), _ansible_check_mode=True)
    assert out["changed"] is True
    assert out["plots"] == [str(tmp_path / "p" / f"bench-{n}.png") for n in ("latency-vs-concurrency", "one-at-a-time",
                                                                             "accuracy-vs-latency", "reliability")]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"format": "gif"}, "value of format must be one of: png, svg, got: gif"),
        ({"dest": None}, "missing required arguments: dest"),
        ({"report": None}, "missing required arguments: report"),
        ({"report": "not a report"}, "argument 'report' is of type str and we were unable to convert to dict"),
        ({"published": "nope"}, "argument 'published' is of type str and we were unable to convert to dict"),
        ({"bogus": 1}, "Unsupported parameters for (basic.py) module: bogus."),
    ],
)
def test_module_refuses_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: dict[str, Any], message: str) -> None:
    given = {"report": REPORT, "dest": str(tmp_path), **args}
    out = run_module(bench_plot, capsys, **{k: v for k, v in given.items() if v is not None})
    assert out["failed"] is True and message in out["msg"]


def test_module_without_matplotlib_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_plot, "HAS_MPL", False)
    monkeypatch.setattr(bench_plot, "MPL_ERROR", "Traceback: no matplotlib")
    monkeypatch.setattr(_traceback, "_is_traceback_enabled", lambda event: event is _traceback.TracebackEvent.ERROR)
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(tmp_path / "p"))
    assert out["failed"] is True and out["msg"].startswith("Failed to import the required Python library (matplotlib) on ")
    assert "Please read the module documentation and install it" in out["msg"] and not (tmp_path / "p").exists()
    assert out["exception"] == "Traceback: no matplotlib"  # the import's traceback, when tracebacks are asked for


# --------------------------------------------------------------------------------------------- the style, pinned
def _ms(marker: str) -> list[list[float]]:
    from matplotlib.markers import MarkerStyle

    style = MarkerStyle(marker)
    return style.get_path().transformed(style.get_transform()).vertices.round(6).tolist()


RICH = {"simulated": False, "settings": {"slo_ms": 250}, "suite": {"name": "s", "questions": 26}, "instances": [
    inst("a", throughput=[{"concurrency": 1, "p50": 40.0, "p99": 60.0, "n": 400, "requests_per_s": 20.0, "goodput_per_s": 19.0}],
         rate=[{"offered_per_s": 8.0, "p50": 41.0, "goodput_per_s": 8.0}, {"offered_per_s": 100.0, "p50": 800.0, "goodput_per_s": 0}],
         latency={"q2": {"p50": 20.0}, "q4": {"p50": 40.0}}, score={"correct": 13, "total": 26, "interval": [0.3, 0.7],
                                                                    "reliability": {"confidence": [{"confidence": 0.7, "accuracy": 0.5,
                                                                                                    "interval": [0.3, 0.7], "n": 8}]}}),
    inst("b", rate=[{"offered_per_s": 8.0, "p50": 30.0}]),
]}


def test_the_style_of_every_plot(figures: list[Any], tmp_path: Path) -> None:
    for name, draw in bench_plot.DRAW.items():
        draw(RICH, PUBLISHED, str(tmp_path / f"{name}.png"))
    lat_c, one, acc, rel, load = figures
    sizes = [tuple(f.get_size_inches().round(2)) for f in figures]
    assert sizes == [(8.0, 4.5), (8.0, 3.4), (11.0, 4.5), (6.5, 5.0), (11.0, 4.5)] and {f.dpi for f in figures} == {110}
    for fig in figures:
        assert fig._suptitle.get_fontsize() == 10.0
        for ax in fig.axes:
            assert ax.xaxis.get_gridlines()[0].get_visible() and ax.yaxis.get_gridlines()[0].get_visible()
            legend = ax.get_legend()
            assert legend is not None and legend.borderaxespad == 0.0
    # latency vs concurrency: p50 dots, p99 crosses dashed, log 2
    p50, p99 = lat_c.axes[0].get_lines()
    assert (p50.get_marker(), p99.get_marker(), p99.get_linestyle()) == ("o", "x", "--")
    assert lat_c.axes[0].xaxis.get_transform().base == 2
    assert lat_c.axes[0].get_ylabel() == "4-question request latency (ms)"
    assert lat_c.axes[0].get_xlabel() == "concurrency (requests in flight, closed loop): the measured levels"
    # one at a time: two bar series, their colours and heights
    q2, q4 = one.axes[0].containers
    assert (q2.get_label(), q4.get_label()) == ("2 questions, p50", "4 questions, p50")
    assert q2[0].get_height() == pytest.approx(0.38) and to_rgba(q2[0].get_facecolor()) == to_rgba("C0")
    assert to_rgba(q4[0].get_facecolor()) == to_rgba("C1")
    assert one.axes[0].get_xlabel() == "latency, one request at a time (ms); hatched: published, not measured here"
    # accuracy: two panels sharing y; dots and hollow squares with caps of 4
    ax, pub = acc.axes
    assert ax.get_shared_y_axes().joined(ax, pub)
    measured, published = ax.containers[0], pub.containers[0]
    assert measured.lines[0].get_marker() == "o" and published.lines[0].get_marker() == "s"
    assert published.lines[0].get_markerfacecolor() == "none" and measured.lines[0].get_markerfacecolor() != "none"
    assert {c.get_markersize() for c in (*measured.lines[1], *published.lines[1])} == {8.0}  # capsize 4
    assert (ax.title.get_fontsize(), pub.title.get_fontsize()) == (9.0, 9.0)
    assert pub.get_xlabel() == "4-question latency (ms), as published"
    assert ax.get_xlabel() == "4-question latency, p50, one request at a time (ms)"
    # reliability: the dotted black diagonal, bins joined with caps of 3
    diag = rel.axes[0].get_lines()[0]
    assert (to_rgba(diag.get_color()), diag.get_linewidth(), diag.get_linestyle()) == (to_rgba("black"), 0.8, ":")
    (bins,) = rel.axes[0].containers
    assert bins.lines[0].get_linestyle() == "-" and {c.get_markersize() for c in bins.lines[1]} == {6.0}
    assert rel.axes[0].get_xlabel() == "confidence of the answer given (mean per bin of 0.2)"
    assert rel.axes[0].get_ylabel() == "accuracy observed in the bin [95 %]"
    # load: per instance its colour, from the schedule filled, from the send hollow
    lat, good = load.axes
    a_sched, a_send, b_sched, b_send = lat.collections
    assert [to_rgba(c.get_facecolors()[0]) for c in (a_sched, b_sched)] == [to_rgba("C0"), to_rgba("C1")]
    assert [to_rgba(c.get_edgecolors()[0]) for c in (a_send, b_send)] == [to_rgba("C0"), to_rgba("C1")]
    a_good, b_good = good.collections
    assert a_good.get_offsets().tolist() == [[8.0, 8.0], [100.0, 0.0]] and a_good.get_label() == "h1/a (d3-a) goodput"
    assert b_good.get_offsets().tolist() == [[8.0, 0.0]]  # no goodput: 0
    assert lat.get_ylabel() == "4-question latency p50 (ms, log)"
    assert {lat.get_xlabel(), good.get_xlabel()} == {"offered request rate (req/s, open loop)"}
