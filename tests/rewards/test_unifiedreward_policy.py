"""``unifiedreward`` follows the judge failure policy (``on_judge_error``) like every judge reward: a failing
judge call is NaN + "judge call failed" (never a parse error, never a score) when the policy says NaN, raises
otherwise; with a backend that fails one request at a time only that sample fails; pairwise too."""

from __future__ import annotations

import math

import pytest

from rewardkit.judges import JudgeBackend
from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX
from rewardkit.testing import random_images

GOOD = "Final Score: 4"


class Failing(JudgeBackend):
    """``generate`` answers GOOD, except: ``down`` -> the whole call raises; with ``isolates_rows`` the
    conversations whose text holds ``poison`` fail alone (as the OpenAI backend reports them)."""

    kind = "failing"

    def __init__(self, down=False, poison=None, isolates_rows=False, answer=GOOD):
        self.down, self.poison, self.isolates_rows, self.answer = down, poison, isolates_rows, answer
        self.calls = 0

    def generate(self, conversations, *, n=1, temperature=0.0, max_new_tokens=256, stop=None, seed=None,
                 row_errors=None):
        self.calls += 1
        if self.down:
            raise ConnectionError("judge server unreachable")
        out = []
        for c in conversations:
            text = c[0]["content"][-1]["text"]
            bad = self.poison is not None and self.poison in text
            if row_errors is not None:
                row_errors.append("HTTP 500 after 2 tries" if bad else None)
                out.append([] if bad else [self.answer])
            elif bad:
                raise RuntimeError("HTTP 500 after 2 tries")
            else:
                out.append([self.answer])
        return out

    def choice_probs(self, conversations, choices):
        raise NotImplementedError


def ur(backend, **kw):
    from rewardkit.rewards.unifiedreward import UnifiedReward

    return UnifiedReward(judge=backend, **kw)


IMGS = random_images(3, size=16, seed=1)


def test_whole_call_failure_follows_on_error():
    r = ur(Failing(down=True))
    out = r(IMGS, ["a cat", "a dog", "a bird"], on_error="nan")
    assert not out.valid.any() and all(math.isnan(float(v)) for v in out.scores)
    assert all(e.startswith(JUDGE_FAILURE_PREFIX) and "unreachable" in e for e in out.errors)
    with pytest.raises(ConnectionError):
        r(IMGS, ["a cat", "a dog", "a bird"], on_error="raise")
    forced = ur(Failing(down=True), on_judge_error="nan")(IMGS, "a cat", on_error="raise")
    assert not forced.valid.any() and forced.errors[0].startswith(JUDGE_FAILURE_PREFIX)
    with pytest.raises(ConnectionError):
        ur(Failing(down=True), on_judge_error="raise")(IMGS, "a cat", on_error="nan")
    with pytest.raises(ValueError, match="on_judge_error"):
        ur(Failing(), on_judge_error="ignore")


def test_one_failing_request_fails_only_its_sample():
    out = ur(Failing(poison="a dog", isolates_rows=True))(IMGS, ["a cat", "a dog", "a bird"], on_error="nan")
    assert out.valid.tolist() == [True, False, True]
    assert out.scores[0] == 4.0 and out.scores[2] == 4.0 and math.isnan(float(out.scores[1]))
    assert out.errors[1].startswith(JUDGE_FAILURE_PREFIX) and "HTTP 500" in out.errors[1]
    # a batched backend (no per-row isolation) fails the chunk together under the NaN policy
    chunk = ur(Failing(poison="a dog"))(IMGS, ["a cat", "a dog", "a bird"], on_error="nan", batch_size=2)
    assert chunk.valid.tolist() == [False, False, True]


def test_acs_template_failure_leaves_every_dimension_nan():
    out = ur(Failing(poison="a dog", isolates_rows=True), template="2.0")(IMGS[:2], ["a cat", "a dog"],
                                                                          on_error="nan")
    assert not bool(out.valid[1]) and out.errors[1].startswith(JUDGE_FAILURE_PREFIX)
    assert all(math.isnan(float(v[1])) for v in out.dimensions.values()) and out.dimensions


def test_pairwise_failure_is_nan_with_the_failure_reason():
    a, b = random_images(2, size=16, seed=2), random_images(2, size=16, seed=3)
    out = ur(Failing(down=True)).compare(a, b, "a cat", on_error="nan")
    assert not out.valid.any() and all(e.startswith(JUDGE_FAILURE_PREFIX) for e in out.errors)
    with pytest.raises(ConnectionError):
        ur(Failing(down=True)).compare(a, b, "a cat", on_error="raise")
