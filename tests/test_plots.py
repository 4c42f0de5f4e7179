"""Tests for scaledl_lab.viz.plots on a small synthetic metrics table with hand-computed answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from scaledl_lab.viz.plots import (
    plot_curves,
    plot_throughput,
    save_standard_plots,
    standard_figures,
    summary_markdown,
    summary_table,
    throughput,
)

STEPS_PER_EPOCH = 20  # rolling window for train curves = 20 / 10 = 2 rows
EPOCHS = 2
RUN_A, RUN_B = "allreduce-dask-2w", "nnt-sim-2w"
# Seconds per step of each (run, rank): rank 1 of each run is twice as fast as rank 0.
STEP_TIME = {(RUN_A, 0): 0.5, (RUN_A, 1): 0.25, (RUN_B, 0): 0.2, (RUN_B, 1): 0.1}


def _row(run: str, rank: int, kind: str, epoch: float, step: int, time: float, **kw) -> dict:
    strategy, runtime = ("allreduce", "dask") if run == RUN_A else ("nnt", "sim")
    base = dict(run=run, strategy=strategy, runtime=runtime, world_size=2, rank=rank, kind=kind)
    base.update(epoch=epoch, step=step, time=time, staleness=math.nan, lr=0.05, bytes_sent=0)
    base.update(kw)
    return base


def make_frame() -> pd.DataFrame:
    rows = []
    for run in (RUN_A, RUN_B):
        for rank in (0, 1):
            dt = STEP_TIME[run, rank]
            for s in range(STEPS_PER_EPOCH * EPOCHS):
                rows.append(
                    _row(
                        run, rank, "train", (s + 1) / STEPS_PER_EPOCH, s + 1, dt * (s + 1),
                        loss=2.0 - 0.01 * s - 0.1 * rank, accuracy=0.1 + 0.01 * s,
                        samples=32, bytes_sent=1000 if run == RUN_A else 2000,
                        staleness=math.nan if run == RUN_A else 1.0 + 2 * rank,
                    )
                )  # fmt: skip
        # Run A evaluates on rank 0 only; run B (decentralised) on both ranks.
        for rank in (0,) if run == RUN_A else (0, 1):
            for epoch in range(EPOCHS + 1):
                t = STEP_TIME[run, 0] * STEPS_PER_EPOCH * epoch + 0.1 * rank
                for kind, acc in (("val", 0.5 + 0.1 * epoch), ("test", 0.4 + 0.2 * epoch)):
                    acc = acc - 0.1 * rank - (0.15 if run == RUN_B and epoch == 2 else 0)
                    rows.append(
                        _row(
                            run, rank, kind, float(epoch), epoch * STEPS_PER_EPOCH, t,
                            loss=1.5 - 0.5 * epoch + 0.2 * rank, accuracy=acc, samples=1000,
                        )
                    )  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_frame()


def test_plot_curves_test_accuracy(frame: pd.DataFrame) -> None:
    fig = plot_curves(frame)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == [RUN_A, RUN_B]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [RUN_A, RUN_B]
    assert ax.get_xlabel() == "epoch"
    assert ax.get_ylabel() == "test accuracy"
    line_a, line_b = ax.get_lines()
    np.testing.assert_allclose(line_a.get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(line_a.get_ydata(), [0.4, 0.6, 0.8])
    # Run B: mean of ranks (rank 1 is 0.1 lower), with a min-max band for it alone.
    np.testing.assert_allclose(line_b.get_ydata(), [0.35, 0.55, 0.60])
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 1


def test_plot_curves_loss_vs_time_on_given_axes(frame: pd.DataFrame) -> None:
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_curves(frame, metric="loss", x="time", kind="val", ax=ax, title="T") is fig
    assert ax.get_xlabel() == "time (s)"
    assert ax.get_ylabel() == "val loss"
    assert ax.get_title() == "T"
    # Run B's eval times are the mean over its ranks: 4*epoch + 0.05.
    np.testing.assert_allclose(ax.get_lines()[1].get_xdata(), [0.05, 4.05, 8.05])
    np.testing.assert_allclose(ax.get_lines()[1].get_ydata(), [1.6, 1.1, 0.6])


def test_plot_curves_train_smoothing(frame: pd.DataFrame) -> None:
    ax = plot_curves(frame, metric="loss", x="step", kind="train").axes[0]
    assert len(ax.get_lines()) == 2
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), np.arange(1, 41))
    # Rank mean is 1.95 - 0.01*s; a rolling mean over 2 rows lags it by half a step.
    rank_mean = 1.95 - 0.01 * np.arange(40)
    expected = np.concatenate([[rank_mean[0]], (rank_mean[1:] + rank_mean[:-1]) / 2])
    np.testing.assert_allclose(line.get_ydata(), expected)
    assert not ax.collections  # no band for training curves


def test_throughput_hand_computed(frame: pd.DataFrame) -> None:
    table = throughput(frame)
    assert list(table["run"]) == [RUN_A, RUN_B]
    # 40 steps per rank, the first 4 dropped: 36 steps of 32 samples over 36*dt seconds.
    rates = {run: [32 / STEP_TIME[run, r] for r in (0, 1)] for run in (RUN_A, RUN_B)}
    np.testing.assert_allclose(table["samples_per_s"], [sum(rates[RUN_A]), sum(rates[RUN_B])])
    np.testing.assert_allclose(table["samples_per_s"], [192.0, 480.0])
    np.testing.assert_allclose(table["steps_per_s"], [(2 + 4) / 2, (5 + 10) / 2])


def test_throughput_warmup_excluded() -> None:
    # A slow first step (setup) must not drag the steady-state rate down.
    times = [10.0] + [10.0 + k for k in range(1, 10)]
    rows = [
        _row("r", 0, "train", (s + 1) / 10, s + 1, times[s], loss=1.0, accuracy=0.5, samples=8)
        for s in range(10)
    ]
    table = throughput(pd.DataFrame(rows))
    assert table["samples_per_s"].iloc[0] == pytest.approx(9 * 8 / 9.0)
    assert table["steps_per_s"].iloc[0] == pytest.approx(1.0)


def test_plot_throughput(frame: pd.DataFrame) -> None:
    ax = plot_throughput(frame).axes[0]
    assert [p.get_height() for p in ax.patches] == pytest.approx([192.0, 480.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == [RUN_A, RUN_B]
    assert "samples/s" in ax.get_ylabel()


def test_summary_table_hand_computed(frame: pd.DataFrame) -> None:
    table = summary_table(frame).set_index("run")
    assert list(table.index) == [RUN_A, RUN_B]
    a, b = table.loc[RUN_A], table.loc[RUN_B]
    assert (a["strategy"], a["runtime"], a["world_size"]) == ("allreduce", "dask", 2)
    assert (b["strategy"], b["runtime"]) == ("nnt", "sim")
    assert a["epochs"] == b["epochs"] == 2.0
    assert a["test_accuracy"] == pytest.approx(0.8)
    assert b["test_accuracy"] == pytest.approx((0.65 + 0.55) / 2)
    assert a["best_val_accuracy"] == pytest.approx(0.7)
    # Run B's val accuracy dips at epoch 2: best rank mean is at epoch 1.
    assert b["best_val_accuracy"] == pytest.approx((0.6 + 0.5) / 2)
    assert a["test_loss"] == pytest.approx(0.5)
    assert b["test_loss"] == pytest.approx(0.6)
    assert a["time_s"] == pytest.approx(20.0)  # rank 0's last step and final evaluation
    assert b["time_s"] == pytest.approx(8.1)  # rank 1's final evaluation
    assert a["samples_per_s"] == pytest.approx(192.0)
    assert (a["bytes_per_step"], b["bytes_per_step"]) == (1000.0, 2000.0)
    assert math.isnan(a["staleness"])
    assert b["staleness"] == pytest.approx(2.0)


def test_summary_markdown(frame: pd.DataFrame) -> None:
    text = summary_markdown(frame)
    lines = text.strip().splitlines()
    assert len(lines) == 2 + 2
    assert lines[0].startswith("| run | strategy |") and "test acc" in lines[0]
    assert set(lines[1].replace("|", "").split()) <= {":---", "---:"}
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert lines[2].startswith(f"| {RUN_A} | allreduce | dask | 2 | 2 | 80.00% | 70.00% |")
    assert "| 20.0 |" in lines[2] and "| 192.0 |" in lines[2] and "1000 B" in lines[2]
    assert lines[2].endswith("| n/a |")
    assert "| 60.00% | 55.00% |" in lines[3] and lines[3].endswith("| 2.00 |")


def test_save_standard_plots(frame: pd.DataFrame, tmp_path) -> None:
    paths = save_standard_plots(frame, tmp_path / "figs")
    names = [p.name for p in paths]
    assert names == [
        "accuracy_vs_epoch.png",
        "loss_vs_epoch.png",
        "accuracy_vs_time.png",
        "loss_vs_time.png",
        "throughput.png",
    ]
    for p in paths:
        assert p.parent == tmp_path / "figs"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_save_standard_plots_falls_back_to_val(frame: pd.DataFrame, tmp_path) -> None:
    paths = save_standard_plots(frame[frame["kind"] != "test"], tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"metric": "f1"}, r"unknown metric 'f1'; choose one of loss, accuracy"),
        ({"x": "wall"}, r"unknown x 'wall'; choose one of epoch, time, step"),
        ({"kind": "eval"}, r"unknown kind 'eval'; choose one of train, val, test"),
    ],
)
def test_plot_curves_bad_arguments(frame: pd.DataFrame, kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        plot_curves(frame, **kwargs)


def test_errors_on_empty_or_incomplete_frames(frame: pd.DataFrame, tmp_path) -> None:
    empty = frame.iloc[:0]
    for fn in (plot_curves, plot_throughput, throughput, summary_table, summary_markdown):
        with pytest.raises(ValueError, match="metrics frame is empty"):
            fn(empty)
    with pytest.raises(ValueError, match="metrics frame is empty"):
        save_standard_plots(empty, tmp_path)
    with pytest.raises(ValueError, match=r"no rows with kind='test'"):
        plot_curves(frame[frame["kind"] == "train"])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['samples'\]"):
        throughput(frame.drop(columns="samples"))


def test_one_colour_per_method_and_one_line_style_per_variant():
    from scaledl_lab.viz.plots import line_styles

    runs = [
        "allreduce · dask · 1w", "allreduce · dask · 2w", "nnt-torus · sim · 16w",
        "allreduce · sim · 16w", "nnt-torus · sim · 16w · straggler", "single",
    ]  # fmt: skip
    frame = pd.DataFrame({"run": runs, "kind": "test"})
    styles = line_styles(frame)
    assert styles["allreduce · dask · 1w"][0] == styles["allreduce · sim · 16w"][0] == "C0"
    assert styles["nnt-torus · sim · 16w"][0] == styles["nnt-torus · sim · 16w · straggler"][0]
    assert styles["nnt-torus · sim · 16w"][0] != "C0" and styles["single"][0] == "C2"
    # The same variant draws the same line style whatever the method.
    assert styles["nnt-torus · sim · 16w"][1] == styles["allreduce · sim · 16w"][1]
    assert len({styles[r][1] for r in runs[:5]}) == 4


def test_real_and_simulated_runs_get_separate_time_panels(tmp_path):
    rows = []
    for run, runtime, scale in (("a · dask · 2w", "dask", 10.0), ("a · sim · 16w", "sim", 0.1)):
        for epoch in (1, 2):
            rows.append(dict(run=run, runtime=runtime, kind="test", rank=0, epoch=epoch,
                             step=epoch, time=scale * epoch, accuracy=0.5, loss=1.0,
                             samples=10))  # fmt: skip
    from scaledl_lab.viz.plots import standard_figures

    figures = dict(standard_figures(pd.DataFrame(rows)))
    for name in ("accuracy_vs_time.png", "accuracy_vs_epoch.png"):
        titles = [ax.get_title() for ax in figures[name].axes]
        assert len(titles) == 2 and "(dask: " in titles[0] and "(sim: " in titles[1], titles


def _many_runs() -> pd.DataFrame:
    """As many runs as the paper comparison draws (6 real, 17 simulated, seeds among them)."""
    names = [f"m{i} · dask · 2w" for i in range(6)]
    names += [f"m{i} · sim · 16w · seed {s}" for i in (0, 1) for s in range(3)]
    names += [f"m{i} · sim · 16w{v}" for i, v in ((2, ""), (3, ""), (4, ""), (5, ""),
                                                  (0, " · straggler"), (1, " · straggler"),
                                                  (1, " · straggler · lead 4"),
                                                  (6, ""), (7, ""), (8, ""), (9, ""))]  # fmt: skip
    rows = [dict(run=run, runtime=run.split(" · ")[1], kind=kind, rank=rank, epoch=e, step=e,
                 time=0.5 * e + i, accuracy=0.1 + 0.3 * e - 0.01 * i, loss=2.0 - 0.5 * e,
                 samples=10)
            for i, run in enumerate(names) for kind in ("train", "test") for rank in (0, 1)
            for e in (0, 1, 2)]  # fmt: skip
    return pd.DataFrame(rows)


def _inside(inner, outer, slack: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack
            and inner.x1 <= outer.x1 + slack and inner.y1 <= outer.y1 + slack)  # fmt: skip


@pytest.mark.parametrize("name", ["accuracy_vs_epoch.png", "accuracy_vs_time.png",
                                  "loss_vs_epoch.png", "loss_vs_time.png"])  # fmt: skip
def test_every_legend_lies_inside_its_figure_and_covers_no_axes(name):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = dict(standard_figures(_many_runs()))[name]
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    figure_box = fig.bbox
    legends = [ax.get_legend() for ax in fig.axes]
    assert all(legends) and len(legends) == 2
    for ax, legend in zip(fig.axes, legends, strict=True):
        box = legend.get_window_extent(renderer)
        assert _inside(box, figure_box), (name, box, figure_box)
        assert not box.overlaps(ax.get_window_extent(renderer))  # beside the axes, not on them
        assert not box.overlaps(ax.title.get_window_extent(renderer))
    # Seeds share an entry: 17 simulated runs, 13 entries.
    entries = [len(legend.get_texts()) for legend in legends]
    assert entries == [6, 13]
    assert "m0 · sim · 16w (seeds 0, 1, 2)" in [t.get_text() for t in legends[1].get_texts()]


def test_a_few_runs_keep_their_legend_inside_the_axes(frame: pd.DataFrame) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot_curves(frame)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    assert _inside(ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer))


# -- the pipeline's Gantt chart -----------------------------------------------------------------


def _gantt_labels_drawn(figsize: tuple[float, float], monkeypatch) -> list[str]:
    """The bar labels a Gantt chart of one stage draws at ``figsize`` (150 dpi): a long
    forward (F0, 0 to 1 s), a short one (F1, 6% of the step) and one of no time (F2)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from scaledl_lab.viz.gantt import plot_pipeline

    events = pd.DataFrame({"run": "r", "rank": 0, "replica": 0, "stage": 0, "step": 0,
                           "micro_batch": [0, 1, 2], "phase": "F", "start": [0.0, 1.0, 1.06],
                           "end": [1.0, 1.06, 1.06]})  # fmt: skip
    drawn: list[str] = []
    draw = Text.draw

    def record(text, renderer):
        drawn.append(text.get_text())
        draw(text, renderer)

    monkeypatch.setattr(Text, "draw", record)
    fig = Figure(figsize=figsize, dpi=150, layout="constrained")
    ax = plot_pipeline(events, step=0, ax=fig.subplots())
    FigureCanvasAgg(fig).draw()
    assert len(ax.patches) == 1 + 2  # the step's idle background, F0, F1: F2 takes no time
    return [label for label in drawn if label in ("F0", "F1", "F2")]


