"""The technique families' records: each family (a folder of :mod:`scaledl_lab.strategies`)
registers one :class:`Family` saying which strategies it holds, what they can do, the
optimiser they train best with, its options (a frozen dataclass whose fields carry their CLI
spelling, :func:`option`) and how they are checked, and what it changes in every worker's
model and optimiser. Code outside a family asks these records ("which strategies take a
topology?") instead of naming strategies; the checks of config fields no family owns (the cost
model's, faults, checkpoints) register here too (:func:`register_check`).

Imports only the contract's names and the errors, so that the config (which validates by
asking the records) and every layer above it may read them. The records are filled when
:mod:`scaledl_lab.strategies` is imported, which ``import scaledl_lab`` does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .contract import CONTRACT_STRATEGIES
from .errors import ConfigError

# What a strategy may be able to do; a record names, for each capability it uses, which of its
# strategies have it (``True``: all of them).
CAPABILITIES: dict[str, str] = {
    "takes_topology": "workers talk along a topology (topology=..., a ring by default)",
    "hosts_servers": "parameter servers hold the model as flat shards (servers=...)",
    "compressible": "messages carry gradients or updates, so compress=... applies",
    "sends_replica_update": "the gradient sent is a replica's whole update (DGC's momentum "
    "correction takes over the optimiser's momentum)",
    "splits_model": "the model itself is split over the workers",
    "pipeline": "the model is split into stages (stages, micro_batches, balance)",
    "interleaves": "a worker holds several model chunks of the pipeline (virtual_stages=V)",
    "slices_layers": "every layer is sliced over the workers (no rank holds a whole layer)",
    "accumulates": "accumulate=K micro-batches per update",
    "batch_schedule": "batch_schedule=... grows the batch during the run",
    "checkpointable": "every step ends where no message is in flight (checkpoint_every=...)",
    "mixed_precision": "precision=bfloat16|float16: each worker steps float32 master weights "
    "of its 16-bit model",
    "mesh": "the parallel dimensions composed on a mesh of ranks (mesh=dp=D,tp=T,pp=P)",
}
OPTIMISER_FIELDS = ("optimizer", "lr", "momentum", "weight_decay")
# Each optimiser's own setting: what a run that names one other than its strategy family's trains
# with, where it gives no rate, momentum or decay (momentum is SGD's and LARS's only).
OPTIMISER_DEFAULTS: dict[str, dict[str, Any]] = {
    "sgd": dict(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0),  # the lab's (DESIGN)
    "adam": dict(optimizer="adam", lr=1e-3, momentum=0.0, weight_decay=0.0),  # Kingma & Ba 2015
    "adamw": dict(optimizer="adamw", lr=1e-3, momentum=0.0, weight_decay=0.01),  # torch's
    "adagrad": dict(optimizer="adagrad", lr=0.01, momentum=0.0, weight_decay=0.0),  # torch's
    # The rate times the trust coefficient is each layer's step relative to its norm: 1% for
    # both, LARS's as in the large-batch study (lr 10, coefficient 0.001), LAMB's (coefficient 1)
    "lars": dict(optimizer="lars", lr=10.0, momentum=0.9, weight_decay=0.0),
    "lamb": dict(optimizer="lamb", lr=0.01, momentum=0.0, weight_decay=0.0),
}


def steps_or_text(text: str) -> int | str:
    """A flag that takes N steps or a text (``--checkpoint-every N|Nepochs``)."""
    return int(text) if text.strip().lstrip("-").isdigit() else text


def number_or_text(text: str) -> float | str:
    """A flag that takes a number or a word (``--loss-scale dynamic|N``)."""
    try:
        return float(text)
    except ValueError:
        return text


def option(
    help: str,
    *,
    flag: str | None = None,
    off_flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[str], Any] | None = None,
    const: Any = None,
) -> dict[str, Any]:
    """A config field's metadata: how it reads on the command line (``scaledl-lab run``).

    ``flag`` is its spelling (default ``--`` and the field's name with dashes). A boolean field
    is a switch: ``flag`` sets the opposite of its default (``--no-error-feedback``), and a
    field that defaults to None (on in a recipe) takes ``flag`` for True and ``off_flag`` for
    False. ``parse`` reads the text (default: the field's type, int or float or str);
    ``choices`` are shown as the metavar (the config's check says what is wrong with a value).
    ``const``: the flag alone gives this value, or it reads one (``--recompute [selective]``).
    """
    return dict(help=help, flag=flag, off_flag=off_flag, metavar=metavar, choices=choices,
                parse=parse, const=const)  # fmt: skip


def _no_check(cfg: Any) -> None:
    """A family without options of its own."""


@dataclass(frozen=True)
class OptimiserChanges:
    """What a family changes in every worker's optimiser (None: no change): no weight decay
    (nor trust ratio) on biases and BatchNorm, LARS/LAMB's trust coefficient, the momentum
    SGD steps with (DGC's momentum correction takes it over)."""

    no_bias_decay: bool | None = None
    trust_coefficient: float | None = None
    momentum: float | None = None

    def then(self, other: OptimiserChanges) -> OptimiserChanges:
        """These changes, with ``other``'s on top."""
        given = {k: v for k, v in dataclasses.asdict(other).items() if v is not None}
        return dataclasses.replace(self, **given)


@dataclass(frozen=True)
class OptimiserDefault:
    """The optimiser some of a family's strategies train with, and why the config's default
    (SGD 0.05, momentum 0.9) fails them: ``why(cfg, setting, flags)`` says it in words, given
    the run's setting and the CLI flags of this one."""

    strategies: tuple[str, ...]
    settings: Mapping[str, Any]
    why: Callable[[Any, str, str], str]

    def __post_init__(self) -> None:
        if set(self.settings) != set(OPTIMISER_FIELDS):
            raise ValueError(f"optimiser defaults set exactly {OPTIMISER_FIELDS}")


@dataclass(frozen=True)
class Family:
    """One technique family: its strategies (name → one-line description), its capabilities
    (capability → which of its strategies have it), its optimiser defaults, its options and
    ``check(cfg)``, and what it changes in every worker's model and optimiser.

    ``options`` is a frozen dataclass in the family's folder, one field per option with its
    default and its :func:`option` metadata: the config takes its fields as its own
    (``ExperimentConfig(servers=2)``, ``cfg.servers``) and ``scaledl-lab run`` has a flag for
    each. ``check`` runs on every config (a family checks its options wherever they are set,
    and the constraints of its own strategies). ``prepare_model(cfg, model)`` and
    ``optimiser_changes(cfg)`` are asked by the loop on every worker and in the sequential
    twins. A family with no strategies (large batches, compression) changes how the others
    train: only its options, its check and its changes count. ``placement(cfg, rank)``: as
    :func:`placement`, where replicas are not runs of consecutive ranks (a mesh's).
    """

    name: str  # its folder below scaledl_lab/strategies
    summary: str
    strategies: Mapping[str, str]  # kept in the contract's order
    capabilities: Mapping[str, tuple[str, ...] | bool] = field(default_factory=dict)
    optimisers: tuple[OptimiserDefault, ...] = ()
    check: Callable[[Any], None] = _no_check
    options: type | None = None
    prepare_model: Callable[[Any, Any], Any] | None = None
    optimiser_changes: Callable[[Any], OptimiserChanges] | None = None
    placement: Callable[[Any, int], tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.options is not None and not (
            dataclasses.is_dataclass(self.options) and self.options.__dataclass_params__.frozen
        ):
            raise ValueError(f"family {self.name!r}: options must be a frozen dataclass")
        names = tuple(self.strategies)
        caps: dict[str, tuple[str, ...]] = {}
        for cap, which in self.capabilities.items():
            if cap not in CAPABILITIES:
                raise ValueError(f"family {self.name!r}: unknown capability {cap!r}")
            which = names if which is True else tuple(which or ())
            if not set(which) <= set(names):
                raise ValueError(f"family {self.name!r}: {cap} names strategies not its own")
            caps[cap] = which
        for default in self.optimisers:
            if not set(default.strategies) <= set(names):
                raise ValueError(f"family {self.name!r}: optimiser defaults of other strategies")
        ordered = {n: self.strategies[n] for n in _contract_order(names)}
        object.__setattr__(self, "strategies", MappingProxyType(ordered))
        options = dataclasses.fields(self.options) if self.options else ()
        object.__setattr__(self, "_option_names", tuple(f.name for f in options))
        object.__setattr__(self, "capabilities", MappingProxyType(caps))

    def has(self, strategy: str, capability: str) -> bool:
        return strategy in self.capabilities.get(capability, ())

    def option_names(self) -> tuple[str, ...]:
        """The config fields this family's options add."""
        return self.__dict__["_option_names"]


FAMILIES: dict[str, Family] = {}
_OF: dict[str, Family] = {}  # strategy name → its family
_CHECKS: list[Callable[[Any], None]] = []  # the checks of fields no family owns (faults, ...)
_ORDERED: dict[tuple[int, ...], tuple[Family, ...]] = {}  # families(), for the records now held


def register_family(family: Family) -> Family:
    """Add ``family``'s record (once per family; a strategy belongs to one family)."""
    for name in family.strategies:
        owner = _OF.get(name)
        if owner is not None and owner.name != family.name:
            raise ValueError(f"strategy {name!r} is claimed by {owner.name!r} and {family.name!r}")
    for other in FAMILIES.values():
        shared = set(family.option_names()) & set(other.option_names())
        if other.name != family.name and shared:
            raise ValueError(
                f"options {sorted(shared)} are declared by {other.name!r} and {family.name!r}"
            )
    FAMILIES[family.name] = family
    _OF.update(dict.fromkeys(family.strategies, family))
    return family


def _contract_order(names: Any) -> tuple[str, ...]:
    rank = {n: i for i, n in enumerate(CONTRACT_STRATEGIES)}
    return tuple(sorted(names, key=lambda n: rank.get(n, len(rank))))


def families() -> tuple[Family, ...]:
    """Every record: the families with strategies in the contract's order, then those that
    register none (options on the others' strategies) by name. (Ordered once per set of
    records: every config asks.)"""
    key = tuple(map(id, FAMILIES.values()))
    if _ORDERED.get(key) is None:
        _ORDERED.clear()
        _ORDERED[key] = _ordered()
    return _ORDERED[key]


def _ordered() -> tuple[Family, ...]:
    own = [f for f in FAMILIES.values() if f.strategies]
    first = {f.name: _contract_order(f.strategies)[0] for f in own}
    own.sort(key=lambda f: CONTRACT_STRATEGIES.index(first[f.name]))
    rest = sorted((f for f in FAMILIES.values() if not f.strategies), key=lambda f: f.name)
    return (*own, *rest)


def strategies() -> tuple[str, ...]:
    """Every strategy some family holds, in the contract's order."""
    return _contract_order(_OF)


def family_of(strategy: str) -> Family:
    """The family holding ``strategy`` (a ConfigError if none does)."""
    try:
        return _OF[strategy]
    except KeyError:
        if not FAMILIES:
            raise ConfigError(
                f"strategy={strategy!r}: no family has registered yet; import scaledl_lab "
                "(which imports scaledl_lab.strategies) before building a config"
            ) from None
        raise ConfigError(f"strategy={strategy!r} belongs to no registered family") from None


def has(strategy: str, capability: str) -> bool:
    """Whether ``strategy`` has ``capability`` (a key of :data:`CAPABILITIES`)."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}")
    family = _OF.get(strategy)
    return family is not None and family.has(strategy, capability)


def with_capability(capability: str) -> tuple[str, ...]:
    """The strategies that have ``capability``, in the contract's order."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}")
    return _contract_order(n for f in FAMILIES.values() for n in f.capabilities.get(capability, ()))


def optimiser_default(strategy: str) -> OptimiserDefault | None:
    """The optimiser ``strategy``'s family trains it with, or None (the config's defaults)."""
    family = _OF.get(strategy)
    if family is None:
        return None
    return next((d for d in family.optimisers if strategy in d.strategies), None)


def optimiser_setting(strategy: str, optimizer: Any = None) -> dict[str, Any]:
    """The values a config's optimiser fields take when left out: the strategy family's setting
    (else SGD's own), unless the config names another optimiser, whose own setting applies."""
    family = optimiser_default(strategy)
    setting = dict(family.settings) if family is not None else dict(OPTIMISER_DEFAULTS["sgd"])
    if not isinstance(optimizer, str) or optimizer == setting["optimizer"]:
        return setting
    return dict(OPTIMISER_DEFAULTS.get(optimizer, setting))  # unknown: the config names it


def with_options() -> tuple[Family, ...]:
    """The families that declare options, in the order of :func:`families`."""
    return tuple(f for f in families() if f.options is not None)


def register_check(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """Add a config check of fields no family owns (the cost model's, faults, checkpoints):
    the layer that knows them registers it when imported (once: again is a no-op)."""
    if check not in _CHECKS:
        _CHECKS.append(check)
    return check


def check(cfg: Any) -> None:
    """Every family's check of ``cfg``, in the order of :func:`families`, then the registered
    checks of the fields no family owns, in the order they registered."""
    family_of(cfg.strategy)
    for family in families():
        family.check(cfg)
    for extra in _CHECKS:
        extra(cfg)


def check_finite(cfg: Any) -> None:
    """Every number a config field holds, the families' options among them, is finite: inf and
    NaN pass range checks written as comparisons (``inf > 0``). ``loss_scale``'s own check
    names its other value ('dynamic')."""
    for name, value in cfg.to_dict().items():
        if isinstance(value, float) and not math.isfinite(value) and name != "loss_scale":
            raise ConfigError(f"{name}={value!r} must be a finite number")


def prepare_model(cfg: Any, model: Any) -> Any:
    """``model`` as every family that changes a run's initial model has prepared it."""
    for family in families():
        if family.prepare_model is not None:
            model = family.prepare_model(cfg, model)
    return model


def placement(cfg: Any, rank: int = 0) -> tuple[int, int]:
    """(ranks that share one replica, the replica ``rank`` trains): the family's placement, or
    consecutive ranks, a pipeline's stages (every worker of a split model; else one) each."""
    family = _OF.get(cfg.strategy)
    if family is not None and family.placement is not None:
        return family.placement(cfg, rank)
    split = cfg.workers if has(cfg.strategy, "splits_model") else 1
    size = (cfg.stages or cfg.workers) if has(cfg.strategy, "pipeline") else split
    return size, rank // size


def optimiser_changes(cfg: Any) -> OptimiserChanges:
    """What the families change in a run's optimiser, one on top of the other."""
    changes = OptimiserChanges()
    for family in families():
        if family.optimiser_changes is not None:
            changes = changes.then(family.optimiser_changes(cfg))
    return changes
