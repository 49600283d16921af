"""Shared plumbing of the CLIP-based rewards (``clipscore``, ``pickscore``, ``hpsv2``, ``aesthetic``): config fields,
loading, devices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..reward import Reward, RewardConfig

PREPROCESS = ("auto", "processor")


@dataclass
class CLIPRewardConfig(RewardConfig):
    model: str = ""
    processor: str | None = None
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 32
    trust_remote_code: bool = False
    # "auto": float [B, 3, H, W] tensors are pre-processed in torch on their device (no PIL, no host copy);
    # "processor": every input goes through PIL and the Hugging Face image processor (the reference path)
    preprocess: str = "auto"


class CLIPReward(Reward):
    """A reward computed from a :class:`~rewardkit.models.clip.CLIPBackbone` (loaded once, in ``__init__``)."""

    tasks = frozenset({"t2i"})
    extras = ("hf",)
    thread_safe = True  # stateless forward passes; the backbone serialises its tokenizer
    differentiable = True  # score_tensor: gradients to pixels through the torch pre-processing
    #: text-image similarity (hpsv2, pickscore, clipscore; aesthetic ignores the prompt): an empty prompt is the
    #: text tower's unconditional input, scored as open_clip / transformers / the hpsv2 package score it
    scores_empty_prompt = True
    #: True for rewards with their own published pre-processing (HPSv2's pad, OpenAI CLIP's transform for the
    #: aesthetic predictor) instead of the Hugging Face processor's: calls keep that exact recipe on PIL (no
    #: tensor fast path), and score_tensor runs its torch port (rewardkit.models.zoo).
    own_preprocessing: ClassVar[bool] = False
    #: text cleaning before the tokenizer (rewardkit.models.clip.TEXT_CLEANING): "openclip" for checkpoints
    #: trained with OpenCLIP's tokenizer (ftfy + HTML unescape + whitespace), None for the transformers one
    text_cleaning: ClassVar[str | None] = None
    #: short names -> hub ids
    VARIANTS: dict[str, str] = {}

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        from ..models.clip import CLIPBackbone

        cfg = self.config
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        if cfg.preprocess not in PREPROCESS:
            raise ValueError(f"preprocess must be one of {PREPROCESS}, got {cfg.preprocess!r}")
        self._check_config()  # before loading any weights
        model = self.VARIANTS.get(cfg.model, cfg.model)
        self.backbone = CLIPBackbone(model, self._processor_for(model), device=cfg.device, dtype=cfg.dtype,
                                     trust_remote_code=cfg.trust_remote_code, text_cleaning=self.text_cleaning)
        self._device = self.backbone.device
        self.default_batch_size = cfg.batch_size

    @property
    def supports_tensor_input(self) -> bool:
        return (not self.own_preprocessing and self.config.preprocess == "auto"
                and self.backbone.tensor_params is not None)

    @property
    def supports_score_tensor(self) -> bool:
        return self.own_preprocessing or self.supports_tensor_input

    def _check_config(self) -> None:
        """Reward-specific option checks (subclasses)."""

    def _official_rgb(self, im):
        """transformers' ``convert_to_rgb`` (the CLIP image processor's; PickScore, CLIPScore). HPSv2 and the
        aesthetic predictor override it with their own package's order."""
        from ..models.zoo import official_hf_clip_rgb

        return official_hf_clip_rgb(im)

    def _processor_for(self, model: str) -> str | None:
        return self.config.processor

    def to(self, device):
        self.backbone.to(device)
        self._device = self.backbone.device
        return self
