"""Messages in flight past the simulator's memory budget go to disk and come back byte for byte."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch

from scaledl_lab import DivergenceError, ExperimentConfig, run
from scaledl_lab.runtime.sim import mail as mail_module
from scaledl_lab.runtime.sim.mail import Copies, Mail, Sent

# Unbounded NNT with a straggler: the straggler's neighbours run ahead and flood the workers two
# hops away, so many gradients wait in the mail (the case that made the budget necessary).
FLOODED = ExperimentConfig(
    strategy="nnt", runtime="sim", workers=9, topology="torus:3x3", dataset="fashion-mnist",
    model="mlp", batch_size=16, train_subset=9 * 16 * 12, val_size=64, test_subset=128,
    optimizer="adagrad", lr=0.01, stragglers="slow:4:6", epochs=1, seed=1,
)  # fmt: skip


def _spill_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("scaledl-sim-mail-*"))


def test_a_spilled_message_comes_back_bit_for_bit_in_order():
    box = Mail(spill_after=3 * 4)  # room for one 3-element float32 message
    sent = [torch.randn(3), torch.randn(2, 2, dtype=torch.float64), torch.arange(4).bfloat16()]
    for i, t in enumerate(sent):
        box.put(0, 1, float(i), Sent(t, readers=1))
    assert box.held == 12 and box.spilled == 2
    for i, t in enumerate(sent):
        arrival, got = box.take(0, 1)
        message = got.take()
        assert arrival == float(i) and message.dtype == t.dtype and torch.equal(message, t)
    assert (0, 1) not in box and box.held == 0
    box.close()


def test_spilling_every_message_changes_no_number(monkeypatch):
    before = _spill_dirs()
    flooded = FLOODED.replace(max_steps=6)  # half the epoch: 216 gradients, many waiting at once
    kept = run(flooded, progress=False, log=None).frame
    spilled: list[Mail] = []

    class Counting(Mail):
        def __init__(self) -> None:
            super().__init__(spill_after=0)
            spilled.append(self)

    monkeypatch.setattr("scaledl_lab.runtime.sim.scheduler.Mail", Counting)
    on_disk = run(flooded, progress=False, log=None).frame
    pd.testing.assert_frame_equal(kept, on_disk)
    assert spilled[0].spilled > 50  # most of the run's gradients went through the disk
    assert _spill_dirs() == before  # and the files are gone when the run ends
    assert mail_module.SPILL_AFTER_BYTES >= 256 << 20


def test_a_simulated_run_leaves_the_process_malloc_as_it_found_it(monkeypatch):
    """The kernel of a notebook runs many simulations: none may keep the training tuning (or
    the memory it keeps) after it ends, also when it ends in an error."""
    calls: list[str] = []
    import scaledl_lab.runtime.sim.scheduler as scheduler

    @contextmanager
    def recorded():
        calls.append("keep")
        try:
            yield True
        finally:
            calls.append("back")

    monkeypatch.setattr(scheduler, "freed_memory_kept", recorded)
    run(FLOODED.replace(stragglers=None, max_steps=2), progress=False, log=None)
    assert calls == ["keep", "back"]
    calls.clear()
    with pytest.raises(DivergenceError):
        run(FLOODED.replace(stragglers=None, lr=1e6, optimizer="sgd"), progress=False, log=None)
    assert calls == ["keep", "back"]


def test_hand_back_memory_restores_the_start_up_settings(monkeypatch):
    from scaledl_lab.runtime import memory

    set_to: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, option: int, value: int) -> int:
            set_to.append((option, value))
            return 1

        def malloc_trim(self, pad: int) -> int:
            set_to.append(("trim", pad))
            return 1

    monkeypatch.setattr(memory, "_libc", Libc)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # what Dask's nanny sets
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    with memory.freed_memory_kept():
        assert set_to[-1] == (memory.M_MMAP_MAX, 0)
    assert set_to[3:] == [(memory.M_TRIM_THRESHOLD, 65536), (memory.M_MMAP_THRESHOLD, 128 * 1024),
                          (memory.M_MMAP_MAX, 65536), ("trim", 0)]  # fmt: skip


def test_receivers_of_one_send_share_one_copy_and_read_it_unchanged():
    copies = Copies()
    gradient = torch.randn(5)
    sent = gradient.clone()
    shares = [copies.of(0, gradient) for _ in range(3)]  # one send to three neighbours
    assert shares[0] is shares[1] is shares[2] and shares[0].readers == 3
    gradient.mul_(0.0)  # the sender's buffer changes after the send: the copy does not
    first = shares[0].take()
    first.add_(1.0)  # a reader changes what it read in place (clipping does) ...
    second, last = shares[1].take(), shares[2].take()
    assert torch.equal(second, sent) and torch.equal(last, sent)  # ... the others don't see it
    assert not torch.equal(first, sent) and shares[0].tensor is None  # the last took the copy
    again = copies.of(1, gradient)
    assert copies.of(1, gradient) is again and again.readers == 2  # unchanged: shared
    gradient.add_(1.0)  # changed in place (its version counter moved): a copy of its own
    assert copies.of(1, gradient) is not again and torch.equal(again.take(), sent * 0.0)


@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-naive", "nnt", "ps-sync"])
def test_a_finished_run_keeps_no_replica_alive(strategy):
    """What a run returns are copies: its worlds, models and gradients go when it ends (a hook
    that held the allreduce reducer strongly kept every run's replicas alive in a notebook)."""
    import gc

    from scaledl_lab.runtime.sim.scheduler import SimWorld

    def alive() -> tuple[int, int]:
        gc.collect()
        objects = gc.get_objects()
        kinds = [type(o) for o in objects]  # not isinstance: no lazy module's __getattr__ runs
        return kinds.count(SimWorld), kinds.count(torch.nn.Parameter)

    topology = FLOODED.topology if strategy == "nnt" else None
    cfg = FLOODED.replace(strategy=strategy, topology=topology, stragglers=None, max_steps=2)
    run(cfg, progress=False, log=None)  # the model template stays: one model, then no more
    before = alive()
    results = run(cfg, progress=False, log=None)
    assert alive() == before and before[0] == 0
    assert len(results.outputs[cfg.label]) == cfg.workers  # the final weights are kept


def test_weights_false_keeps_the_tables_and_no_model():
    """A sweep of large models may keep only its tables: the same rows and per-rank outputs,
    without any rank's final parameters (what notebook 06's ResNet-18 sweeps do)."""
    cfg = ExperimentConfig(
        strategy="gpipe", runtime="sim", workers=2, micro_batches=2, dataset="fashion-mnist",
        model="mlp", batch_size=8, train_subset=64, val_size=0, test_subset=32, max_steps=3,
    )  # fmt: skip
    kept, dropped = run(cfg, progress=False), run(cfg, progress=False, weights=False)
    pd.testing.assert_frame_equal(kept.frame, dropped.frame)
    pd.testing.assert_frame_equal(kept.events, dropped.events)
    for full, light in zip(kept.outputs[cfg.label], dropped.outputs[cfg.label], strict=True):
        assert "state_dict" in full and "state_dict" not in light
        assert {k: v for k, v in full.items() if k != "state_dict"} == light
    assert dropped.weights() == {}


# NNT with a lead bound posts lead + 1 receives per neighbour: buffers that wait for a message.
BOUNDED = ExperimentConfig(
    strategy="nnt", runtime="sim", workers=9, topology="torus:3x3", dataset="fashion-mnist",
    model="mlp", batch_size=16, train_subset=9 * 16 * 6, val_size=64, test_subset=128,
    optimizer="adagrad", lr=0.01, stragglers="slow:4:3", nnt_max_lead=2, epochs=1, seed=1,
)  # fmt: skip


def test_a_posted_buffer_holds_no_memory_of_its_own_until_its_message_comes():
    from scaledl_lab.runtime.sim import comm as sim_comm
    from scaledl_lab.runtime.sim import mail as sim_mail

    a, b = torch.empty(1000), torch.empty(1000)
    assert sim_mail.lend(a) and sim_mail.lend(b)
    assert a.data_ptr() == b.data_ptr()  # both on the one placeholder
    assert a.shape == (1000,) and a.is_contiguous()
    whole = torch.zeros(2000)
    view, aliased = whole[:1000], torch.empty(1000)
    keep = aliased.view(10, 100)  # another tensor sees its storage
    assert not sim_mail.lend(view) and not sim_mail.lend(aliased)
    assert not sim_mail.lend(torch.empty(3, requires_grad=True))
    assert keep.data_ptr() == aliased.data_ptr() != a.data_ptr()
    message = torch.randn(1000)
    sent = Sent(message, readers=1)
    incoming = sim_comm.SimIncoming.__new__(sim_comm.SimIncoming)
    incoming.tensor, incoming.lent, incoming.copied = a, True, False
    incoming._fill(sent)  # the last reader's buffer takes the message's copy as its storage
    assert torch.equal(a, message) and a.data_ptr() != b.data_ptr() and sent.tensor is None


def test_lending_posted_buffers_changes_no_number(monkeypatch):
    lent = run(BOUNDED, progress=False, log=None).frame
    monkeypatch.setattr("scaledl_lab.runtime.sim.comm.lend", lambda tensor: False)
    copied = run(BOUNDED, progress=False, log=None).frame
    pd.testing.assert_frame_equal(lent, copied)
