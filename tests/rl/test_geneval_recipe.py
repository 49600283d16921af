"""``recipes/nft/sd3_geneval.yaml`` mirrors DiffusionNFT's ``sd3_geneval`` (transcribed in
tests/helpers/host_rewards.py); its tiny variant trains 2 steps on CPU with each prompt's GenEval metadata row
reaching the reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.host_rewards import diffusionnft_sd3_geneval

ROOT = Path(__file__).resolve().parents[2]
DECAY = {0: "copy", 1: "linear_to_0_5", 2: "delayed_linear_to_0_999"}


def _cfg(name):
    import yaml

    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig

    return build_config(NFTConfig, yaml.safe_load((ROOT / "recipes/nft" / name).read_text()))


def test_sd3_geneval_recipe_mirrors_the_official_config():
    cfg, off = _cfg("sd3_geneval.yaml"), diffusionnft_sd3_geneval(n_gpus=8)
    got = {"pretrained": cfg.model.pretrained, "num_steps": cfg.sample.num_steps,
           "eval_num_steps": cfg.sample.eval_num_steps, "resolution": cfg.sample.resolution,
           "kl_coef": cfg.train.kl_coef, "group_size": cfg.sample.group_size, "num_groups": cfg.sample.num_groups,
           "batch_size": cfg.sample.batch_size, "train_batch_size": cfg.train.batch_size,
           "steps_per_epoch": cfg.train.steps_per_epoch, "guidance_scale": cfg.sample.guidance_scale,
           "solver": cfg.sample.solver, "decay_type": cfg.train.decay_type, "beta": cfg.train.beta,
           "adv_mode": cfg.train.adv_mode, "rewards": cfg.rewards, "seed": cfg.seed, "save_every": cfg.save_every,
           "eval_every": cfg.eval_every, "mixed_precision": cfg.mixed_precision, "lr": cfg.train.lr,
           "weight_decay": cfg.train.weight_decay}
    off["decay_type"] = DECAY[off["decay_type"]]
    assert got == off
    assert cfg.prompts.endswith("geneval/train_metadata.jsonl")
    # DiffusionNFT trains on multi_score's "avg" = its gen_eval's partial `scores` (flow_grpo/rewards.py:282-302,
    # gen_eval.py:343-377), detector fed the RGB arrays (gen_eval.py:286) that mmdet reads as BGR
    assert cfg.reward_kwargs["geneval"]["form"] == "score"
    assert cfg.reward_kwargs["geneval"]["detector_channels"] == "bgr"


def test_tiny_recipe_prompt_rows_are_geneval_metadata():
    from rewardkit.rl.prompts import load_prompt_set

    cfg = _cfg("sd3_geneval_tiny.yaml")
    prompts, rows = load_prompt_set(str(ROOT / cfg.prompts))
    tags = {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    assert {r["tag"] for r in rows} == tags and all(r["prompt"] == p and r["include"] for p, r in zip(prompts, rows))
    assert cfg.rewards == {"geneval": 1.0} and cfg.reward_kwargs == {"geneval": {"tiny": True}}
    assert cfg.num_epochs * cfg.train.steps_per_epoch == 2


def _run(tmp_path, monkeypatch, *over):
    from rewardkit.cli import main

    monkeypatch.chdir(ROOT)  # the recipe names its prompt file from the repository root
    code = main(["rl", "nft", "--config", "recipes/nft/sd3_geneval_tiny.yaml", f"output_dir={tmp_path / 'run'}",
                 "resume=never", *over])
    assert code == 0
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tiny_recipe_trains_two_steps_with_metadata_reaching_the_reward(tmp_path, monkeypatch):
    """Until the geneval reward is merged: the recipe with a stand-in that records the metadata it is given
    (built through the same `{tiny: true}` path as the recipe's geneval)."""
    from rewardkit.rl.prompts import load_prompt_set
    from tests.helpers.geneval_layouts import BrightIsCorrect, register_bright

    register_bright(monkeypatch)
    metrics = _run(tmp_path, monkeypatch, "rewards={bright-is-correct: 1.0}",
                   "reward_kwargs={bright-is-correct: {tiny: true}}")
    assert [m["global_step"] for m in metrics if "final" not in m] == [1, 2]
    _, rows = load_prompt_set(str(ROOT / "recipes/nft/geneval_tiny_metadata.jsonl"))
    assert len(BrightIsCorrect.seen) == 16  # 2 epochs x 2 prompts x 4 images
    assert all(m in rows for m in BrightIsCorrect.seen)  # each sample got its prompt's whole row


@pytest.mark.slow
def test_tiny_recipe_with_the_registered_geneval_reward(tmp_path, monkeypatch):
    """The recipe as written (runs once the geneval reward is registered)."""
    from rewardkit.registry import list_rewards

    if "geneval" not in list_rewards():
        pytest.skip("no reward registered as 'geneval' on this branch")
    metrics = _run(tmp_path, monkeypatch)
    assert [m["global_step"] for m in metrics if "final" not in m] == [1, 2]
    assert all("reward/geneval/mean" in m for m in metrics if "final" not in m)
