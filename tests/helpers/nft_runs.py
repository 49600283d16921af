"""The tiny DiffusionNFT run configuration the RL trainer tests share (paths from the ``tiny_dirs`` fixture)."""

from __future__ import annotations

from rewardkit.rl.config import NFTConfig


def tiny_cfg(out, tiny_dirs, **over) -> NFTConfig:
    from rewardkit.config import build_config

    base = {
        "output_dir": str(out), "seed": 3, "model": {"pretrained": tiny_dirs["sd3"], "max_sequence_length": 8},
        "lora": {"r": 4, "alpha": 8},
        "sample": {"num_steps": 2, "resolution": 32, "batch_size": 4, "num_groups": 2, "group_size": 4},
        "train": {"batch_size": 4, "lr": 1e-3},
        "rewards": {"pickscore": 1.0}, "reward_kwargs": {"pickscore": {"model": tiny_dirs["clip"], "device": "cpu"}},
        "reward_workers": 2, "num_epochs": 2, "mixed_precision": "no", "cpu": True, "save_every": 1, "eval_every": 0,
        "progress": False, "resume": "never",
    }
    from rewardkit.config import _merge

    return build_config(NFTConfig, _merge(base, over, NFTConfig))  # `rewards` in `over` replaces pickscore