def test_a_gantt_bar_is_labelled_only_where_its_label_fits(monkeypatch):
    # F1's bar is 6% of the step: 82 px wide in a 12-inch chart, room for "F1" (8 pt: 21 px
    # at 150 dpi); 9 px in a 3-inch chart, where its label would spill over F0 and the idle
    # time. (A fixed share of the step, as the chart had before, labels both or neither.)
    assert _gantt_labels_drawn((12, 1.5), monkeypatch) == ["F0", "F1"]
    assert _gantt_labels_drawn((3, 1.5), monkeypatch) == ["F0"]


def test_small_multiples_name_their_runs_and_can_share_one_y_range(frame: pd.DataFrame) -> None:
    from scaledl_lab.viz.small_multiples import small_multiples

    panels = {"A": [RUN_A], "B": [RUN_B]}
    apart = small_multiples(frame, panels, zoom=False).axes
    assert apart[0].get_ylim()[0] > 0.3  # run A's test accuracy: 0.4 to 0.8, on its own axis
    a, b = small_multiples(frame, panels, zoom=False, labels={RUN_A: "A (adam)"}, same_y=True).axes
    assert [t.get_text() for t in a.get_legend().get_texts()] == ["A (adam)"]
    assert [t.get_text() for t in b.get_legend().get_texts()] == [RUN_B]  # not named: its run
    assert a.get_ylim() == b.get_ylim()
    assert a.get_ylim()[0] < 0.3 and a.get_ylim()[1] > 0.8  # B's band reaches down to 0.3
