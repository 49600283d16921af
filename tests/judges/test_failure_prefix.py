"""A judge call that failed keeps the judge-failure prefix in its reason (the prefix the score cache reads to skip
it), through every judge reward: UnifiedReward's edit template, EVR's dimensions, the default pairwise compare,
and the joined reasons (failures first). Expected reasons are written by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rewardkit.judges import JudgeBackend  # noqa: E402
from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402


def _text(conv):
    return " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")


def _n_images(conv):
    return sum(1 for c in conv[-1]["content"] if c.get("type") == "image")


# --------------------------------------------------------------- judge failures keep the cache-skip prefix
class IsolatingJudge(JudgeBackend):
    """Fails (as the OpenAI backend reports a request that failed after its retries) every conversation for which
    ``fails(conv)`` is true; answers ``answer(conv)`` otherwise; P(Yes) = 0.9 for choice questions."""

    kind = "isolating"
    isolates_rows = True

    def __init__(self, fails, answer=lambda conv: "", p_yes=0.9):
        self.fails, self.answer, self.p_yes = fails, answer, p_yes

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None,
                 row_errors=None):
        out = []
        for c in conversations:
            bad = self.fails(c)
            if row_errors is not None:
                row_errors.append("HTTP 500 after 2 tries" if bad else None)
            elif bad:
                raise RuntimeError("HTTP 500 after 2 tries")
            out.append([] if bad else [self.answer(c)] * n)
        return out

    def _rows(self, conversations, width, row_errors):
        errs = ["HTTP 503 after 2 tries" if self.fails(c) else None for c in conversations]
        if row_errors is not None:
            row_errors[:] = errs
        rows = [[math.nan] * width if e else [self.p_yes, 1 - self.p_yes][:width] for e in errs]
        return torch.tensor(rows, dtype=torch.float32)

    def choice_probs(self, conversations, choices, *, row_errors=None):
        return self._rows(conversations, len(choices), row_errors)

    def raw_choice_probs(self, conversations, choices, *, reasons=None, row_errors=None):
        out = self._rows(conversations, len(choices), row_errors)
        if reasons is not None:
            reasons[:] = [None] * len(conversations)
        return out


EDIT_OK = '{"reasoning": "fine", "score": [20, 16]}'


def test_unifiedreward_edit_failed_request_reason_starts_with_the_prefix():
    """Bug: the edit template joined its two reasons as 'instruction-following answer: judge call failed: ...',
    which does not start with JUDGE_FAILURE_PREFIX: the bench score cache stored a transient failure."""
    from rewardkit.rewards.unifiedreward import UnifiedReward

    im = random_images(2, size=16, seed=1)
    # the instruction-following request (two images: source + edited) fails; the quality answer is fine
    r = UnifiedReward(judge=IsolatingJudge(lambda c: _n_images(c) == 2, lambda c: EDIT_OK), template="edit")
    out = r(im[:1], "add a hat", sources=[[im[1]]], on_error="nan")
    assert not bool(out.valid[0]) and math.isnan(float(out.scores[0]))
    assert out.errors[0].startswith(JUDGE_FAILURE_PREFIX), out.errors[0]
    assert "instruction-following" in out.errors[0] and "HTTP 500" in out.errors[0]
    # the quality request fails and the instruction answer is unparseable: the failure still leads
    r = UnifiedReward(judge=IsolatingJudge(lambda c: _n_images(c) == 1, lambda c: "no json"), template="edit")
    out = r(im[:1], "add a hat", sources=[[im[1]]], on_error="nan")
    assert out.errors[0].startswith(JUDGE_FAILURE_PREFIX) and "no \"score\"" in out.errors[0], out.errors[0]
    # an answer the judge did give but that does not parse is not a failure (a cache may keep it)
    r = UnifiedReward(judge=IsolatingJudge(lambda c: False, lambda c: "no json"), template="edit")
    out = r(im[:1], "add a hat", sources=[[im[1]]], on_error="nan")
    assert not out.errors[0].startswith(JUDGE_FAILURE_PREFIX) and "instruction-following answer" in out.errors[0]
    # and both answers fine: sqrt(min(20, 16) * min(20, 16)) = 16
    r = UnifiedReward(judge=IsolatingJudge(lambda c: False, lambda c: EDIT_OK), template="edit")
    out = r(im[:1], "add a hat", sources=[[im[1]]], on_error="nan")
    assert bool(out.valid[0]) and float(out.scores[0]) == pytest.approx(16.0)


def test_evr_failed_dimension_reason_starts_with_the_prefix():
    """Bug: EVR's per-dimension failure read 'harmony: judge call failed: ...' (bench cache stored it)."""
    from rewardkit.rewards.evr import EVR

    im = random_images(2, size=32, seed=1)
    judge = IsolatingJudge(lambda c: "Evaluate only the harmony" in _text(c), lambda c: "Reason: fine\nScore: 4")
    out = EVR(judge=judge, k=1)(im[:1], "put the cat on the sofa", sources=[[im[1]]], on_error="nan")
    assert not bool(out.valid[0]) and math.isnan(float(out.scores[0]))
    assert out.errors[0].startswith(JUDGE_FAILURE_PREFIX), out.errors[0]
    assert "harmony" in out.errors[0] and "HTTP 500" in out.errors[0]


def test_default_compare_keeps_the_failure_prefix():
    """Bug: Reward.compare joined the sides as 'a: judge call failed: ...' (bench pairwise mode cached it)."""
    from rewardkit.rewards.vqascore import VQAScore

    a, b = random_images(2, size=16, seed=3), random_images(2, size=16, seed=4)
    r = VQAScore(judge=IsolatingJudge(lambda c: "a dog" in _text(c)))
    out = r.compare(a, b, ["a cat", "a dog"], on_error="nan")
    assert out.valid.tolist() == [True, False]
    assert float(out.prob_a[0]) == pytest.approx(0.5)  # both sides 0.9: sigmoid(0) = 0.5
    assert out.errors[1].startswith(JUDGE_FAILURE_PREFIX) and "(a)" in out.errors[1] and "(b)" in out.errors[1]


def test_join_reasons_orders_failures_first():
    from rewardkit.judges.policy import join_reasons

    assert join_reasons([("a", None), ("b", None)]) is None
    assert join_reasons([("a", "bad image"), ("b", None)]) == "a: bad image"
    assert join_reasons([("a", "bad image"), ("b", f"{JUDGE_FAILURE_PREFIX}: HTTP 503")]) == \
        f"{JUDGE_FAILURE_PREFIX} (b): HTTP 503; a: bad image"
