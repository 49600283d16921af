"""Group rewards through every host's call shape: flow_grpo's ``multi_score``, TRL's GRPO reward function and
verl's per-sample ``compute_score`` give each sample the reward a direct ``GroupReward`` call gives it on the same
groups."""

from __future__ import annotations

import concurrent.futures as cf
import math

import numpy as np
import pytest
import torch

from tests.helpers.pairwise_judges import QualityJudge, solid


@pytest.fixture(scope="module")
def pick(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")


def _pixels(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 24, 24, generator=g)


def _judge_reward():
    from rewardkit.rewards.unifiedreward import UnifiedReward

    return UnifiedReward(judge=QualityJudge(bias=0.1), template="2.0", reencode="none", both_orders=False)


def test_flow_grpo_multi_score_groups_by_prompt_and_metadata(pick):
    from rewardkit import GroupReward
    from rewardkit.integrations.flow_grpo import multi_score

    images = _pixels(6)
    prompts = ("a cat", "a cat", "a dog", "a cat", "a dog", "a cat")
    # the same prompt with other metadata is another prompt row: another group
    metadata = ({"tag": 1}, {"tag": 1}, {}, {"tag": 2}, {}, {"tag": 2})
    for mode in ("winrate", "rank", "zscore"):
        g = GroupReward(pick, mode=mode)
        fn = multi_score("cpu", {"pref": 2.0}, rewards={"pref": g})
        got, info = fn(images, prompts, metadata, only_strict=True)
        want = g(images, list(prompts), groups=["c1", "c1", "d", "c2", "d", "c2"])
        assert got["pref"].tolist() == pytest.approx(want.scores.tolist())
        assert got["avg"].tolist() == pytest.approx((2 * want.scores).tolist())
        assert info["pref"]["valid_fraction"] == 1.0


def test_flow_grpo_multi_score_with_a_pairwise_judge():
    from rewardkit import GroupReward
    from rewardkit.integrations.flow_grpo import multi_score

    ims = solid([0.1, 0.6, 0.3, 0.8])
    images = torch.stack([torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255 for im in ims])
    g = GroupReward(_judge_reward(), mode="winrate")
    got, _ = multi_score("cpu", {"w": 1.0}, rewards={"w": g})(images, ("p", "q", "p", "q"), ({}, {}, {}, {}))
    want = g(ims, ["p", "q", "p", "q"])
    assert got["w"].tolist() == pytest.approx(want.scores.tolist(), abs=1e-6)
    assert got["w"][0] + got["w"][2] == pytest.approx(1.0, abs=1e-6)


def test_trl_num_generations_consecutive_completions_form_a_group(pick):
    from PIL import Image

    from rewardkit import GroupReward
    from rewardkit.integrations.trl import trl_reward_func

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)) for _ in range(6)]
    completions = ["a red cube", "a cube", "red", "two dogs", "dogs on grass", "a dog"]
    g = GroupReward(pick, mode="zscore", zscore="trl")
    fn = trl_reward_func(g, num_generations=3)
    got = fn(prompts=["p"] * 6, completions=completions, completion_ids=None, trainer_state=None, image=images)
    want = g(images, completions, groups=[0, 0, 0, 1, 1, 1])
    assert got == pytest.approx(want.scores.tolist())
    with pytest.raises(ValueError, match="num_generations"):
        trl_reward_func(g)(prompts=["p"] * 6, completions=completions, image=images)
    # an empty completion is a missing member: NaN (then the NaN policy), left out of its group's statistics
    masked = trl_reward_func(g, num_generations=3, nan_policy="mask")
    got = masked(prompts=["p"] * 6, completions=completions[:4] + ["", completions[5]], image=images)
    ref = g([images[i] for i in (0, 1, 2, 3, 5)], [completions[i] for i in (0, 1, 2, 3, 5)], groups=[0, 0, 0, 1, 1])
    assert got[4] is None and [got[i] for i in (0, 1, 2, 3, 5)] == pytest.approx(ref.scores.tolist())


def test_verl_uid_groups_concurrent_per_sample_calls(pick):
    from rewardkit import GroupReward
    from rewardkit.integrations.verl import verl_compute_score

    pixels = (_pixels(6, seed=4) * 255).to(torch.uint8)
    prompts = ["a cat", "a dog", "a cat", "a dog", "a cat", "a dog"]
    uids = ["u1", "u2", "u1", "u2", "u1", "u2"]
    g = GroupReward(pick, mode="winrate")
    fn = verl_compute_score(g, group_size=3, group_timeout_s=30)
    with cf.ThreadPoolExecutor(6) as ex:   # verl runs sync scorers in an executor, many at once
        futs = [ex.submit(fn, data_source="d", solution_image=pixels[i], ground_truth=prompts[i],
                          extra_info={"prompt": prompts[i], "uid": uids[i]}) for i in range(6)]
        got = [f.result(timeout=60)["score"] for f in futs]
    want = g(list(pixels), prompts, groups=uids)
    assert got == pytest.approx(want.scores.tolist(), abs=1e-6)
    with pytest.raises(ValueError, match="group_size"):
        verl_compute_score(g)(solution_image=pixels[0], ground_truth="a cat")
    short = verl_compute_score(g, group_size=3, group_timeout_s=0.2)
    with pytest.raises(TimeoutError, match="1 of 3"):
        short(solution_image=pixels[0], ground_truth="a cat", extra_info={"uid": "lonely"})


def test_a_group_with_one_valid_member_follows_the_nan_policy(pick):
    from rewardkit import GroupReward
    from rewardkit.integrations._common import NonFiniteRewardError
    from rewardkit.integrations.flow_grpo import multi_score

    g = GroupReward(pick, mode="rank")
    images = _pixels(3)
    with pytest.raises(NonFiniteRewardError, match="1 valid member"):
        multi_score("cpu", {"r": 1.0}, rewards={"r": g})(images, ("a", "a", "b"), ({}, {}, {}))
    got, info = multi_score("cpu", {"r": 1.0}, rewards={"r": g}, nan_policy="fill", fill_value=-1.0)(
        images, ("a", "a", "b"), ({}, {}, {}))
    assert got["r"].tolist()[2] == -1.0 and not math.isnan(got["r"][0]) and info["r"]["n_invalid"] == 1
