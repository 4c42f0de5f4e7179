"""Config errors of the mesh, each naming the field, before any cluster starts: the mesh's
text, its product against the workers, and what each dimension must divide (gpt-tiny's heads
and width for ``tp``, its layers for ``pp`` times the virtual stages, the batch for the
micro-batches, gpt-tiny-moe's experts for ``ep``)."""

from __future__ import annotations

from typing import Any

from ... import families, gpt
from ...data.licenses import SEQUENCE
from ...errors import ConfigError, choices
from ..memory.checks import ELEMENTWISE_OPTIMIZERS
from .grid import Mesh
from .options import CP_METHODS, SCHEDULES, ZERO_STAGES


def mesh_of(cfg: Any) -> Mesh:
    return Mesh.parse(cfg.mesh)


def _mesh_or_none(cfg: Any) -> Mesh | None:
    """The mesh, or None while its text is wrong (:func:`check_mesh` then says why)."""
    try:
        return mesh_of(cfg)
    except ConfigError:
        return None


def placement(cfg: Any, rank: int) -> tuple[int, int]:
    """(ranks that share one replica: every dimension but ``dp``, ``rank``'s ``dp`` coordinate)."""
    mesh = _mesh_or_none(cfg)
    if mesh is None:
        return 1, rank
    data = mesh.size("dp") * mesh.size("ep")  # ep ranks are data ranks too
    replica = mesh.coordinate(rank, "dp") * mesh.size("ep") + mesh.coordinate(rank, "ep")
    return mesh.world_size // data, replica


def check_mesh(cfg: Any) -> None:
    if not families.has(cfg.strategy, "mesh"):
        defaults = (("mesh", None), ("zero_stage", 0), ("pipeline_schedule", "1f1b"))
        for name, default in (*defaults, ("cp_method", "ring")):
            if getattr(cfg, name) != default:
                raise ConfigError(
                    f"{name}={getattr(cfg, name)!r} applies only to strategy='mesh', not to "
                    f"strategy={cfg.strategy!r}"
                )
        return
    if cfg.mesh is None:
        raise ConfigError("strategy='mesh' needs mesh=..., its dimensions, e.g. 'dp=2,tp=2,pp=2'")
    mesh = mesh_of(cfg)
    if mesh.world_size != cfg.workers:
        raise ConfigError(
            f"mesh={cfg.mesh!r} has {mesh.world_size} ranks but workers={cfg.workers}; the "
            f"product of the mesh's sizes must equal the workers"
        )
    if cfg.model == "gpt-tiny-moe" or mesh.size("ep") > 1:
        check_ep(cfg, mesh)
    elif cfg.model != "gpt-tiny":
        raise ConfigError(
            f"strategy='mesh' splits gpt-tiny's blocks; model={cfg.model!r} is not supported, "
            "use model='gpt-tiny' (dataset='licenses')"
        )
    if cfg.zero_stage not in ZERO_STAGES:
        raise ConfigError(f"zero_stage={cfg.zero_stage!r} must be one of 0, 1, 2, 3")
    if cfg.pipeline_schedule not in SCHEDULES:
        raise ConfigError(
            f"pipeline_schedule={cfg.pipeline_schedule!r} must be one of {choices(SCHEDULES)}"
        )
    if cfg.optimizer not in ELEMENTWISE_OPTIMIZERS:
        raise ConfigError(
            f"optimizer={cfg.optimizer!r} scales each layer's step by the layer's norms, but "
            f"strategy='mesh' steps slices and flat shards of layers; use one of "
            f"{', '.join(ELEMENTWISE_OPTIMIZERS)}"
        )
    _check_tp(cfg, mesh.size("tp"))
    _check_pp(cfg, mesh.size("pp"))
    _check_cp(cfg, mesh)


def _check_tp(cfg: Any, tp: int) -> None:
    """``tp`` splits the heads (and so the width h = heads · d, and the sequence of 32, which
    every divisor of gpt-tiny's 4 heads divides: sequence parallelism needs nothing more)."""
    if gpt.HEADS % tp:
        raise ConfigError(
            f"mesh={cfg.mesh!r}: tp={tp} does not divide gpt-tiny's {gpt.HEADS} attention heads "
            f"(nor then its hidden width {gpt.HIDDEN}, as heads); choose a divisor of {gpt.HEADS}"
        )


