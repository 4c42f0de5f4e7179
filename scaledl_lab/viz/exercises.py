"""Exercises that answer the student: a prediction held in a variable, compared with what the
run measured, and feedback printed (right, close, or what to look at).

A prediction left blank is ``...`` (Ellipsis), as the student versions of the notebooks write it
(``scaledl_lab.course``): ``check`` then says "not answered yet" and shows nothing of what was
measured. With the environment variable ``SCALEDL_ANSWERS`` set to a file, every ``check`` also
appends its answer to that file as one JSON line, for an instructor to collect."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

VERDICTS = ("right", "close", "not yet")
UNANSWERED = "not answered yet"
ANSWERS_VARIABLE = "SCALEDL_ANSWERS"  # the file every check appends its answer to, when set


class AnswersFileError(OSError):
    """The answers file named by ``SCALEDL_ANSWERS`` cannot be written."""


def check(prediction: Any, measured: Any, *, tolerance: float = 0.1, hint: str = "",
          what: str = "the run") -> str:  # fmt: skip
    """Compare ``prediction`` with ``measured`` and print feedback; return the verdict.

    Numbers are right within ``tolerance`` (relative to ``measured``), close within three times
    it; anything else (a word, a set, a ranking) is right only if equal. ``hint`` says what to
    look at when the prediction is not right. A prediction that is, or holds, ``...`` is not
    answered yet: the verdict is "not answered yet" and the measurement is not shown.
    """
    if is_blank(prediction):
        verdict = UNANSWERED
        print(f"{UNANSWERED}: replace each ... with your prediction, then run this cell again")
    else:
        verdict, shown = _compare(prediction, measured, tolerance)
        line = f"{verdict}: you predicted {prediction!r}; {what} measured {shown}"
        if verdict != "right" and hint:
            line += f". Look at: {hint}"
        print(line)
    if path := os.environ.get(ANSWERS_VARIABLE):
        record(Path(path), prediction, measured, verdict, what)
    return verdict


def is_blank(prediction: Any) -> bool:
    """``...``, or a dict, list, tuple or set holding ``...`` anywhere (a prediction filled in
    part)."""
    if prediction is Ellipsis:
        return True
    if isinstance(prediction, dict):
        return any(is_blank(v) for v in prediction.values())
    if isinstance(prediction, (list, tuple, set, frozenset)):
        return any(is_blank(v) for v in prediction)
    return False


def _compare(prediction: Any, measured: Any, tolerance: float) -> tuple[str, str]:
    """The verdict, and the measurement as the feedback line shows it."""
    if isinstance(prediction, bool) or not isinstance(prediction, (int, float)):
        return ("right" if prediction == measured else "not yet"), f"{measured!r}"
    scale = abs(float(measured)) or 1.0
    off = abs(float(prediction) - float(measured)) / scale
    verdict = "right" if off <= tolerance else "close" if off <= 3 * tolerance else "not yet"
    return verdict, f"{float(measured):.4g}"


def record(path: Path, prediction: Any, measured: Any, verdict: str, what: str) -> None:
    """Append one answer to ``path`` as a JSON line: the notebook (where Jupyter says which),
    what was measured, the prediction, the measurement (none while unanswered: the file is the
    student's too), the verdict and the time (UTC)."""
    answer = {
        "notebook": _notebook(),
        "what": what,
        "prediction": _plain(prediction),
        "measured": None if verdict == UNANSWERED else _plain(measured),
        "verdict": verdict,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        with path.expanduser().open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(answer, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise AnswersFileError(
            f"{ANSWERS_VARIABLE}={path}: cannot append this answer ({exc.strerror or exc}); "
            f"set {ANSWERS_VARIABLE} to a file you can write, or unset it to stop recording"
        ) from exc


def _notebook() -> str | None:
    """The notebook's file name, as Jupyter Server (2.0 and later) tells its kernels; None
    elsewhere (nbconvert, a script)."""
    session = os.environ.get("JPY_SESSION_NAME")
    return Path(session).name if session else None


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: numbers, words, lists and dicts as they are, ``...`` as
    null, NumPy and torch scalars as numbers, anything else as its repr."""
    if value is Ellipsis or value is None or isinstance(value, (bool, int, float, str)):
        return None if value is Ellipsis else value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", None) == 0:
        return value.item()
    return repr(value)
