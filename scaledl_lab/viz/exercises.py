"""Exercises that answer the student: a prediction held in a variable, compared with what the
run measured, and feedback printed (right, close, or what to look at)."""

from __future__ import annotations

from typing import Any

VERDICTS = ("right", "close", "not yet")


def check(prediction: Any, measured: Any, *, tolerance: float = 0.1, hint: str = "",
          what: str = "the run") -> str:  # fmt: skip
    """Compare ``prediction`` with ``measured`` and print feedback; return the verdict.

    Numbers are right within ``tolerance`` (relative to ``measured``), close within three times
    it; anything else (a word, a set, a ranking) is right only if equal. ``hint`` says what to
    look at when the prediction is not right.
    """
    if isinstance(prediction, bool) or not isinstance(prediction, (int, float)):
        verdict = "right" if prediction == measured else "not yet"
        shown = f"{measured!r}"
    else:
        scale = abs(float(measured)) or 1.0
        off = abs(float(prediction) - float(measured)) / scale
        verdict = "right" if off <= tolerance else "close" if off <= 3 * tolerance else "not yet"
        shown = f"{float(measured):.4g}"
    line = f"{verdict}: you predicted {prediction!r}; {what} measured {shown}"
    if verdict != "right" and hint:
        line += f". Look at: {hint}"
    print(line)
    return verdict
