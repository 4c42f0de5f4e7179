"""The whole model of a run, by the unsplit model's own ``state_dict()`` names: the parts its
ranks returned, joined.

Every program returns from each rank what it holds at the end under the unsplit model's names,
and each family's placement (:func:`scaledl_lab.families.placement`) says which ranks train one
replica; the parts of a replica then join by a union, whatever the strategy:

- data parallelism, ZeRO (stage 3 gathers its shards at the end), the parameter servers (every
  worker pulls the servers' final weights), EASGD (the centre), DiLoCo: every rank holds the
  whole model, and is a replica of its own;
- pipelines: each rank holds its stage's layers (interleaved: its chunks); a replica's stages
  together hold the model;
- tensor parallelism of the MLP: every rank holds the whole model, its slices put together at
  the end;
- the mesh (and gpt-tiny's tensor parallelism, the mesh ``tp=p``): rank 0 holds the whole
  model, gathered along every dimension; its other ranks none;
- workers that train models of their own (gossip, local SGD, NNT): replica ``r`` is worker
  ``r``'s model; they differ (a run's ``best_rank`` output names the best on validation).

Where ranks of one replica hold the same tensor, the lowest rank's is taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .. import families
from ..data import num_classes, sample_shape
from ..models import build_model

State = dict[str, torch.Tensor]


def unsplit_state(cfg: Any) -> State:
    """The run's model at its start, built whole in one process: the names, shapes and dtypes
    every joined model must have."""
    model = build_model(
        cfg.model, sample_shape(cfg.dataset), num_classes(cfg.dataset), seed=cfg.seed
    )
    return dict(families.prepare_model(cfg, model).to(cfg.dtype).state_dict())


def parts(cfg: Any, outputs: Sequence[Mapping[str, Any]], replica: int = 0) -> State:
    """The union of what the ranks of ``replica`` returned (``outputs``: one per rank), in the
    unsplit model's order; names it does not have come after."""
    joined = _union(cfg, outputs, replica)
    return _ordered(joined, unsplit_state(cfg)) if joined else joined


def whole(cfg: Any, outputs: Sequence[Mapping[str, Any]], replica: int, run: str) -> State:
    """Replica ``replica``'s whole model in ``run``; an error that says what is missing when
    its ranks returned none, or not all of it."""
    if not 0 <= replica < cfg.replicas:
        raise ValueError(
            f"run {run!r} trains {cfg.replicas} replica(s), numbered from 0: there is no "
            f"replica {replica}"
        )
    joined = _union(cfg, outputs, replica)
    if not joined:
        raise ValueError(
            f"run {run!r} kept no weights of replica {replica}: its ranks returned none (a run "
            "keeps none with weights=False; a results folder keeps replica 0's only, in "
            "weights.pt; a mesh returns replica 0's only)"
        )
    expected = unsplit_state(cfg)
    missing = [k for k in expected if k not in joined]
    unknown = [k for k in joined if k not in expected]
    wrong = [
        f"{k} {tuple(joined[k].shape)} {joined[k].dtype}"
        for k in expected
        if k in joined
        and (joined[k].shape, joined[k].dtype) != (expected[k].shape, expected[k].dtype)
    ]
    if missing or unknown or wrong:
        said = [
            f"{len(missing)} missing ({_some(missing)})" if missing else "",
            f"not the model's: {_some(unknown)}" if unknown else "",
            f"shape or dtype not the model's: {_some(wrong)}" if wrong else "",
        ]
        raise ValueError(
            f"run {run!r}: the ranks of replica {replica} returned {len(joined)} tensors, not "
            f"{cfg.model}'s {len(expected)}: " + "; ".join(s for s in said if s)
        )
    return _ordered(joined, expected)


def held(outputs: Sequence[Mapping[str, Any]], rank: int, run: str) -> State:
    """What ``rank`` returned in ``run``; an error where it kept nothing."""
    if 0 <= rank < len(outputs) and "state_dict" in outputs[rank]:
        return outputs[rank]["state_dict"]
    raise ValueError(
        f"run {run!r} kept no weights of rank {rank}: a run keeps every rank's unless "
        "weights=False; a results folder keeps only the whole model (model_state_dict())"
    )


def _union(cfg: Any, outputs: Sequence[Mapping[str, Any]], replica: int) -> State:
    joined: State = {}
    for rank, output in enumerate(outputs):
        if families.placement(cfg, rank)[1] == replica:
            for name, tensor in output.get("state_dict", {}).items():
                joined.setdefault(name, tensor)  # the lowest rank's
    return joined


def _ordered(joined: State, order: Mapping[str, Any]) -> State:
    return {**{k: joined[k] for k in order if k in joined}, **joined}


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
