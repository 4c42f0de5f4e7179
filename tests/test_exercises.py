"""The exercises' check answers the student: right, close or not yet, with a hint."""

from __future__ import annotations

from scaledl_lab.viz.exercises import check


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
