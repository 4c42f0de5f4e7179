"""How far a run moves when only the CPU's kernels change, next to how far it moves with the seed.

The simulator is bit-identical for a given seed on one machine and torch build. Another
processor runs other vectorised kernels (AVX-512, AVX2, NEON, or plain C++), which round sums
in another order: the same run then drifts. ``ATEN_CPU_CAPABILITY`` picks torch's kernel set
on one machine, so that drift can be measured here, set by set, beside the spread over seeds.

The cases are the notebooks' own quick-mode settings (the cells that print accuracies), so
their tolerances are read from what this script measures (``results/kernel-drift/``):

- ``03 §3``: 16 simulated workers, MLP, SGD 0.05: ps-sync, ps-async, staleness-aware,
  DC-ASGD-a, Hogwild! (notebook 03, section 3);
- ``03 downpour``: 8 workers, one epoch: ps-async and Downpour (notebook 03, exercise 3);
- ``04 §5``: 16 workers; allreduce and D-PSGD with Adam 1e-3, NNT ring and torus and staged NNT
  with the paper's AdaGrad (the NNT family's default) (notebook 04, section 5);
- ``04 §7``: 8 workers, 2 epochs: allreduce, local SGD, EASGD, AD-PSGD (notebook 04, exercise 3).

Every (kernel set, seed) runs in a process of its own (the variable is read when torch loads);
the native set also runs seed 0 twice, to check that a run repeats bit for bit.

    python benchmarks/kernel_drift.py [--seeds 5] [--kernels native avx2 default] [--jobs 2]
                                      [--out results/kernel-drift]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def cases() -> dict[str, list]:
    """The notebooks' quick-mode configs, by case (seed 0; the script varies it)."""
    from scaledl_lab import ExperimentConfig
    from scaledl_lab.strategies.decentralised import NNT_ADAGRAD

    nb03 = ExperimentConfig(
        runtime="sim", workers=16, dataset="fashion-mnist", model="mlp", batch_size=32,
        lr=0.05, momentum=0.0, epochs=6, val_size=500, test_subset=1000, train_subset=3072,
    )  # fmt: skip
    pair = nb03.replace(workers=8, epochs=1, train_subset=4096, val_size=0, test_subset=1000)
    nb04 = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=16, dataset="fashion-mnist", model="mlp",
        optimizer="adam", lr=1e-3, momentum=0.0, weight_decay=0.0, batch_size=32, epochs=4,
        val_size=500,
        train_subset=2048, test_subset=500,
    )  # fmt: skip
    loose = nb04.replace(workers=8, epochs=2, train_subset=4096)
    paper = nb04.replace(**NNT_ADAGRAD.settings)  # NNT as the paper ran it
    return {
        "03 §3": [
            *(nb03.replace(strategy=s, name=s) for s in ("ps-sync", "ps-async", "staleness-aware")),
            nb03.replace(strategy="dc-asgd", dc_adaptive=True, dc_lambda=2.0, name="dc-asgd-a"),
            nb03.replace(strategy="hogwild", name="hogwild"),
        ],
        "03 downpour": [
            pair.replace(strategy="ps-async", name="ps-async"),
            pair.replace(strategy="downpour", n_push=4, n_fetch=4, name="downpour"),
        ],
        "04 §5": [
            nb04.replace(name="allreduce"),
            paper.replace(strategy="nnt", topology="ring", name="nnt ring"),
            paper.replace(strategy="nnt", topology="torus:4x4", name="nnt torus 4x4"),
            paper.replace(strategy="nnt-staged", topology="torus:4x4", name="nnt-staged torus 4x4"),
            nb04.replace(strategy="dpsgd", topology="torus:4x4", name="dpsgd torus 4x4"),
        ],
        "04 §7": [
            loose.replace(name="allreduce"),
            loose.replace(strategy="local-sgd", sync_period=4, name="local-sgd"),
            loose.replace(strategy="easgd", sync_period=4, name="easgd"),
            loose.replace(strategy="adpsgd", topology="ring", name="adpsgd ring"),
        ],
    }


