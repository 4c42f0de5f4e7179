"""Two tiers of network in the simulator's cost model: a link inside a node and a link between
nodes, rank r on node r // gpus_per_node, each collective charged at the links its group's ring
crosses, each message at the link between its two ranks' nodes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from common import SMALL

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.runtime.sim.cost import NETWORKS, ComputeProfile, CostModel, NetworkProfile
from scaledl_lab.runtime.sim.network import link_of
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.memory.plan import plan
from scaledl_lab.strategies.memory.transformer import Transformer, plan_transformer

NUMEL = 2**18  # float32: 1 MiB
NBYTES = NUMEL * 4


def _alpha_beta(net: NetworkProfile, inter: bool) -> tuple[float, float]:
    """A link's (α, β) read from the profile's own fields."""
    if inter:
        return net.inter_latency_s, net.inter_bandwidth_Bps
    return net.latency_s, net.bandwidth_Bps


# The ring's steps and what each step sends, p members, n bytes (Patarasuk & Yuan; the byte
# formulas of scaledl_lab.runtime.collectives): per step α + chunk/β on the link it crosses.
RING = {
    "allreduce": lambda p, n: (2 * (p - 1), n / p),
    "reduce_scatter": lambda p, n: (p - 1, n / p),
    "all_gather_into": lambda p, n: (p - 1, n / p),  # n: the gathered result, p shards
    "allgather": lambda p, n: (p - 1, n),  # n from each member
}


async def _collective(comm, kind: str, group) -> None:
    if kind == "allreduce":
        await comm.allreduce(torch.ones(NUMEL), group=group)
    elif kind == "reduce_scatter":
        await comm.reduce_scatter(torch.ones(NUMEL), group=group)
    elif kind == "all_gather_into":
        p = len(group)
        await comm.all_gather_into(torch.empty(NUMEL), torch.ones(NUMEL // p), group=group)
    else:
        await comm.allgather(torch.ones(NUMEL), group=group)


def _time_of_group(kind: str, members: tuple[int, ...], gpus_per_node: int, world: int = 8):
    """Virtual seconds the members of ``members`` spend in one collective among themselves
    (every rank creates the group, as torch.distributed requires; the others wait)."""
    cost = CostModel(
        ComputeProfile("t", 0.0, 1e-9), NETWORKS["h100-node"], gpus_per_node=gpus_per_node
    )
    sim = SimWorld(world, cost)
    times = {}

    async def program(comm):
        group = comm.new_group(members)
        if comm.rank in group:
            await _collective(comm, kind, group)
            times[comm.rank] = comm.now()

    sim.run([program] * world)
    assert len(set(times.values())) == 1  # every member ends together
    return times[members[0]]


@pytest.mark.parametrize("kind", sorted(RING))
def test_one_group_inside_a_node_and_across_two_differs_by_what_the_links_predict(kind):
    """Ranks 0-3 on a node of 4 GPUs ride NVLink; on nodes of 2 their ring crosses between
    nodes on two of its hops and every step waits for the slower link (InfiniBand)."""
    net, members = NETWORKS["h100-node"], (0, 1, 2, 3)
    inside = _time_of_group(kind, members, gpus_per_node=4)
    across = _time_of_group(kind, members, gpus_per_node=2)
    steps, chunk = RING[kind](len(members), NBYTES)
    (a_in, b_in), (a_out, b_out) = _alpha_beta(net, False), _alpha_beta(net, True)
    assert inside == pytest.approx(steps * (a_in + chunk / b_in), rel=1e-12)
    assert across == pytest.approx(steps * (a_out + chunk / b_out), rel=1e-12)
    difference = steps * ((a_out - a_in) + chunk * (1 / b_out - 1 / b_in))
    assert across - inside == pytest.approx(difference, rel=1e-9)
    assert across > 2 * inside  # InfiniBand: the slower link by far


def test_tensor_parallel_groups_innermost_stay_inside_a_node():
    """8 ranks on 2 nodes of 4, groups of 2: adjacent ranks (the innermost mesh dimension)
    share a node; ranks 4 apart (the outermost) are on two nodes."""
    net = NETWORKS["h100-node"]
    inner = _time_of_group("allreduce", (2, 3), gpus_per_node=4)
    outer = _time_of_group("allreduce", (2, 6), gpus_per_node=4)
    (a_in, b_in), (a_out, b_out) = _alpha_beta(net, False), _alpha_beta(net, True)
    assert inner == pytest.approx(2 * (a_in + NBYTES / 2 / b_in), rel=1e-12)
    assert outer == pytest.approx(2 * (a_out + NBYTES / 2 / b_out), rel=1e-12)


@pytest.mark.parametrize(("dst", "inter"), [(1, False), (2, True)])
def test_a_message_crosses_the_link_between_its_two_ranks_nodes(dst, inter):
    net = NETWORKS["a100-node"]
    sim = SimWorld(4, CostModel(ComputeProfile("t", 0.0, 1e-9), net, gpus_per_node=2))
    got = {}

    async def program(comm):
        if comm.rank == 0:
            await comm.send(torch.ones(NUMEL), dst=dst)
        elif comm.rank == dst:
            await comm.recv(torch.zeros(NUMEL), src=0)
            got["at"] = comm.now()

    sim.run([program] * 4)
    latency, bandwidth = _alpha_beta(net, inter)
    assert got["at"] == pytest.approx(latency + NBYTES / bandwidth, rel=1e-12)


def test_the_placement_picks_the_link():
    net = NETWORKS["h100-node"]
    assert link_of(net, None, range(64)) is net.intra  # every worker on one node
    assert link_of(net, 8, range(8)) is net.intra and link_of(net, 8, (7, 8)) is net.inter
    assert link_of(net, 8, (16, 23)) is net.intra  # node 2
    one = NETWORKS["100g-ib"]
    assert link_of(one, 1, (0, 5)) is one and one.inter is one and one.intra is one
    assert (net.inter.latency_s, net.inter.bandwidth_Bps) == _alpha_beta(net, inter=True)
    assert (net.intra.latency_s, net.intra.bandwidth_Bps) == _alpha_beta(net, inter=False)


SAME = dict(runtime="sim", model="mlp", **{**SMALL, "max_steps": 6})


@pytest.mark.parametrize(
    "setting",
    [
        dict(strategy="allreduce", workers=4),
        dict(strategy="zero2", workers=4),
        dict(strategy="ps-async", workers=4, servers=2),
        dict(strategy="gpipe", workers=2, stages=2, micro_batches=2),
    ],
)
def test_two_equal_tiers_give_the_one_tier_numbers_bit_for_bit(setting):
    """A two-tier network whose links are the same is today's one-tier network: the same
    metrics, time column included, whatever the placement (collectives, messages, servers)."""
    one = run(ExperimentConfig(network="custom:2e-5:1e9", **SAME, **setting), progress=False)
    two = ExperimentConfig(network="custom:2e-5:1e9:2e-5:1e9", gpus_per_node=1, **SAME, **setting)
    keep = [c for c in one.frame.columns if c != "run"]
    frame = run(two, progress=False).frame
    pd.testing.assert_frame_equal(one.frame[keep], frame[keep], check_exact=True)


def test_plan_charges_the_link_between_nodes_and_predicts_the_run():
    cfg = ExperimentConfig(strategy="zero2", network="h100-node", compute_profile="h100", **SAME)
    one_node = plan(cfg.replace(workers=4, gpus_per_node=4))
    two_nodes = plan(cfg.replace(workers=4, gpus_per_node=2))
    assert two_nodes.step_s > one_node.step_s
    assert plan(cfg.replace(workers=4)).step_s == one_node.step_s  # default: one node
    train = run(cfg.replace(workers=4, gpus_per_node=2), progress=False).frame
    train = train.query("kind == 'train' and rank == 0").sort_values("step")
    step_s = np.diff(train["time"].to_numpy())[1:]
    assert step_s == pytest.approx([two_nodes.step_s] * len(step_s), rel=1e-12)


def test_a_transformer_plan_over_two_nodes_pays_the_link_between_them():
    cfg = ExperimentConfig(
        strategy="zero3", runtime="sim", model="gpt-tiny", dataset="licenses", workers=16,
        network="a100-node", compute_profile="a100",
    )  # fmt: skip
    model = Transformer.parse("12,768,12,1024,50257")
    one_node = plan_transformer(cfg.replace(gpus_per_node=16), model)
    two_nodes = plan_transformer(cfg.replace(gpus_per_node=8), model)
    assert two_nodes.step_s > one_node.step_s
    assert two_nodes.bytes_per_step == one_node.bytes_per_step  # the same bytes, a slower link


def test_plan_command_names_the_placement(capsys):
    argv = ["plan", "--strategy", "allreduce", "--workers", "8", "--model", "mlp"]
    assert main([*argv, "--network", "a100-node", "--gpus-per-node", "4"]) == 0
    assert "step (sim: cpu-core, a100-node, 4 GPUs per node):" in capsys.readouterr().out


def test_list_shows_the_two_tier_networks(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("sim two-tier networks"))
    assert "h100-node" in line and "a100-node" in line and "custom:LAT:BW:INTER_LAT" in line
    assert "h100-node" not in next(x for x in out.splitlines() if x.startswith("sim networks:"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gpus_per_node": 0}, r"gpus_per_node=0 must be a positive integer or None"),
        ({"gpus_per_node": -8}, r"gpus_per_node=-8 must be a positive integer or None"),
        (
            {"gpus_per_node": 2, "network": "nvlink"},
            r"gpus_per_node=2 places ranks on nodes, but network='nvlink' has one link for every "
            r"pair of ranks, so the placement would change nothing; choose a two-tier network "
            r"\(h100-node, a100-node or custom:LAT:BW:INTER_LAT:INTER_BW\)",
        ),
        (
            {"gpus_per_node": 4, "workers": 6},
            r"workers=6 spans nodes of gpus_per_node=4 but does not fill them \(rank r lives on "
            r"node r // 4\); choose workers a multiple of 4, or gpus_per_node dividing 6",
        ),
        (
            {"network": "custom:1e-6:1e11:1e-7:1e10"},
            r"the link between nodes is the slower one \(latency >= 1e-06, bandwidth <= "
            r"1e\+11 of the link inside a node\); got latency 1e-07, bandwidth 1e\+10",
        ),
        ({"network": "custom:1e-6:1e11:1e-5"}, r"use custom:LATENCY_S:BANDWIDTH_BPS or custom:LAT"),
        ({"network": "custom:1e-6:1e11:1e-5:-1"}, r"bandwidth must be positive, got -1.0"),
    ],
)
def test_bad_placements_and_two_tier_networks_are_refused(changes, message):
    base = dict(runtime="sim", network="h100-node", workers=8)
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**{**base, **changes})


def test_a_partial_node_is_fine_and_a_link_needs_both_numbers():
    cfg = ExperimentConfig(runtime="sim", network="h100-node", workers=4, gpus_per_node=8)
    assert cfg.gpus_per_node == 8  # 4 GPUs of one 8-GPU node
    with pytest.raises(ValueError, match=r"give the link between nodes both a latency and a"):
        NetworkProfile("half", 1e-6, 1e9, inter_latency_s=1e-5)


def test_a_one_tier_network_prints_its_one_link():
    assert repr(NETWORKS["wan"]) == (
        "NetworkProfile(name='wan', latency_s=0.04, bandwidth_Bps=125000000.0)"
    )
    assert "inter_bandwidth_Bps=50000000000.0)" in repr(NETWORKS["h100-node"])
