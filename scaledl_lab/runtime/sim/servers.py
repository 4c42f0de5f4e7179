"""The simulated runtime's hosted servers: calls travel through each server's own link, one
message at a time, and are taken by the shared :class:`~..servers.ServerLoop` (a call it parks
is answered once the server's state has changed). A server is a host of its own: its link is
the network's link between nodes (:mod:`.network`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import clone_tensors, tensor_bytes
from ..servers import Answer, ServerLoop
from .comm import SimCall


@dataclass
class _ServerState:
    """A hosted server's loop and when its links are next free."""

    loop: ServerLoop
    ingress_free: float = 0.0
    egress_free: float = 0.0


class SimServers:
    """The hosted-server half of :class:`~.scheduler.SimWorld` (a mixin: it uses the world's heap,
    clocks and cost model)."""

    servers: list[_ServerState]
    cost: Any
    _waiting_call: dict[int, SimCall]

    def _call(self, call: SimCall, departure: float, nbytes: int) -> None:
        """The request leaves at ``departure``; it is served once its last byte has arrived."""
        server = self.servers[call.server]
        link = self.cost.network.inter
        start = max(departure + link.latency_s, server.ingress_free)
        server.ingress_free = start + nbytes / link.bandwidth_Bps
        self._push(server.ingress_free, -1, "deliver", call)

    def _serve(self, call: SimCall, now: float) -> None:
        server = self.servers[call.server]
        for answer in server.loop.take(call, call.method, call.args):
            self._answered(server, answer, now)

    def _answered(self, server: _ServerState, answer: Answer, now: float) -> None:
        if answer.error is not None:  # a server's bug ends the simulated run
            raise answer.error
        call: SimCall = answer.caller
        call.value = clone_tensors(answer.value)
        call.reply_bytes = tensor_bytes(answer.value)
        start = max(now, server.egress_free)
        link = self.cost.network.inter
        server.egress_free = start + call.reply_bytes / link.bandwidth_Bps
        call.reply_at = server.egress_free + link.latency_s
        rank = call.comm.rank
        if self._waiting_call.get(rank) is call:
            del self._waiting_call[rank]
            self._wake_call(call)

    def _wake_call(self, call: SimCall) -> None:
        assert call.reply_at is not None
        rank = call.comm.rank
        link = self.cost.network.inter
        transfer = call.reply_bytes / link.bandwidth_Bps
        self._advance(rank, call.reply_at - transfer - link.latency_s, "idle")
        self._advance(rank, call.reply_at, "comm")
        self._resume(rank, self.comms[rank].clock, call.value)

    def server_stats(self) -> list[dict[str, Any]]:
        return [{"server": i, **s.loop.stats()} for i, s in enumerate(self.servers)]
