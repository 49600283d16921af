"""Transcriptions of the RL hosts' own reward code, the references the host-name rewards are tested against.

Each function is a transcription (not a copy of the code path under test) with file and line cited:
- kvablack/ddpo-pytorch @ 1958463, ``ddpo_pytorch/rewards.py``;
- yifan123/flow_grpo @ ac4c86e, ``flow_grpo/rewards.py`` and ``flow_grpo/qwenvl.py``;
- NVlabs/DiffusionNFT @ 24af555, ``flow_grpo/rewards.py`` (the same jpeg formula, ``:8-30``).
"""

from __future__ import annotations

import io
import re

import numpy as np
import torch
from PIL import Image


def host_jpeg_incompressibility(images: torch.Tensor) -> np.ndarray:
    """ddpo_pytorch/rewards.py:7-19 (= flow_grpo/rewards.py:7-19): float NCHW [0, 1] -> uint8 by
    ``(x * 255).round().clamp(0, 255)`` (:10), NHWC (:11), PIL JPEG at quality 95 (:15), ``tell() / 1000`` (:16)."""
    arr = (images * 255).round().clamp(0, 255).to(torch.uint8).cpu().numpy().transpose(0, 2, 3, 1)
    sizes = []
    for a in arr:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG", quality=95)
        sizes.append(buf.tell() / 1000)
    return np.array(sizes)


def ddpo_jpeg_compressibility(images: torch.Tensor) -> np.ndarray:
    """ddpo_pytorch/rewards.py:22-29: ``-rew`` (:26)."""
    return -host_jpeg_incompressibility(images)


def flow_grpo_jpeg_compressibility(images: torch.Tensor) -> np.ndarray:
    """flow_grpo/rewards.py:22-29: ``-rew/500`` (:27); DiffusionNFT flow_grpo/rewards.py:28 ``-rew / 500``."""
    return -host_jpeg_incompressibility(images) / 500


#: flow_grpo/qwenvl.py:40-58, ``self.task``: the triple-quoted string, opening and closing newline included
FLOW_GRPO_QWENVL_TASK = (
    "\n"
    "Your role is to evaluate the aesthetic quality score of given images.\n"
    "1. Bad: Extremely blurry, underexposed with significant noise, indiscernible\n"
    "subjects, and chaotic composition.\n"
    "2. Poor: Noticeable blur, poor lighting, washed-out colors, and awkward\n"
    "composition with cut-off subjects.\n"
    "3. Fair: In focus with adequate lighting, dull colors, decent composition but\n"
    "lacks creativity.\n"
    "4. Good: Sharp, good exposure, vibrant colors, thoughtful composition with\n"
    "a clear focal point.\n"
    "5. Excellent: Exceptional clarity, perfect exposure, rich colors, masterful\n"
    "composition with emotional impact.\n"
    "\n"
    "Please first provide a detailed analysis of the evaluation process, including the criteria for judging "
    "aesthetic quality, within the <Thought> tag. Then, give a final score from 1 to 5 within the <Score> tag.\n"
    "<Thought>\n"
    "[Analyze the evaluation process in detail here]\n"
    "</Thought>\n"
    "<Score>X</Score>\n"
)


def flow_grpo_qwenvl_messages(image) -> list:
    """flow_grpo/qwenvl.py:63-72: one user turn, the image then the task text."""
    return [{"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": FLOW_GRPO_QWENVL_TASK}]}]


def flow_grpo_qwenvl_score(text: str) -> float:
    """flow_grpo/qwenvl.py:16-24 (extract_scores, one answer): first ``<Score>(\\d+)</Score>`` / 5, else 0."""
    m = re.search(r"<Score>(\d+)</Score>", text)
    return float(m.group(1)) / 5 if m else 0


# ---------------------------------------------------------------------------------------------------- GenEval
#: yifan123/reward-server @ 92ac29f, reward_server/gen_eval.py:321 (``required_keys``)
GENEVAL_REQUIRED_KEYS = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]


def reward_server_compute_geneval(results: list[dict]) -> tuple:
    """reward_server/gen_eval.py:320-340 after ``evaluate_image`` (``results``: its per-image dicts, :296-308):
    ``(scores, rewards, strict_rewards, grouped_rewards, grouped_strict_rewards)``."""
    from collections import defaultdict

    scores, strict_rewards, rewards = [], [], []
    grouped_strict_rewards, grouped_rewards = defaultdict(list), defaultdict(list)
    for result in results:
        strict_rewards.append(1.0 if result["strict_correct"] else 0.0)
        scores.append(result["score"])
        rewards.append(1.0 if result["correct"] else 0.0)
        tag = result["tag"]
        for key in GENEVAL_REQUIRED_KEYS:
            if key != tag:
                grouped_strict_rewards[key].append(-10.0)
                grouped_rewards[key].append(-10.0)
            else:
                grouped_strict_rewards[tag].append(1.0 if result["strict_correct"] else 0.0)
                grouped_rewards[tag].append(1.0 if result["correct"] else 0.0)
    return scores, rewards, strict_rewards, dict(grouped_rewards), dict(grouped_strict_rewards)


def flow_grpo_multi_score_geneval(results: list[dict], weight: float = 1.0) -> dict:
    """flow_grpo/rewards.py @ ac4c86e :377-401 with only ``geneval`` weighted: the score_details dict (the server's
    ``correct`` is already False under ``only_strict``, gen_eval.py:292-293)."""
    scores, rewards, strict_rewards, group_rewards, group_strict_rewards = reward_server_compute_geneval(results)
    score_details = {"accuracy": rewards, "strict_accuracy": strict_rewards}
    for key, value in group_strict_rewards.items():
        score_details[f"{key}_strict_accuracy"] = value
    for key, value in group_rewards.items():
        score_details[f"{key}_accuracy"] = value
    score_details["geneval"] = scores
    score_details["avg"] = [weight * s for s in scores]
    return score_details


# ----------------------------------------------------------------------------------------- DiffusionNFT config
def diffusionnft_sd3_geneval(n_gpus: int = 8) -> dict:
    """NVlabs/DiffusionNFT @ 24af555 ``config/nft.py:82-94`` (``sd3_geneval``: reward {"geneval": 1},
    gradient_step_per_epoch 1, dataset geneval) through ``_get_config`` (:11-67) on ``config/base.py``
    (seed :13, save_freq :20, eval_freq :21, fp16 :23, learning_rate :66, adam_weight_decay :72), the batch-size
    search of :31-47 written out."""
    num_image_per_prompt, num_groups, bsz, steps = 24, 48, 9, 1                      # :26-29
    while True:                                                                      # :31-47
        assert bsz >= 1
        if num_groups * num_image_per_prompt % (n_gpus * bsz) == 0 and bsz * n_gpus % num_image_per_prompt == 0:
            if (num_groups * num_image_per_prompt // (n_gpus * bsz)) % steps == 0:
                break
        bsz -= 1
    return {"pretrained": "stabilityai/stable-diffusion-3.5-medium", "num_steps": 10, "eval_num_steps": 40,
            "resolution": 512, "kl_coef": 0.0001, "group_size": num_image_per_prompt, "num_groups": num_groups,
            "batch_size": bsz, "train_batch_size": bsz, "steps_per_epoch": steps, "guidance_scale": 1.0,
            "solver": "dpm2", "decay_type": 1, "beta": 1.0, "adv_mode": "all", "rewards": {"geneval": 1.0},
            "seed": 42, "save_every": 30, "eval_every": 10, "mixed_precision": "fp16", "lr": 3e-4,
            "weight_decay": 1e-4}
