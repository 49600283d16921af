"""``qwenvl``: flow_grpo's QwenVL aesthetic prompt byte for byte and its ``<Score>N</Score>`` parsing (references
transcribed from yifan123/flow_grpo @ ac4c86e in tests/helpers/host_rewards.py), failing loud where flow_grpo
scores 0."""

from __future__ import annotations

import math

import pytest

from rewardkit.judges import JudgeBackend
from rewardkit.testing import random_images
from tests.helpers.host_rewards import FLOW_GRPO_QWENVL_TASK, flow_grpo_qwenvl_messages, flow_grpo_qwenvl_score


class Recorder(JudgeBackend):
    """Answers from a list, in order; records the conversations it was sent."""

    kind = "recorder"

    def __init__(self, answers):
        self.answers, self.convs, self.kwargs = list(answers), [], []

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None):
        self.kwargs.append({"n": n, "temperature": temperature, "max_new_tokens": max_new_tokens})
        self.convs += conversations
        return [[self.answers.pop(0)] for _ in conversations]

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def test_prompt_bytes_and_turn_equal_flow_grpos():
    from rewardkit.rewards.qwenvl import QwenVLAesthetic

    judge = Recorder(["<Thought>ok</Thought>\n<Score>4</Score>"])
    img = random_images(1, size=16, seed=0)[0]
    out = QwenVLAesthetic(judge=judge)([img], None)
    sent = judge.convs[0]
    assert sent[0]["content"][1]["text"].encode("utf-8") == FLOW_GRPO_QWENVL_TASK.encode("utf-8")
    want = flow_grpo_qwenvl_messages(sent[0]["content"][0]["image"])
    assert sent == want  # one user turn, the image first, no caption
    assert judge.kwargs == [{"n": 1, "temperature": 0.0, "max_new_tokens": 2048}]  # qwenvl.py:91
    assert out.scores.tolist() == [4.0]


ANSWERS = [
    "<Thought>fine</Thought>\n<Score>3</Score>",
    "<Score>5</Score> and later <Score>1</Score>",   # the first one counts (re.search)
    "<Score> 4</Score>",                             # flow_grpo: no match -> 0; rewardkit: NaN
    "Final score: 4",                                # no tag
    "<Score>X</Score>",                              # the template's placeholder echoed
    "<Score>7</Score>",                              # outside 1-5: flow_grpo 1.4; rewardkit NaN
]


def test_parsing_agrees_with_flow_grpo_where_flow_grpo_reads_a_score_and_fails_loud_elsewhere():
    from rewardkit.rewards.qwenvl import QwenVLAesthetic

    out = QwenVLAesthetic(judge=Recorder(ANSWERS))(random_images(len(ANSWERS), size=16, seed=1), None,
                                                  on_error="nan")
    host = [flow_grpo_qwenvl_score(a) for a in ANSWERS]
    assert host == [0.6, 1.0, 0, 0, 0, 1.4]
    got = out.scores.tolist()
    assert got[:2] == [3.0, 5.0]
    assert [g * 0.2 for g in got[:2]] == pytest.approx(host[:2])  # the flow_grpo drop-in's factor
    assert all(math.isnan(g) for g in got[2:])
    assert out.errors[2] == out.errors[3] == out.errors[4] == "no <Score>N</Score> in the answer"
    assert "outside [1, 5]" in out.errors[5]
    assert out.rationales == ANSWERS


def test_template_is_versioned_and_cites_its_source():
    from rewardkit.judges import load_template

    t = load_template("qwenvl")
    assert t.version == "flow_grpo-qwenvl-ac4c86e"
    assert "flow_grpo/qwenvl.py" in open(t.path, encoding="utf-8").read()


def test_failed_judge_call_is_nan_with_the_failure_not_a_parse_error():
    from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX
    from rewardkit.rewards.qwenvl import QwenVLAesthetic

    class Down(Recorder):
        def generate(self, *a, **k):
            raise ConnectionError("judge server unreachable")

    out = QwenVLAesthetic(judge=Down([]))(random_images(2, size=16, seed=2), None, on_error="nan")
    assert all(math.isnan(s) for s in out.scores.tolist())
    assert all(e.startswith(JUDGE_FAILURE_PREFIX) and e.count(JUDGE_FAILURE_PREFIX) == 1 for e in out.errors)
    with pytest.raises(ConnectionError):
        QwenVLAesthetic(judge=Down([]))(random_images(1, size=16, seed=2), None)
