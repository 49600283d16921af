"""HPSv3 (Ma et al. 2025, "HPSv3: Towards Wide-Spectrum Human Preference Score"): Qwen2-VL-7B with a reward
token and a ranknet head trained with an uncertainty-aware ranking loss on HPDv3.

``score = mu``, the first output of the head on the hidden state of ``<|Reward|>`` (what HPSv3's
``reward(...)[:, 0]`` gives; unbounded, model averages on the HPSv3 leaderboard are roughly 1-11). ``sigma = exp(log_sigma)`` (the head's
second output) is reported as a dimension: the model's own uncertainty. Input: HPSv3's instruction with the
prompt, the reward token inside the user text, images resized to exactly 256*28*28 pixels (qwen-vl
``smart_resize``, bicubic). ``compare()`` is ``sigmoid(mu_a - mu_b)``.

Rotary positions are HPSv3's: plain 1-D positions for every token, image tokens included (its forward calls
the language model with ``position_ids=None`` and no image grid), not Qwen2-VL's 3-D ones. ``positions=``
overrides it (``"mrope"``: the 3-D positions earlier rewardkit versions used); a directory converted before
the option existed has no ``positions`` key and gets the official ``"sequential"``.

Convert the official weights once (safetensors or the .pth; key names of transformers 4.45 -> current)::

    rewardkit convert hpsv3 HPSv3.safetensors hpsv3/ [--base Qwen/Qwen2-VL-7B-Instruct]
    load_reward("hpsv3", model="hpsv3/", dtype="bfloat16")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..reward import RewardBatch, RewardOutput
from .preference import PreferenceReward, PreferenceRewardConfig


@dataclass
class HPSv3Config(PreferenceRewardConfig):
    model: str = ""          # directory written by `rewardkit convert hpsv3`
    batch_size: int = 8
    # rotary positions: "" = as converted (official: "sequential"), or "sequential" / "mrope"
    positions: str = ""
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


def resolve_positions(override: str, manifest: dict, model_type: str | None) -> str:
    """The rotary positions for a converted HPSv3 / EditReward directory: ``override`` when set, else the
    manifest's ``positions``, else (a directory converted before the key existed) the official positions for
    the backbone's ``model_type``."""
    from ..convert.hpsv3 import official_positions
    from ..models.preference import check_positions

    return check_positions(override or manifest.get("positions") or official_positions(model_type))


class HPSv3(PreferenceReward):
    """HPSv3 human-preference score (mu of the ranknet head); sigma as a dimension."""

    name: ClassVar[str] = "hpsv3"
    tasks = frozenset({"t2i"})
    dimensions = ("sigma", "log_sigma")
    Config = HPSv3Config
    differentiable = True  # the Qwen-VL tensor path (tests/rewards/test_zoo_gradients.py)
    scores_empty_prompt = True  # as the official package: an empty prompt is a legitimate (unconditional) input

    def __init__(self, config=None, /, **overrides):
        from ..config import build_config
        from ..convert._io import read_manifest

        cfg = build_config(self.Config, config, overrides)
        if not cfg.model:
            raise ValueError("hpsv3 needs model=<directory written by `rewardkit convert hpsv3 HPSv3.safetensors DIR`>")
        self.manifest = read_manifest(cfg.model, "hpsv3")  # before any weights load
        super().__init__(cfg)
        if self.model.head_type != "ranknet":
            raise ValueError(f"{cfg.model}: expected HPSv3's ranknet head, found {self.model.head_type!r}")
        self.dimensions = tuple(d for d in self.dimensions if d != "log_sigma") + ("sigma", "log_sigma")
        self.model.positions = resolve_positions(cfg.positions, self.manifest,
                                                 getattr(self.model.vlm.config, "model_type", None))

    def _score(self, batch: RewardBatch) -> RewardOutput:
        out = super()._score(batch)
        out.dimensions["sigma"] = torch.exp(out.dimensions["log_sigma"])
        out.info["reward"] = "hpsv3"
        out.info["positions"] = self.model.positions
        return out

    @classmethod
    def tiny(cls, workdir: str) -> "HPSv3":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny import write_tiny_hpsv3

        root = Path(workdir)
        out = root / "tiny-hpsv3"
        if not (out / "rewardkit.json").is_file():
            ckpt, base = write_tiny_hpsv3(root / "hpsv3-src")
            convert("hpsv3", ckpt, out, base=str(base), pixels=56 * 56)
        return cls(model=str(out), device="cpu")
