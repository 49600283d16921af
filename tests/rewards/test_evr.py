"""EVR: hand-computed arithmetic, parsing, policies, ablations (scripted judge), and end-to-end on tiny Qwen."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rewardkit import load_reward  # noqa: E402
from rewardkit.rewards.evr import (EVR, aggregate_dimensions, dimension_scores, normalise,  # noqa: E402
                                   parse_hypothesis)
from rewardkit.testing import random_images  # noqa: E402
from tests.helpers.evr_judges import PAPER_CASE, ScriptedJudge, cot, scripted  # noqa: E402

EPS = 1e-6
NAN = float("nan")


# ------------------------------------------------------------------------------------------ pure math
def test_dimension_scores_hand_computed():
    S = torch.tensor([[4.0, 5.0, 2.0], [3.0, 3.0, 3.0], [5.0, 1.0, 1.0]])
    v = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    r, rej = dimension_scores(S, v, eps=EPS)
    torch.testing.assert_close(r, torch.tensor([9 / (2 + EPS), 9 / (3 + EPS), 5 / (1 + EPS)]))
    assert not rej.any()
    # soft verdicts: r = sum p S / (sum p + eps)
    r, _ = dimension_scores(torch.tensor([4.0, 5.0, 2.0]), torch.tensor([0.9, 0.6, 0.2]), eps=EPS)
    assert r.item() == pytest.approx((3.6 + 3.0 + 0.4) / (1.7 + EPS), rel=1e-6)
    # no verifier: plain mean; an unparsed hypothesis (NaN) is ignored
    r, _ = dimension_scores(torch.tensor([4.0, NAN, 2.0]), None)
    assert r.item() == pytest.approx(3.0)
    r, _ = dimension_scores(torch.tensor([4.0, NAN, 2.0]), torch.tensor([1.0, 1.0, 0.0]), eps=0.0)
    assert r.item() == pytest.approx(4.0)


def test_all_rejected_policies():
    S, v = torch.tensor([5.0, 1.0, 3.0]), torch.zeros(3)
    r, rej = dimension_scores(S, v, all_rejected="invalid")
    assert math.isnan(r.item()) and rej.item()
    r, _ = dimension_scores(S, v, all_rejected="unverified_mean")
    assert r.item() == pytest.approx(3.0)
    r, _ = dimension_scores(S, v, all_rejected="zero")
    assert r.item() == 0.0
    # soft: every P(Yes) < 0.5 counts as all rejected; otherwise the soft formula applies
    r, rej = dimension_scores(S, torch.tensor([0.4, 0.1, 0.2]), all_rejected="unverified_mean")
    assert rej.item() and r.item() == pytest.approx(3.0)
    r, rej = dimension_scores(S, torch.tensor([0.5, 0.1, 0.2]), all_rejected="invalid", eps=0.0)
    assert not rej.item() and r.item() == pytest.approx((2.5 + 0.1 + 0.6) / 0.8)
    # nothing parsed -> NaN whatever the policy
    r, _ = dimension_scores(torch.full((3,), NAN), torch.ones(3), all_rejected="zero")
    assert math.isnan(r.item())
    with pytest.raises(ValueError):
        dimension_scores(S, v, all_rejected="eps")


def test_aggregation_hand_computed():
    r = torch.tensor([[4.5, 3.0, 5.0, 4.0, 14 / 3], [4.0, 0.0, 5.0, 5.0, 5.0], [4.0, NAN, 5.0, 5.0, 5.0]])
    geo = aggregate_dimensions(r, "geometric")
    assert geo[0].item() == pytest.approx(1260 ** 0.2, rel=1e-6)  # 4.5*3*5*4*14/3 = 1260
    assert geo[1].item() == 0.0  # one dimension zero -> geometric mean zero
    assert math.isnan(geo[2].item())
    ari = aggregate_dimensions(r, "arithmetic")
    assert ari[0].item() == pytest.approx((4.5 + 3 + 5 + 4 + 14 / 3) / 5)
    assert ari[1].item() == pytest.approx(19 / 5)
    torch.testing.assert_close(normalise(torch.tensor([1.0, 3.0, 5.0, 0.0])), torch.tensor([0.0, 0.5, 1.0, 0.0]))
    with pytest.raises(ValueError):
        aggregate_dimensions(r, "harmonic")


@pytest.mark.parametrize("text,cot,expected", [
    ("Reason: the cat matches.\nScore: 4", True, (4.0, "the cat matches.")),
    ("**Reason:** sharp, 2 objects.\n**Score:** 5", True, (5.0, "sharp, 2 objects.")),
    ("Reason: I'd say score 2 at first.\nScore: 3", True, (3.0, "I'd say score 2 at first.")),
    ("Reason: x\nScore: 6", True, None),
    ("Reason: x\nScore: 0", True, None),
    ("Score: 4", True, None),  # CoT asked for a reason
    ("4", True, None),
    ("4", False, (4.0, "")),
    ("4/5", False, (4.0, "")),
    ("Score: 3.5", False, (3.5, "")),
    ("garbage \x00", False, None),
    ("", True, None),
])
def test_parse_hypothesis(text, cot, expected):
    assert parse_hypothesis(text, cot=cot) == expected


@pytest.fixture(scope="module")
def imgs():
    return random_images(4, sizes=[(32, 32), (48, 40)], seed=5)


def run(judge, imgs, n_refs=2, **cfg):
    reward = EVR(judge=judge, k=3, eps=EPS, **cfg)
    return reward, reward(imgs[:1], "put the cat from image 1 on the sofa of image 2", sources=[imgs[1:1 + n_refs]])


@pytest.mark.parametrize("n_refs", [1, 2, 3])
def test_evr_end_to_end_hand_computed(imgs, n_refs):
    judge = scripted()
    reward, out = run(judge, imgs, n_refs=n_refs)
    R = 1260 ** 0.2
    assert out.valid.tolist() == [True]
    assert out.dimensions["raw"][0].item() == pytest.approx(R, rel=1e-5)
    assert out.scores[0].item() == pytest.approx((R - 1) / 4, rel=1e-5)
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(4.5, rel=1e-5)
    assert out.dimensions["visual_quality"][0].item() == pytest.approx(14 / 3, rel=1e-5)
    assert set(judge.n_images) == {n_refs + 1}  # every reference + the candidate in every prompt
    assert judge.gen_calls == [(5, 3, 0.7, 0)] and judge.prob_calls == [(15, ("Yes", "No"))]
    assert judge.sessions == 1
    det = out.details[0]["dimensions"]["reference_consistency"]["hypotheses"]
    assert [h["score"] for h in det] == [4, 5, 2] and [h["verdict"] for h in det] == [1.0, 1.0, 0.0]
    assert det[0]["rationale"] == "evidence RC0" and "reference_consistency 4.50 (2/3 kept)" in out.rationales[0]
    assert out.info["template"] == "evr/default@3" and out.info["judge"] == {"kind": "scripted"}
    import json
    json.dumps(out.to_dict())


def test_evr_ablations(imgs):
    _, out = run(scripted(), imgs, aggregate="arithmetic")
    assert out.dimensions["raw"][0].item() == pytest.approx((4.5 + 3 + 5 + 4 + 14 / 3) / 5, rel=1e-5)
    judge = scripted()
    _, out = run(judge, imgs, verifier="none")
    means = [11 / 3, 3, 7 / 3, 10 / 3, 14 / 3]
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)
    assert judge.prob_calls == []  # no verification questions at all
    soft = {"RC": [0.9, 0.6, 0.2]}
    _, out = run(scripted(soft=soft), imgs, verifier="soft")
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(7 / (1.7 + EPS), rel=1e-5)
    _, out = run(scripted(), imgs, dimensions=["RC", "IC"], output="raw")
    assert list(out.dimensions) == ["reference_consistency", "instruction_consistency", "raw"]
    assert out.scores[0].item() == pytest.approx((4.5 * 4) ** 0.5, rel=1e-5)
    joint = {"ALL": ([4, 2, 5], [1, 0, 1])}
    judge = scripted(joint)
    _, out = run(judge, imgs, use_dimensions=False)
    assert list(out.dimensions) == ["overall", "raw"] and out.dimensions["raw"][0].item() == pytest.approx(4.5, rel=1e-5)
    judge = ScriptedJudge({d: [["4", "5", "3"]] for d in ("RC", "SC", "H", "IC", "Q")})
    _, out = run(judge, imgs, cot=False)
    assert out.dimensions["raw"][0].item() == pytest.approx(4.0, rel=1e-5)


def test_all_rejected_dimension_policies(imgs):
    case = dict(PAPER_CASE, H=([5, 1, 1], [0, 0, 0]))
    _, out = run(scripted(case), imgs)
    assert not out.valid[0] and "harmony: the verifier rejected all 3 hypotheses" in out.errors[0]
    assert math.isnan(out.scores[0].item())
    _, out = run(scripted(case), imgs, all_rejected="unverified_mean")
    assert out.dimensions["harmony"][0].item() == pytest.approx(7 / 3)
    _, out = run(scripted(case), imgs, all_rejected="zero")
    assert out.valid[0] and out.dimensions["raw"][0].item() == 0.0 and out.scores[0].item() == 0.0


def test_unparseable_answers_retry_then_invalid(imgs):
    answers = {d: [[cot(f"{d}{i}", s) for i, s in enumerate(S)]] for d, (S, _) in PAPER_CASE.items()}
    answers["SC"] = [["no idea", cot("SC1", 3), "Score: 9"], [cot("SCr", 3), cot("SCr", 3)]]  # fixed on retry
    judge = ScriptedJudge(answers)
    _, out = run(judge, imgs)
    assert out.valid[0] and out.details[0]["dimensions"]["scene_consistency"]["hypotheses"][0]["attempts"] == 2
    assert judge.gen_calls[1][:2] == (1, 2) and judge.gen_calls[1][3] != judge.gen_calls[0][3]  # new seed
    answers["SC"] = [["no idea", cot("SC1", 3), "Score: 9"], ["still no idea", "Score: 9"]]  # never fixed
    judge = ScriptedJudge(answers)
    _, out = run(judge, imgs, max_retries=1)
    assert not out.valid[0] and "scene_consistency: 2/3 hypotheses unparseable after 1 retries" in out.errors[0]
    assert "last answer: 'still no idea'" in out.errors[0]  # the raw answer is reported
    judge = ScriptedJudge(answers)
    _, out = run(judge, imgs, max_retries=1, unparsed="drop")
    assert out.valid[0] and out.dimensions["scene_consistency"][0].item() == pytest.approx(3.0, rel=1e-5)


def test_compare_swaps_positions(imgs):
    reward = EVR(judge=scripted(), k=3)
    pw = reward.compare(imgs[:2], imgs[2:4], "edit", sources=[[imgs[1]], [imgs[0], imgs[1]]])
    # P(a) = (P(A | a, b) + P(B | b, a)) / 2 = (0.7 + 0.6) / 2
    torch.testing.assert_close(pw.prob_a, torch.tensor([0.65, 0.65]))
    assert pw.valid.all() and "with a second: 0.6000" in pw.rationales[0]
    reward.judge.pairwise = (0.5, 0.5)
    torch.testing.assert_close(reward.compare(imgs[:1], imgs[2:3], "edit", sources=[[imgs[1]]]).prob_a,
                               torch.tensor([0.5]))
    scores = EVR(judge=scripted(), k=3, compare_mode="scores").compare(imgs[:1], imgs[2:3], "e", sources=[[imgs[1]]])
    assert scores.prob_a[0].item() == pytest.approx(0.5)  # same scripted scores for both


def test_user_metadata_never_switches_evr_to_pairwise(imgs):
    """Bug (issue 24's rule, "internal switches never travel in user metadata", which rational followed and EVR
    did not): a ``__evr_pairwise__`` key in the caller's metadata turned a pointwise call into the pairwise path
    (the last reference taken as candidate b). Only compare() / judge_4way ask pairwise."""
    plain = run(scripted(), imgs)[1]
    reward = EVR(judge=scripted(), k=3, eps=EPS)
    out = reward(imgs[:1], "put the cat from image 1 on the sofa of image 2", sources=[imgs[1:3]],
                 metadata=[{"__evr_pairwise__": "2way"}])
    assert out.valid.tolist() == [True] and out.scores.tolist() == plain.scores.tolist()
    assert "reference_consistency" in out.dimensions
    pw = reward.compare(imgs[:1], imgs[2:3], "edit", sources=[[imgs[1]]], metadata=[{"__evr_pairwise__": None}])
    torch.testing.assert_close(pw.prob_a, torch.tensor([0.65]))  # compare stays pairwise


def test_judge_4way_hand_computed(imgs):
    reward = EVR(judge=scripted(), k=3)
    # (first better, second better, both good, both bad) with a first, then with b first
    reward.judge.fourway = ([0.5, 0.1, 0.3, 0.1], [0.2, 0.4, 0.3, 0.1])
    # a better = (0.5 + 0.4) / 2 = 0.45, b better = (0.1 + 0.2) / 2 = 0.15, good 0.3, bad 0.1
    assert reward.judge_4way(imgs[:2], imgs[2:4], "edit", sources=[[imgs[1]], [imgs[0]]]) == ["A>B", "A>B"]
    reward.judge.fourway = ([0.1, 0.1, 0.2, 0.6], [0.1, 0.1, 0.2, 0.6])
    assert reward.judge_4way(imgs[:1], imgs[2:3], "edit", sources=[[imgs[1]]]) == ["A=B=Bad"]
    reward.judge.fourway = ([0.1, 0.6, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1])  # b preferred in both orders
    assert reward.judge_4way(imgs[:1], imgs[2:3], "edit", sources=[[imgs[1]]]) == ["B>A"]
    reward.judge.fourway = ([float("nan")] * 4, [0.25] * 4)  # no probabilities: no verdict, never a guess
    assert reward.judge_4way(imgs[:1], imgs[2:3], "edit", sources=[[imgs[1]]]) == [None]
    assert reward.judge.prob_calls[-1] == (2, ("1", "2", "3", "4"))


def test_config_errors(imgs):
    with pytest.raises(ValueError, match="needs a judge"):
        EVR()
    for bad in ({"verifier": "maybe"}, {"all_rejected": "eps"}, {"aggregate": "median"}, {"k": 0},
                {"dimensions": ["colour"]}):
        with pytest.raises(ValueError):
            EVR(judge=scripted(), **bad)
    reward = load_reward("evr", judge=scripted())
    assert isinstance(reward, EVR)
    with pytest.raises(Exception, match="sources"):
        reward(imgs[:1], "edit")


# ------------------------------------------------------------------------------------------ tiny Qwen judge
def test_evr_on_tiny_qwen_counts_images_and_never_fabricates(tmp_path, imgs):
    reward = EVR.tiny(str(tmp_path))
    model = reward.judge.model
    seen = []
    hook = model.model.visual.register_forward_pre_hook(
        lambda m, a, k: seen.append(int(k["grid_thw"].shape[0])), with_kwargs=True)
    try:
        refs = imgs[2:4]
        out = reward(imgs[:2], "put the cat on the sofa", sources=[refs, refs])
    finally:
        hook.remove()
    assert sum(seen) == 4  # 2 candidates + 2 shared references, each once per reward call
    seen.clear()
    hook = model.model.visual.register_forward_pre_hook(
        lambda m, a, k: seen.append(int(k["grid_thw"].shape[0])), with_kwargs=True)
    try:  # chunked call: the session spans all chunks, the shared references are still encoded once
        reward(imgs[:2], "put the cat on the sofa", sources=[refs, refs], batch_size=1)
    finally:
        hook.remove()
    assert sum(seen) == 4
    # a random model does not answer in the format: NaN + reason with the raw answer, never a made-up score
    assert not out.valid.any() and torch.isnan(out.scores).all()
    assert all("unparseable after 0 retries" in e and "last answer" in e for e in out.errors)
    pw = reward.compare(imgs[:1], imgs[1:2], "edit", sources=[refs])
    pw2 = reward.compare(imgs[1:2], imgs[:1], "edit", sources=[refs])
    assert pw.valid.all() and (pw.prob_a + pw2.prob_a).item() == pytest.approx(1.0, abs=1e-5)
    verdicts = reward.judge_4way(imgs[:2], imgs[1::-1], "edit", sources=[refs, refs])
    assert all(v in ("A>B", "B>A", "A=B=Good", "A=B=Bad") for v in verdicts)


def test_missing_verifier_probability_is_invalid_not_a_rejection(imgs):
    class NoProbs(ScriptedJudge):
        def choice_probs(self, conversations, choices):
            out = super().choice_probs(conversations, choices)
            out[0] = float("nan")  # e.g. the OpenAI backend when no choice ranks among the top log-probs
            return out

    judge = NoProbs(scripted().answers, scripted().verdicts)
    _, out = run(judge, imgs)
    assert not out.valid[0] and "no usable Yes/No probability" in out.errors[0]
    assert "rejected" not in out.errors[0].replace("not rejected", "")   # unanswered is not a rejection


def test_judge_failure_raises_or_marks_the_chunk_invalid(imgs):
    from rewardkit.judges.openai_backend import JudgeServerError

    class Down(ScriptedJudge):
        def generate(self, *a, **k):
            raise JudgeServerError("http://127.0.0.1:8000/v1 failed after 5 attempts; last error: HTTP 503")

    with pytest.raises(JudgeServerError):
        run(Down({}), imgs)
    _, out = run(Down({}), imgs, on_judge_error="nan")
    assert not out.valid.any() and "judge call failed: JudgeServerError" in out.errors[0]
    assert torch.isnan(out.dimensions["harmony"]).all()


def test_all_rejected_zero_is_the_literal_formula_only_for_binary_verdicts():
    """The docstring's claim: with binary verdicts, every hypothesis rejected means v = 0 and the formula
    sum v S / (sum v + eps) is exactly 0 (= ``"zero"``); with soft verdicts all below 0.5 the literal formula is
    the v-weighted mean of the scores (by hand: (0.1*4 + 0.3*2) / (0.4 + 1e-6)), which ``"zero"`` replaces."""
    import torch

    from rewardkit.rewards.evr import dimension_scores

    s = torch.tensor([[4.0, 2.0]])
    binary = torch.tensor([[0.0, 0.0]])
    r_zero, rej = dimension_scores(s, binary, all_rejected="zero")
    literal_binary = float((binary * s).sum() / (binary.sum() + 1e-6))
    assert bool(rej[0]) and float(r_zero[0]) == literal_binary == 0.0
    soft = torch.tensor([[0.1, 0.3]])
    r_soft_zero, rej_soft = dimension_scores(s, soft, all_rejected="zero")
    literal_soft = (0.1 * 4 + 0.3 * 2) / (0.4 + 1e-6)
    assert bool(rej_soft[0]) and float(r_soft_zero[0]) == 0.0 and literal_soft == pytest.approx(2.5, rel=1e-5)
    import rewardkit.rewards.evr as evr_module

    doc = " ".join(evr_module.__doc__.split())
    assert 'with ``verifier="soft"`` the formula taken literally would give the P(Yes)-weighted mean' in doc
