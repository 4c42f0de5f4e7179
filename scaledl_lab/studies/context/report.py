"""Context parallelism's claims decided on the measurements of :mod:`.study`, as typed
:class:`~scaledl_lab.studies.verdict.Claim` records, and results/context/ written from them:
``python -m scaledl_lab.studies.context.report`` runs the measurements and writes the CSVs and
``summary.md`` (``--out DIR`` elsewhere, ``--summary`` to render the summary from the CSVs)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...data.licenses import SEQUENCE
from ...runtime.collectives import ring_allreduce_bytes
from ..committed import markdown_table, read_tables, study_main, write_summary_lines
from ..verdict import Claim, mark
from . import study
from .plan import STATS, attention_bytes

LIU = "Liu et al. 2023, Ring Attention with Blockwise Transformers (in our words)"
JACOBS = "Jacobs et al. 2023, DeepSpeed Ulysses (in our words)"
ZIGZAG = "Llama 3 (Dubey et al. 2024) and Megatron-LM's context parallelism (in our words)"
TABLES = ("memory", "overlap", "traffic", "work")


def memory_claim(memory: pd.DataFrame) -> Claim:
    """Supported if every split ring run's activations per rank, times C, are between 0.8 and
    1.02 of the unsplit mesh's (about 1/C, at most 2% above it)."""
    ring = memory[(memory["method"] == "ring") & (memory["cp"] > 1)]
    ulysses = memory[(memory["method"] == "ulysses") & (memory["cp"] > 1)]
    ratios = ring["activations_times_c"]
    whole = ring[["params_times_c", "grads_times_c", "optim_times_c"]].div(ring["cp"], axis=0)
    low, high = whole.min().min(), whole.max().max()
    kept = f"{low:.2f}" if low == high else f"{low:.2f} to {high:.2f}"
    shown = ", ".join(f"C={r.cp} {r.activations_times_c:.3f}" for r in ring.itertuples())
    other = ", ".join(f"C={r.cp} {r.activations_times_c:.3f}" for r in ulysses.itertuples())
    return Claim(
        key="ring-memory",
        claim="Ring attention divides the activation memory per rank by C",
        source=LIU, in_our_words=True,
        verdict=mark(bool(((ratios >= 0.8) & (ratios <= 1.02)).all())),
        reason=f"gpt-tiny's activations per rank times C over the unsplit mesh's: ring {shown} "
        f"(below 1/C: it keeps Q, K, V, its output and the log-sum-exp, no S x S scores), "
        f"Ulysses {other}; the parameters, gradients and optimiser state stay whole on every "
        f"rank ({kept} times the unsplit mesh's at every C), "
        "the position embedding's rows for the whole sequence among them",
        figures={f"activations_times_c_{r.method}_{r.cp}": r.activations_times_c
                 for r in memory[memory["cp"] > 1].itertuples()},  # fmt: skip
        test="ring's activations per rank x C / the unsplit mesh's in [0.8, 1.02] for every C",
    )  # fmt: skip


def overlap_claim(overlap: pd.DataFrame) -> Claim:
    """Supported if the simulated forward takes the overlapped time (within 1%) at every point,
    and the transfers cost nothing (within 1% of the free link's time) exactly where a block's
    compute is at least its transfer."""
    follows = ((overlap["measured_s"] / overlap["overlapped_s"] - 1).abs() <= 0.01).all()
    hidden = overlap["exposed"] <= 0.01
    agrees = bool((hidden == overlap["hidden_by_rule"]).all())
    rows = overlap[overlap["hidden_by_rule"]]
    points = ", ".join(f"S/C={r.per_member} on {r.link}" for r in rows.itertuples())
    saved = (1 - overlap["measured_s"] / overlap["serial_s"]).max()
    return Claim(
        key="ring-overlap",
        claim="Ring attention's forward hides its transfers when a block's attention takes "
        "longer than sending the block",
        source=LIU, in_our_words=True, verdict=mark(bool(follows) and agrees),
        reason=f"the lab's ring posts each key/value block's send and receive before it attends "
        f"to the block it holds; its simulated forward took the overlapped time at every point "
        f"({bool(follows)}), and no longer than on a free link exactly where compute(block) >= "
        f"transfer(block) ({agrees}: {points}); up to {saved:.0%} below the time with every "
        "transfer after the blocks",
        figures={"points": len(overlap), "hidden_points": len(rows), "most_saved": saved,
                 "worst_exposed_where_hidden": rows["exposed"].max() if len(rows) else 0.0},
        test="forward time within 1% of sum over the sending steps of max(compute, transfer) "
        "plus the last block; within 1% of the free link's time iff compute(block) >= "
        "transfer(block)",
    )  # fmt: skip


