"""The paper's claims the reproduction tests, as we read them, each beside the sentence of
docs/PAPER.md it reads (:mod:`.claims` decides them)."""

from __future__ import annotations

# Each claim the paper makes, as we read it (our words), and the sentence of docs/PAPER.md (our
# summary of the paper, also in our words) that it reads, verbatim (its line breaks read as
# spaces), by the key :func:`verdicts` files the claim's verdict under.
# Each claim quotes the clause it reads, and no two claims the same one.
SOURCE = "docs/PAPER.md"
CLAIMS: dict[str, tuple[str, str]] = {
    "accuracy": (
        "NNT trains as accurately as synchronous SGD at equal epochs: its workers keep their own "
        "batch where a global pattern's effective batch grows with the workers",
        "large effective batches generalise worse unless tricks are used",
    ),
    "traffic": (
        "NNT's communication per worker stays constant as the cluster grows, and stays between "
        "neighbours: no step needs a global collective",
        "Communication per worker stays constant as the cluster grows",
    ),
    "time": (
        "Without a global communication pattern NNT scales better: it trains faster per epoch "
        "than allreduce or a parameter server",
        "These limit scaling",
    ),
    "straggler": (
        "A global pattern couples every worker to the slowest one; NNT's workers do not wait "
        "for a slow one",
        "couple every worker to the slowest one",
    ),
    "straggler run": (
        "A straggler therefore slows an NNT run less than a synchronous one",
        "The worker never waits for its neighbours: it drains what has arrived and carries on "
        "with its next local batch",
    ),
    "staleness": (
        "Asynchronous SGD pays for stale gradients in accuracy",
        "staleness slows or destabilises convergence unless compensated (staleness-aware LR, "
        "delay compensation)",
    ),
    "topology": (
        "Information diffuses over the whole topology within a few steps, so a topology of "
        "smaller diameter keeps NNT's workers closer together",
        "information still diffuses across the whole topology over a few steps",
    ),
}
