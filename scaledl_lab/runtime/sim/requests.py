"""What a simulated worker asks its scheduler for (:mod:`.scheduler`): sleep until a time, a
collective, a message or a server's answer; a worker's coroutine yields one and resumes with the
answer (:class:`Await`)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Request:
    rank: int


@dataclass
class Sleep(Request):
    until: float


@dataclass
class Collective(Request):
    kind: str  # "allreduce" | "allgather" | "reduce_scatter" | "all_gather_into" | ...
    tensor: torch.Tensor | None = None
    src: int = 0
    group: tuple[int, ...] | None = None  # None: every worker
    out: torch.Tensor | None = None  # all_gather_into: where the shards go
    started: float | None = None  # a background allreduce: its transfer began then
    overlapped: bool = False  # ... from inside a compute block: the timeline shows it hidden


@dataclass
class Until(Request):
    """Resume no earlier than ``until`` (the worker's own NIC finishing a send)."""

    until: float


@dataclass
class WaitRecv(Request):
    incoming: Any  # comm.SimIncoming


@dataclass
class WaitCall(Request):
    pending: Any  # comm.SimCall


class Await:
    """Hands a request to the scheduler and resumes with its answer."""

    def __init__(self, request: Request) -> None:
        self.request = request

    def __await__(self) -> Generator[Request, Any, Any]:
        return (yield self.request)