def backward_overlap_claim(overlap: pd.DataFrame) -> Claim:
    """The forward's rule for the backward (a backward block computes twice the scores and
    sends twice the bytes: the same ratio), less the last hop of dK/dV home that nothing can
    hide: supported if the simulated backward takes within 1% of the free link's time plus
    one transfer exactly where compute(block) >= transfer(block)."""
    hidden = overlap["backward_beyond_home"] <= 0.01
    agrees = bool((hidden == overlap["hidden_by_rule"]).all())
    rows = overlap[overlap["hidden_by_rule"]]
    shown = ", ".join(f"S/C={r.per_member} on {r.link} {r.backward_exposed:.3f}"
                      for r in rows.itertuples())  # fmt: skip
    worst = float(rows["backward_beyond_home"].abs().max()) if len(rows) else 0.0
    return Claim(
        key="ring-overlap-backward",
        claim="Ring attention's backward hides its transfers when a block's attention takes "
        "longer than sending the block, all but the last hop of the key/value gradients home",
        source=LIU, in_our_words=True, verdict=mark(len(rows) > 0 and agrees),
        reason="the lab's ring posts the next block's exchange and the receive of the held "
        "block's key/value gradients before the block's attention, and sends their sum on as "
        "soon as it has it; the last hop home comes after the last block's work, so nothing "
        f"hides it: where compute(block) >= transfer(block), the backward took longer than on "
        f"a free link by {shown} of its free-link time, and within {worst:.1e} of the free "
        "link's time plus that one transfer; elsewhere more than 1% over it",
        figures={"worst_beyond_home_where_hidden": worst,
                 "worst_exposed_where_hidden": float(rows["backward_exposed"].max())
                 if len(rows) else 0.0},  # fmt: skip
        test="backward time within 1% of the free link's plus one transfer (the last hop "
        "home) iff compute(block) >= transfer(block)",
    )  # fmt: skip


def mesh_formula(memory: pd.DataFrame) -> pd.Series:
    """Per row of :func:`.study.memory_table`, the bytes a step of gpt-tiny on the ``cp`` mesh
    sends by the formulas: its attention's (:func:`.plan.attention_bytes`), the weights'
    gradients averaged over cp and the loss's (:mod:`.plan`)."""

    def formula(method: str, c: int, params: int) -> int:
        cfg = study.gpt_tiny_config(method, c)
        average = ring_allreduce_bytes(params, c) + ring_allreduce_bytes(STATS, c)
        return attention_bytes(cfg, SEQUENCE, study.BYTES) + average

    rows = memory.itertuples()
    return pd.Series([formula(r.method, r.cp, int(r.params)) for r in rows], index=memory.index)


def traffic_claim(traffic: pd.DataFrame, memory: pd.DataFrame) -> Claim:
    """Supported if the recorded bytes equal the formulas (attention alone, and gpt-tiny's
    steps on the mesh, the metrics' ``bytes_sent``), Ulysses' stay under their limit of four
    blocks (8·B·H·(S/C)·d bytes) at every point, and ring's grow at least as fast as C."""
    exact = bool((traffic["bytes_sent"] == traffic["formula"]).all() & traffic["ranks_alike"].all())
    steps = bool((memory["bytes_sent"] == mesh_formula(memory)).all())
    ulysses = traffic[traffic["method"] == "ulysses"]
    ring = traffic[traffic["method"] == "ring"]
    growth = {m: t["bytes_sent"].iloc[-1] / t["bytes_sent"].iloc[0] for m, t in
              (("ring", ring), ("ulysses", ulysses))}  # fmt: skip
    c_growth = ring["cp"].iloc[-1] / ring["cp"].iloc[0]
    bounded = bool((ulysses["per_block"] < 4).all())
    points = ", ".join(f"({r.sequence}, {r.cp})" for r in ring.itertuples())
    return Claim(
        key="ulysses-volume",
        claim="Ulysses' all-to-all volume per rank stays constant when the sequence and C grow "
        "together, while ring attention's does not",
        source=JACOBS, in_our_words=True,
        verdict=mark(exact and steps and bounded and growth["ring"] >= c_growth),
        reason=f"bytes one rank sent in a forward and backward at (S, C) = {points}, "
        f"equal to the formulas on every rank: {exact}, and gpt-tiny's steps on the mesh at "
        f"cp = {', '.join(map(str, sorted(set(memory['cp']))))} (the metrics' bytes_sent: "
        f"attention, the gradients' and the loss's average over cp) equal to them: {steps}; "
        "Ulysses "
        + ", ".join(f"{v:.2f}" for v in ulysses["per_block"])
        + " key/value blocks (under 4, (C-1)/C of it), x"
        f"{growth['ulysses']:.2f} over the points; ring "
        + ", ".join(f"{v:.0f}" for v in ring["per_block"])
        + f" blocks (3C - 2), x{growth['ring']:.2f} while C grew x{c_growth:.0f}",
        figures={"ulysses_growth": growth["ulysses"], "ring_growth": growth["ring"],
                 "c_growth": c_growth},
        test="recorded bytes = formula; Ulysses' under 8 B H (S/C) d bytes at every point; "
        "ring's first-to-last growth >= C's",
    )  # fmt: skip