def _final(frame: pd.DataFrame, run: str) -> dict[str, float]:
    """The figures the notebooks print: the last test evaluation (rank 0's for one-model
    methods), the best-on-validation worker's and the workers' mean, the last consensus."""
    from scaledl_lab.analysis import final_scores

    rows = frame[frame["run"] == run]
    test = rows[rows["kind"] == "test"]
    scores = final_scores(rows)
    consensus = rows[rows["kind"] == "consensus"]["value"]
    return {
        "test_acc": float(test["accuracy"].iloc[-1]),
        "test_loss": float(test["loss"].iloc[-1]),
        "test_acc_best_worker": scores["best"],
        "test_acc_mean": scores["mean"],
        "consensus": float(consensus.iloc[-1]) if len(consensus) else float("nan"),
    }


def child(kernel: str, seed: int, out: Path, repeat: bool, only: list[str] | None) -> None:
    """Run every case at ``seed`` under this process's kernel set; write finals and curves."""
    import torch

    from scaledl_lab import compare

    capability = torch.backends.cpu.get_cpu_capability()
    finals, curves, identical = [], [], []
    for case, configs in cases().items():
        if only and case not in only:
            continue
        configs = [c.replace(seed=seed) for c in configs]
        frame = compare(configs, progress=False, log=None).frame
        if repeat:
            again = compare(configs, progress=False, log=None).frame
            identical.append(frame.equals(again))
        for cfg in configs:
            key = {"case": case, "run": cfg.name, "strategy": cfg.strategy, "seed": seed}
            finals.append({**key, "kernel": kernel, "capability": capability,
                           **_final(frame, cfg.name)})  # fmt: skip
        evals = frame[frame["kind"] == "test"]
        for row in evals.itertuples():
            curves.append({"case": case, "run": row.run, "seed": seed, "kernel": kernel,
                           "rank": row.rank, "step": row.step, "epoch": row.epoch,
                           "accuracy": row.accuracy, "loss": row.loss})  # fmt: skip
    out.write_text(
        json.dumps({"finals": finals, "curves": curves, "repeat_identical": identical or None})
    )


def _spawn(kernel: str, seed: int, tmp: Path, repeat: bool, only: list[str] | None) -> dict:
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "native":
        env["ATEN_CPU_CAPABILITY"] = kernel
    out = tmp / f"{kernel}-{seed}.json"
    cmd = [sys.executable, __file__, "--child", kernel, "--seed", str(seed), "--to", str(out)]
    if repeat:
        cmd.append("--repeat")
    if only:
        cmd += ["--cases", *only]
    subprocess.run(cmd, env=env, check=True)
    return json.loads(out.read_text())


