"""The hosted-server loop both runtimes share (runtime/servers.py): a call is answered at once or
parked (NOT_READY) until a state change lets it go, one call at a time, in arrival order."""

from __future__ import annotations

import torch

from scaledl_lab.runtime.base import NOT_READY
from scaledl_lab.runtime.servers import ServerLoop


class Versions:
    """A server whose ``at_least(v)`` waits for version ``v``; ``bump`` makes the next one."""

    def __init__(self) -> None:
        self.version = 0
        self.log: list[tuple[str, int]] = []

    def bump(self, grad: torch.Tensor) -> int:
        self.version += 1
        self.log.append(("bump", self.version))
        return self.version

    def at_least(self, version: int) -> torch.Tensor | object:
        if self.version < version:
            return NOT_READY
        self.log.append(("at_least", version))
        return torch.full((4,), float(self.version))

    def chain(self, version: int) -> int | object:
        """Answerable at ``version``, and itself a state change (makes the next version)."""
        if self.version < version:
            return NOT_READY
        self.version += 1
        self.log.append(("chain", version))
        return self.version

    def broken(self) -> None:
        raise KeyError("shard 3")


def test_a_call_that_can_be_answered_is_answered_at_once():
    loop = ServerLoop(Versions())
    (answer,) = loop.take("rank0", "bump", (torch.ones(8),))
    assert (answer.caller, answer.value, answer.error) == ("rank0", 1, None)
    assert loop.stats() == {"calls": 1, "bytes_in": 32, "bytes_out": 8}


def test_a_parked_call_goes_after_the_state_change_that_lets_it_and_not_before():
    server = Versions()
    loop = ServerLoop(server)
    assert loop.take("a", "at_least", (2,)) == []
    assert loop.take("b", "at_least", (1,)) == []
    assert [caller for caller, _, _ in loop.parked] == ["a", "b"]
    # The first bump lets b go (version 1), a stays parked; answers come this call first.
    first = loop.take("c", "bump", (torch.ones(1),))
    assert [(x.caller, x.value if x.caller == "c" else x.value[0].item()) for x in first] == [
        ("c", 1),
        ("b", 1.0),
    ]
    second = loop.take("c", "bump", (torch.ones(1),))
    assert [x.caller for x in second] == ["c", "a"] and second[1].value[0].item() == 2.0
    assert loop.parked == []
    assert server.log == [("bump", 1), ("at_least", 1), ("bump", 2), ("at_least", 2)]
    # Bytes in count when a call is taken (a float32 tensor's 4 bytes, a number's 8), bytes
    # out and calls once it is answered.
    assert loop.stats() == {"calls": 4, "bytes_in": 2 * 4 + 2 * 8, "bytes_out": 2 * 8 + 2 * 16}


def test_parked_calls_are_passed_over_again_while_any_goes_oldest_first():
    server = Versions()
    loop = ServerLoop(server)
    # Parked in the order 3, 2, 1: each is answerable only once the one before it has gone.
    for caller, version in (("x", 3), ("y", 2), ("z", 1)):
        assert loop.take(caller, "chain", (version,)) == []
    answers = loop.take("w", "bump", (torch.zeros(0),))  # version 1: z, then y, then x
    assert [a.caller for a in answers] == ["w", "z", "y", "x"]
    assert server.log == [("bump", 1), ("chain", 1), ("chain", 2), ("chain", 3)]
    assert server.version == 4 and loop.parked == []


def test_a_call_that_raises_is_answered_with_its_error_and_the_server_goes_on():
    loop = ServerLoop(Versions())
    (answer,) = loop.take("r", "broken", ())
    assert isinstance(answer.error, KeyError) and answer.error.args == ("shard 3",)
    assert loop.stats()["calls"] == 0  # not counted: nothing was answered
    (answer,) = loop.take("r", "bump", (torch.ones(1),))
    assert answer.value == 1


def test_a_call_that_parks_does_not_retry_the_others():
    server = Versions()
    loop = ServerLoop(server)
    loop.take("a", "at_least", (1,))
    assert loop.take("b", "at_least", (5,)) == []  # no state change: a is not tried again
    assert [caller for caller, _, _ in loop.parked] == ["a", "b"] and server.log == []
