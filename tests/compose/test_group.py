"""``GroupReward``: win rates, ranks and z-scores within groups, checked against independent references (a
brute-force loop over ordered pairs, scipy's ``rankdata``, flow_grpo's / TRL's normalisation transcribed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.pairwise_judges import QualityJudge, quality, solid, true_p

QS = [0.1, 0.5, 0.9, 0.3, 0.7]
PROMPTS = ["a cat"] * 3 + ["a dog"] * 2


def _ur(judge, **kw):
    from rewardkit.rewards.unifiedreward import UnifiedReward

    return UnifiedReward(judge=judge, template="2.0", reencode="none", **kw)


@pytest.fixture(scope="module")
def pick(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")


def _images(n, seed=0):
    g = np.random.default_rng(seed)
    return [g.integers(0, 256, (24, 24, 3), dtype=np.uint8) for _ in range(n)]


def _brute_winrate(compare, images, prompts, groups):
    """Mean over the other members j of the group of compare(i, j), one ordered pair at a time."""
    out = []
    for i in range(len(images)):
        ps = [float(compare([images[i]], [images[j]], prompts[i]).prob_a[0])
              for j in range(len(images)) if j != i and groups[j] == groups[i]]
        out.append(sum(ps) / len(ps))
    return out


def test_bt_winrate_equals_brute_force_over_ordered_pairs(pick):
    from rewardkit import GroupReward

    ims, prompts = _images(5), PROMPTS
    out = GroupReward(pick, mode="winrate")(ims, prompts)
    want = _brute_winrate(pick.compare, ims, prompts, prompts)
    assert out.valid.all() and out.scores.tolist() == pytest.approx(want, abs=1e-6)
    assert out.info["group"]["pairwise"].startswith("scores")
    # the win rates of a group of G sum to G / 2 (each pair gives p + (1 - p) = 1 to its two members)
    assert float(out.scores[:3].sum()) == pytest.approx(1.5) and float(out.scores[3:].sum()) == pytest.approx(1.0)


def test_judge_winrate_equals_brute_force_over_ordered_pairs():
    from rewardkit import GroupReward

    ims = solid(QS)
    for both in (True, False):   # the judge averages both orders itself, or asks one order per call
        r = _ur(QualityJudge(bias=0.1), both_orders=both)
        g = GroupReward(r, mode="winrate", both_orders=both)
        out = g(ims, PROMPTS)
        if both:   # compare is symmetric: brute force over ordered pairs of compare
            want = _brute_winrate(r.compare, ims, PROMPTS, PROMPTS)
        else:      # one order per compare, so the reference is a one-order win rate over ordered pairs
            want = []
            for i in range(5):
                ps = [r.judge.p(quality(ims[i]), quality(ims[j])) if i < j else 1 - r.judge.p(quality(ims[j]), quality(ims[i]))
                      for j in range(5) if j != i and PROMPTS[j] == PROMPTS[i]]
                want.append(sum(ps) / len(ps))
        assert out.valid.all() and out.scores.tolist() == pytest.approx(want, abs=2e-6)


def test_both_orders_removes_a_planted_position_bias():
    from rewardkit import GroupReward

    ims = solid(QS)
    q = [quality(im) for im in ims]
    unbiased = [np.mean([true_p(q[i], q[j], 1.5) for j in range(5) if j != i and PROMPTS[j] == PROMPTS[i]])
                for i in range(5)]
    judge = QualityJudge(k=1.5, bias=0.2)   # P(first) = sigmoid(1.5 dq) + 0.2, never clipped on these images
    r = _ur(judge, both_orders=False)
    swapped = GroupReward(r, mode="winrate")(ims, PROMPTS)            # both_orders=True (default)
    one = GroupReward(r, mode="winrate", both_orders=False)(ims, PROMPTS)
    assert swapped.scores.tolist() == pytest.approx(unbiased, abs=2e-6)
    assert max(abs(a - b) for a, b in zip(one.scores.tolist(), unbiased)) > 0.1   # the bias is there
    assert swapped.info["group"]["orders"] == 2 and one.info["group"]["orders"] == 1


def test_judge_pairs_go_in_one_compare_call_in_one_session():
    from rewardkit import GroupReward

    judge = QualityJudge()
    r = _ur(judge, both_orders=True, batch_size=64)
    out = GroupReward(r)(solid(QS), PROMPTS)
    # 3 + 1 unordered pairs, each asked in both orders: 8 conversations in one generate call, one session
    assert judge.calls == [8] and judge.sessions == 1 and out.info["group"]["pairs"] == 4


def test_ranks_equal_scipys_rankdata(pick):
    from scipy.stats import rankdata

    from rewardkit import GroupReward
    from rewardkit.compose.group_math import normalised_rank

    ims = _images(5, seed=3)
    out = GroupReward(pick, mode="rank")(ims, PROMPTS)
    base = pick(ims, PROMPTS).scores.double().numpy()
    for sl in (slice(0, 3), slice(3, 5)):
        r = rankdata(base[sl], method="average")
        assert out.scores[sl].tolist() == pytest.approx(((r - 1) / (len(r) - 1)).tolist())
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0])  # ties, hand-checked against scipy
    want = (rankdata(x, method="average") - 1) / 5
    assert normalised_rank(torch.tensor(x)).tolist() == pytest.approx(want.tolist())
    assert normalised_rank(torch.tensor([2.0, float("nan"), 1.0])).tolist()[::2] == [1.0, 0.0]


def _flow_grpo_tracker(prompts, rewards, global_std=False):
    """flow_grpo/stat_tracking.py PerPromptStatTracker.update, type 'grpo' (yifan123/flow_grpo@ac4c86e8, lines
    11-31; the same in NVlabs/DiffusionNFT@24af5554 lines 12-32), transcribed for one fresh tracker."""
    prompts = np.array(prompts)
    rewards = np.array(rewards, dtype=np.float64)
    advantages = np.empty_like(rewards) * 0.0
    for prompt in np.unique(prompts):
        stats = rewards[prompts == prompt]
        mean = np.mean(stats, axis=0, keepdims=True)
        std = (np.std(rewards, axis=0, keepdims=True) if global_std else np.std(stats, axis=0, keepdims=True)) + 1e-4
        advantages[prompts == prompt] = (rewards[prompts == prompt] - mean) / std
    return advantages


def _trl_group(rewards, g):
    """TRL 1.16 GRPOTrainer, scale_rewards='group' (trl/trainer/grpo_trainer.py:2765-2787; nanstd in
    trl/trainer/utils.py:1037-1043, Bessel-corrected), transcribed."""
    r = torch.tensor(rewards, dtype=torch.float64)
    mean = r.view(-1, g).mean(dim=1).repeat_interleave(g)
    std = r.view(-1, g).std(dim=1, correction=1).repeat_interleave(g)
    return ((r - mean) / (std + 1e-4)).tolist()


def test_zscores_equal_the_hosts_normalisation(pick):
    from rewardkit import GroupReward

    ims = _images(6, seed=5)
    prompts = ["a", "b", "a", "b", "a", "b"]
    base = pick(ims, prompts).scores.double().numpy()
    for global_std in (False, True):
        out = GroupReward(pick, mode="zscore", global_std=global_std)(ims, prompts)
        assert out.scores.tolist() == pytest.approx(_flow_grpo_tracker(prompts, base, global_std).tolist(), abs=1e-5)
    grouped = ["a", "a", "a", "b", "b", "b"]
    out = GroupReward(pick, mode="zscore", zscore="trl")(ims, grouped)
    assert out.scores.tolist() == pytest.approx(_trl_group(pick(ims, grouped).scores.double().tolist(), 3), abs=1e-5)
    assert out.dimensions["base"].tolist() == pytest.approx(pick(ims, grouped).scores.tolist())


def test_hand_computed_values():
    from rewardkit.compose.group_math import bt_probs, group_zscore_host, winrates

    # three members, P(0>1)=0.8, P(0>2)=0.6, P(1>2)=0.3: win rates (0.8+0.6)/2, (0.2+0.3)/2, (0.4+0.7)/2
    rate, count = winrates(3, [(0, 1), (0, 2), (1, 2)], torch.tensor([0.8, 0.6, 0.3]))
    assert rate.tolist() == pytest.approx([0.7, 0.25, 0.55]) and count.tolist() == [2, 2, 2]
    rate, count = winrates(3, [(0, 1), (0, 2), (1, 2)], torch.tensor([0.8, float("nan"), 0.3]))
    assert rate.tolist() == pytest.approx([0.8, 0.25, 0.7]) and count.tolist() == [1, 2, 1]
    assert bt_probs(torch.tensor([1.0, 0.0]), [(0, 1)], 0.5).tolist() == pytest.approx([1 / (1 + math.exp(-2))])
    assert bt_probs(torch.tensor([1.0, 0.0]), [(0, 1)], 1.0, False).tolist() == pytest.approx([1 / (1 + math.e)])
    # [1, 2, 3]: mean 2, std sqrt(2/3) -> (x - 2) / (0.816497 + 1e-4)
    z = group_zscore_host(torch.tensor([1.0, 2.0, 3.0]), ["g"] * 3)
    assert z.tolist() == pytest.approx([-1 / (math.sqrt(2 / 3) + 1e-4), 0.0, 1 / (math.sqrt(2 / 3) + 1e-4)])


def test_invalid_members_are_left_out_and_small_groups_are_nan(pick):
    from rewardkit import GroupReward

    ims = _images(5, seed=1)
    bad = list(ims)
    bad[1] = np.full((24, 24, 3), 7, dtype=np.float64) * float("nan")   # unreadable: NaN pixels
    prompts = ["a", "a", "a", "b", "b"]
    for mode in ("winrate", "rank", "zscore"):
        g = GroupReward(pick, mode=mode)
        out = g(bad, prompts, on_error="nan")
        ref = g([ims[0], ims[2], ims[3], ims[4]], ["a", "a", "b", "b"])
        assert not out.valid[1] and out.errors[1] and math.isnan(out.scores[1])
        assert out.scores[[0, 2, 3, 4]].tolist() == pytest.approx(ref.scores.tolist())  # as if it were absent
        one = g([ims[0], bad[1], ims[3], ims[4]], ["a", "a", "b", "b"], on_error="nan")
        assert not one.valid[0] and "1 valid member" in one.errors[0] and one.valid[2:].all()


def test_a_failed_pair_makes_both_members_nan_or_is_skipped():
    from rewardkit import GroupReward

    judge = QualityJudge(fail_below=0.2)   # every conversation showing q=0.1 first fails
    r = _ur(judge, both_orders=False)
    ims = solid([0.1, 0.5, 0.9])
    out = GroupReward(r, both_orders=False)(ims, "p", on_error="nan")
    assert out.valid.tolist() == [False, False, False] and "pair with sample 1" in out.errors[0]
    skip = GroupReward(r, both_orders=False, on_pair_error="skip")(ims, "p")
    assert skip.valid.tolist() == [False, True, True] and "no pair" in skip.errors[0]
    assert float(skip.scores[1]) == pytest.approx(judge.p(quality(ims[1]), quality(ims[2])), abs=1e-6)  # pair (1, 2)


def test_explicit_groups_metadata_groups_and_max_pairs(pick):
    from rewardkit import GroupReward

    ims = _images(6, seed=2)
    g = GroupReward(pick, mode="rank")
    by_ids = g(ims, "same prompt", groups=[0, 0, 0, 1, 1, 1])
    by_prompt = g(ims, ["x"] * 3 + ["y"] * 3)
    by_meta = GroupReward(pick, mode="rank", group_by="uid")(ims, "same prompt",
                                                             metadata=[{"uid": u} for u in "aaabbb"])
    assert by_ids.scores.tolist() == by_meta.scores.tolist()
    assert by_prompt.scores.tolist() == g(ims, ["x"] * 3 + ["y"] * 3, groups="ppprrr").scores.tolist()
    assert GroupReward(pick, mode="rank")(ims, "same prompt").scores.tolist() != by_ids.scores.tolist()
    with pytest.raises(ValueError, match="metadata"):
        GroupReward(pick, group_by="uid")(ims, "p", metadata=[{"uid": 1}] * 5 + [{}])
    # max_pairs: an estimator over a seeded subset of the pairs, each member over its drawn pairs
    from rewardkit.compose.group_math import sample_pairs

    ims = _images(8, seed=2)
    full = GroupReward(pick)(ims, "p", groups=[0] * 8)
    est = GroupReward(pick, max_pairs=8, seed=3)(ims, "p", groups=[0] * 8)
    again = GroupReward(pick, max_pairs=8, seed=3)(ims, "p", groups=[0] * 8)
    assert est.valid.all() and est.scores.tolist() == again.scores.tolist() != full.scores.tolist()
    assert [d["group_size"] for d in est.details] == [8] * 8
    pairs = sample_pairs(range(8), 16, seed=1)   # D = 2: every member meets 4 distinct opponents
    assert len(pairs) == 16 and len({frozenset(p) for p in pairs}) == 16
    assert all(sum(i in p for p in pairs) == 4 for i in range(8))
    assert sample_pairs(range(8), 28) == sample_pairs(range(8), None) and len(sample_pairs(range(8), 28)) == 28


def test_options_are_checked(pick):
    from rewardkit import GroupReward
    from rewardkit.errors import ConfigError

    for bad in ({"mode": "elo"}, {"pairwise": "x"}, {"max_pairs": 0}, {"zscore": "numpy"}, {"on_pair_error": "x"}):
        with pytest.raises(ConfigError):
            GroupReward(pick, **bad)
    with pytest.raises(ConfigError, match="no pairwise prompt"):
        GroupReward(pick, pairwise="judge")
