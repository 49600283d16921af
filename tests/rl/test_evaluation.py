"""rl/evaluation.py: evaluation runs on the EMA weights (docs/rl.md, "Evaluation ... the EMA weights") and gives the
trained weights back afterwards."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")


def test_evaluation_samples_with_the_ema_weights_and_restores_the_trained_ones(tmp_path, tiny_dirs):
    """The EMA tensors are set by hand to values the trained adapter does not hold (seeded random, not a copy), and
    the sampler's velocity call records the adapter's weights: every evaluation call must see exactly the EMA values
    (the expected value is what the test wrote, not the trainer's own bookkeeping), and after the evaluation the
    trained weights are back bit for bit. With `train.ema: false` the sampler sees the trained weights.
    Bugs caught: evaluation sampling with the trained weights (the copy from `tr.ema` skipped or done after the
    sampling), the trained weights left replaced by the EMA ones, the EMA and trained lists zipped out of order."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.evaluation import evaluate
    from rewardkit.rl.trainer import NFTTrainer

    prompts = tmp_path / "eval.txt"
    prompts.write_text("a red cube\na blue ball\n")
    (tmp_path / "train.txt").write_text("a green cone\na cat\n")
    cfg = {"output_dir": str(tmp_path / "run"), "seed": 3, "prompts": str(tmp_path / "train.txt"),
           "model": {"pretrained": tiny_dirs["sd3"], "max_sequence_length": 8}, "lora": {"r": 4, "alpha": 8},
           "sample": {"num_steps": 2, "resolution": 32, "batch_size": 2, "num_groups": 1, "group_size": 2,
                      "eval_num_steps": 2},
           "train": {"batch_size": 2}, "rewards": {"pickscore": 1.0},
           "reward_kwargs": {"pickscore": {"model": tiny_dirs["clip"], "device": "cpu"}},
           "eval_prompts": str(prompts), "eval_grid": 0, "reward_workers": 1, "num_epochs": 1,
           "mixed_precision": "no", "cpu": True, "save_every": 0, "eval_every": 1, "progress": False,
           "resume": "never"}
    for ema in (True, False):
        tr = NFTTrainer(build_config(NFTConfig, {**cfg, "train": {**cfg["train"], "ema": ema}}))
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for p in tr.trainable:  # trained weights: seeded, and different from the EMA values below
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
        trained = [p.detach().clone() for p in tr.trainable]
        if ema:
            written = [0.01 * torch.randn(p.shape, generator=g) for p in tr.trainable]
            for e, w in zip(tr.ema, written):
                e.copy_(w)
        seen: list[list[torch.Tensor]] = []
        real = tr.policy.sample_velocity

        def spy(*args, **kw):
            seen.append([p.detach().clone() for p in tr.trainable])
            return real(*args, **kw)

        tr.policy.sample_velocity = spy
        evaluate(tr)
        assert len(seen) >= 2  # two steps at least
        want = written if ema else trained
        for weights in seen:
            assert all(torch.equal(a, b) for a, b in zip(weights, want))
        assert all(torch.equal(p, t) for p, t in zip(tr.trainable, trained))  # given back, bit for bit
