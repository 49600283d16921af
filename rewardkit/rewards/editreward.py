"""EditReward (Wu et al. 2025, TIGER-Lab): a Qwen2.5-VL reward model for instruction-guided image editing,
trained on EditReward-Data with two ranknet heads.

Two forward passes per sample, as upstream: head 0 on the *instruction following* prompt, head 1 on the
*visual quality* prompt, each over [source image, edited image, prompt text with ``<|Reward|>``] at
256*28*28 pixels per image. ``score = (mu_following + mu_quality) / 2`` (upstream's ``reward[0]``, the mean
pooling of the two heads); both mus are dimensions, and ``log_sigma`` is the mean of the two log-sigmas.
Unbounded (the prompts mention a 1-4 scale; the heads are not clipped).

Rotary positions are EditReward's: on Qwen2-/2.5-VL backbones plain 1-D positions for every token (its forward
calls the language model with ``position_ids=None`` and no image grid); on Qwen3-VL the model's own 3-D ones.
``positions=`` overrides it; a directory converted before the option existed gets the official positions.

    rewardkit convert editreward model.safetensors editreward/ [--base Qwen/Qwen2.5-VL-7B-Instruct]
    load_reward("editreward", model="editreward/", dtype="bfloat16")(edited, instruction, sources=[[src], ...])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput


@dataclass
class EditRewardConfig(RewardConfig):
    model: str = ""          # directory written by `rewardkit convert editreward`
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 4
    trust_remote_code: bool = False
    # rotary positions: "" = as converted (official), or "sequential" / "mrope"
    positions: str = ""
    # vision patch embedding: "linear" (transformers' fused forward, within float rounding) or "conv" (stock)
    patch_embed: str = "linear"
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class EditReward(Reward):
    """EditReward: mean of two ranknet heads (instruction following, visual quality) on a Qwen2.5-VL."""

    name: ClassVar[str] = "editreward"
    tasks = frozenset({"edit"})
    score_range = None
    extras = ("hf",)
    dimensions = ("instruction_following", "visual_quality", "log_sigma")
    thread_safe = False
    Config = EditRewardConfig

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        from pathlib import Path

        from safetensors.torch import load_file

        from ..convert._io import read_manifest
        from ..models.preference import PreferenceModel, PreferenceTemplate, RankNetHead

        cfg = self.config
        if not cfg.model:
            raise ValueError("editreward needs model=<directory written by `rewardkit convert editreward SRC DIR`>")
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        self.manifest = man = read_manifest(cfg.model, "editreward")
        self.following = PreferenceModel.from_pretrained(cfg.model, device=cfg.device, dtype=cfg.dtype,
                                                         trust_remote_code=cfg.trust_remote_code,
                                                         patch_embed=cfg.patch_embed)
        if self.following.head_type != "ranknet":
            raise ValueError(f"{cfg.model}: expected ranknet heads, found {self.following.head_type!r}")
        q = man["heads"]["quality"]
        head = RankNetHead(self.following.hidden_size, hidden=self.following.head_hidden).float()
        head.load_state_dict(load_file(str(Path(cfg.model) / q["file"])), strict=True)
        from .hpsv3 import resolve_positions

        positions = resolve_positions(cfg.positions, man, getattr(self.following.vlm.config, "model_type", None))
        self.following.positions = positions
        self.quality = PreferenceModel(self.following.vlm, self.following.processor, head="ranknet",
                                       positions=positions,
                                       head_hidden=self.following.head_hidden,
                                       template=PreferenceTemplate.from_dict(q["template"]),
                                       base_model=self.following.base_model,
                                       reward_token_id=self.following.reward_token_id, head_module=head,
                                       patch_embed=cfg.patch_embed)
        self.quality.head.to(self.following.device)
        self.quality.eval()
        self._device = self.following.device
        self.default_batch_size = cfg.batch_size

    def to(self, device):
        self.following.to(device)
        self.quality.head.to(device)
        self._device = self.following.device
        return self

    def _score(self, batch: RewardBatch) -> RewardOutput:
        outs = []
        for m in (self.following, self.quality):  # one forward pass per head, each with its own prompt
            enc, order = m.encode_by_length(batch.images, batch.prompts, batch.sources)
            mu, log_sigma = m.forward_grouped(order, **{k: v.to(self._device) for k, v in enc.items()})
            outs.append((mu.float().cpu(), log_sigma.float().cpu()))
        (mu_f, ls_f), (mu_q, ls_q) = outs
        return RewardOutput(scores=(mu_f + mu_q) / 2,
                            dimensions={"instruction_following": mu_f, "visual_quality": mu_q,
                                        "log_sigma": (ls_f + ls_q) / 2},
                            info={"model": self.config.model, "reward": "editreward",
                                  "positions": self.following.positions})

    @classmethod
    def tiny(cls, workdir: str) -> "EditReward":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny import write_tiny_editreward

        root = Path(workdir)
        out = root / "tiny-editreward"
        if not (out / "rewardkit.json").is_file():
            ckpt, base = write_tiny_editreward(root / "editreward-src")
            convert("editreward", ckpt, out, base=str(base), pixels=56 * 56)
        return cls(model=str(out), device="cpu")
