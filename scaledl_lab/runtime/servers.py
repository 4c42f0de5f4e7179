"""The hosted-server loop both runtimes share: a parameter server (Dean et al. 2012) or the
EASGD centre (Zhang et al. 2015) is a plain object; its calls are taken one at a time, and a
call it answers with ``NOT_READY`` is parked until the server's state changes.

The simulator delivers calls in virtual time, the Dask transports as they arrive; each hands
every call to :meth:`ServerLoop.take` and sends back the answers it returns, in their order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import NOT_READY, tensor_bytes


@dataclass
class Answer:
    """A call that has been answered: ``caller`` is the transport's own token for whom to reply
    to, ``value`` the server's return value, or ``error`` what the call raised."""

    caller: Any
    value: Any = None
    error: Exception | None = None


class ServerLoop:
    """One server object, the calls it has parked, and its counters (``calls`` answered,
    ``bytes_in`` of the calls taken, ``bytes_out`` of the answers)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.parked: list[tuple[Any, str, tuple[Any, ...]]] = []
        self.calls = self.bytes_in = self.bytes_out = 0

    def take(self, caller: Any, method: str, args: tuple[Any, ...]) -> list[Answer]:
        """Run ``method(*args)`` on the server for ``caller``; returns the calls it lets go, in
        the order they were answered: this one (unless parked), then every parked call that can
        go now, oldest first, passing over them again while any went (a state change)."""
        self.bytes_in += tensor_bytes(args)
        answer = self._apply(caller, method, args)
        if answer is None:
            self.parked.append((caller, method, args))
            return []
        answers = [answer]
        progressed = True
        while progressed and self.parked:
            progressed = False
            for call in list(self.parked):
                if (answer := self._apply(*call)) is not None:
                    self.parked.remove(call)
                    answers.append(answer)
                    progressed = True
        return answers

    def _apply(self, caller: Any, method: str, args: tuple[Any, ...]) -> Answer | None:
        try:
            value = getattr(self.obj, method)(*args)
        except Exception as exc:  # answered: the transport raises it in the caller
            return Answer(caller, error=exc)
        if value is NOT_READY:
            return None
        self.calls += 1
        self.bytes_out += tensor_bytes(value)
        return Answer(caller, value)

    def stats(self) -> dict[str, int]:
        return {"calls": self.calls, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}
