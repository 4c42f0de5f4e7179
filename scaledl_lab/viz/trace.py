"""One training step as a Chrome trace (the Trace Event Format that Perfetto, ``ui.perfetto.dev``,
and ``chrome://tracing`` open), and the two traces of a step side by side.

A simulated run's step comes from its timeline (``Results.timeline``): one process per rank,
its compute, communication and idle bars on the worker's thread and the transfers that ran
behind compute (``overlapped``) on a second thread, as NCCL's and gloo's own threads show them
in a real trace. A real rank's step comes from ``torch.profiler`` (``profile_step``,
:mod:`scaledl_lab.training.profile`); :func:`profiler_bars` reads it back into the same bars:
the operators of the thread that ran the step are compute, the backend's ``gloo:``/``nccl:``
work on its threads is communication.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

# Each sim bar's thread in its rank's process: the worker, or the background transfers.
WORKER_TID, BACKGROUND_TID = 0, 1
COLOURS = {"compute": "C0", "comm": "C3", "overlapped": "C2", "idle": "0.8"}
COMM_PREFIXES = ("gloo:", "nccl:", "ncclDevKernel", "ncclKernel")
OP_GAP_S = 50e-6  # operators of one thread closer than this are one stretch of compute


def step_window(frame: pd.DataFrame, step: int, rank: int) -> tuple[float, float]:
    """When ``rank`` ran training step ``step`` (1-based, the metrics' ``step``): from the end
    of the step before it (its train row, or the evaluation logged after it) to its own train
    row. A step the run did not take is refused by name."""
    train = frame[frame["kind"] == "train"]
    mine = train[train["rank"] == rank]
    if mine.empty:
        raise ValueError(f"rank {rank} logged no training step")
    steps = mine["step"].astype(int)
    if step not in set(steps):
        raise ValueError(
            f"step {step} is not a training step of this run: rank {rank} took steps "
            f"{steps.min()} to {steps.max()}"
        )
    end = float(mine.loc[steps == step, "time"].iloc[0])
    before = pd.concat(
        [mine[steps == step - 1], frame[(frame["kind"] != "train") & (frame["step"] == step - 1)]]
    )
    before = before[before["time"] <= end]
    return (float(before["time"].max()) if len(before) else 0.0), end


def step_timeline(timeline: pd.DataFrame, frame: pd.DataFrame, step: int) -> pd.DataFrame:
    """The timeline's bars of training step ``step``, every rank's cut to its window; times
    from the earliest rank's start of the step (seconds)."""
    if timeline.empty:
        raise ValueError("the timeline is empty: only simulated runs record events")
    parts = []
    for rank in sorted(timeline["rank"].unique()):
        start, end = step_window(frame, step, int(rank))
        bars = timeline[(timeline["rank"] == rank) & (timeline["end"] > start)]
        bars = bars[bars["start"] < end]
        clipped = {"start": bars["start"].clip(lower=start), "end": bars["end"].clip(upper=end)}
        parts.append(bars.assign(**clipped))
    bars = pd.concat(parts, ignore_index=True)
    origin = bars["start"].min()
    return bars.assign(start=bars["start"] - origin, end=bars["end"] - origin)


def sim_trace(
    timeline: pd.DataFrame, frame: pd.DataFrame, step: int, *, label: str = "simulated run"
) -> dict[str, Any]:
    """Training step ``step`` of a simulated run as a Chrome trace: ``{"traceEvents": [...]}``
    with one complete event (``"ph": "X"``, microseconds) per bar, process ``rank``, thread 0
    the worker (compute, comm, idle) and thread 1 the transfers hidden behind compute."""
    bars = step_timeline(timeline, frame, step)
    events: list[dict[str, Any]] = []
    for rank in sorted(bars["rank"].unique()):
        events += [
            _meta("process_name", int(rank), 0, f"rank {rank} ({label})"),
            _meta("thread_name", int(rank), WORKER_TID, "worker"),
            _meta("thread_name", int(rank), BACKGROUND_TID, "background allreduce"),
        ]
    for bar in bars.itertuples(index=False):
        tid = BACKGROUND_TID if bar.kind == "overlapped" else WORKER_TID
        events.append(
            {
                "name": str(bar.kind),
                "cat": str(bar.kind),
                "ph": "X",
                "ts": bar.start * 1e6,
                "dur": (bar.end - bar.start) * 1e6,
                "pid": int(bar.rank),
                "tid": tid,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"step": step}}


def _meta(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def write_trace(trace: dict[str, Any] | str, path: str | Path) -> Path:
    """``trace`` (a dict, or a profiler's JSON text) to ``path``; returned."""
    path = Path(path)
    path.write_text(trace if isinstance(trace, str) else json.dumps(trace))
    return path


def load_trace(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def profiler_bars(trace: dict[str, Any] | str, rank: int) -> pd.DataFrame:
    """A ``torch.profiler`` Chrome trace of one rank's step as the simulator's bars (rank, kind,
    start, end; seconds from the trace's first event): the top-level operators of the thread
    that ran the most of them are ``compute`` (overlapping ones merged); the backend's
    collectives, on its own threads, are ``overlapped`` while compute runs and ``comm`` when
    nothing else does."""
    trace = json.loads(trace) if isinstance(trace, str) else trace
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    if not ops:
        raise ValueError("the trace holds no complete events")
    origin = min(float(e["ts"]) for e in ops)
    sent = [e for e in ops if str(e["name"]).startswith(COMM_PREFIXES)]
    cpu = [e for e in ops if e.get("cat") == "cpu_op" and e not in sent]
    threads = pd.Series([e["tid"] for e in cpu], dtype=object).value_counts()
    main = [e for e in cpu if len(threads) and e["tid"] == threads.index[0]]
    compute = _merged(main, origin, gap_s=OP_GAP_S)
    rows = [(rank, "compute", s, e) for s, e in compute]
    for s, e in _merged(sent, origin):
        hidden = [(max(s, cs), min(e, ce)) for cs, ce in compute if min(e, ce) > max(s, cs)]
        rows += [(rank, "overlapped", hs, he) for hs, he in hidden]
        edges = [s] + [x for span in hidden for x in span] + [e]  # the gaps between them
        gaps = zip(edges[::2], edges[1::2], strict=True)
        rows += [(rank, "comm", a, b) for a, b in gaps if b > a]
    return pd.DataFrame(rows, columns=["rank", "kind", "start", "end"])


def _merged(
    events: list[dict[str, Any]], origin: float, gap_s: float = 0.0
) -> list[tuple[float, float]]:
    """The union of the events' intervals, in seconds from ``origin``, closing gaps of at most
    ``gap_s`` (the interpreter's time between two operators of one computation)."""
    spans = sorted(((e["ts"] - origin) * 1e-6, (e["ts"] + e["dur"] - origin) * 1e-6)
                   for e in events)  # fmt: skip
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + gap_s:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_share(bars: pd.DataFrame) -> float:
    """The share of the step's communication time that ran behind compute (every rank):
    ``overlapped`` over ``overlapped`` + ``comm``, in either kind of trace."""
    span = (bars["end"] - bars["start"]).groupby(bars["kind"]).sum()
    total = span.get("comm", 0.0) + span.get("overlapped", 0.0)
    return float(span.get("overlapped", 0.0) / total) if total > 0 else 0.0


def plot_step_traces(panels: dict[str, pd.DataFrame], *, title: str | None = None) -> Any:
    """One Gantt chart per trace, side by side (a matplotlib ``Figure``): each rank's compute
    on one lane and its communication below it, the part of a transfer hidden behind compute
    hatched in green."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(6.5 * len(panels), 0.9 + 0.9 * _ranks(panels)), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, bars) in zip(axes, panels.items(), strict=True):
        ranks = sorted(bars["rank"].unique())
        labels = []
        for i, rank in enumerate(ranks):
            mine = bars[bars["rank"] == rank]
            lanes = {"compute": 2 * i, "idle": 2 * i, "comm": 2 * i + 1, "overlapped": 2 * i + 1}
            for bar in mine.itertuples(index=False):
                ax.broken_barh(
                    [(bar.start * 1e3, (bar.end - bar.start) * 1e3)],
                    (lanes[bar.kind] - 0.4, 0.8),
                    facecolors=COLOURS[bar.kind],
                    hatch="//" if bar.kind == "overlapped" else None,
                    edgecolor="k" if bar.kind == "overlapped" else "none",
                    linewidth=0.3,
                )
            labels += [f"rank {rank} compute", f"rank {rank} comm"]
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set(xlabel="time in the step (ms)", title=name)
        ax.grid(axis="x", alpha=0.3)
    fig.legend(
        handles=[
            Patch(facecolor=COLOURS[k], label=k, hatch="//" if k == "overlapped" else None)
            for k in ("compute", "comm", "overlapped", "idle")
        ],  # fmt: skip
        loc="outside lower center",
        ncols=4,
    )
    if title:
        fig.suptitle(title)
    return fig


def _ranks(panels: dict[str, pd.DataFrame]) -> int:
    return max(len(bars["rank"].unique()) for bars in panels.values())


def run_traces(results: Any, run: str | None = None) -> dict[str, Any]:
    """The traces ``profile_step`` recorded of ``run`` (the first by default) in ``results``
    (a ``Results``), by file name: a simulated run's step, every rank in one
    (``trace-RUN.json``); a Dask run's ``torch.profiler`` trace of each rank
    (``trace-RUN-rankR.json``, its JSON text)."""
    run = run or results.configs[0].label
    step = next(c for c in results.configs if c.label == run.split("#")[0]).profile_step
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in run)
    if step is None:
        return {}
    if run in results.timelines:
        frame = results.frame[results.frame["run"] == run]
        return {f"trace-{name}.json": sim_trace(results.timeline(run), frame, step, label=run)}
    ranks = results.outputs.get(run, [])
    return {f"trace-{name}-rank{r}.json": o["trace"] for r, o in enumerate(ranks) if "trace" in o}


def save_traces(results: Any, out: Path) -> list[Path]:
    """Every run's :func:`run_traces` into the results folder ``out``; the files written."""
    runs = sorted(results.outputs.keys() | results.timelines.keys())
    return [write_trace(t, out / n) for run in runs for n, t in run_traces(results, run).items()]
