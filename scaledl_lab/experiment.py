"""Run one config or a comparison; collect the tidy metrics table; save and load results."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from . import folders
from .config import ExperimentConfig, check_resources
from .environment import environment_info
from .errors import ConfigError, Interrupt, RunError
from .metrics import METRIC_COLUMNS, events_frame, is_event, to_frame
from .strategies.launch import RowsCallback, check_data, check_program
from .strategies.launch import execute as execute_run
from .training import whole_model
from .training.checkpoint import Writer, is_checkpoint, kept_rows, left_on_disk
from .training.worker import Program, steps_per_epoch_of, total_steps
from .viz.trace import save_traces

__all__ = [
    "METRIC_COLUMNS",
    "Results",
    "compare",
    "environment_info",
    "run",
    "to_frame",
    "total_steps",
]


@dataclass
class Results:
    """The outcome of one or more runs: the metrics table plus what each run returned."""

    frame: pd.DataFrame
    configs: list[ExperimentConfig]
    outputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    out_dir: Path | None = None
    timelines: dict[str, list[Any]] = field(default_factory=dict)  # sim runs: sim.scheduler.Event
    events: pd.DataFrame = field(default_factory=lambda: events_frame([]))  # pipelines

    def timeline(self, run: str | None = None) -> pd.DataFrame:
        """A sim run's per-worker events (rank, kind, start, end) as a table."""
        run = run or self.configs[0].label
        return pd.DataFrame(
            [vars(e) for e in self.timelines[run]], columns=["rank", "kind", "start", "end"]
        )

    def state_dict(self, run: str | None = None, rank: int = 0) -> dict[str, Any]:
        """What ``rank`` in ``run`` (the only run when omitted) held at the end: a pipeline
        stage's layers, say (the whole model: :meth:`model_state_dict`)."""
        run = run or self.configs[0].label
        return whole_model.held(self.outputs.get(run, []), rank, run)

    def model_state_dict(self, run: str | None = None, replica: int = 0) -> dict[str, Any]:
        """The whole trained model of ``run``'s ``replica``, by the unsplit model's own names,
        shapes and dtypes (``build_model(...).load_state_dict`` takes it): the parts its ranks
        hold joined (:mod:`scaledl_lab.training.whole_model`: stages, slices, shards; where
        workers train models of their own, replica r is worker r's). A results folder keeps
        replica 0's. An error says what is missing."""
        run = run or self.configs[0].label
        return whole_model.whole(self._config(run), self.outputs.get(run, []), replica, run)

    def plot(self, metric: str = "accuracy", x: str = "epoch", kind: str = "test", **kwargs: Any):
        from .viz import plots

        return plots.plot_curves(self.frame, metric=metric, x=x, kind=kind, **kwargs)

    def summary(self) -> pd.DataFrame:
        from .viz import plots

        return plots.summary_table(self.frame, self.configs)

    def warnings(self) -> list[str]:
        """Runs that ended near chance or whose loss exploded, each with its likely cause."""
        from .training.health import run_warnings

        return run_warnings(self.summary(), self.configs)

    def save(self, out_dir: str | os.PathLike[str], *, figures: bool = True) -> Path:
        """Write metrics.csv/.parquet, config.json, PNG plots (``figures``) and summary.md."""
        from .training.ledger import memory_markdown
        from .viz import plots
        from .viz.text import generation_markdown

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.frame.to_csv(out / "metrics.csv", index=False)
        self.frame.to_parquet(out / "metrics.parquet", index=False)
        write_config(out, self.configs)
        if figures:
            plots.save_standard_plots(self.frame, out)
        text = "# scaledl_lab results\n\n" + plots.summary_markdown(self.frame, self.configs) + "\n"
        warnings = self.warnings()
        if warnings:
            text += "\n## Warnings\n\n" + "".join(f"- {w}\n" for w in warnings)
        text += memory_markdown(self.frame) + generation_markdown(self)
        if len(self.events):
            text += self._save_pipeline(out)
        save_traces(self, out)  # --profile-step K: its step as Chrome traces
        (out / "summary.md").write_text(text)
        self.save_weights(out)
        self.out_dir = out
        return out

    def weights(self, run: str | None = None) -> dict[str, Any]:
        """A run's final model as its ranks returned it: replica 0's parts joined, in the unsplit
        model's order (:meth:`model_state_dict` also checks that they are the whole model)."""
        run = run or self.configs[0].label
        return whole_model.parts(self._config(run), self.outputs.get(run, []))

    def _config(self, run: str) -> ExperimentConfig:
        return dict(zip(_unique_labels(self.configs), self.configs, strict=True))[run]

    def save_weights(self, out: str | os.PathLike[str]) -> None:
        """weights.pt: each run's final model (what ``scaledl-lab analyse`` and
        :meth:`model_state_dict` read back)."""
        import torch

        saved = {run: state for run in self.outputs if (state := self.weights(run))}
        if saved:
            torch.save(saved, Path(out) / "weights.pt")

    def sharpness(self, runs: Sequence[str] | None = None, **options: Any) -> pd.DataFrame:
        """Sharpness and generalisation gap of each run's final model (see
        :func:`scaledl_lab.strategies.large_batch.sharpness.analyse`)."""
        from .strategies.large_batch.sharpness import analyse

        return analyse(self, runs, **options)

    def _save_pipeline(self, out: Path) -> str:
        """events.csv, a Gantt chart per pipeline run, and the summary's pipeline section."""
        import matplotlib.pyplot as plt

        from .viz import gantt

        self.events.to_csv(out / "events.csv", index=False)
        for run in self.events["run"].unique():
            ax = gantt.plot_pipeline(self.events, run)
            ax.figure.savefig(out / f"pipeline_{_file_name(run)}.png", dpi=100)
            plt.close(ax.figure)
        summary = gantt.summary_markdown(self.events, self.outputs, self.configs)
        return "\n## Pipeline schedule\n\n" + summary

    @classmethod
    def load(cls, out_dir: str | os.PathLike[str]) -> Results:
        out = Path(out_dir)
        frame = pd.read_csv(out / "metrics.csv")
        meta = json.loads((out / "config.json").read_text())
        configs = [ExperimentConfig.from_dict(c) for c in meta["runs"]]
        path = out / "events.csv"
        events = pd.read_csv(path) if path.exists() else events_frame([])
        outputs: dict[str, list[dict[str, Any]]] = {}
        if (out / "weights.pt").exists():
            import torch

            saved = torch.load(out / "weights.pt", weights_only=True)
            outputs = {run: [{"state_dict": state}] for run, state in saved.items()}
        return cls(frame=frame, configs=configs, outputs=outputs, out_dir=out, events=events)


