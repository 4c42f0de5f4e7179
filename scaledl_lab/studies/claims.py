"""The paper's claims, each decided on measured tables (see :mod:`scaledl_lab.analysis`).

:func:`verdicts` reads the comparison table (:func:`scaledl_lab.analysis.comparison_table`) and
the traffic sweep (:func:`scaledl_lab.analysis.traffic_table`) and decides every claim into a
:class:`~scaledl_lab.studies.verdict.Claim`: **supported** or **not supported** by a stated rule, or
**inconclusive** where the measured difference lies inside the spread over seeds. Runs that
differ only in their seed (names ending " · seed N") are one method, reported as mean ± standard
deviation; variants that differ only in their learning rate (" · lr×F") are one method whose
rate is chosen on validation
(:func:`by_method`). Every number in its text comes from the tables or from the configs they
record (topology, straggler setting), never typed in.

Whose words: the paper itself is not at hand. ``docs/PAPER.md`` is the project's summary of it,
in our words. Each claim (:data:`CLAIMS`) is a claim the paper makes, as we read it, stated in
our words, beside the sentence of our summary it reads (quoted verbatim); every Claim says so
(``source``, ``quote``, ``in_our_words``). :func:`markdown_line` renders a Claim as the summaries
print it.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ..runtime.sim.cost import Stragglers
from ..topology import diameter, neighbours
from .verdict import Claim, Verdict, mark

MARGIN = 0.05  # a speed claim holds only if the difference exceeds this (timings are noisy)
ACC_POINTS = 2.0  # "reaches the accuracy": the best worker within this many points
# "Constant in N": within this fraction across N; "grows with N": by at least (1 − it) × N's growth.
TRAFFIC_TOLERANCE = 0.05
RATE_KEPT = 0.9  # "not coupled": the other workers keep this fraction of their step rate

from .paper_claims import CLAIMS, SOURCE  # noqa: E402  (the claims' words)

QUOTES: dict[str, str] = {key: quote for key, (_, quote) in CLAIMS.items()}


def quoted(key: str, test: str, verdict: Verdict, reason: str, figures: dict[str, float]) -> Claim:
    """The claim filed under ``key`` (a key of :data:`CLAIMS`), with the sentence of
    docs/PAPER.md it reads: ``test`` what is tested (with its rule), ``reason`` the numbers in
    words, ``figures`` by name."""
    claim, quote = CLAIMS[key]
    return Claim(key=key, claim=claim, source=SOURCE, quote=quote, in_our_words=True, test=test,
                 verdict=verdict, reason=reason, figures=figures)  # fmt: skip


def markdown_line(claim: Claim) -> str:
    """The summary's line: "- <claim> (our reading of the paper; docs/PAPER.md, our summary in
    our words: *“<quote>”*). Tested: <what is tested>: **<verdict>** — <numbers>." """
    return (
        f"- {claim.claim} (our reading of the paper; {claim.source}, our summary in our words: "
        f"*“{claim.quote}”*). Tested: {claim.test}: **{claim.verdict}** — {claim.reason}."
    )


SEED = re.compile(r" · seed \d+$")
LR_VARIANT = re.compile(r" · lr×[^ ]+")
ACCURACIES = ("test_acc_best_worker", "test_acc_spread", "val_acc_best_worker")
MEANS = ("time_per_epoch_s", "straggler_slowdown", "staleness", "speedup_vs_1_worker")


def decide(holds: bool, distance: float, spread: float) -> Verdict:
    """The verdict on a claim: "inconclusive" when the measured difference is within the
    seed ``spread`` of the claim's threshold (``distance``: how far it lies from it), else
    "supported" or "not supported" as ``holds`` says. One seed has no spread (0 or NaN)."""
    if spread > 0 and abs(distance) <= spread:
        return "inconclusive"
    return mark(holds)


def by_method(table: pd.DataFrame) -> pd.DataFrame:
    """One row per method: runs that differ only in their seed averaged (``seeds``, and the
    standard deviation of each accuracy in ``<column>_sd``); among variants that differ only in
    their learning rate, the one with the best mean validation accuracy of its best worker."""
    table = table.copy()
    table["method"] = table["run"].str.replace(SEED, "", regex=True)
    groups = table.groupby("method", sort=False)
    out = table.loc[[rows.index[0] for _, rows in groups]].reset_index(drop=True)
    out["run"], out["seeds"] = out["method"], [len(rows) for _, rows in groups]
    for col in (c for c in ACCURACIES + MEANS if c in table):
        out[col] = [rows[col].mean() for _, rows in groups]
        if col in ACCURACIES:
            out[f"{col}_sd"] = [
                rows[col].std(ddof=1) if len(rows) > 1 else 0.0 for _, rows in groups
            ]
    if "val_acc_best_worker" in out and out["run"].str.contains(LR_VARIANT).any():
        out["family"] = out["run"].str.replace(LR_VARIANT, "", regex=True)
        best = out.groupby("family", sort=False)["val_acc_best_worker"].idxmax()
        out = out.loc[sorted(best)].reset_index(drop=True)
    return out


