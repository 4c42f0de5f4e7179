"""An existing cluster, started as users start one: `dask scheduler` and `dask worker` commands,
each worker on its own address, then `scaledl-lab run --address` and `reproduce --address`.

The workers listen on different loopback addresses (127.0.0.2 and 127.0.0.3), so a rendezvous
that assumed every rank on the scheduler's or the driver's host would fail; the cluster must be
up, with the same workers, after the runs. A second cluster speaks TLS (`tls://`, a self-signed
certificate made here) and the CLI reaches it with `--tls-ca-file --tls-cert --tls-key`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client
from distributed.security import Security

from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.dask.cluster import connect, live_workers

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("127.0.0.2", "127.0.0.3")
START_S = 60  # a loaded CI machine may take this long to start three Python processes
STOP_S = 3  # then the teardown kills what is left


def _can_bind(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    not all(_can_bind(h) for h in HOSTS),
    reason="needs the loopback range 127.0.0.0/8 (Linux); macOS has only 127.0.0.1",
)


def _env() -> dict[str, str]:
    # The scheduler and workers import this checkout's scaledl_lab, as the driver does.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


class Cluster:
    """`dask scheduler` and one `dask worker --nthreads 1` per host, each its own process."""

    def __init__(self, tmp: Path, hosts: tuple[str, ...], tls: Path | None = None) -> None:
        """``tls``: a PEM file holding a self-signed certificate and its key (the scheduler,
        the workers and the client all present it, and trust it as their CA)."""
        self.tmp = tmp
        self.tls = [] if tls is None else tls_options(tls)
        self.security = None
        if tls is not None:
            pem = str(tls)
            self.security = Security(
                tls_ca_file=pem, tls_client_cert=pem, tls_client_key=pem, require_encryption=True
            )
        self.procs: list[subprocess.Popen] = []
        self.logs: list[object] = []
        self.file = tmp / "scheduler.json"
        try:
            self._start_all(hosts, tls)
        except BaseException:
            self.close()
            raise

    def _start_all(self, hosts: tuple[str, ...], tls: Path | None) -> None:
        dask = [sys.executable, "-m", "dask"]  # the `dask` command of this Python
        scheduler = ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard"]
        if tls:
            scheduler += ["--protocol", "tls"]
        self._start([*dask, *scheduler, "--scheduler-file", str(self.file), *self.tls], "sched")
        for i, host in enumerate(hosts):
            worker = ["worker", "--scheduler-file", str(self.file), "--host", host]
            worker += ["--nthreads", "1", "--memory-limit", "0", "--no-dashboard"]
            self._start([*dask, *worker, "--name", f"w{i}", *self.tls], f"w{i}")
        deadline = time.monotonic() + START_S
        while True:
            try:
                self.address = json.loads(self.file.read_text())["address"]
                break
            except (FileNotFoundError, ValueError):  # not yet written, or half written
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no scheduler: {self.log('sched')}") from None
                time.sleep(0.2)
        with self.client() as c:
            c.wait_for_workers(len(hosts), timeout=START_S)

    def _start(self, cmd: list[str], name: str) -> None:
        log = (self.tmp / f"{name}.log").open("w")
        self.logs.append(log)
        self.procs.append(
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(),
                cwd=self.tmp,
                start_new_session=True,  # its group: a worker's nanny and its process end together
            )
        )

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args} exited with {p.returncode}")

    def client(self) -> Client:
        return Client(self.address, security=self.security, timeout=START_S)

    def workers(self) -> dict[str, str]:
        """Each connected worker's name and address."""
        with self.client() as c:
            info = live_workers(c)
        return {str(w["name"]): a for a, w in info.items()}

    def close(self) -> None:
        """Stop every process; what has not exited within a few seconds of SIGTERM (a nanny
        closing its worker gracefully, a scheduler saying goodbye) is killed with its group."""
        for p in reversed(self.procs):
            p.terminate()
        deadline = time.monotonic() + STOP_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, HOSTS)
    try:
        yield c
    finally:
        c.close()


def scaledl_lab(*args: str, cwd: Path) -> str:
    """Run the `scaledl-lab` command (this checkout's) and return what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "scaledl_lab.cli", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


TINY = ["--model", "mlp", "--dataset", "fashion-mnist", "--batch-size", "32", "--quick"]
TINY += ["--train-subset", "512", "--test-subset", "200", "--max-steps", "6"]


def test_run_and_reproduce_on_a_scheduler_with_workers_on_two_addresses(cluster, tmp_path):
    before = cluster.workers()
    assert sorted(before) == ["w0", "w1"]
    assert {a.split("//")[1].rsplit(":", 1)[0] for a in before.values()} == set(HOSTS)
    for strategy in ("allreduce", "nnt"):
        out = tmp_path / strategy
        printed = scaledl_lab(
            "run", "--strategy", strategy, "--workers", "2", *TINY,
            "--address", cluster.address, "--out", str(out), cwd=tmp_path,
        )  # fmt: skip
        assert f"Attached to Dask scheduler {cluster.address}" in printed
        frame = pd.read_csv(out / "metrics.csv")
        train = frame[frame["kind"] == "train"]
        assert sorted(train["rank"].unique()) == [0, 1], strategy
        assert train.groupby("rank")["step"].max().to_list() == [6, 6], strategy
        assert (frame[frame["kind"] == "test"]["accuracy"] > 0).all()
    out = tmp_path / "reproduce"
    printed = scaledl_lab(
        "reproduce", "--smoke", "--address", cluster.address, "--out", str(out), cwd=tmp_path
    )
    assert "## The paper comparison" in printed
    table = pd.read_csv(out / "comparison.csv")
    assert set(table["runtime"]) == {"dask"} and len(table) == 6
    # The same two workers, still connected: attaching never restarts or closes the cluster.
    assert cluster.workers() == before


def tls_options(pem: Path) -> list[str]:
    """The options `dask scheduler`, `dask worker` and `scaledl-lab` share."""
    return ["--tls-ca-file", str(pem), "--tls-cert", str(pem), "--tls-key", str(pem)]


def self_signed(tmp: Path) -> Path:
    """A PEM file with a fresh self-signed certificate and its key (openssl, RSA 2048)."""
    pem = tmp / "tls.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=scaledl-test", "-keyout", str(pem), "-out", str(tmp / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    pem.write_text(pem.read_text() + (tmp / "cert.pem").read_text())
    return pem


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_run_on_a_tls_scheduler(tmp_path):
    pem = self_signed(tmp_path)
    tls = tls_options(pem)
    cluster = Cluster(tmp_path, HOSTS[:1], tls=pem)
    try:
        assert cluster.address.startswith("tls://")
        out = tmp_path / "run"
        scaledl_lab(
            "run", "--strategy", "allreduce", "--workers", "1", *TINY,
            "--address", cluster.address, *tls, "--out", str(out), cwd=tmp_path,
        )  # fmt: skip
        assert (pd.read_csv(out / "metrics.csv")["kind"] == "train").sum() == 6
        # Without a certificate: a clear error naming the options, before any connection.
        with pytest.raises(ConfigError, match="speaks TLS.*--tls-ca-file, --tls-cert"):
            with connect(1, cluster.address, log=None):
                pass
    finally:
        cluster.close()