def write_config(out: Path, configs: Sequence[ExperimentConfig]) -> None:
    """config.json: the exact configs, package versions and machine."""
    meta = {"runs": [c.to_dict() for c in configs], "environment": environment_info()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(meta, indent=2, default=str))


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def _unique_labels(configs: Sequence[ExperimentConfig]) -> list[str]:
    labels: list[str] = []
    for cfg in configs:
        label, n = cfg.label, 2
        while label in labels:
            label, n = f"{cfg.label}#{n}", n + 1
        labels.append(label)
    return labels


def compare(
    configs: Sequence[ExperimentConfig],
    *,
    address: str | None = None,
    client: Any = None,
    out: str | os.PathLike[str] | None = None,
    progress: bool = True,
    on_rows: RowsCallback | None = None,
    log: Callable[[str], None] | None = print,
    security: Any = None,
    resume: int | None = None,
    weights: bool = True,
    figures: bool = True,
    strategy: Program | None = None,
    overwrite: bool = False,
) -> Results:
    """Run several configs one after another on one cluster; one results table for all.

    Every config is validated and its data located before any cluster starts. ``security``:
    Dask's ``Security`` for a ``tls://`` ``address`` (see
    :func:`scaledl_lab.runtime.dask.cluster.connect`).
    ``resume`` (:func:`scaledl_lab.resume.resume`): one config continues from the
    checkpoint of that step in ``out`` (each rank reads its own file there), its rows appended
    to the table. ``weights=False`` keeps no run's final model (a sweep of large models then
    holds only its tables: ``model_state_dict`` and ``state_dict`` say so, ``sharpness`` fails);
    ``figures=False`` writes ``out`` without its PNGs (a folder to resume or for a script).

    ``strategy``: a per-worker program of your own (``async def train(ctx)``, e.g. written in a
    notebook) that every config runs instead of its named strategy's; the config's ``strategy``
    still names the family whose defaults and checks apply (say ``"allreduce"`` for a
    synchronous data-parallel program) and ``name`` labels the run. Both runtimes run it: the
    simulator calls it in this process, Dask ships it to the workers with cloudpickle (which
    pickles a notebook's functions by value).

    ``out`` (:mod:`scaledl_lab.folders`): an existing non-empty folder is refused unless
    ``overwrite``; the run writes into ``<out>.partial-<time>`` beside it, renamed ``out`` when
    the run ends (the old folder goes only then); a run that fails or is interrupted leaves it
    there, and its error names it. A resumed run appends to its own folder in place.
    """
    from .runtime.dask.cluster import connect

    configs = list(configs)
    if not configs:
        raise ValueError("compare() needs at least one config")
    check_program(strategy)
    for cfg in configs:
        if address is None and client is None:
            check_resources(cfg)
        check_data(cfg)
    labels = _unique_labels(configs)
    target = Path(out) if out is not None else None
    saving = [c for c in configs if c.checkpoint_every is not None]
    if saving and (target is None or len(configs) > 1):
        raise ConfigError("checkpoint_every needs one run and a results folder (out=...)")
    staging: Any = contextlib.nullcontext(target)  # none, or a resumed run's own folder
    if target is not None and resume is None:
        staging = folders.staged(target, overwrite=overwrite)
    with staging as out_dir:
        rows: list[dict[str, Any]] = []
        offset = 0.0  # a resumed run's wall-clock rows go on from the kept rows' end (simulated
        if resume is not None and out_dir is not None:  # ranks: from their checkpointed clocks)
            rows, end = kept_rows(out_dir, resume)
            offset = 0.0 if configs[0].runtime == "sim" else end
        writer = Writer(out_dir, saving[0].workers, offset) if saving and out_dir else None
        # a run that stops early still leaves its config beside its metrics
        append = None
        if out_dir:
            started = functools.partial(write_config, out_dir, configs)
            append = folders.MetricsFile(out_dir / "metrics.csv", started)
            if resume is not None:  # its table restarts from the rows it keeps
                (out_dir / "metrics.csv").unlink(missing_ok=True)
        if append and rows:
            append(rows)
        events: list[dict[str, Any]] = []
        outputs: dict[str, list[dict[str, Any]]] = {}
        timelines: dict[str, list[Any]] = {}

        def execute(client: Any) -> None:
            for cfg, label in zip(configs, labels, strict=False):
                bar = _progress_bar(cfg, label) if progress else None

                per_epoch = steps_per_epoch_of(cfg) if bar is not None else 0

                def collect(
                    batch: list[dict[str, Any]], bar: Any = bar, per_epoch: int = per_epoch
                ) -> None:
                    Interrupt.check()  # a Ctrl-C that a finalizer swallowed (the CLI's)
                    if any(is_event(r) for r in batch):
                        events.extend(r for r in batch if is_event(r))
                        batch = [r for r in batch if not is_event(r)]
                    if any(is_checkpoint(r) for r in batch):
                        for r in batch:
                            if is_checkpoint(r) and writer is not None:
                                writer(r)
                        batch = [r for r in batch if not is_checkpoint(r)]
                    for r in batch:
                        r["time"] += offset
                        if r["kind"] == "worker-lost" and writer is not None:
                            writer.lose(int(r["rank"]))
                    rows.extend(batch)
                    if append:
                        append(batch)
                    if bar is not None:
                        # Progress in epochs (global progress for asynchronous methods, where
                        # ranks take different numbers of steps), shown in steps per worker.
                        epochs = [r["epoch"] for r in batch if r["kind"] == "train"]
                        if epochs:
                            done = min(round(max(epochs) * per_epoch), bar.total)
                            bar.update(max(0, done - bar.n))
                    if on_rows:
                        on_rows(batch)

                try:
                    point = (str(out_dir.resolve()), resume) if resume is not None else None
                    outcome = execute_run(
                        cfg, label, collect, client=client, program=strategy, resume=point
                    )
                    outputs[label] = [
                        o if weights else {k: v for k, v in o.items() if k != "state_dict"}
                        for o in outcome.results
                    ]
                    if outcome.events is not None:
                        timelines[label] = outcome.events
                except RunError as exc:
                    raise type(exc)(f"{exc}{left_on_disk(out_dir)}") from exc
                finally:
                    if bar is not None:
                        bar.close()

        if client is not None or all(c.runtime == "sim" for c in configs):
            execute(client)
        else:
            # Only the real runs need processes: sim workers all live in this one.
            real = max(c.workers for c in configs if c.runtime != "sim")
            with connect(real, address, log=log, security=security) as own_client:
                execute(own_client)
        results = Results(
            frame=to_frame(rows),
            configs=configs,
            outputs=outputs,
            timelines=timelines,
            events=events_frame(events),
        )
        if out_dir:
            results.save(out_dir, figures=figures)
    results.out_dir = target
    return results


def run(config: ExperimentConfig, **kwargs: Any) -> Results:
    """Run one config (see :func:`compare` for the keyword arguments; ``strategy=fn`` runs a
    per-worker program of your own instead of the config's strategy)."""
    return compare([config], **kwargs)


def _progress_bar(cfg: ExperimentConfig, label: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total_steps(cfg), desc=label, unit="step", leave=True)
