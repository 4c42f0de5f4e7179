"""Results folders are never overwritten or mixed: a run writes into a partial folder beside its
``--out`` and moves it into place when it ends; bad folders, a dead scheduler address, a bad
certificate and Ctrl-C each end in one line."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaledl_lab import ConfigError, DivergenceError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.errors import Interrupt
from scaledl_lab.runtime.dask import cluster

ROOT = Path(__file__).resolve().parents[1]
# 512 samples, batch 64 per worker on 2 workers: 4 steps an epoch, well under a second.
C = ["--runtime", "sim", "--workers", "2", "--dataset", "mnist1d", "--model", "mlp",
     "--train-subset", "512", "--test-subset", "256", "--val-size", "256",
     "--batch-size", "64"]  # fmt: skip
CFG = ExperimentConfig(runtime="sim", workers=2, dataset="mnist1d", model="mlp", train_subset=512,
                       test_subset=256, val_size=256, batch_size=64)  # fmt: skip


def partials(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.partial-*"))


def files(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def error_line(capsys) -> str:
    """The one line of the error (besides progress bars, which also go to stderr)."""
    lines = capsys.readouterr().err.strip().splitlines()
    [line] = [x for x in lines if "scaledl-lab:" in x]
    assert line == lines[-1] and line.startswith("scaledl-lab: error: ")
    return line.removeprefix("scaledl-lab: error: ")


def test_an_existing_results_folder_is_refused_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", *C, "--max-steps", "2", "--out", str(out)]) == 0
    first = files(out)
    assert main(["run", *C, "--max-steps", "2", "--lr", "0.5", "--out", str(out)]) == 1
    assert error_line(capsys) == (
        f"results folder {out} exists and is not empty: pass --overwrite (Python: "
        "overwrite=True) to replace it when the new run ends, or choose another --out"
    )
    assert files(out) == first  # untouched
    argv = ["run", *C, "--max-steps", "2", "--lr", "0.5", "--out", str(out), "--overwrite"]
    assert main(argv) == 0
    assert f"results written to {out}" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["runs"][0]["lr"] == 0.5
    assert sorted(p.name for p in out.glob("*.png")) == [
        "accuracy_vs_epoch.png", "accuracy_vs_time.png", "loss_vs_epoch.png",
        "loss_vs_time.png", "throughput.png",
    ]  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no partial or replaced folder left
    # The Python API keeps the same rule.
    with pytest.raises(ConfigError, match=r"exists and is not empty: pass --overwrite"):
        run(CFG.replace(max_steps=2), out=out, progress=False)
    res = run(
        CFG.replace(max_steps=2, lr=0.2),
        out=out,
        overwrite=True,
        progress=False,
        figures=False,
        log=None,
    )
    assert res.out_dir == out and json.loads((out / "config.json").read_text())["runs"][0][
        "lr"
    ] == pytest.approx(0.2)
    notes = tmp_path / "notes"  # not a results folder: --overwrite leaves it alone
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert main(["run", *C, "--max-steps", "2", "--out", str(notes), "--overwrite"]) == 1
    assert error_line(capsys) == (
        f"{notes} holds no config.json, so it is not a results folder: --overwrite replaces "
        "only those; choose another --out"
    )
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is no one's results
    run(CFG.replace(max_steps=2), out=empty, progress=False, figures=False, log=None)
    assert (empty / "metrics.csv").exists() and (empty / "summary.md").exists()
    # figures=False: the tables, the summary and the weights, without the CLI's PNGs.
    assert not list(empty.glob("*.png")) and (empty / "weights.pt").exists()


def test_a_default_folder_that_holds_a_run_is_kept_and_the_next_run_says_where_it_writes(
    tmp_path, capsys, monkeypatch
):
    """No --out: the README's `reproduce --quick` meets its committed folder, and two runs that
    differ only in --lr share a label. Neither is refused nor overwritten unasked."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", *C, "--max-steps", "2", "--name", "t"]
    assert main(argv) == 0
    first = files(tmp_path / "results" / "t")
    capsys.readouterr()
    assert main([*argv, "--lr", "0.5"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "results/t holds an earlier run: this one writes results/t-2 "
        "(--overwrite replaces results/t; --out chooses the folder)"
    )
    assert files(tmp_path / "results" / "t") == first  # untouched
    second = json.loads((tmp_path / "results" / "t-2" / "config.json").read_text())
    assert second["runs"][0]["lr"] == 0.5
    assert main([*argv, "--lr", "0.25", "--overwrite"]) == 0  # asked: the first is replaced
    third = json.loads((tmp_path / "results" / "t" / "config.json").read_text())
    assert third["runs"][0]["lr"] == 0.25
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["t", "t-2"]


def test_a_failed_run_leaves_the_old_results_whole_and_its_own_beside_them(tmp_path, capsys):
    out = tmp_path / "stale"  # the case: a diverging run over a checkpointed one
    assert main(["run", *C, "--checkpoint-every", "2", "--out", str(out)]) == 0
    old = files(out)
    argv = ["run", *C, "--model", "cnn1d", "--lr", "1e6", "--out", str(out), "--overwrite"]
    assert main(argv) == 1
    message = error_line(capsys)
    [partial] = partials(out)
    assert message.startswith("training diverged: loss=")
    assert f"metrics so far are in {partial / 'metrics.csv'}, the config in config.json" in message
    assert "checkpoint" not in message  # the old run's checkpoint is not this run's
    assert files(out) == old  # the old results whole
    assert json.loads((partial / "config.json").read_text())["runs"][0]["model"] == "cnn1d"
    # The old run resumes from its own checkpoint; the partial folder, which has none, is
    # refused clearly.
    assert main(["resume", str(partial)]) == 1
    assert "holds no checkpoint" in error_line(capsys)
    assert main(["resume", str(out), "--epochs", "2"]) == 0


def test_a_stopped_run_checkpoints_into_its_partial_folder_which_resumes(tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["run", *C, "--checkpoint-every", "2", "--epochs", "2", "--faults", "kill:1:3"]
    assert main([*argv, "--out", str(out)]) == 1
    message = error_line(capsys)
    [partial] = partials(out)
    assert not out.exists()  # nothing finished: nothing is named as if it had
    assert f"the last checkpoint (step 2) in {partial / 'checkpoint'}" in message
    assert main(["resume", str(partial)]) == 0  # appends to its own folder
    assert f"results written to {partial}" in capsys.readouterr().out
    train = [r for r in (partial / "metrics.csv").read_text().splitlines() if ",train," in r]
    assert len(train) == 2 * 8


@pytest.mark.parametrize("case", ["file", "under a file", "not permitted"])
def test_an_out_that_cannot_be_a_folder_is_one_line(case, tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("not a folder")
    out, expected = {
        "file": (a_file, f"--out {a_file} is a file, not a folder: choose another --out"),
        "under a file": (
            a_file / "r",
            f"--out {a_file / 'r'} cannot be created: {a_file} is a file, not a folder",
        ),
        # /sys refuses new folders to everyone, root included
        "not permitted": (Path("/sys/scaledl-lab-test"), "cannot write results folder "),
    }[case]
    assert main(["run", *C, "--max-steps", "2", "--out", str(out)]) == 1
    assert error_line(capsys).startswith(expected)
    assert a_file.read_text() == "not a folder"


def test_an_unreachable_scheduler_is_one_line_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cluster, "CONNECT_S", 1.0)
    out = tmp_path / "r"
    assert main(["run", *C, "--max-steps", "2", "--out", str(out)]) == 0
    old = files(out)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    dask = [a if a != "sim" else "dask" for a in C]
    start = time.monotonic()
    assert main(["run", *dask, "--address", address, "--out", str(out), "--overwrite"]) == 1
    assert time.monotonic() - start < 8
    assert error_line(capsys).startswith(
        f"cannot reach the Dask scheduler at {address} (waited 1 s): is it running"
    )
    assert files(out) == old  # no header-only metrics.csv
    assert partials(out) == []


def test_a_certificate_that_is_not_pem_is_named(tmp_path, capsys):
    from test_existing_cluster import self_signed

    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    pem = self_signed(tmp_path)
    argv = ["run", *C, "--max-steps", "2", "--address", "tls://127.0.0.1:8786"]
    assert main([*argv, "--tls-ca-file", str(junk), "--tls-cert", str(pem)]) == 1
    assert error_line(capsys).startswith(f"TLS CA file {junk} is not a PEM certificate")
    assert main([*argv, "--tls-ca-file", str(pem), "--tls-cert", str(junk)]) == 1
    assert error_line(capsys).startswith(f"TLS certificate {junk} is not a PEM certificate")


def test_ctrl_c_prints_one_line_and_keeps_the_partial_results(tmp_path):
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "scaledl_lab.cli", "run", *C, "--epochs", "1000"]
    argv += ["--out", str(out)]

    # Ctrl-C's default action in the child, whatever this process inherited: a shell starts
    # background jobs (and so some test runners) with SIGINT ignored, which a child keeps.
    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    env["PYTHONFAULTHANDLER"] = "1"  # a child that does not stop says where it is (SIGABRT)
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, preexec_fn=default_sigint, **pipes)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the run has written rows
            found = partials(out)
            metrics = found[0] / "metrics.csv" if found else None
            if metrics is not None and metrics.exists() and len(metrics.read_text()) > 2000:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate()
            where = [x for x in err.replace("\r", "\n").splitlines() if "step/s" not in x]
            pytest.fail("still running 60 s after Ctrl-C:\n" + "\n".join(where[-60:]))
    finally:
        if proc.poll() is None:
            proc.kill()
    [partial] = partials(out)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == f"scaledl-lab: interrupted; partial results in {partial}"
    assert "Traceback" not in err
    assert not out.exists() and (partial / "config.json").exists()


