"""Per-worker data shards (IID, or McMahan et al. 2017's label-skewed non-IID) and batch order.

Every function is pure: the same arguments give the same indices in every process, so each
worker computes its own shard and batch order without any communication.
"""

from __future__ import annotations

import hashlib

import torch

SHARDINGS = ("iid", "label-skew")


def _generator(*parts: int) -> torch.Generator:
    # A stable mix of the integers: Python's hash() is salted per process, and simple
    # arithmetic mixes such as seed + epoch collide (seed 1, epoch 0 == seed 0, epoch 1).
    digest = hashlib.sha256(":".join(str(int(p)) for p in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def shard_indices(
    labels: torch.Tensor,
    world_size: int,
    rank: int,
    *,
    scheme: str = "iid",
    seed: int = 0,
    classes_per_worker: int = 2,
) -> torch.Tensor:
    """Indices into the training set that worker ``rank`` of ``world_size`` trains on.

    ``iid``: a seeded permutation dealt round-robin, every shard cut to ``N // world_size``.
    ``label-skew`` (McMahan et al. 2017, "pathological non-IID"): indices sorted by label and
    cut into ``world_size * classes_per_worker`` equal chunks; each worker gets
    ``classes_per_worker`` chunks chosen by a seeded permutation, so it sees only about that
    many classes. All shards have the same length and are disjoint.
    """
    if scheme not in SHARDINGS:
        raise ValueError(f"unknown sharding scheme {scheme!r}; choose one of {SHARDINGS}")
    if labels.dim() != 1 and scheme != "iid":
        raise ValueError(
            f"{scheme} sharding needs one label per sample, got labels of shape "
            f"{tuple(labels.shape)} (next-token targets: use iid)"
        )
    n = int(labels.shape[0])
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if world_size > n:
        raise ValueError(f"world_size={world_size} exceeds the {n} samples to shard")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} out of range for world_size={world_size}")

    if scheme == "iid":
        perm = torch.randperm(n, generator=_generator(seed))
        return perm[rank::world_size][: n // world_size]

    if classes_per_worker < 1:
        raise ValueError(f"classes_per_worker must be >= 1, got {classes_per_worker}")
    num_chunks = world_size * classes_per_worker
    if num_chunks > n:
        raise ValueError(
            f"label-skew needs world_size*classes_per_worker={num_chunks} chunks "
            f"but there are only {n} samples"
        )
    chunk_len = n // num_chunks
    gen = _generator(seed)
    # Shuffle first so that the samples dropped to equalise chunk lengths are random ones and
    # so that each class's samples sit in random order inside its run of the sorted list.
    kept = torch.randperm(n, generator=gen)[: num_chunks * chunk_len]
    by_label = kept[torch.sort(labels[kept], stable=True).indices]
    chunks = by_label.view(num_chunks, chunk_len)
    mine = torch.randperm(num_chunks, generator=gen)[
        rank * classes_per_worker : (rank + 1) * classes_per_worker
    ]
    return chunks[mine].reshape(-1)


def epoch_batches(
    shard: torch.Tensor, batch_size: int, *, seed: int, epoch: int, rank: int
) -> list[torch.Tensor]:
    """The shard's indices shuffled for this ``(seed, epoch, rank)``, cut into full batches.

    The last partial batch is dropped, so every worker takes the same number of steps.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = shard[torch.randperm(len(shard), generator=_generator(seed, epoch, rank))]
    steps = steps_per_epoch(len(shard), batch_size)
    # view + unbind rather than split: split of an empty tensor yields one empty batch.
    return list(order[: steps * batch_size].view(steps, batch_size).unbind(0))


def steps_per_epoch(shard_len: int, batch_size: int) -> int:
    """Number of full batches in a shard of ``shard_len`` samples."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return shard_len // batch_size
