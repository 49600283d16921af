"""Shared plumbing of the CLIP-based rewards (``clipscore``, ``pickscore``): config fields, loading, devices."""

from __future__ import annotations

from dataclasses import dataclass

from ..reward import Reward, RewardConfig


@dataclass
class CLIPRewardConfig(RewardConfig):
    model: str = ""
    processor: str | None = None
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 32
    trust_remote_code: bool = False


class CLIPReward(Reward):
    """A reward computed from a :class:`~rewardkit.models.clip.CLIPBackbone` (loaded once, in ``__init__``)."""

    tasks = frozenset({"t2i"})
    extras = ("hf",)
    thread_safe = True  # stateless forward passes under inference_mode
    #: short names -> hub ids
    VARIANTS: dict[str, str] = {}

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        from ..models.clip import CLIPBackbone

        cfg = self.config
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        self._check_config()  # before loading any weights
        model = self.VARIANTS.get(cfg.model, cfg.model)
        self.backbone = CLIPBackbone(model, self._processor_for(model), device=cfg.device, dtype=cfg.dtype,
                                     trust_remote_code=cfg.trust_remote_code)
        self._device = self.backbone.device
        self.default_batch_size = cfg.batch_size

    def _check_config(self) -> None:
        """Reward-specific option checks (subclasses)."""

    def _processor_for(self, model: str) -> str | None:
        return self.config.processor

    def to(self, device):
        self.backbone.to(device)
        self._device = self.backbone.device
        return self
