"""A ``GroupReward`` as the NFT trainer's reward (``reward_kwargs.<name>.group``): judged once per epoch with every
member of each prompt group (over all processes), and the tiny Pref-GRPO recipe trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _scorer(tmp_path, clip_dir, group: dict):
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import _RewardScorer

    cfg = build_config(NFTConfig, {"output_dir": str(tmp_path), "rewards": {"pickscore": 1.0},
                                   "reward_kwargs": {"pickscore": {"model": str(clip_dir), "device": "cpu",
                                                                   "group": group}}})
    return _RewardScorer(cfg, tmp_path, None)


@pytest.mark.parametrize("mode", ["winrate", "rank"])
def test_group_reward_is_combined_over_the_epoch_by_prompt(tmp_path, tiny_clip_dir, mode):
    from rewardkit import GroupReward

    sc = _scorer(tmp_path, tiny_clip_dir, {"mode": mode})
    g = sc.rewards[0]
    assert isinstance(g, GroupReward) and sc.deferred == {"pickscore"}
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(6, 3, 24, 24, generator=gen)
    prompts = ["a cat", "a dog", "a cat", "a dog", "a cat", "a dog"]
    ids = torch.tensor([0, 1, 0, 1, 0, 1])
    # two decoded batches of 3 (each holds partial groups); the epoch's groups are complete only at finalize
    res = [sc(images[:3], prompts[:3], [{"prompt": p} for p in prompts[:3]]),
           sc(images[3:], prompts[3:], [{"prompt": p} for p in prompts[3:]])]
    assert torch.isnan(res[0]["total"]).all()
    fin = sc.finalize(res, ids)
    want = g(list(((images.clamp(0, 1) * 255).round().to(torch.uint8))), prompts, groups=ids.tolist())
    assert fin["total"].tolist() == pytest.approx(want.scores.double().tolist(), abs=1e-6)
    assert fin["total"][[0, 2, 4]].sum().item() == pytest.approx(1.5)     # a group's win rates / ranks sum to G/2


def test_group_option_must_be_a_mapping(tmp_path, tiny_clip_dir):
    with pytest.raises(ValueError, match="mapping"):
        _scorer(tmp_path, tiny_clip_dir, "winrate")


def test_tiny_pref_grpo_recipe_trains_two_steps(tmp_path, tiny_dirs):
    """recipes/nft/tiny_pref_grpo.yaml (winrate over PickScore's pairwise preference): two epochs, one optimizer
    step each; every sample has a win rate and each prompt group's win rates average exactly 1/2."""
    import yaml

    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import NFTTrainer

    raw = yaml.safe_load((ROOT / "recipes/nft/tiny_pref_grpo.yaml").read_text())
    raw["output_dir"] = str(tmp_path / "run")
    raw["model"]["pretrained"] = tiny_dirs["sd3"]
    raw["reward_kwargs"]["pickscore"]["model"] = tiny_dirs["clip"]
    raw["sample"]["num_steps"] = 2
    raw.update(save_every=0, progress=False, resume="never")
    cfg = build_config(NFTConfig, raw)
    assert cfg.reward_kwargs["pickscore"]["group"] == {"mode": "winrate"} and cfg.num_epochs == 2
    tr = NFTTrainer(cfg)
    before = {k: v.detach().clone() for k, v in tr.policy.transformer.named_parameters() if v.requires_grad}
    recs = [tr.run_epoch() for _ in range(2)]
    for rec in recs:
        assert rec["invalid_rewards"] == 0
        assert rec["reward/total/mean"] == pytest.approx(0.5, abs=1e-6)    # the mean win rate of every group
    after = dict(tr.policy.transformer.named_parameters())
    assert any(not torch.equal(before[k], after[k].detach()) for k in before)
