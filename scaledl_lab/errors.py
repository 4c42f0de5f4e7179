"""The package's error classes. Imports nothing from the package, so every layer may raise them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the allowed values."""


class RunError(RuntimeError):
    """A run stopped before finishing; the message says why and where the partial metrics are."""


class DivergenceError(RunError):
    """The training loss became NaN or infinite."""


class WorkerLostError(RunError):
    """A worker process died during a run."""


class ServerLostError(RunError):
    """A parameter server (or another hosted server object) stopped answering."""


class PeerLostError(RunError):
    """A message was awaited from a peer that died before sending it (tolerant strategies
    catch it and go on without that peer)."""

    def __init__(self, message: str, peer: int = -1) -> None:
        super().__init__(message)
        self.peer = peer  # -1: not known (the error re-raised with more context)


class WorkerKilled(BaseException):
    """An injected fault (``faults="kill:RANK:STEP"``) ends this worker's program here. A
    BaseException, so that no strategy's error handling mistakes it for a failure."""

    def __init__(self, rank: int, step: int) -> None:
        super().__init__(f"rank {rank} killed after step {step} (an injected fault)")
        self.rank, self.step = rank, step


def choices(values: tuple[str, ...]) -> str:
    """The allowed values of a field, as error messages list them."""
    return ", ".join(repr(v) for v in values)


class Interrupt:
    """Ctrl-C, remembered. Python prints and drops an exception raised while a finalizer
    (``__del__``) runs, so a KeyboardInterrupt that lands in one is lost and the run goes on.
    The command line's SIGINT handler (:meth:`handler`) also sets this flag, and a run raises
    the interrupt again at its next batch of rows (:meth:`check`)."""

    pending = False

    @classmethod
    def handler(cls, signum: int, frame: object) -> None:
        cls.pending = True
        raise KeyboardInterrupt

    @classmethod
    def check(cls) -> None:
        if cls.pending:
            raise KeyboardInterrupt