def summarise(finals: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per (case, run, metric): the drift across kernel sets (largest over seeds of the range
    between kernel sets; for accuracy also over every evaluation of the curve), the spread over
    seeds (standard deviation and range, native kernels), and the distribution of every draw
    (each seed on each kernel set): its mean, standard deviation, lowest and highest value."""
    rows = []
    native = finals["kernel"].iloc[0]  # the first kernel set is the machine's own
    for (case, run), g in finals.groupby(["case", "run"], sort=False):
        c = curves[(curves["case"] == case) & (curves["run"] == run)]
        points = c.groupby(["seed", "rank", "step"])["accuracy"]
        for metric in ("test_acc", "test_acc_best_worker", "test_loss"):
            per_seed = g.groupby("seed")[metric]
            mine = g[g["kernel"] == native].set_index("seed")[metric]
            row = {"case": case, "run": run, "metric": metric,
                   "kernel_drift_max": (per_seed.max() - per_seed.min()).max(),
                   "seed_sd": mine.std(ddof=1), "seed_range": mine.max() - mine.min(),
                   "draws": int(g[metric].notna().sum()), "mean": g[metric].mean(),
                   "sd": g[metric].std(ddof=1), "min": g[metric].min(), "max": g[metric].max(),
                   "seed0": mine.loc[0]}  # fmt: skip
            if metric == "test_acc":
                row["curve_drift_max"] = (points.max() - points.min()).max()
            rows.append(row)
    table = pd.DataFrame(rows)
    table["drift_over_seed_sd"] = table["kernel_drift_max"] / table["seed_sd"]
    return table


def _write_summary(out: Path, table: pd.DataFrame, meta: dict) -> None:
    table.to_csv(out / "drift.csv", index=False)
    kernels = [f"{k} ({c})" for k, c in meta["kernels"].items()]
    text = _markdown(table, kernels, len(meta["seeds"]), meta["repeat_bit_identical"])
    (out / "summary.md").write_text(text)


def _markdown(table: pd.DataFrame, kernels: list[str], seeds: int, identical: bool) -> str:
    acc = table[table["metric"] == "test_acc"]
    lines = [
        "# How far runs move across CPU kernel sets",
        "",
        f"Kernel sets (`ATEN_CPU_CAPABILITY`): {', '.join(kernels)}; seeds 0..{seeds - 1}; "
        "the notebooks' quick-mode settings (see `benchmarks/kernel_drift.py`). Seed 0 run "
        f"twice on the native kernels: bit-identical = {identical}.",
        "",
        "Test accuracy at the end of each run (rank 0's last evaluation; the best-on-validation "
        "worker's, which notebook 04 prints, is `test_acc_best_worker` in `drift.csv`). *Drift*: "
        "the largest difference between kernel sets for one seed, at the end and at any "
        "evaluation of the curve; *seeds*: the spread over seeds on the native kernels; *all "
        "draws*: every seed on every kernel set.",
        "",
        "| case | run | drift (final) | drift (any eval) | sd over seeds | range over seeds "
        "| drift / seed sd | all draws: mean ± sd | min | max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in acc.itertuples():
        lines.append(
            f"| {r.case} | {r.run} | {r.kernel_drift_max:.4f} | {r.curve_drift_max:.4f} | "
            f"{r.seed_sd:.4f} | {r.seed_range:.4f} | {r.drift_over_seed_sd:.2f} | "
            f"{r.mean:.3f} ± {r.sd:.3f} | {r.min:.3f} | {r.max:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--kernels", nargs="+", default=["native", "avx2", "default"])
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time (default 2)")
    parser.add_argument("--cases", nargs="+", help="only these cases (default: all)")
    parser.add_argument("--out", default=str(ROOT / "results" / "kernel-drift"))
    parser.add_argument(
        "--summarise", action="store_true", help="only rebuild drift.csv and summary.md from --out"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--to", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seed, Path(args.to), args.repeat, args.cases)
        return

    out = Path(args.out)
    if args.summarise:
        finals, curves = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "curves.csv")
        meta = json.loads((out / "config.json").read_text())
        _write_summary(out, summarise(finals, curves), meta)
        return

    from scaledl_lab.environment import environment_info

    started = time.perf_counter()
    jobs = [(k, s) for s in range(args.seeds) for k in args.kernels]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        done = list(
            pool.map(
                lambda ks: _spawn(*ks, Path(tmp), ks == (args.kernels[0], 0), args.cases), jobs
            )
        )
    finals = pd.DataFrame([row for d in done for row in d["finals"]])
    curves = pd.DataFrame([row for d in done for row in d["curves"]])
    capabilities = finals.groupby("kernel", sort=False)["capability"].first().to_dict()
    if len(set(capabilities.values())) < len(capabilities):
        raise SystemExit(f"two kernel sets ran the same kernels here: {capabilities}")
    identical = all(x for d in done for x in (d["repeat_identical"] or []))
    out.mkdir(parents=True, exist_ok=True)
    finals.to_csv(out / "runs.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    ran = set(finals.case)
    configs = {c: [x.to_dict() for x in cfgs] for c, cfgs in cases().items() if c in ran}
    (out / "config.json").write_text(
        json.dumps(
            {
                "kernels": capabilities,
                "seeds": list(range(args.seeds)),
                "repeat_bit_identical": identical,
                "cases": configs,
                "environment": environment_info(),
                "seconds": round(time.perf_counter() - started),
            },
            indent=1,
            default=str,
        )  # fmt: skip
    )
    _write_summary(out, summarise(finals, curves), json.loads((out / "config.json").read_text()))
    print((out / "summary.md").read_text())
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
