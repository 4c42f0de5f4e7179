"""A claim decided on measured figures: the one typed result of every verdict module (the
paper's claims, :mod:`scaledl_lab.studies.claims`; the large-batch and the compression reports).
Each module decides its claims into :class:`Claim` records and renders its summary lines from
them, so a test asserts the verdict and the figures, not the English of a sentence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

Verdict = Literal["supported", "not supported", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)


def mark(holds: bool) -> Verdict:
    """The verdict "supported" if the claim's rule ``holds``, else "not supported"."""
    return "supported" if holds else "not supported"


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One claim and what our measurements say of it.

    ``claim`` is the claim as stated; ``source`` says where it comes from (a file of this
    repository or the works it cites), ``quote`` the sentence of that source it reads, verbatim
    (empty where it reads none), and ``in_our_words`` whether the claim is in our words (our
    summary or paraphrase of the work) rather than the work's own: the paper itself is not at
    hand, so docs/PAPER.md, which the paper's claims read, is our summary "in our words".
    ``test`` is what the measurement tests where the claim does not state it (a quoted sentence
    carries no threshold); ``figures`` the measured numbers that decide it, by name; ``reason``
    those numbers in words, as the summaries print them."""

    key: str
    claim: str
    source: str
    in_our_words: bool
    verdict: Verdict
    reason: str
    figures: Mapping[str, float] = field(default_factory=dict, hash=False)
    test: str = ""
    quote: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r}; allowed: {', '.join(VERDICTS)}")
        figures = MappingProxyType({k: float(v) for k, v in self.figures.items()})
        object.__setattr__(self, "figures", figures)

    @property
    def supported(self) -> bool:
        return self.verdict == "supported"
