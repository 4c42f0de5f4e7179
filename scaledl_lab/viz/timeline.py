"""Who waited, and for how long: a simulated run's timeline (``Results.timeline``) read.

The simulator records every virtual second of every worker as one of three bars: ``compute``,
``comm`` (sending, or a collective moving bytes) and ``idle`` (waiting for a message or for the
others in a collective).
"""

from __future__ import annotations

import pandas as pd


def idle_share(timeline: pd.DataFrame, frame: pd.DataFrame) -> pd.Series:
    """Each rank's share of its time spent idle up to its second-to-last training step (by
    rank). The last step of a decentralised run waits for every message still owed to the
    worker, which is the end of the run, not its pace (as :func:`~scaledl_lab.analysis.step_rates`
    reads it): a worker that never waits for a neighbour has 0 here."""
    train = frame[frame["kind"] == "train"]
    until = train.groupby("rank")["time"].apply(lambda t: t.sort_values().iloc[-2])
    bars = timeline[timeline["kind"] == "idle"]
    end = bars["end"].clip(upper=bars["rank"].map(until))
    idle = (end - bars["start"]).clip(lower=0.0).groupby(bars["rank"]).sum()
    return (idle.reindex(until.index, fill_value=0.0) / until).rename("idle_share")