def test_an_expected_divergence_is_not_logged_by_the_worker_a_real_failure_is():
    from scaledl_lab.runtime.dask.worker import _ExpectedFailure

    def record(exception_text: str) -> logging.LogRecord:
        fmt = "Compute Failed\nKey:       %s\nState:     %s\nTask:  %s\nException: %r\n"
        args = ("rank0", "executing", "run_rank(...)", exception_text)
        return logging.LogRecord("distributed.worker", logging.ERROR, "", 0, fmt, args, None)

    keep = _ExpectedFailure().filter
    assert not keep(record("DivergenceError('training diverged: loss=nan at epoch 1')"))
    assert keep(record("RuntimeError('Connection closed by peer')"))
    assert keep(record("WorkerLostError('...')"))
    other = logging.LogRecord("distributed.worker", logging.ERROR, "", 0, "other", (), None)
    assert keep(other)
    # a rank's task cancelled as its worker closes (Ctrl-C): the driver already says why
    from scaledl_lab.runtime.dask.worker import _ClosedRank

    def closing(key: str) -> logging.LogRecord:
        task = f"<Task cancelled name=\"execute('{key}')\" coro=<Worker.execute() done>>"
        text = f"Async instruction for {task} ended with CancelledError"
        return logging.LogRecord("distributed.worker", logging.WARNING, "", 0, text, (), None)

    assert not _ClosedRank().filter(closing("allreduce-dask-2w-rank0-197c2898"))
    assert _ClosedRank().filter(closing("some-other-task-0123"))


