"""Unit tests of the bench plots (module d3fleet.fleet.bench_plot) in-process with matplotlib's Agg backend: what
each plot draws (points, lines, labels, markers, scales, titles, the SIMULATED mark), the files it writes and the
module's arguments, check mode and a missing matplotlib. The figures are read back before they are closed."""

from __future__ import annotations

import struct
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
from matplotlib.markers import MarkerStyle  # noqa: E402

SIM = "SIMULATED (lab stand-in): not a property of D3"
LAT_TITLE = "Latency vs concurrency per model (4-question requests)"


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


def marker_vertices(m: str) -> list[list[float]]:
    style = MarkerStyle(m)
    return style.get_path().transformed(style.get_transform()).vertices.round(6).tolist()


def hollow_star(coll: Any, x: float, y: float, marker: str, label: str) -> None:
    """A published point: hollow, black-edged, size 120, drawn above the measured ones, with this marker."""
    assert coll.get_offsets().tolist() == [[x, y]]
    assert coll.get_label() == label
    assert coll.get_sizes().tolist() == [120] and coll.get_zorder() == 5
    assert len(coll.get_facecolors()) == 0 and coll.get_edgecolors().tolist() == [[0.0, 0.0, 0.0, 1.0]]
    assert coll.get_paths()[0].vertices.round(6).tolist() == marker_vertices(marker)


def decorated(fig: Any, ax: Any, title: str, simulated: bool) -> None:
    if simulated:
        assert ax.get_title() == f"{title}\n{SIM}" and ax.title.get_color() == "darkred"
        (mark,) = fig.texts
        assert (mark.get_text(), mark.get_position(), mark.get_fontsize(), mark.get_color(), mark.get_alpha()) == (
            "SIMULATED", (0.5, 0.5), 54.0, "red", 0.12)
        assert (mark.get_ha(), mark.get_va(), mark.get_rotation()) == ("center", "center", 25.0)
    else:
        assert ax.get_title() == title and ax.title.get_color() == "black" and fig.texts == []
    assert ax.title.get_fontsize() == 10.0
    grid = ax.xaxis.get_gridlines()[0]
    assert grid.get_visible() and grid.get_alpha() == 0.3 and ax.yaxis.get_gridlines()[0].get_visible()
    legend = ax.get_legend()
    assert legend._loc == 0 and {t.get_fontsize() for t in legend.get_texts()} == {7.0}  # loc "best"
    assert fig.subplotpars.left != 0.125  # tight_layout moved the axes from matplotlib's default
    assert tuple(fig.get_size_inches()) == (8.0, 5.0) and fig.dpi == 110


PUBLISHED = {
    "source": "field report",
    "latency": [{"config": "cfg A", "q4_ms": 490}, {"config": "cfg B", "q2_ms": 240}, {"config": "cfg C", "q4_ms": 470}],
    "accuracy": [{"model": "qw", "correct": 19, "total": 19, "q4_ms": 170}, {"model": "d3", "correct": 17, "total": 20, "q4_ms": 215}],
}


