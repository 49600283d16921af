"""Judge-answer parsers: the exact error each malformed response gets, values kept for usable rows, and the
documented defaults (found by mutation testing: the table tests in test_parsers.py checked only the
error type and that usable rows are finite)."""

from __future__ import annotations

import math

import pytest
import torch

from rewardkit.compose.rubric import parse_intent
from rewardkit.judges.openai_backend import JudgeServerError, read_choice_logprobs
from rewardkit.judges.policy import usable_rows
from rewardkit.rewards.evr import parse_hypothesis


def _resp(top):
    return {"choices": [{"logprobs": {"content": [{"token": "Yes", "logprob": -0.1, "top_logprobs": top}]}}]}


@pytest.mark.parametrize("data, why", [
    ({"choices": []}, r"no choices"),
    ({"choices": [], "raw": b"\x00bytes"}, r"no choices"),     # not JSON-serialisable: still a clear error
    ({"choices": [{"logprobs": {"content": [5]}}]}, r"content is not a list of token entries"),
    (_resp("Yes"), r"top_logprobs is not a list"),
    (_resp([{"logprob": -0.1}]), r"an alternative without a string token"),
    (_resp([{"token": "Yes", "logprob": "x"}]), r"logprob 'x' is not a number"),
    (_resp([{"token": "Yes", "logprob": True}]), r"logprob True is not a number"),
])
def test_read_choice_logprobs_names_the_problem(data, why):
    with pytest.raises(JudgeServerError, match=rf"^unreadable logprobs \({why}\) in \{{"):
        read_choice_logprobs(data, ["Yes", "No"])


def test_read_choice_logprobs_values():
    top = [{"token": " Yes", "logprob": -0.25}, {"token": "No", "logprob": -1.5}, {"token": "Yes", "logprob": -9.0}]
    # exact token text only (" Yes" is another token, even when it ranks higher); absent -> -inf
    assert read_choice_logprobs(_resp(top), ["Yes", "No", "Maybe"]) == [-9.0, -1.5, -math.inf]
    dup = [{"token": "Yes", "logprob": -0.5}, {"token": "Yes", "logprob": -3.0}, {"token": "No", "logprob": -1.0}]
    assert read_choice_logprobs(_resp(dup), ["Yes", "No"]) is None  # which "Yes" is it? unanswered, not the first
    # a tiny positive log-prob from rounding is clamped to 0
    assert read_choice_logprobs(_resp([{"token": "Yes", "logprob": 1e-9}]), ["Yes", "No"]) == [0.0, -math.inf]
    assert read_choice_logprobs(_resp([]), ["Yes"]) is None


def test_usable_rows_keeps_values_and_clamps_within_tolerance():
    rows = torch.tensor([[0.7, 0.3], [-0.0005, 1.0005], [0.25, 0.75], [0.5, 0.6]])
    p, ok = usable_rows(rows, 4, 2)
    assert ok.tolist() == [True, True, True, False]
    assert p.dtype == torch.float32
    assert torch.allclose(p[0], torch.tensor([0.7, 0.3])) and torch.equal(p[2], torch.tensor([0.25, 0.75]))
    assert torch.equal(p[1], torch.tensor([0.0, 1.0]))           # within atol: clamped into [0, 1]
    assert torch.isnan(p[3]).all()
    # atol is a parameter: a tighter tolerance refuses the second row
    assert usable_rows(rows, 4, 2, atol=1e-4)[1].tolist() == [True, False, True, False]


def test_usable_rows_bounds_are_inclusive_and_float64_comes_back_float32():
    import numpy as np

    # catches `p < 1 + atol`: an entry exactly at 1 + atol is inside the tolerance (the row sums to 1)
    p, ok = usable_rows([[1.001, -0.001]], 1, 2, atol=1e-3)
    assert ok.tolist() == [True] and p.tolist() == [[1.0, 0.0]]
    # catches a dropped dtype: a float64 array (what numpy gives) still comes back float32, as documented
    p, ok = usable_rows(np.array([[0.25, 0.75]], dtype=np.float64), 1, 2)
    assert p.dtype == torch.float32 and ok.tolist() == [True]


def test_parse_intent_short_answer_with_a_capitalised_label_and_non_text():
    # catches a lower-case-only word pattern: "Neutral" mid-sentence is the one label of a short answer
    assert parse_intent("The prompt is Neutral.") == "neutral"
    assert parse_intent("I would call this prompt Strict.") == "strict"
    # catches a bare error: a non-string answer says what it got
    with pytest.raises(ValueError, match=r"the intent answer is not text: int"):
        parse_intent(3)


def test_parse_hypothesis_default_requires_a_reason():
    assert parse_hypothesis("4") is None                 # default cot=True: a bare number is not a hypothesis
    assert parse_hypothesis("4", cot=False) == (4.0, "")
    assert parse_hypothesis("Score: 4") is None          # label but no reason


def test_parse_hypothesis_reason_keeps_its_own_characters():
    assert parse_hypothesis("Reason: **X marks it X**\nScore: 4") == (4.0, "X marks it X")
    assert parse_hypothesis("Rationale = XX fine\nScore: 2") == (2.0, "XX fine")