def _check_pp(cfg: Any, pp: int) -> None:
    v, m = cfg.virtual_stages, cfg.micro_batches
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"virtual_stages={v!r} must be a positive integer")
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ConfigError(f"micro_batches={m!r} must be a positive integer")
    if v > 1 and (cfg.pipeline_schedule != "interleaved-1f1b" or pp < 2):
        raise ConfigError(
            f"virtual_stages={v} needs pipeline_schedule='interleaved-1f1b' and pp of at least 2 "
            f"(mesh={cfg.mesh!r}, pipeline_schedule={cfg.pipeline_schedule!r})"
        )
    layers = gpt.LAYERS + 2  # the embedding, the blocks, the head
    if layers % (pp * v):
        raise ConfigError(
            f"mesh={cfg.mesh!r}: pp={pp} × virtual_stages={v} = {pp * v} stages do not divide "
            f"gpt-tiny's {layers} layers (embedding, {gpt.LAYERS} blocks, head); every stage "
            "takes as many"
        )
    if cfg.batch_size % m:
        raise ConfigError(
            f"micro_batches={m} does not divide the per-replica batch_size={cfg.batch_size}; "
            f"choose a divisor of {cfg.batch_size}"
        )
    if v > 1 and m % pp:
        raise ConfigError(
            f"micro_batches={m} is not a multiple of pp={pp}: interleaved 1F1B sends "
            f"micro-batches through the chunks in groups of {pp}; choose a multiple of {pp}"
        )


def _check_cp(cfg: Any, mesh: Mesh) -> None:
    """``cp`` splits gpt-tiny's sequence (ring attention: into 2C zig-zag chunks; Ulysses: C,
    and C must divide each tp rank's heads); it composes with ``dp`` and ``tp``."""
    if cfg.cp_method not in CP_METHODS:
        raise ConfigError(f"cp_method={cfg.cp_method!r} must be one of {choices(CP_METHODS)}")
    if (cp := mesh.size("cp")) == 1:
        return
    for what, bad in (
        (f"pp={mesh.size('pp')}", mesh.size("pp") > 1),
        ("sequence_parallel=True", cfg.sequence_parallel),
        (f"zero_stage={cfg.zero_stage}", cfg.zero_stage != 0),
    ):
        if bad:
            raise ConfigError(
                f"mesh={cfg.mesh!r}: cp composes with dp and tp (zero_stage 0, no sequence "
                f"parallelism, pp=1) so far; {what} with cp={cp} is not supported"
            )
    chunks = 2 * cp if cfg.cp_method == "ring" else cp
    if SEQUENCE % chunks:
        raise ConfigError(
            f"mesh={cfg.mesh!r}: cp_method={cfg.cp_method!r} splits gpt-tiny's sequence of "
            f"{SEQUENCE} into {chunks} chunks"
            + (" (2C, the zig-zag split)" if cfg.cp_method == "ring" else "")
            + ", which do not divide it"
        )
    heads = gpt.HEADS // mesh.size("tp")
    if cfg.cp_method == "ulysses" and heads % cp:
        raise ConfigError(
            f"mesh={cfg.mesh!r}: Ulysses gives each cp rank H/C of its {heads} heads "
            f"(gpt-tiny's {gpt.HEADS} over tp={mesh.size('tp')}): cp={cp} does not divide "
            f"{heads}; use cp_method='ring'"
        )


def check_ep(cfg: Any, mesh: Mesh) -> None:
    """``ep`` spreads gpt-tiny-moe's experts over data ranks; it composes with ``dp`` (ZeRO
    stage 0, one micro-batch: the capacity and the aux loss count a worker's whole batch)."""
    ep = mesh.size("ep")
    if cfg.model != "gpt-tiny-moe":
        raise ConfigError(
            f"mesh={cfg.mesh!r}: ep={ep} spreads the experts of model='gpt-tiny-moe'; "
            f"model={cfg.model!r} has none"
        )
    others = [f"{n}={mesh.size(n)}" for n in ("tp", "pp", "cp") if mesh.size(n) > 1]
    for what, bad in (
        (", ".join(others), bool(others)),
        (f"zero_stage={cfg.zero_stage}", cfg.zero_stage != 0),
        (f"micro_batches={cfg.micro_batches}", cfg.micro_batches != 1),
        ("sequence_parallel=True", cfg.sequence_parallel),
    ):
        if bad:
            raise ConfigError(
                f"mesh={cfg.mesh!r}: gpt-tiny-moe on the mesh composes ep with dp (zero_stage 0, "
                f"micro_batches=1) so far; {what} is not supported"
            )
    if isinstance(cfg.experts, int) and cfg.experts % ep:
        raise ConfigError(
            f"mesh={cfg.mesh!r}: ep={ep} does not divide experts={cfg.experts}; every ep rank "
            f"holds as many experts: choose experts a multiple of {ep}"
        )
