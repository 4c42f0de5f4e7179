"""Notebook kernels forked from a process that imported the lab once.

Every notebook nbval runs starts a kernel, and its first cell imports torch, pandas, matplotlib
and the lab: about 4 CPU-s each, paid again by each of the suite's ~20 notebooks. Here a server
imports them once per test process (``serve``) and forks a kernel for each request; the kernel
spec that ``tests/conftest.py`` puts first on ``JUPYTER_PATH`` runs this file as a launcher
(``launch``), which asks the server for a kernel, relays the signals the kernel manager sends
(interrupt, terminate) and exits with the kernel's status, so jupyter_client manages it as it
manages its own child. A kernel forked this way is the ordinary IPython kernel, running the
ordinary notebook, with the environment and working directory the kernel manager gave; only
its imports were done before it started.

Without the server (its socket absent), the launcher execs the ordinary kernel instead. The
file imports nothing heavy itself: the launcher starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import time

# What a kernel and a notebook's first cell import that decides nothing about where it runs as
# it loads. Left out: pandas (its display.max_columns is chosen at import, by whether an IPython
# kernel is running), matplotlib.pyplot and matplotlib_inline (they hook into the kernel's shell
# as they load), tqdm.auto (it picks its notebook or console bar as it loads), and the lab, which
# imports all three.
PRELOAD = (
    "zmq",
    "IPython",
    "ipykernel.kernelapp",
    "numpy",
    "torch",
    "torch._dynamo",
    "matplotlib",
    "distributed",
)
SOCKET_VARIABLE = "SCALEDL_KERNEL_SERVER"  # the server's Unix socket, for the launchers
START_S = 10.0  # how long a launcher waits for a server that has not made its socket yet


def _ordinary_kernel() -> None:
    if log := os.environ.get("SCALEDL_KERNEL_DEBUG"):
        with open(log, "a") as f:
            f.write(f"ordinary kernel: server {os.environ.get(SOCKET_VARIABLE)!r}\n")
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *sys.argv[2:]])


def launch() -> None:
    """The kernel spec's command: a kernel forked by the server, or the ordinary one."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        _ordinary_kernel()
    waited = 0.0
    while not os.path.exists(path) and waited < START_S:  # the server is still starting
        time.sleep(0.05)
        waited += 0.05
    if not os.path.exists(path):
        _ordinary_kernel()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        _ordinary_kernel()
    request = {"argv": sys.argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}
    conn.sendall(json.dumps(request).encode() + b"\n")
    reader = conn.makefile("r")
    line = reader.readline()  # the kernel's pid, once the server has forked it
    if not line.strip():  # the server went away before: start the ordinary kernel
        _ordinary_kernel()
    pid = int(line)

    def relay(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, relay)
    line = reader.readline()  # the kernel's exit status, when it ends
    sys.exit(int(line) if line.strip() else 1)


def _run_kernel(request: dict) -> None:
    """In the forked child: become the kernel the launcher asked for."""
    os.setsid()  # its own process group, as a launched kernel's signals expect
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not the kernel's
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # sys.path as ipykernel_launcher leaves it: without the directory of the script running.
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    if parent := request["env"].get("JPY_PARENT_PID"):  # read as ipykernel's module loaded
        sys.argv.append(f"--IPKernelApp.parent_handle={parent}")
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


def serve(path: str) -> None:
    """Import the kernel's modules once, then fork a kernel per launcher that connects; tell it
    the kernel's pid, then its exit status; kill a kernel whose launcher went away."""
    import importlib

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # launchers see the socket only once it listens
    for name in PRELOAD:  # a launcher that connects meanwhile waits in the backlog
        importlib.import_module(name)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}  # pid -> its launcher's connection
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _loop(listener, selector, kernels)
    finally:  # stopped (the test process is ending): its kernels end with it
        for pid in kernels:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _loop(listener: socket.socket, selector: selectors.BaseSelector, kernels: dict) -> None:
    while True:
        for key, _ in selector.select(timeout=0.2):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                request = json.loads(conn.makefile("r").readline())
                pid = os.fork()
                if pid == 0:  # the kernel: nothing of the server's stays open in it
                    for sock in (listener, conn, *kernels.values()):
                        sock.close()
                    selector.close()
                    code = 1
                    try:
                        _run_kernel(request)
                        code = 0
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else 1
                    finally:
                        os._exit(code)
                kernels[pid] = conn
                conn.sendall(f"{pid}\n".encode())
                selector.register(conn, selectors.EVENT_READ, pid)
            else:  # a launcher closed its end: it was killed, so is its kernel
                pid = key.data
                selector.unregister(key.fileobj)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = kernels.pop(pid, None)
            if conn is not None:
                try:
                    selector.unregister(conn)
                except (KeyError, ValueError):
                    pass
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
        if os.getppid() == 1:  # the test process that started it is gone
            return


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        launch()
