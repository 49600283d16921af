"""Preference reward: a Bradley–Terry model trained with ``rewardkit train preference`` (the Arena RM recipe).

``load_reward("preference", model=DIR_OR_HUB_ID)`` (alias ``arena-rm``) scores images with the raw reward of a
:class:`~rewardkit.models.preference.PreferenceModel`: a linear / MLP / uncertainty head on the hidden state
of a reward token of a Qwen-VL backbone. Scores are unbounded; ``compare()`` is ``sigmoid(r_a - r_b)``
(the Bradley–Terry probability the model was trained on), whatever the normalisation.

Normalisation (``normalize=``): ``"none"`` (raw reward), ``"calibration"`` (z-score with the mean / std the
``rewardkit calibrate`` command saved with the model) or ``"quantile"`` (the score's position in [0, 1] among the
saved calibration quantiles). A model without saved calibration refuses the last two with a clear error.

Editing: pass ``sources=`` (one source image per sample, or several for multi-reference editing); the
template shows them before the candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput

NORMALIZE = ("none", "calibration", "quantile")


@dataclass
class PreferenceRewardConfig(RewardConfig):
    model: str = ""                 # directory written by `rewardkit train preference`, or a hub id
    revision: str | None = None     # hub revision
    base_model: str | None = None   # LoRA models: where the base weights are (default: as saved)
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 16
    normalize: str = "none"         # none | calibration | quantile
    trust_remote_code: bool = False
    # "auto": text-to-image calls with a float [B, 3, H, W] tensor are pre-processed in torch on its device
    # (resize, normalise, patchify; no PIL, no host copy); "processor": always PIL + the HF processor
    preprocess: str = "auto"
    # vision patch embedding: "linear" (one matrix product, transformers' own fused forward; within float
    # rounding of the convolution, faster) or "conv" (the stock Conv3d, bit for bit the original)
    patch_embed: str = "linear"


class PreferenceReward(Reward):
    """Raw Bradley–Terry reward of a trained preference model (higher is better)."""

    name: ClassVar[str] = "preference"
    tasks = frozenset({"t2i", "edit", "multi_ref"})
    score_range = None
    extras = ("hf",)
    thread_safe = False  # one processor + model; the base class serialises calls
    differentiable = True  # score_tensor: gradients to pixels through the torch pre-processing
    Config = PreferenceRewardConfig

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        cfg = self.config
        if not cfg.model:
            raise ValueError("preference reward needs model=<directory or hub id of a trained preference model>")
        if cfg.normalize not in NORMALIZE:
            raise ValueError(f"normalize must be one of {NORMALIZE}, got {cfg.normalize!r}")
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        if cfg.preprocess not in ("auto", "processor"):
            raise ValueError(f"preprocess must be 'auto' or 'processor', got {cfg.preprocess!r}")
        from ..models.preference import PreferenceModel

        self.model = PreferenceModel.from_pretrained(cfg.model, device=cfg.device, dtype=cfg.dtype,
                                                     trust_remote_code=cfg.trust_remote_code,
                                                     revision=cfg.revision, base_model=cfg.base_model,
                                                     patch_embed=cfg.patch_embed)
        self.model.requires_grad_(False)  # a reward: gradients go to input pixels only (score_tensor)
        if cfg.normalize != "none" and not self.model.calibration:
            raise ValueError(f"normalize={cfg.normalize!r} needs calibration statistics; run "
                             f"`rewardkit calibrate --model {cfg.model} --data ...` first")
        dims = ("raw",) if cfg.normalize != "none" else ()
        self.dimensions = dims + (("log_sigma",) if self.model.head_type == "uncertainty" else ())
        self._device = self.model.device
        self.default_batch_size = cfg.batch_size

    def to(self, device):
        self.model.to(device)
        self._device = self.model.device
        return self

    @property
    def supports_tensor_input(self) -> bool:
        return self.config.preprocess == "auto" and self.model.tensor_params() is not None

    def _encode(self, batch: RewardBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """The encoded batch and its row order (:meth:`PreferenceModel.encode_by_length`; None: as given)."""
        if isinstance(batch.images, torch.Tensor):  # tensor path (base class: float [B, 3, H, W], no sources)
            enc = self.model.encode_tensor(batch.images, batch.prompts)
            if enc is not None:
                return enc, None
            if torch.is_grad_enabled() and batch.images.requires_grad:
                raise RuntimeError("the torch pre-processing does not reproduce this model's processor "
                                   "(checked on the first call), so score_tensor cannot give gradients")
            from .. import media  # the check just retired the tensor path: this call takes the processor path

            batch = RewardBatch(images=[media.to_pil(x) for x in batch.images.detach().cpu()],
                                prompts=batch.prompts, metadata=batch.metadata, indices=batch.indices)
        return self.model.encode_by_length(batch.images, batch.prompts, batch.sources)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ..models.preference import apply_calibration

        enc, order = self._encode(batch)
        r, log_sigma = self.model.forward_grouped(order, **{k: v.to(self._device) for k, v in enc.items()})
        raw = r.float()
        if self.config.normalize == "none":
            scores = raw
        else:
            scores = apply_calibration(raw, self.model.calibration, self.config.normalize)
        dims = {"raw": raw} if self.config.normalize != "none" else {}
        if log_sigma is not None:
            dims["log_sigma"] = log_sigma.float()
        info = {"model": self.config.model, "template": self.model.template.version,
                "normalize": self.config.normalize}
        return RewardOutput(scores=scores, dimensions=dims, info=info)

    def _compare_values(self, out: RewardOutput) -> torch.Tensor:
        """``compare`` is ``sigmoid(r_a - r_b)`` on the raw rewards whatever ``normalize`` is."""
        return out.dimensions["raw"] if self.config.normalize != "none" else out.scores

    @classmethod
    def tiny(cls, workdir: str) -> "PreferenceReward":
        """A tiny, randomly initialised preference model on a tiny Qwen2.5-VL (saved once under ``workdir``)."""
        from pathlib import Path

        from ..models.preference import CONFIG_NAME, PreferenceModel

        path = Path(workdir) / "tiny-preference"
        if not (path / CONFIG_NAME).is_file():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = PreferenceModel.from_backbone("tiny:qwen2_5_vl")
            model.save_pretrained(path)
        return cls(model=str(path), device="cpu")
