"""How the ranks of a Dask run call its hosted servers, picked by the config's
``server_transport``.

Every server lives in a Dask actor (:class:`.worker.ServerHost`): placement, counters and
shutdown. Its calls travel one of three ways, each into the same
:class:`~..servers.ServerLoop`:

- ``actor``: Dask actor calls (pickled, over the worker's TCP connection); works anywhere;
- ``shm``: shared memory on one machine (:mod:`.shm_link`);
- ``p2p``: torch.distributed point-to-point messages on a gloo group of the server's own
  (:mod:`.p2p`); works across machines.

A link to a server (a rank's side) has ``start(method, args)``, ``wait(timeout_s)`` (the reply;
``ConnectionError``, ``TimeoutError`` or ``ProcessLookupError`` when the server is gone,
``RuntimeError`` with the server's error) and ``close()``.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..servers import ServerLoop
from .p2p import P2PClient, P2PServer
from .shm_link import ShmClient, ShmServer


def host_key() -> str:
    """Names this machine: processes with the same key share /dev/shm ("" without one)."""
    if not Path("/dev/shm").is_dir():
        return ""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def choose(requested: str, hosts: list[str], label: str) -> str:
    """The transport of a run's server calls: ``requested`` is the config's
    ``server_transport``, ``hosts`` the :func:`host_key` of every rank and server. ``auto``
    takes shared memory when one machine holds them all, else actor calls."""
    if requested in ("actor", "p2p"):
        return requested
    one_machine = len(set(hosts)) == 1 and hosts[0] != ""
    if requested == "shm" and not one_machine:
        raise ConfigError(
            f"server_transport='shm' needs the servers and every worker on one machine with "
            f"/dev/shm, but run {label!r} spans {len(set(hosts))} machine(s) "
            f"({sorted(set(hosts))}); use 'auto' (actor calls there), 'p2p' or 'actor'"
        )
    return "shm" if one_machine else "actor"


def start_server(
    transport: str, loop: ServerLoop, run_id: str, index: int, ranks: int, timeout_s: float
) -> tuple[Any, dict[str, Any]]:
    """Start server ``index``'s side of ``transport`` in this process, answering ``ranks``
    ranks through ``loop``: the running server (it has ``close()``) and its address."""
    if transport == "shm":
        server: Any = ShmServer(Path(f"/dev/shm/scaledl-{run_id}-server{index}"), ranks, loop)
    elif transport == "p2p":
        server = P2PServer(loop, ranks, timeout_s)
    else:
        raise ConfigError(f"server_transport={transport!r} has no server thread to start")
    return server, {"transport": transport, "host": host_key(), **server.address()}


def connect(address: dict[str, Any], rank: int, timeout_s: float) -> Any:
    """Rank ``rank``'s link to the server at ``address`` (what :func:`start_server` gave)."""
    if address["transport"] == "shm":
        return ShmClient(address, rank)
    return P2PClient(address, rank, timeout_s)


def remove_left_behind(links: list[dict[str, Any]]) -> None:
    """Remove the shared-memory directories of servers on this machine that are over (a
    server whose process was killed could not remove its own)."""
    here = host_key()
    for link in links:
        if link["transport"] == "shm" and link["host"] == here:
            shutil.rmtree(link["directory"], ignore_errors=True)
