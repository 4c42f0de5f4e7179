"""The simulated runtime's hosted servers: calls travel through each server's own link, one
message at a time, and a call the server answers NOT_READY is parked until its state changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base import NOT_READY, clone_tensors, tensor_bytes
from .comm import SimCall


@dataclass
class _ServerState:
    """A hosted server object, its links and the calls it has parked (NOT_READY)."""

    obj: Any
    ingress_free: float = 0.0
    egress_free: float = 0.0
    parked: list[SimCall] = field(default_factory=list)
    calls: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class SimServers:
    """The hosted-server half of :class:`~.scheduler.SimWorld` (a mixin: it uses the world's heap,
    clocks and cost model)."""

    servers: list[_ServerState]
    cost: Any
    _waiting_call: dict[int, SimCall]

    def _call(self, call: SimCall, departure: float, nbytes: int) -> None:
        """The request leaves at ``departure``; it is served once its last byte has arrived."""
        server = self.servers[call.server]
        bandwidth, latency = self.cost.network.bandwidth_Bps, self.cost.network.latency_s
        start = max(departure + latency, server.ingress_free)
        server.ingress_free = start + nbytes / bandwidth
        server.bytes_in += nbytes
        self._push(server.ingress_free, -1, "deliver", call)

    def _serve(self, call: SimCall, now: float) -> None:
        server = self.servers[call.server]
        if not self._apply(server, call, now):
            server.parked.append(call)
            return
        progressed = True
        while progressed and server.parked:  # a state change may unblock parked calls
            progressed = False
            for parked in list(server.parked):
                if self._apply(server, parked, now):
                    server.parked.remove(parked)
                    progressed = True

    def _apply(self, server: _ServerState, call: SimCall, now: float) -> bool:
        value = getattr(server.obj, call.method)(*call.args)
        if value is NOT_READY:
            return False
        server.calls += 1
        call.value = clone_tensors(value)
        call.reply_bytes = tensor_bytes(value)
        server.bytes_out += call.reply_bytes
        start = max(now, server.egress_free)
        server.egress_free = start + call.reply_bytes / self.cost.network.bandwidth_Bps
        call.reply_at = server.egress_free + self.cost.network.latency_s
        rank = call.comm.rank
        if self._waiting_call.get(rank) is call:
            del self._waiting_call[rank]
            self._wake_call(call)
        return True

    def _wake_call(self, call: SimCall) -> None:
        assert call.reply_at is not None
        rank = call.comm.rank
        transfer = call.reply_bytes / self.cost.network.bandwidth_Bps
        self._advance(rank, call.reply_at - transfer - self.cost.network.latency_s, "idle")
        self._advance(rank, call.reply_at, "comm")
        self._resume(rank, self.comms[rank].clock, call.value)

    def server_stats(self) -> list[dict[str, Any]]:
        return [
            {"server": i, "calls": s.calls, "bytes_in": s.bytes_in, "bytes_out": s.bytes_out}
            for i, s in enumerate(self.servers)
        ]
