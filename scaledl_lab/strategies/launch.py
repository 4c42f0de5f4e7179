"""Hand one config's strategy to a runtime, and turn what the runtime reports into rows.

The runtimes run a :class:`~scaledl_lab.runtime.base.Launch` and know nothing of strategies,
configs or the metrics table; this is where those meet: the strategy's program is bound to the
config (:class:`BoundProgram`), its servers become factories, the sim gets its cost model, and
server counters and lost workers become ``server``/``worker-lost`` rows. It sits beside the
registry, above every family: a strategy is looked up here once the package has imported them
all.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ExperimentConfig
from ..errors import ConfigError
from ..metrics import Row, record
from ..models import model_flops
from ..runtime.base import Comm, Emit, Launch, Outcome
from ..runtime.sim.cost import Stragglers, build_cost_model
from ..training.checkpoint import load_rank, load_servers
from ..training.faults import check_fault_steps
from ..training.profile import check_profile_step
from ..training.worker import Program, WorkerContext, load_for, total_steps
from .large_batch.checks import check_data as check_large_batch_data
from .registry import Strategy, get_strategy

RowsCallback = Callable[[list[dict[str, Any]]], None]


@dataclass(frozen=True)
class BoundProgram:
    """A strategy's program bound to a run: what a runtime calls on every rank."""

    program: Program
    config: ExperimentConfig
    run_label: str
    resume: tuple[str, int] | None = None  # (results folder, step): continue a checkpoint

    def prepare(self) -> None:
        load_for(self.config)

    async def __call__(self, comm: Comm, device: torch.device, emit: Emit) -> dict[str, Any]:
        data = load_for(self.config).to(device)  # a GPU worker's data goes there once
        ctx = WorkerContext(self.config, comm, data, device, emit, self.run_label)
        if self.resume is not None:  # each rank reads its own state where it runs
            ctx.resume = load_rank(*self.resume, comm.rank)
            comm.restore_clock(ctx.resume["clock"])
        await self.program(ctx)
        return ctx.result


def launch_for(
    cfg: ExperimentConfig,
    run_label: str,
    program: Strategy | Program | None = None,
    resume: tuple[str, int] | None = None,
) -> Launch:
    """The Launch of ``cfg``: its strategy, or ``program`` instead (a Strategy with its servers,
    or a bare per-worker program with none; benchmarks and tests run their own this way);
    ``resume``: (results folder, step) of the checkpoint to continue from."""
    if program is None:
        strategy = get_strategy(cfg.strategy)
    elif isinstance(program, Strategy):
        strategy = program
    else:
        strategy = Strategy(cfg.strategy, program, "a program given by the caller")
    spec = strategy.servers
    count = spec.count(cfg) if spec is not None else 0
    saved = load_servers(*resume) if resume and count else [None] * count
    return Launch(
        program=BoundProgram(strategy.program, cfg, run_label, resume),
        world_size=cfg.workers,
        label=run_label,
        servers=tuple(functools.partial(_server, spec, cfg, i, saved[i]) for i in range(count)),
        tolerates_worker_loss=strategy.survives_worker_loss(cfg),
        device=cfg.device,
        timeout_s=cfg.timeout_s,
        stragglers=Stragglers.parse(cfg.stragglers, seed=cfg.seed) if cfg.stragglers else None,
        server_transport=cfg.server_transport,
    )


def _server(spec: Any, cfg: ExperimentConfig, index: int, state: Any) -> Any:
    """Server ``index`` of ``cfg``, given back its checkpointed ``state`` if there is one."""
    server = spec.create(cfg, index)
    if state is not None:
        server.restore(state)
    return server


def execute(
    cfg: ExperimentConfig,
    run_label: str,
    on_rows: RowsCallback,
    *,
    client: Any = None,
    program: Strategy | Program | None = None,
    resume: tuple[str, int] | None = None,
) -> Outcome:
    """Run ``cfg`` on its runtime (``client``: the Dask cluster for real runs; ``resume``:
    the results folder and step of the checkpoint to continue from)."""
    launch = launch_for(cfg, run_label, program, resume)
    if cfg.runtime == "sim":
        from ..runtime.sim.scheduler import run_sim

        data = load_for(cfg)
        cost = build_cost_model(cfg, model_flops(cfg.model, data.input_shape, data.num_classes))
        outcome = run_sim(launch, cost, on_rows)
    else:
        from ..runtime.dask.driver import run_dask

        def on_lost(rank: int, at: float) -> None:
            on_rows(
                [
                    _row(
                        cfg,
                        run_label,
                        rank,
                        Row(kind="worker-lost", epoch=math.nan, step=-1, time=at),
                    )
                ]
            )

        outcome = run_dask(client, launch, on_rows, on_lost)
    if outcome.server_stats:
        on_rows(server_rows(cfg, run_label, outcome.server_stats, outcome.end_time))
    return outcome


def _row(cfg: ExperimentConfig, run_label: str, rank: int, row: Row) -> dict[str, Any]:
    return record(
        row,
        run=run_label,
        strategy=cfg.strategy,
        runtime=cfg.runtime,
        world_size=cfg.workers,
        rank=rank,
    )


def server_rows(
    cfg: ExperimentConfig, run_label: str, stats: list[dict[str, int]], time: float
) -> list[dict[str, Any]]:
    """One ``kind="server"`` row per hosted server (rank = workers + index): the calls it
    served, the bytes it sent and the bytes it received."""
    return [
        _row(
            cfg,
            run_label,
            cfg.workers + i,
            Row(
                kind="server",
                epoch=float(cfg.epochs),
                step=-1,
                time=time,
                bytes_sent=int(s["bytes_out"]),
                bytes_received=int(s["bytes_in"]),
                calls=int(s["calls"]),
            ),
        )
        for i, s in enumerate(stats)
    ]


def check_data(cfg: ExperimentConfig) -> None:
    """Locate the data (a missing dataset fails with the fetch instructions) and check that
    every replica (every worker, without model splits) gets at least one full batch."""
    n = len(load_for(cfg).train)
    if cfg.workers > n:
        raise ConfigError(
            f"workers={cfg.workers} exceeds the {n} training samples of "
            f"{cfg.dataset}: every worker needs a shard"
        )
    shards = cfg.replicas  # the workers that split one model share its shard
    if n // shards < cfg.batch_size:
        who = "workers" if shards == cfg.workers else "replicas"
        raise ConfigError(
            f"each of the {shards} {who} gets {n // shards} training "
            f"samples, fewer than batch_size={cfg.batch_size}; use a smaller "
            f"batch, fewer {who} or more data"
        )
    check_large_batch_data(cfg, n)  # batch schedules, warmup and milestones against the data
    steps = total_steps(cfg)
    check_fault_steps(cfg.faults, cfg.workers, steps)
    check_profile_step(cfg, steps)  # --profile-step K: a step the run takes


def check_program(program: Any) -> None:
    """A ConfigError unless ``program`` is None or an ``async def`` taking the worker's context."""
    if program is None:
        return
    if not inspect.iscoroutinefunction(program):
        raise ConfigError(
            f"strategy= takes the program one worker runs, an `async def train(ctx)`; got "
            f"{program!r}, which is not a coroutine function (a strategy's name goes in "
            "ExperimentConfig(strategy=...))"
        )
    try:
        inspect.signature(program).bind(None)
    except TypeError:
        raise ConfigError(
            f"strategy={program.__name__} must take one argument, the worker's context "
            f"(WorkerContext); its signature is {inspect.signature(program)}"
        ) from None
