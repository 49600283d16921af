"""Every parser of a judge's answer accepts only well-formed values inside its documented scale.

Table-driven: for each parser, well-formed answers with their values, and at least 20 malformed ones that must
be rejected (None / ValueError / a NaN row), never read as some number or label the judge did not give.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rewardkit.compose.rubric import QuestionTree, parse_intent, parse_question_list
from rewardkit.judges.openai_backend import JudgeServerError, read_choice_logprobs
from rewardkit.judges.policy import JudgeError, usable_rows
from rewardkit.rewards.evr import parse_hypothesis

# ------------------------------------------------------------------------------- EVR hypothesis (1..5)
GOOD_HYPOTHESES = [
    ("Reason: the cat matches.\nScore: 4", True, (4.0, "the cat matches.")),
    ("**Reason:** sharp, 2 objects.\n**Score:** 5", True, (5.0, "sharp, 2 objects.")),
    ("Reason: I'd say score 2 at first.\nScore: 3", True, (3.0, "I'd say score 2 at first.")),
    ("Reason: fine. Score: 2", True, (2.0, "fine.")),
    ("Reason: ok\nScore: 4.", True, (4.0, "ok")),
    ("Reason: ok\nScore: **4**", True, (4.0, "ok")),
    ("Reason: ok\n\nScore: 4\n\n", True, (4.0, "ok")),
    ("Reason: ok\nScore: 4/5", True, (4.0, "ok")),
    ("Reason: ok\nScore: 3.5", True, (3.5, "ok")),
    ("Reason: ok\nScore = 1", True, (1.0, "ok")),
    ("4", False, (4.0, "")),
    ("4/5", False, (4.0, "")),
    ("**5**", False, (5.0, "")),
    ("Score: 3.5", False, (3.5, "")),
    ("Score: 1.0", False, (1.0, "")),
]

MALFORMED_HYPOTHESES = [
    "Reason: ok\nScore: 4/10",          # another scale
    "Reason: ok\nScore: 1e9",           # exponent
    "Reason: ok\nScore: 4.9e3",         # exponent (was read as 4.9)
    "Reason: ok\nScore: 4\nScore: N/A",  # final answer is N/A (was read as 4)
    "Reason: ok\nScore: N/A",
    "Reason: ok\nScore: 6",
    "Reason: ok\nScore: 0",
    "Reason: ok\nScore: 5.5",
    "Reason: ok\nScore: -3",
    "Reason: ok\nScore: +4",
    "Reason: ok\nScore: 4 out of 5",
    "Reason: ok\nScore: 4-5",
    "Reason: ok\nScore: 3 or 4",
    "Reason: ok\nScore: 4,5",
    "Reason: ok\nScore: four",
    "Reason: ok\nScore: \uff14",        # full-width digit
    "Reason: ok\nScore: 4\nActually I meant 2.",  # text after the score
    "Reason: ok\nScore: 2\nScore: 4",   # two score labels
    "Reason: ok\nScore:",
    "Reason: ok\nScore: 45",
    "Reason: ok\nScore: 4 (good)",
    "Score: 4",                          # CoT asked for a reason
    "Reason: \nScore: 4",
    "Reason: ok",                         # no score
    "4",                                  # CoT asked for a reason
    "",
    "   \n ",
    "Reason: ok\nScore: inf",
    "Reason: ok\nScore: nan",
    "Reason: ok\nScore: 0x4",
]


@pytest.mark.parametrize("text,cot,expected", GOOD_HYPOTHESES)
def test_parse_hypothesis_accepts_well_formed(text, cot, expected):
    assert parse_hypothesis(text, cot=cot) == expected


@pytest.mark.parametrize("text", MALFORMED_HYPOTHESES)
def test_parse_hypothesis_rejects_malformed(text):
    assert parse_hypothesis(text, cot=True) is None


@pytest.mark.parametrize("text", ["Score: 4/10", "1e9", "4.9e3", "4\nN/A", "Score: 4\nScore: N/A", "6", "0", "0.5",
                                  "-2", "+3", "4 out of 5", "four", "N/A", "", "4 5", "4/4", "4.", "..4",
                                  "4 stars", "\uff14", "3-4", "4%", None, 4, b"4"])
def test_parse_hypothesis_score_only_rejects_malformed(text):
    if text == "4.":
        assert parse_hypothesis(text, cot=False) == (4.0, "")   # a final period is allowed
        return
    assert parse_hypothesis(text, cot=False) is None


# ------------------------------------------------------------------------------- intent labels
GOOD_INTENTS = [("Strict.", "strict"), ("strict", "strict"), ("**Open** - the user leaves it to the model, not strict",
                                                              "open"),
                ("The prompt is neutral.", "neutral"), ("Intent: open", "open"), ("NEUTRAL", "neutral"),
                ("Strictly speaking, it's neutral", "neutral"), ("`strict`", "strict"),
                ("Strict - a product shot on a plain background.", "strict")]

MALFORMED_INTENTS = [
    "", "   ", "unsure", "strict or open", "Strict/open", "strict and neutral", "Strict?", "The prompt is not strict.",
    "It isn't open", "neither strict nor open", "I cannot classify this prompt.", "42", "None", "N/A",
    "either strict or open", "The prompt could be strict, neutral or open", "not open", "stricter", "Neutral or strict",
    "**strict** or **open**", "open / neutral", "Strict maybe", "It is probably open but maybe neutral",
    "This prompt, which describes a cat in a garden with flowers and sunshine, is in my view open", "opening",
]


@pytest.mark.parametrize("text,label", GOOD_INTENTS)
def test_parse_intent_accepts(text, label):
    assert parse_intent(text) == label


@pytest.mark.parametrize("text", MALFORMED_INTENTS + [None, 3, ["strict"]])
def test_parse_intent_rejects(text):
    with pytest.raises(ValueError):
        parse_intent(text)


# ------------------------------------------------------------------------------- question lists
GOOD_LISTS = [
    ('[{"id": 1, "question": "Is there a cat?", "parents": []}]', 1),
    ('Sure!\n```json\n[{"id": 1, "question": "Is there a cat?", "parents": []}]\n```', 1),
    ('{"questions": ["A?", "B?"]}', 2),
    ('Here: [{"id": 1, "question": "A?"}] (note [1] refers to the subject)', 1),
    ('[{"id": "a", "question": "A?", "parents": [0]}, {"id": "b", "question": "B?", "parents": ["a"]}]', 2),
    ('[{"id": 1, "question": "A?", "parents": null}, {"id": 2, "question": "B?", "parents": 1}]', 2),
]

MALFORMED_LISTS = [
    "no json here",
    "",
    "[]",
    "[1, 2, 3]",
    '["A?", 5]',
    '["A?", ""]',
    '[{"id": 1, "question": ""}]',
    '[{"id": 1, "question": 5}]',
    '[{"id": 1}]',
    '[{"id": 1, "question": "A?"}, {"id": 1, "question": "B?"}]',            # duplicate ids
    '[{"id": 1, "question": "A?", "parents": [7]}]',                          # unknown parent
    '[{"id": 1, "question": "A?", "parents": [2]}, {"id": 2, "question": "B?", "parents": [1]}]',  # cycle
    '[{"id": 1, "question": "A?", "parents": [1]}]',                          # self parent
    '[{"id": true, "question": "A?"}]',                                       # bool id
    '[{"id": 1.5, "question": "A?"}]',                                        # float id
    '[{"id": [1], "question": "A?"}]',                                        # list id
    '[{"id": 0, "question": "A?"}]',                                          # reserved id
    '[{"id": 1, "question": "A?", "parents": [{"id": 0}]}]',                  # parent not an id
    '["A?"] and also ["B?"]',                                                 # two different lists
    '{"questions": "A?"}',
    '{"items": ["A?"]}',
    '[{"id": 1, "question": "A?"',                                            # truncated
    json.dumps(["Q%d?" % i for i in range(201)]),                            # over 200 questions
    '[[["A?"]]]',
    'null',
    '"A?"',
]


@pytest.mark.parametrize("text,n", GOOD_LISTS)
def test_parse_question_list_accepts(text, n):
    assert len(parse_question_list(text)) == n


@pytest.mark.parametrize("text", MALFORMED_LISTS + [None, 7])
def test_parse_question_list_rejects(text):
    with pytest.raises(ValueError):
        parse_question_list(text)


def test_question_tree_from_list_rejects_non_lists():
    for bad in ("A?", {"question": "A?"}, b"[]", 5):
        with pytest.raises(ValueError):
            QuestionTree.from_list(bad)


# ------------------------------------------------------------------------------- OpenAI top-logprobs
def _resp(top, *, token="Yes"):
    return {"choices": [{"index": 0, "message": {"content": token},
                         "logprobs": {"content": [{"token": token, "logprob": -0.1, "top_logprobs": top}]}}]}


def alt(tok, lp):
    return {"token": tok, "logprob": lp}


GOOD_LOGPROBS = [
    (_resp([alt("Yes", math.log(0.6)), alt("No", math.log(0.3)), alt("Maybe", math.log(0.1))]),
     [math.log(0.6), math.log(0.3)]),
    (_resp([alt(" Yes", -0.2), alt("No", -2.0)]), [-math.inf, -2.0]),                 # " Yes" is not "Yes"
    (_resp([alt(" Yes", -0.5), alt("Yes", -1.5), alt("No", -2.0)]), [-1.5, -2.0]),     # exact token wins
    (_resp([alt("Yes", -0.1)]), [-0.1, -math.inf]),                                   # No below the top list
    (_resp([alt("Yes", -math.inf), alt("No", -0.5)]), [-math.inf, -0.5]),            # an exact zero
    (_resp([alt("Yes", 0.0), alt("No", -30.0)]), [0.0, -30.0]),
    (_resp([alt("Yes", 1e-7), alt("No", -10.0)]), [0.0, -10.0]),                      # rounding above 0
    (_resp([alt("Yes", -1), alt("No", -2)]), [-1.0, -2.0]),                           # JSON integers
]

UNUSABLE_LOGPROBS = [  # no usable probability: None (a NaN row), never a guess
    _resp([]),
    _resp(None),
    _resp([alt("Maybe", -0.1), alt("yes", -0.2)]),             # labels missing (case matters)
    _resp([alt("Yes", math.nan), alt("No", -0.5)]),
    _resp([alt("Yes", -0.5), alt("No", math.nan)]),
    _resp([alt("Yes", -math.inf), alt("No", -math.inf)]),
    _resp([alt("Yes", -math.inf)]),
    _resp([alt("Yes", math.inf), alt("No", -0.5)]),
    _resp([alt("Yes", 2.0), alt("No", 1.0)]),                  # off-scale (log-probs are <= 0)
    _resp([alt("Yes", 0.5)]),
    _resp([alt("Yes", -0.05), alt("No", -0.05)]),             # P(Yes) + P(No) = 1.90: no distribution
    _resp([alt("Yes", -0.1), alt("No", -2.4), alt("Yes", -5.0)]),   # "Yes" twice, different values (sum 1.002)
    _resp([alt("Yes", -0.5), alt("No", -1.5), alt("Maybe", math.nan)]),  # a NaN anywhere: broken values
]

MALFORMED_LOGPROBS = [  # a protocol violation: JudgeServerError (a judge failure)
    {},
    {"choices": []},
    {"choices": "x"},
    {"choices": [5]},
    {"choices": [{"message": {"content": "Yes"}}]},                                    # no logprobs at all
    {"choices": [{"logprobs": None}]},
    {"choices": [{"logprobs": {"content": None}}]},
    {"choices": [{"logprobs": {"content": []}}]},
    {"choices": [{"logprobs": {"content": "Yes"}}]},
    {"choices": [{"logprobs": {"content": [5]}}]},
    {"choices": [{"logprobs": "yes"}]},
    _resp("Yes"),
    _resp([5]),
    _resp([{"token": 5, "logprob": -0.1}]),
    _resp([{"token": "Yes"}]),
    _resp([{"token": "Yes", "logprob": "-0.1"}]),
    _resp([{"token": "Yes", "logprob": None}]),
    _resp([{"token": "Yes", "logprob": True}]),
    _resp([{"token": "Yes", "logprob": [-0.1]}]),
    _resp([{"logprob": -0.1}]),
    [],
    None,
]


@pytest.mark.parametrize("data,expected", GOOD_LOGPROBS)
def test_read_choice_logprobs(data, expected):
    assert read_choice_logprobs(data, ["Yes", "No"]) == pytest.approx(expected)


@pytest.mark.parametrize("data", UNUSABLE_LOGPROBS)
def test_read_choice_logprobs_unusable(data):
    assert read_choice_logprobs(data, ["Yes", "No"]) is None


@pytest.mark.parametrize("data", MALFORMED_LOGPROBS)
def test_read_choice_logprobs_malformed(data):
    with pytest.raises(JudgeServerError):
        read_choice_logprobs(data, ["Yes", "No"])


# ------------------------------------------------------------------------------- choice_probs rows
ROWS = [([0.7, 0.3], True), ([1.0, 0.0], True), ([0.5, 0.5], True),
        ([math.nan, math.nan], False), ([math.nan, 0.5], False), ([math.inf, 0.0], False), ([-math.inf, 1.0], False),
        ([0.7, 0.7], False), ([0.2, 0.2], False), ([1.5, -0.5], False), ([-0.1, 1.1], False), ([0.0, 0.0], False),
        ([2.0, -1.0], False)]


def test_usable_rows_table():
    p, ok = usable_rows(torch.tensor([r for r, _ in ROWS]), len(ROWS), 2)
    assert ok.tolist() == [good for _, good in ROWS]
    assert torch.isnan(p[~ok]).all() and torch.isfinite(p[ok]).all()
    with pytest.raises(JudgeError, match="shape"):
        usable_rows(torch.zeros(3, 2), 4, 2)
    with pytest.raises(JudgeError, match="shape"):
        usable_rows(torch.zeros(3), 3, 2)


@pytest.mark.parametrize("top", [
    [("Yes", -0.05), ("No", -0.05)],                      # sum 1.90
    [("Yes", -0.1), ("No", -2.4), ("Yes", -5.0)],         # a choice listed twice with different values
    [("Yes", -0.5), ("No", -1.5), ("Maybe", math.nan)],   # NaN in an alternative
    [("Yes", -0.5), ("No", -1.5), ("Maybe", 0.3)],        # a positive log-probability
])
def test_impossible_logprobs_refused_by_both_readers(top):
    """One rule (``implausible_logprobs``) for choice_probs' reader and the raw (full-vocabulary) reader: before,
    choice_probs renormalised Yes = No = -0.05 (sum 1.9) to 0.5 / 0.5 and took the first of two "Yes"."""
    from rewardkit.judges.openai_backend import implausible_logprobs, read_raw_logprobs

    data = _resp([alt(t, v) for t, v in top])
    assert read_choice_logprobs(data, ["Yes", "No"]) is None
    row, why = read_raw_logprobs(data, ["Yes", "No"])
    assert row is None and why == implausible_logprobs(top, ["Yes", "No"]) and why