def zigzag_claim(work: pd.DataFrame) -> Claim:
    """Supported if the zig-zag split's max/min causal work is within 1% of 1 at every C, and
    the plain split's between 0.9 and 1 times 2C − 1."""
    first = work.drop_duplicates(["cp", "split"])
    zig, plain = first[first["split"] == "zig-zag"], first[first["split"] == "plain"]
    level = bool(((zig["max_over_min"] - 1).abs() <= 0.01).all())
    near = plain["max_over_min"] / plain["two_c_minus_one"]
    skewed = bool(((near >= 0.9) & (near <= 1)).all())
    return Claim(
        key="zigzag",
        claim="The zig-zag split makes the ranks' causal-attention work equal, where a plain "
        "split's is near 2C - 1 from the last rank to the first",
        source=ZIGZAG, in_our_words=True, verdict=mark(level and skewed),
        reason="max/min of the scores ring attention counted per rank: zig-zag "
        + ", ".join(f"C={r.cp} {r.max_over_min:.2f}" for r in zig.itertuples())
        + "; plain "
        + ", ".join(f"C={r.cp} {r.max_over_min:.2f} (2C-1 = {r.two_c_minus_one})"
                    for r in plain.itertuples()),  # fmt: skip
        figures={f"{r.split}_{r.cp}": r.max_over_min for r in first.itertuples()},
        test="zig-zag max/min within 0.01 of 1; plain max/min in [0.9, 1] x (2C - 1)",
    )  # fmt: skip


def verdicts(tables: dict[str, pd.DataFrame]) -> list[Claim]:
    return [memory_claim(tables["memory"]), overlap_claim(tables["overlap"]),
            backward_overlap_claim(tables["overlap"]),
            traffic_claim(tables["traffic"], tables["memory"]),
            zigzag_claim(tables["work"])]  # fmt: skip


def verdict_section(tables: dict[str, pd.DataFrame]) -> list[str]:
    """The summary's verdict lines, rendered from the typed claims."""
    lines = ["## Verdicts", ""]
    return lines + [f"- **{c.key}** ({c.verdict}): {c.reason}." for c in verdicts(tables)]


def measure() -> dict[str, pd.DataFrame]:
    return {"memory": study.memory_table(), "overlap": study.overlap_table(),
            "traffic": study.traffic_table(), "work": study.work_table()}  # fmt: skip


def read(out: str | os.PathLike[str]) -> dict[str, pd.DataFrame]:
    return read_tables(out, TABLES)


def write_summary(out: str | os.PathLike[str], tables: dict[str, pd.DataFrame]) -> Path:
    overlap = tables["overlap"].drop(columns=["sequence", "cp", "backward_free_s"])
    lines = ["# Context parallelism's claims", "",
             "Measured on the simulator by ``python -m scaledl_lab.studies.context.report`` "
             "(:mod:`scaledl_lab.studies.context`). Bytes, float32.", "",
             "## Memory and bytes per rank: gpt-tiny, batch 8, one step (`memory.csv`)", "",
             *markdown_table(tables["memory"][["method", "cp", "params", "activations",
                                       "activations_times_c", "bytes_sent"]]
                     .assign(formula_bytes=mesh_formula(tables["memory"]))), "",
             f"## Ring attention's forward and backward, C = 4, compute at {study.DEVICE}'s "
             "rate (`overlap.csv`, seconds)", "", *markdown_table(overlap), "",
             "## Bytes per rank, one forward and backward, B = 1, H = 8, d = 8 (`traffic.csv`)",
             "", *markdown_table(tables["traffic"]), "",
             "## Causal work per rank (`work.csv`: scores per rank)", "",
             *markdown_table(tables["work"].drop_duplicates(["cp", "split"])
                     .drop(columns=["rank", "scores"])), "",
             *verdict_section(tables)]  # fmt: skip
    return write_summary_lines(out, lines)


def main(argv: list[str] | None = None) -> None:
    study_main(
        argv,
        description="Context parallelism's claims, measured.",
        default_out="results/context",
        names=TABLES,
        measure=measure,
        write_summary=write_summary,
    )


if __name__ == "__main__":
    main()
