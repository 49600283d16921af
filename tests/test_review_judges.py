"""Adversarial review of the judge code of 2026-12-01 (raw_choice_probs, vqascore, unifiedreward templates,
EVR reference_roles): each test names the bug it pins; expected values are written by hand."""

from __future__ import annotations

import math
import time

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


# --------------------------------------------------------------- strict OpenAI reader: duplicated token texts
def _response(top):
    return {"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
        {"token": "Yes", "logprob": top[0][1], "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}]}}]}


def test_read_raw_logprobs_tolerates_a_non_choice_text_listed_twice():
    """Bug: any token text listed twice (distinct byte pieces both shown as U+FFFD) made the row NaN, although
    the choice itself is listed once and exactly; and the over-unity check counted such a text once."""
    from rewardkit.judges.openai_backend import read_raw_logprobs

    top = [("Yes", math.log(0.5)), ("\ufffd", math.log(0.2)), ("\ufffd", math.log(0.1)), ("No", math.log(0.1))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert why is None and row == pytest.approx([math.log(0.5)])
    # 0.5 + 0.3 + 0.25 = 1.05 > 1: the two pieces are two tokens, both count towards the sum
    top = [("Yes", math.log(0.5)), ("\ufffd", math.log(0.3)), ("\ufffd", math.log(0.25))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert row is None and "sum" in why
    # a choice listed twice with different values is still ambiguous: refused
    top = [("Yes", math.log(0.5)), ("No", math.log(0.1)), ("Yes", math.log(0.2))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert row is None and "twice" in why


# --------------------------------------------------------------- vqascore yes_no: a row must be a distribution
class Unnormed(JudgeBackend):
    kind = "unnormed"

    def __init__(self, row):
        self.row = row

    def generate(self, conversations, **kw):
        return [[""] for _ in conversations]

    def choice_probs(self, conversations, choices):
        return torch.tensor([self.row] * len(conversations), dtype=torch.float32)


@pytest.mark.parametrize("row, want", [([0.2, 0.2], None), ([0.7, 0.7], None), ([0.75, 0.25], 0.75),
                                       ([1.0, 0.0], 1.0), ([float("nan"), 0.5], None)])
def test_vqascore_yes_no_refuses_a_row_that_is_not_a_distribution(row, want):
    """Bug: probability='yes_no' took P(Yes) from any finite row in [0, 1] ([0.2, 0.2] scored 0.2, valid),
    against the judge policy (a row not summing to 1 is an unanswered question)."""
    from rewardkit.rewards.vqascore import VQAScore

    out = VQAScore(judge=Unnormed(row), probability="yes_no")(random_images(1, seed=2), "a cat", on_error="nan")
    if want is None:
        assert not bool(out.valid[0]) and math.isnan(float(out.scores[0])) and out.errors[0]
    else:
        assert bool(out.valid[0]) and float(out.scores[0]) == pytest.approx(want)


# --------------------------------------------------------------- unifiedreward parsers
@pytest.mark.parametrize("digit", ["\uff14", "\u0664", "\u096a"])  # fullwidth, Arabic-Indic, Devanagari four
def test_unifiedreward_parsers_take_ascii_digits_only(digit):
    """Bug: the parsers used Python's Unicode-aware \\d, so 'Final Score: ４' read as 4.0 (EVR's parser, by
    contrast, takes ASCII digits only)."""
    from rewardkit.rewards.unifiedreward import parse_axis_scores, parse_final_score, parse_pair_axis_scores

    assert parse_final_score(f"Final Score: {digit}")[0] is None
    assert parse_final_score("Final Score: 4") == (4.0, None)
    acs = "Alignment Score (1-5): {}\nCoherence Score (1-5): 3\nStyle Score (1-5): 5"
    assert parse_axis_scores(acs.format(digit))[0] is None
    assert parse_axis_scores(acs.format("4"))[0] == {"alignment": 4.0, "coherence": 3.0, "style": 5.0}
    pair = ("Alignment Score:\n Image 1: {}\n Image 2: 0.4\n\nCoherence Score:\n Image 1: 0.5\n Image 2: 0.5\n\n"
            "Style Score:\n Image 1: 1\n Image 2: 0")
    assert parse_pair_axis_scores(pair.format(f"0.{digit}"))[0] is None
    assert parse_pair_axis_scores(pair.format("0.6"))[0] == {"alignment": (0.6, 0.4), "coherence": (0.5, 0.5),
                                                              "style": (1.0, 0.0)}


@pytest.mark.parametrize("text", [
    '{"sc\\u006fre": [25, 25], "score": [1, 2]}',         # a second "score" the raw-text count cannot see
    '{"score": [1, 2], "reasoning": "a", "reasoning": "b"}',
])
def test_parse_edit_scores_refuses_duplicate_keys(text):
    """Bug: json.loads keeps the last of duplicated keys silently: '{"sc\\u006fre": [25, 25], "score": [1, 2]}'
    read as [1, 2] although the answer gives "score" twice."""
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    vals, why = parse_edit_scores(text)
    assert vals is None and "twice" in why


def test_parse_edit_scores_adversarial_answers():
    from rewardkit.rewards.unifiedreward import parse_edit_scores

    assert parse_edit_scores('```json\n{"reasoning": "ok",\n"score" : [20, 16],\n}\n```') == ([20.0, 16.0], None)
    for bad in ('{"score": [20, 16]} {"score2": 1}',          # two JSON objects
                '{"reasoning": {"score": [1, 2]}}',          # nested score
                '{"score": [NaN, 2]}', '{"score": [Infinity, 2]}', '{"score": [25.5, 2]}', '{"score": [true, 2]}',
                '{"score": ["4", 2]}', '{"score": [4]}', '{"score": [1' + "0" * 400 + ', 2]}',
                '{"score": [1, 2], "extra": 1}', '"score": ' + "[" * 100_000):
        vals, why = parse_edit_scores(bad)
        assert vals is None and why, bad[:60]


def test_parse_think_verdict_is_linear_in_the_answer_length():
    """Bug: the lazy <answer>(.*?)</answer> search ran before the count of opening tags: 12 000 unclosed
    '<answer>' took ~5 s (quadratic; 8 000: 2.4 s on this machine). The count now refuses them first."""
    from rewardkit.rewards.unifiedreward import parse_think_verdict

    t0 = time.perf_counter()
    v, why = parse_think_verdict("<think>" + "<answer>" * 12_000)
    assert time.perf_counter() - t0 < 1.0
    assert v is None and "12000 <answer> blocks" in why
    v, why = parse_think_verdict("<answer>" * 3 + "<answer>Image 1 is better</answer>")
    assert v is None and "4 <answer> blocks" in why
    assert parse_think_verdict("<think>x</think>\n<answer>Image 2 is better.</answer>") == (0.0, None)
    assert parse_think_verdict("<answer>Image 1 is better")[0] is None
    assert parse_think_verdict("no tags")[1] == "no <answer>...</answer> block"


@pytest.mark.parametrize("prompt", ["{prompt}", "a {0} b {x!r} c %s {{}}", "line 1\nline 2 }", "{__class__}"])
def test_unifiedreward_templates_render_prompts_with_braces_verbatim(prompt):
    from rewardkit.judges import load_template

    for name in ("t2i", "2.0", "think", "edit"):
        t = load_template("unifiedreward", name)
        for key in ("pointwise", "pairwise", "instruction_following"):
            if key in t.fields:
                text = t.render(key, prompt=prompt)
                assert prompt in text and "{{" not in text.replace(prompt, "")
        if "quality" in t.fields:  # no placeholder: the JSON example's braces come out single
            assert '{\n\n"reasoning"' in t.render("quality")


# --------------------------------------------------------------- raw probabilities from a server without logprobs
def test_vqascore_full_on_a_server_without_logprobs_is_a_judge_failure():
    """Bug: with probability='full' a server that returns no log-probabilities at all gave NaN + a reason without
    the failure prefix (the bench cache kept it: fixing the server did not help) and never raised with
    on_error='raise'; probability='yes_no' (choice_probs) raises JudgeServerError for the same server."""
    pytest.importorskip("httpx")
    from test_judge_fake_server import FakeServer

    from rewardkit.judges.openai_backend import JudgeServerError, OpenAIJudge
    from rewardkit.rewards.vqascore import VQAScore

    server = FakeServer()
    try:
        server.mode = "nologprobs"
        judge = OpenAIJudge(server.url, model="fake", api_key="", timeout=2.0, max_retries=0, check_tokens=False,
                            server="openai")
        ims = random_images(2, seed=6)
        for probability in ("full", "yes_no"):
            r = VQAScore(judge=judge, probability=probability)
            out = r(ims, "a cat", on_error="nan")
            assert not out.valid.any()
            assert all(e.startswith(JUDGE_FAILURE_PREFIX) and "log-prob" in e for e in out.errors), out.errors
            with pytest.raises(JudgeServerError, match="log-prob"):
                r(ims, "a cat", on_error="raise")
    finally:
        server.close()