def _acc(row: pd.Series, col: str = "test_acc_best_worker") -> str:
    """An accuracy, with ± its standard deviation over seeds where there are several."""
    seeds = int(row.get("seeds", 1))
    sd = f" ± {100 * row[f'{col}_sd']:.1f}" if seeds > 1 else ""
    return f"{row[col]:.2%}{sd}"


def _sd(*rows: pd.Series, col: str = "test_acc_best_worker") -> float:
    """The seed spread of a difference between ``rows``, in points: the sum of their sds."""
    return sum(100 * float(r.get(f"{col}_sd", 0.0) or 0.0) for r in rows)


def _behind(points: float, other: str) -> str:
    """``points`` (>0: behind) as words: "3.1 points behind X", "0.4 points ahead of X"."""
    if round(points, 1) == 0:
        return f"level with {other}"
    return f"{abs(points):.1f} points {'behind' if points > 0 else 'ahead of'} {other}"


def _mib(values: pd.Series) -> str:
    return ", ".join(f"{v / 2**20:.2f}" for v in values) + " MiB"


def _ns(workers: pd.Series) -> str:
    return ", ".join(str(int(n)) for n in workers)


def _slow_ranks(spec: str) -> str:
    """The straggler setting in words: "rank 5 4× slower"."""
    slow = Stragglers.parse(spec).slow
    if not slow:
        return f"stragglers {spec}"
    return ", ".join(f"rank {r} {f:g}× slower" for r, f in sorted(slow.items()))


def _pick(frame: pd.DataFrame, strategy: str, topology: str = "") -> pd.Series | None:
    hits = frame[frame["strategy"] == strategy]
    hits = hits[hits["topology"].fillna("").str.startswith(topology)]
    return hits.iloc[0] if len(hits) else None


def _traffic_verdict(traffic: pd.DataFrame) -> Claim | None:
    """Constant per NNT worker and sent to neighbours only (one gradient per neighbour), beside
    allreduce's per-worker bytes (bounded too, but every step global) and a server's load
    (growing with N): decided on the sweep's rows."""
    nnt = traffic[traffic["strategy"].str.startswith("nnt")].sort_values(["method", "workers"])
    ps = traffic[traffic["servers"] > 0].sort_values("workers")
    ring = traffic[traffic["strategy"] == "allreduce"].sort_values("workers")
    if nnt.empty or ps["workers"].nunique() < 2:
        return None
    parts, flat, local, figures = [], True, True, {}
    for method, rows in nnt.groupby("method", sort=False):
        sent = rows["bytes_per_worker_step"]
        flat &= bool(sent.max() <= (1 + TRAFFIC_TOLERANCE) * sent.min())
        figures |= {f"{method} bytes_per_worker_step @{n}w": b for n, b in zip(
            rows["workers"].astype(int), sent, strict=True)}  # fmt: skip
        grads = sent / rows["model_bytes"]
        degree = [len(neighbours(t, int(n), 0)) for t, n in zip(
            rows["topology"], rows["workers"], strict=True)]  # fmt: skip
        if grads.notna().all():
            local &= bool(np.allclose(grads, degree, rtol=TRAFFIC_TOLERANCE))
        per = f" ({grads.mean():.0f} gradients, one per neighbour)" if grads.notna().all() else ""
        parts.append(f"{method} {_mib(sent)} at N = {_ns(rows['workers'])}{per}")
    lo, hi = ps.iloc[0], ps.iloc[-1]
    growth = hi["server_bytes_per_round"] / lo["server_bytes_per_round"]
    more = hi["workers"] / lo["workers"]
    grows = bool(growth >= (1 - TRAFFIC_TOLERANCE) * more)
    figures |= {f"server_bytes_per_round @{int(r['workers'])}w": r["server_bytes_per_round"]
                for _, r in ps.iterrows()}  # fmt: skip
    figures |= {"server_growth": growth, "workers_growth": more}
    allreduce = ""
    if not ring.empty:
        figures |= {f"allreduce bytes_per_worker_step @{int(r['workers'])}w":
                    r["bytes_per_worker_step"] for _, r in ring.iterrows()}  # fmt: skip
        top = int(ring["workers"].max())
        torus = nnt[(nnt["workers"] == top) & nnt["topology"].fillna("").str.startswith("torus")]
        more_than = ""
        if len(torus):
            ratio = torus["bytes_per_worker_step"].iloc[0] / ring["bytes_per_worker_step"].iloc[-1]
            figures[f"nnt torus over allreduce @{top}w"] = ratio
            more_than = f"; at N = {top} an NNT torus worker sends ×{ratio:.1f} allreduce's bytes"
        allreduce = (
            f"; allreduce {_mib(ring['bytes_per_worker_step'])} at N = {_ns(ring['workers'])}: "
            f"bounded per worker too (2(N − 1)/N gradients), but every step a global "
            f"collective{more_than}"
        )
    return quoted(
        "traffic",
        f"an NNT worker's bytes per step stay constant as the workers grow (within "
        f"{TRAFFIC_TOLERANCE:.0%}) and are one gradient per neighbour, while the busiest "
        f"parameter server's grow with the workers",
        mark(flat and local and grows),
        f"bytes a worker sends per step: {'; '.join(parts)}{allreduce}; the busiest server moves "
        f"{_mib(ps['server_bytes_per_round'])} per round at N = {_ns(ps['workers'])} "
        f"(×{growth:.1f} for ×{more:g} workers; simulated, "
        f"{int(hi['servers'])} server{'s' if hi['servers'] > 1 else ''})",
        figures,
    )


