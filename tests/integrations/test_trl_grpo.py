"""A real two-step TRL GRPOTrainer run: tiny Qwen2.5-VL policy, a rewardkit reward through the TRL adapter."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.slow
def test_grpo_trainer_two_steps_with_rewardkit_reward(tiny_clip_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rewardkit import load_reward
    from rewardkit.integrations import trl_reward_func
    from rewardkit.integrations.trl import message_text
    from rewardkit.testing import random_images, tiny_qwen2_5_vl

    model, proc = tiny_qwen2_5_vl()
    model.train()
    images = random_images(4, size=56)
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Describe the image."}]] * 4, "image": images})
    pick = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")
    rf = trl_reward_func(pick)
    seen = []
    score = rf._score

    def record(prompts, completions, kwargs):
        out = score(prompts, completions, kwargs)
        seen.append((list(kwargs["image"]), [message_text(c, "assistant") for c in completions], out, sorted(kwargs)))
        return out

    rf._score = record
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, max_steps=2, learning_rate=1e-3, use_cpu=True, bf16=False,
                      gradient_checkpointing=False, report_to=[], logging_steps=1, save_strategy="no", seed=0)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = GRPOTrainer(model=model, processing_class=proc, reward_funcs=[rf], args=args, train_dataset=ds)
    trainer.train()

    assert len(seen) == 2                                            # one reward call per generation batch
    for imgs, texts, out, keys in seen:
        assert {"completion_ids", "image", "log_metric", "trainer_state"} <= set(keys)
        assert out == pick(imgs, texts).scores.tolist()              # what a direct call gives
    logs = [h for h in trainer.state.log_history if "rewards/pickscore/mean" in h]
    assert len(logs) == 2 and all(h["rewardkit/pickscore/valid_fraction"] == 1.0 for h in logs)
    assert any(not torch.equal(before[k], v) for k, v in model.named_parameters())
