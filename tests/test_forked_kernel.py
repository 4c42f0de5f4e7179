"""The suite's notebook kernels (tests/forked_kernel.py): a kernel forked from the preloading
server answers as an ordinary kernel does (working directory and environment its kernel manager
gave, sys.path, pandas' and matplotlib's kernel defaults) with torch already imported, and
stops when asked; without a server the launcher starts the ordinary kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import forked_kernel
import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks: Linux")

PROBE = (
    "import os, sys, pandas, matplotlib\n"
    "print(os.getcwd(), os.environ.get('PROBE'), sys.path[0], "
    "pandas.get_option('display.max_columns'), matplotlib.get_backend(), "
    "'torch' in sys.modules)"
)


def _spec(home: Path) -> None:
    spec = home / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, forked_kernel.__file__, "launch", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))


def _probe(home: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], int]:
    """What a kernel started through the spec in ``home`` prints, and its process's parent."""
    monkeypatch.setenv("JUPYTER_PATH", str(home))
    monkeypatch.setenv("PROBE", "given")
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(cwd), stderr=subprocess.DEVNULL)
    lines: list[str] = []
    try:
        kc.execute_interactive(
            PROBE + "\nprint(os.getppid())",
            output_hook=lambda m: lines.extend(m["content"].get("text", "").split()),
            timeout=60,
        )
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    return lines[:-1], int(lines[-1])


def test_a_forked_kernel_answers_as_the_ordinary_kernel_does(tmp_path, monkeypatch):
    home = tmp_path / "home"
    _spec(home)
    monkeypatch.delenv(forked_kernel.SOCKET_VARIABLE, raising=False)
    ordinary, _ = _probe(home, tmp_path, monkeypatch)
    socket_path = str(home / "server.sock")
    env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    server = subprocess.Popen(
        [sys.executable, forked_kernel.__file__, "serve", socket_path], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        monkeypatch.setenv(forked_kernel.SOCKET_VARIABLE, socket_path)
        printed, parent = _probe(home, tmp_path, monkeypatch)
        # The ordinary kernel's answers (pandas shows 20 columns in a kernel, 0 in a terminal),
        # with torch already there: the server's child, not a process of its own.
        assert printed[:-1] == ordinary[:-1] and printed[-1] == "True"
        assert printed[:2] + printed[3:5] == [
            str(tmp_path), "given", "20", "module://matplotlib_inline.backend_inline",
        ]  # fmt: skip
        assert parent == server.pid
        # Asked to stop, the kernel ends, and the server reaps it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text()
            if not children.split():
                break
            time.sleep(0.1)
        assert not children.split()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_without_a_server_the_launcher_starts_the_ordinary_kernel(tmp_path, monkeypatch):
    home = tmp_path / "home"
    _spec(home)
    monkeypatch.delenv(forked_kernel.SOCKET_VARIABLE, raising=False)  # no server started
    printed, parent = _probe(home, tmp_path, monkeypatch)
    assert printed[:2] + printed[3:4] == [str(tmp_path), "given", "20"]
    assert printed[-1] == "False"  # imported nothing before its first cell
    assert parent == os.getpid()  # the kernel manager's own child (the launcher exec'd it)
