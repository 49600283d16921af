"""EditReward (TIGER-Lab, ``EditReward-Qwen2.5-7B-VL`` / ``-MiMo-VL-7B-SFT-2508``) -> a rewardkit directory.

A Qwen2.5-VL reward model with ``<|Reward|>`` and two ranknet heads, ``rm_heads.head_0`` (instruction
following, scored on ``INSTRUCTION_EDIT_FOLLOWING``) and ``rm_heads.head_1`` (visual quality, on
``INSTRUCTION_EDIT_QUALITY``); one forward pass per head. The checkpoint (``model.safetensors``, or
``model.pth`` read weights-only) may use the legacy or the current key names; both are handled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._editreward_prompts import INSTRUCTION_EDIT_FOLLOWING, INSTRUCTION_EDIT_QUALITY
from .hpsv3 import PIXELS, REWARD_TOKEN, SUFFIX, convert_qwen_reward

__all__ = ["convert_editreward", "editreward_template", "DEFAULT_BASE"]

DEFAULT_BASE = "Qwen/Qwen2.5-VL-7B-Instruct"


def editreward_template(dimension: str) -> dict[str, Any]:
    """[source image, edited image, instruction text + reward-token suffix] in one user turn."""
    text = {"following": INSTRUCTION_EDIT_FOLLOWING, "quality": INSTRUCTION_EDIT_QUALITY}[dimension]
    text = text.replace("{text_prompt}", "{prompt}") + SUFFIX
    return {"version": f"editreward-{dimension}-1.0", "system": None, "t2i": text, "edit": text, "multi_ref": text,
            "reward_token": REWARD_TOKEN, "reward_token_in_text": True}


def convert_editreward(src: str | Path, dst: str | Path, *, base: str = DEFAULT_BASE, overwrite: bool = False,
                       pixels: int = PIXELS) -> Path:
    """Convert an EditReward checkpoint (a local file, or a hub id whose ``model.safetensors`` is downloaded)
    for ``load_reward("editreward", model=dst)``."""
    return convert_qwen_reward(
        src, dst, reward="editreward", base=base,
        heads={"following": "rm_heads.head_0.", "quality": "rm_heads.head_1."},
        templates={"following": editreward_template("following"), "quality": editreward_template("quality")},
        model_types=("qwen2_5_vl", "qwen2_vl", "qwen3_vl"), pixels=pixels, overwrite=overwrite,
        variant="EditReward", hub_files=("model.safetensors",))