# --------------------------------------------------------------------------------------------- latency vs concurrency
def test_latency_vs_concurrency_draws_p50_and_p99_per_instance(figures: list[Any], tmp_path: Path) -> None:
    report = {"simulated": False, "instances": [
        inst("big", throughput=[thr(16, 900.0, 1500.0), thr(1, 470.0, 520.0), thr(4, None, 0.0), thr(4, 600.0, 800.0)]),
        inst("idle", throughput=[thr(1, None, 1.0)]),  # no p50 at any level: not drawn
        inst("none"),
        inst("small", throughput=[thr(2, 100.0, 150.0)]),
    ]}
    path = tmp_path / "l.png"
    bench_plot.latency_vs_concurrency(report, PUBLISHED, str(path))
    (fig,) = figures
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [(ln.get_label(), ln.get_xdata().tolist(), ln.get_ydata().tolist()) for ln in lines] == [
        ("h1/big (d3-big) p50", [1, 4, 16], [470.0, 600.0, 900.0]),
        ("h1/big (d3-big) p99", [1, 4, 16], [520.0, 800.0, 1500.0]),
        ("h1/small (d3-small) p50", [2], [100.0]),
        ("h1/small (d3-small) p99", [2], [150.0]),
    ]
    for p50, p99 in (lines[0:2], lines[2:4]):
        assert (p50.get_marker(), p50.get_linestyle(), p50.get_alpha()) == ("o", "-", None)
        assert (p99.get_marker(), p99.get_linestyle(), p99.get_alpha()) == ("None", "--", 0.6)
        assert to_rgba(p99.get_color()) == to_rgba(p50.get_color())
    assert to_rgba(lines[0].get_color()) != to_rgba(lines[2].get_color())
    # the published latencies with a 4-question figure, then the published accuracy rows', at concurrency 1
    stars = ax.collections
    assert len(stars) == 4
    for coll, (what, ms), m in zip(stars, (("cfg A", 490), ("cfg C", 470), ("qw", 170), ("d3", 215)), "*PXD", strict=True):
        hollow_star(coll, 1, ms, m, f"published (field report), one at a time: {what}, {ms} ms")
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.get_xlabel() == "concurrency (requests in flight)" and ax.get_ylabel() == "4-question request latency (ms)"
    decorated(fig, ax, LAT_TITLE, simulated=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", path.read_bytes()[16:24]) == (880, 550)  # 8 x 5 in at 110 dpi


def test_latency_markers_cycle_and_the_source_defaults(figures: list[Any], tmp_path: Path) -> None:
    published = {"latency": [{"config": f"c{n}", "q4_ms": 100 + n} for n in range(10)]}
    report = {"simulated": True, "instances": [inst("x", throughput=[thr(1, 5.0, 6.0)])]}
    bench_plot.latency_vs_concurrency(report, published, str(tmp_path / "l.svg"))
    (fig,) = figures
    ax = fig.axes[0]
    assert len(ax.collections) == 10
    for n, coll in enumerate(ax.collections):
        hollow_star(coll, 1, 100 + n, "*PXD^vso"[n % 8], f"published (published), one at a time: c{n}, {100 + n} ms")
    decorated(fig, ax, LAT_TITLE, simulated=True)
    assert (tmp_path / "l.svg").read_text().startswith("<?xml")


# --------------------------------------------------------------------------------------------- accuracy vs latency
def test_accuracy_vs_latency_one_point_per_instance(figures: list[Any], tmp_path: Path) -> None:
    report = {"simulated": True, "suite": {"name": "tickets", "questions": 24}, "instances": [
        inst("big", latency={"q4": {"p50": 470.0}}, score={"accuracy": 0.75, "correct": 18, "total": 24}),
        inst("slow", latency={"q4": {"p50": None}}, score={"accuracy": 0.5, "correct": 12, "total": 24}),
        inst("unscored", latency={"q4": {"p50": 300.0}}, score={"accuracy": None, "correct": 0, "total": 0}),
        inst("bare"),
        inst("zero", latency={"q4": {"p50": 90.0}}, score={"accuracy": 0.0, "correct": 0, "total": 24}),
    ]}
    bench_plot.accuracy_vs_latency(report, PUBLISHED, str(tmp_path / "a.png"))
    (fig,) = figures
    (ax,) = fig.axes
    big, zero, *stars = ax.collections
    for coll, xy, label in ((big, [470.0, 0.75], "h1/big (d3-big): 18/24"), (zero, [90.0, 0.0], "h1/zero (d3-zero): 0/24")):
        assert coll.get_offsets().tolist() == [xy] and coll.get_label() == label
        assert coll.get_sizes().tolist() == [50] and len(coll.get_facecolors()) == 1 and coll.get_zorder() == 1
        assert coll.get_paths()[0].vertices.round(6).tolist() == marker_vertices("o")
    assert len(stars) == 2
    hollow_star(stars[0], 170, 1.0, "*", "published (field report, its own 19 questions): qw 19/19")
    hollow_star(stars[1], 215, 0.85, "P", "published (field report, its own 20 questions): d3 17/20")
    assert ax.get_xlabel() == "4-question latency, p50, one request at a time (ms)"
    assert ax.get_ylabel() == "accuracy on the suite" and ax.get_ylim() == (-0.02, 1.05)
    decorated(fig, ax, "Accuracy vs 4-question latency (suite tickets, 24 questions)", simulated=True)


def test_accuracy_vs_latency_of_an_empty_report(figures: list[Any], tmp_path: Path) -> None:
    published = {"accuracy": [{"model": f"m{n}", "correct": n, "total": 10, "q4_ms": n} for n in range(9)]}
    bench_plot.accuracy_vs_latency({}, published, str(tmp_path / "a.png"))
    ax = figures[0].axes[0]
    for n, coll in enumerate(ax.collections):
        hollow_star(coll, n, n / 10, "*PXD^vso"[n % 8], f"published (published, its own 10 questions): m{n} {n}/10")
    decorated(figures[0], ax, "Accuracy vs 4-question latency (suite None, None questions)", simulated=False)
    assert ax.get_ylim() == (-0.02, 1.05)  # the full scale, though no point is above 0.8


# --------------------------------------------------------------------------------------------- the module
REPORT = {"simulated": False, "suite": {"name": "s", "questions": 1},
          "instances": [inst("a", throughput=[thr(1, 5.0, 6.0)], latency={"q4": {"p50": 5.0}},
                             score={"accuracy": 1.0, "correct": 1, "total": 1})]}


def test_module_writes_both_plots_into_a_new_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dest = tmp_path / "out" / "plots"
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(dest))
    paths = [str(dest / "bench-latency-vs-concurrency.png"), str(dest / "bench-accuracy-vs-latency.png")]
    assert out["changed"] is True and out["plots"] == paths
    assert sorted(p.name for p in dest.iterdir()) == ["bench-accuracy-vs-latency.png", "bench-latency-vs-concurrency.png"]
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in paths)
    # again into the existing directory, as SVG with another prefix and published figures
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(dest), format="svg", prefix="lab", published=PUBLISHED)
    assert out["plots"] == [str(dest / "lab-latency-vs-concurrency.svg"), str(dest / "lab-accuracy-vs-latency.svg")]
    assert all(Path(p).read_text().startswith("<?xml") for p in out["plots"])
    assert plt.get_fignums() == []  # every figure closed


def test_module_dest_is_a_path(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    out = run_module(bench_plot, capsys, report=REPORT, dest="~/p")
    assert out["plots"][0] == str(tmp_path / "p" / "bench-latency-vs-concurrency.png") and (tmp_path / "p").is_dir()


def test_module_check_mode_writes_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run_module(bench_plot, capsys, report=REPORT, dest=str(tmp_path / "p"), _ansible_check_mode=True)
    assert out["changed"] is True
    assert out["plots"] == [str(tmp_path / "p" / "bench-latency-vs-concurrency.png"), str(tmp_path / "p" / "bench-accuracy-vs-latency.png")]
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