def test_a_divergence_on_dask_leaves_no_compute_failed_in_the_workers_logs(client):
    def listen() -> None:  # on each worker: keep what its logger lets through
        handler = logging.Handler()
        handler.name, handler.messages = "scaledl-test", []
        handler.emit = lambda record: handler.messages.append(record.getMessage())
        logging.getLogger("distributed.worker").addHandler(handler)

    def heard() -> list[str]:
        logger = logging.getLogger("distributed.worker")
        [handler] = [h for h in logger.handlers if h.name == "scaledl-test"]
        logger.removeHandler(handler)
        return handler.messages

    client.run(listen)
    cfg = CFG.replace(runtime="dask", model="cnn1d", lr=1e6, max_steps=4)
    with pytest.raises(DivergenceError, match=r"^training diverged: loss="):
        run(cfg, client=client, progress=False, log=None)
    logged = [m for messages in client.run(heard).values() for m in messages]
    assert not [m for m in logged if m.startswith("Compute Failed")], logged


def test_a_ctrl_c_that_a_finalizer_swallowed_stops_the_run_at_its_next_rows(monkeypatch, tmp_path):
    """Python prints and drops a KeyboardInterrupt raised inside a ``__del__`` (seen: a
    ledger's, mid-run, and the run went on); the CLI's handler also sets Interrupt.pending."""
    monkeypatch.setattr(Interrupt, "pending", True)  # as the handler leaves it
    with pytest.raises(KeyboardInterrupt):
        run(CFG.replace(max_steps=50), out=tmp_path / "r", progress=False, log=None)
    assert not (tmp_path / "r").exists() and partials(tmp_path / "r") == []  # nothing written