def _straggler_verdicts(
    strag: pd.DataFrame, s_sync: pd.Series, s_nnt: pd.Series, s_async: pd.Series | None
) -> list[Claim]:
    """Two claims: the other workers' step rates (a worker does not wait for a slow one), where
    the table has them, and the whole run's slowdown (until its slowest worker is done) against
    synchronous SGD's: never waiting is not never being slowed."""
    slow, kept = "straggler_slowdown", "others_rate_kept"
    who = _slow_ranks(s_nnt["stragglers"])
    also = f", ×{s_async[slow]:.2f} for async PS" if s_async is not None else ""
    times = f"×{s_nnt[slow]:.2f} as long for NNT torus, ×{s_sync[slow]:.2f} for allreduce{also}"
    figures = {f"rank_{r}_slower": f for r, f in Stragglers.parse(s_nnt["stragglers"]).slow.items()}
    figures |= {"allreduce_slowdown": s_sync[slow], "nnt_torus_slowdown": s_nnt[slow]}
    if s_async is not None:
        figures["ps_async_slowdown"] = s_async[slow]
    degree = len(neighbours(s_nnt["topology"], int(s_nnt["workers"]), 0))
    out = []
    if kept in s_nnt and not math.isnan(s_nnt[kept]):
        nnt = strag[(strag["strategy"] == "nnt") & strag["topology"].fillna("").str.startswith(
            "torus")]  # fmt: skip
        others = nnt[nnt["run"] != s_nnt["run"]]
        variants = ", ".join(f"{r[kept]:.1%} with {r['run']}" for _, r in others.iterrows())
        rates = {"nnt_torus_rate_kept": s_nnt[kept], "allreduce_rate_kept": s_sync[kept]}
        rates |= {f"{r['run']} rate_kept": r[kept] for _, r in others.iterrows()}
        out.append(quoted(
            "straggler",
            f"the other workers of NNT keep at least {RATE_KEPT:.0%} of their step rate on "
            f"average, where synchronous SGD's do not",
            mark(s_nnt[kept] >= RATE_KEPT and s_sync[kept] < RATE_KEPT),
            f"with {who}, the others keep {s_nnt[kept]:.1%} of their step rate with NNT torus"
            + (f" ({variants})" if variants else "")
            + f", {s_sync[kept]:.1%} with allreduce (a mean: NNT's neighbours of the straggler "
            f"step faster, receiving fewer gradients to apply, and workers two hops away slower)",
            figures | rates,
        ))  # fmt: skip
    ok = s_nnt[slow] < (1 - MARGIN) * s_sync[slow]
    out.append(quoted(
        "straggler run",
        f"the straggler lengthens an epoch of the whole NNT run (until its slowest worker is "
        f"done) by less than synchronous SGD's (by more than {MARGIN:.0%})",
        mark(ok),
        f"with {who}, an epoch of the whole run takes {times}; the straggler itself applies "
        f"1 + {degree} gradients per step (its own and one per neighbour) at its slow pace",
        figures | {"degree": degree},
    ))  # fmt: skip
    return out


def _acc_figures(**rows: pd.Series) -> dict[str, float]:
    """Each row's best-worker test accuracy (and its seed sd where there are several seeds)."""
    out = {}
    for name, row in rows.items():
        out[f"{name}_acc"] = row["test_acc_best_worker"]
        if int(row.get("seeds", 1)) > 1:
            out[f"{name}_acc_sd"] = row["test_acc_best_worker_sd"]
    return out


