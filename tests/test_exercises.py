"""The exercises' check answers the student: right, close or not yet, with a hint; not answered
yet while the prediction is blank; and records every answer when SCALEDL_ANSWERS names a file."""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pytest

from scaledl_lab.viz.exercises import AnswersFileError, check


def test_numbers_are_right_within_the_tolerance_and_close_within_three_times_it(capsys):
    assert check(10, 9.5) == "right"
    assert check(12, 10.0, tolerance=0.1) == "close"
    assert check(20, 10.0, hint="bytes per round") == "not yet"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "right: you predicted 10; the run measured 9.5"
    assert out[2].endswith("Look at: bytes per round")


def test_words_and_rankings_are_right_only_if_equal(capsys):
    assert check("slower", "slower") == "right"
    assert check(["a", "b"], ["b", "a"], hint="the table") == "not yet"
    assert check(True, True) == "right" and check(True, False) == "not yet"
    assert "Look at: the table" in capsys.readouterr().out


def test_a_blank_prediction_is_not_answered_yet_and_hides_the_measurement(capsys):
    assert check(..., 7.8, hint="α + β n") == "not answered yet"
    assert check({2: 1, 4: ..., 8: 7}, {2: 1, 4: 3, 8: 7}) == "not answered yet"  # filled in part
    assert check((..., ...), (1610, 4290)) == "not answered yet"
    out = capsys.readouterr().out.splitlines()
    unanswered = "not answered yet: replace each ... with your prediction, then run this cell again"
    assert out == [unanswered] * 3
    assert check({2: 1, 4: 3}, {2: 1, 4: 3}) == "right"  # filled in full: compared as before


def test_every_check_appends_one_json_line_to_the_answers_file(tmp_path, monkeypatch, capsys):
    answers = tmp_path / "answers.jsonl"
    monkeypatch.setenv("SCALEDL_ANSWERS", str(answers))
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/student/notebooks/02_simulated_scaling.ipynb")
    check(7.8, np.float64(7.5), what="the cost model")
    check(..., "latency", what="the sweep")
    check({"ring": 8}, {"ring": np.int64(15)})
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [{k: v for k, v in a.items() if k != "time"} for a in lines] == [
        dict(notebook="02_simulated_scaling.ipynb", what="the cost model", prediction=7.8,
             measured=7.5, verdict="right"),
        dict(notebook="02_simulated_scaling.ipynb", what="the sweep", prediction=None,
             measured=None, verdict="not answered yet"),  # the answer is not given away
        dict(notebook="02_simulated_scaling.ipynb", what="the run", prediction={"ring": 8},
             measured={"ring": 15}, verdict="not yet"),
    ]  # fmt: skip
    assert all(datetime.fromisoformat(a["time"]).tzinfo is not None for a in lines)


def test_an_answers_file_that_cannot_be_written_says_which_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEDL_ANSWERS", str(tmp_path / "missing" / "answers.jsonl"))
    with pytest.raises(AnswersFileError) as info:
        check(1.0, 1.0)
    message = str(info.value)
    assert message.startswith(f"SCALEDL_ANSWERS={tmp_path / 'missing' / 'answers.jsonl'}: ")
    assert "No such file or directory" in message and "unset it to stop recording" in message
