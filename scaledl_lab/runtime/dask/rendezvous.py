"""Where the torch.distributed rendezvous listens: on the Dask worker's own interface (the host
of its address: 127.0.0.1 in the embedded cluster), never on every interface.

The stores are unauthenticated: whoever reaches one can write into a run. torch's ``TCPStore``
binds its listening socket to every interface whatever host it is given (checked in torch 2.13
with both its backends, libuv and the older one: ``ss -ltn`` shows ``*:PORT``); handed a socket
that is already bound and listening (``master_listen_fd``, libuv backend) it serves on that
one. Gloo's pairs connect through a listener on the address of the group's device, which
``ProcessGroupGloo`` derives from the machine's hostname unless ``GLOO_SOCKET_IFNAME`` names an
interface (``init_process_group`` takes no device): :func:`gloo_interface` names the worker's.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import urlparse

import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def worker_host() -> str:
    """The host part of this Dask worker's address (where the scheduler and the other workers
    reach it); 127.0.0.1 outside a worker."""
    from distributed import get_worker

    try:
        address = get_worker().address
    except ValueError:
        return LOOPBACK
    return urlparse(address).hostname or LOOPBACK


def _listening(host: str, port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str | None = None) -> int:
    """A port free on ``host`` (this worker's interface when None) for a rendezvous."""
    with _listening(host or worker_host()) as sock:
        return sock.getsockname()[1]


def master_store(host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """A ``TCPStore`` server listening on ``host`` only (``port`` 0: a free one; its ``port``
    attribute says which)."""
    sock = _listening(host, port)
    return dist.TCPStore(
        host,
        sock.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=timeout,
        master_listen_fd=sock.detach(),  # the store owns (and closes) the socket from now on
        use_libuv=True,  # the backend that serves on a given socket
    )


def rank_store(host: str, port: int, rank: int, timeout: timedelta) -> dist.TCPStore:
    """The store of a group whose rank 0 serves it on ``host:port``: the server on rank 0, a
    client elsewhere."""
    if rank == 0:
        return master_store(host, port, timeout)
    return dist.TCPStore(host, port, is_master=False, timeout=timeout)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return host == "localhost"


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds address ``host``, if any."""
    import psutil  # a dependency of distributed

    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] in wanted for a in addresses):
            return name
    return None


@contextlib.contextmanager
def gloo_interface(host: str) -> Iterator[None]:
    """Gloo groups created inside the block listen on loopback when ``host`` is (as
    ``GLOO_SOCKET_IFNAME``, which each new group reads; a value set by the user wins). On
    another host they listen where the machine's hostname resolves, as gloo chooses: an
    interface holds several addresses (IPv6 ones too), and gloo would take the first."""
    name = interface_of(host) if _is_loopback(host) else None
    if name is None or "GLOO_SOCKET_IFNAME" in os.environ:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def gloo_options(host: str, timeout: timedelta) -> dist.ProcessGroupGloo._Options:
    """Options of a gloo group whose device listens on ``host``."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return options