def verdicts(table: pd.DataFrame, traffic: pd.DataFrame | None = None) -> list[Claim]:
    """The paper's claims, each decided on the measured tables: ``table`` as
    :func:`.reproduce.paper_table` builds it (simulated runs decide), ``traffic`` as
    :func:`.reproduce.traffic_summary` does. A claim whose runs are missing is left out; every
    number in a Claim comes from the tables or the configs they record."""
    sim = table[(table["runtime"] == "sim") & ~table["straggler"]]
    strag = table[table["straggler"]]
    out = []
    sim, strag = by_method(sim), by_method(strag)
    sync, ps_sync, ps_async = (_pick(sim, s) for s in ("allreduce", "ps-sync", "ps-async"))
    nnt_t, nnt_r = _pick(sim, "nnt", "torus"), _pick(sim, "nnt", "ring")
    acc = "test_acc_best_worker"
    if sync is not None and nnt_t is not None:
        gap = 100 * (sync[acc] - nnt_t[acc])
        out.append(
            quoted(
                "accuracy",
                f"NNT reaches the accuracy of synchronous SGD (best worker within {ACC_POINTS:g} "
                f"points, same epochs)",
                decide(gap <= ACC_POINTS, gap - ACC_POINTS, _sd(sync, nnt_t)),
                f"torus {_acc(nnt_t)}, {_behind(gap, 'allreduce')} ({_acc(sync)})",
                {**_acc_figures(nnt_torus=nnt_t, allreduce=sync), "gap_points": gap},
            )
        )
    if traffic is not None and (claim := _traffic_verdict(traffic)) is not None:
        out.append(claim)
    if sync is not None and nnt_t is not None and ps_sync is not None:
        t = "time_per_epoch_s"
        faster = nnt_t[t] < (1 - MARGIN) * min(sync[t], ps_sync[t])
        out.append(
            quoted(
                "time",
                f"NNT trains faster per epoch than the global patterns (by more than {MARGIN:.0%})",
                mark(faster),
                f"time per epoch NNT torus {nnt_t[t]:.2f} s, allreduce {sync[t]:.2f} s, PS sync "
                f"{ps_sync[t]:.2f} s (simulated, {int(nnt_t['workers'])} workers, steady state)",
                {
                    "nnt_torus_s": nnt_t[t],
                    "allreduce_s": sync[t],
                    "ps_sync_s": ps_sync[t],
                    "workers": nnt_t["workers"],
                },
            )
        )
    s_sync, s_async = _pick(strag, "allreduce"), _pick(strag, "ps-async")
    s_nnt = _pick(strag, "nnt", "torus")
    if s_sync is not None and s_nnt is not None:
        out += _straggler_verdicts(strag, s_sync, s_nnt, s_async)
    if ps_async is not None and sync is not None:
        gap = 100 * (sync[acc] - ps_async[acc])
        out.append(
            quoted(
                "staleness",
                f"Asynchronous PS pays for staleness (mean {ps_async['staleness']:.1f}) in "
                f"accuracy",
                decide(gap > 0, gap, _sd(sync, ps_async)),
                f"{_acc(ps_async)}, {_behind(gap, 'synchronous allreduce')} ({_acc(sync)})",
                {
                    **_acc_figures(ps_async=ps_async, allreduce=sync),
                    "gap_points": gap,
                    "staleness": ps_async["staleness"],
                },
            )
        )
    if nnt_r is not None and nnt_t is not None:
        n = int(nnt_t["workers"])
        d_t = diameter(nnt_t["topology"], n)
        d_r = diameter(nnt_r["topology"], int(nnt_r["workers"]))
        spread_t, spread_r = 100 * nnt_t["test_acc_spread"], 100 * nnt_r["test_acc_spread"]
        sd = _sd(nnt_t, nnt_r, col="test_acc_spread")
        out.append(
            quoted(
                "topology",
                f"Information crosses the torus in fewer hops than the ring (diameter {d_t} vs "
                f"{d_r} at {n} workers), so NNT's workers agree more on the torus",
                decide(spread_t < spread_r, spread_t - spread_r, sd),
                f"spread of the workers' test accuracies {spread_t:.1f} vs {spread_r:.1f} "
                f"points; best worker {_acc(nnt_t)} vs {_acc(nnt_r)}",
                {
                    "torus_diameter": d_t,
                    "ring_diameter": d_r,
                    "workers": n,
                    "torus_spread_points": spread_t,
                    "ring_spread_points": spread_r,
                    **_acc_figures(nnt_torus=nnt_t, nnt_ring=nnt_r),
                },
            )
        )
    return out
