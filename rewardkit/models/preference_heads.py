"""Reward heads of :class:`~rewardkit.models.preference.PreferenceModel`: ``[B, H]`` hidden states of the reward
token -> ``[B, 1]`` (reward) or ``[B, 2]`` (mean, log-sigma), computed in fp32. Re-exported by
:mod:`rewardkit.models.preference`."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["LinearHead", "MLPHead", "UncertaintyHead", "RankNetHead", "HEADS", "build_head"]


class LinearHead(nn.Module):
    """``[B, H] -> [B, 1]``: one linear layer (the Arena RM head)."""

    out_dim = 1

    def __init__(self, in_features: int, **_: Any) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 1)
        nn.init.normal_(self.proj.weight, std=1.0 / math.sqrt(in_features))
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


class MLPHead(nn.Module):
    """``[B, H] -> [B, 1]``: Linear -> SiLU -> Linear (one hidden layer).

    rewardkit's own small MLP head. Earlier docs called it "HPSv3-style"; it is not HPSv3's head (that is
    :class:`RankNetHead`, ``head="ranknet"``). The name ``mlp`` and its saved keys are unchanged, so models
    trained with it load as before."""

    out_dim = 1

    def __init__(self, in_features: int, hidden: int = 1024, **_: Any) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.SiLU(), nn.Linear(hidden, 1))
        nn.init.normal_(self.net[2].weight, std=1.0 / math.sqrt(hidden))
        nn.init.zeros_(self.net[2].bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)


class UncertaintyHead(nn.Module):
    """``[B, H] -> [B, 2]``: (mean, log-sigma) of a Gaussian reward."""

    out_dim = 2

    def __init__(self, in_features: int, **_: Any) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 2)
        nn.init.normal_(self.proj.weight, std=1.0 / math.sqrt(in_features))
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


class RankNetHead(nn.Sequential):
    """``[B, H] -> [B, 2]`` (mu, log-sigma): HPSv3's / EditReward's ``ranknet`` head.

    ``Linear(H, hidden) -> ReLU -> Dropout(0.05) -> Linear(hidden, 16) -> ReLU -> Linear(16, 2)``, a
    ``Sequential`` so its parameter keys are HPSv3's ``rm_head.{0,3,5}.*`` without the prefix. HPSv3 reports mu;
    sigma = exp(log-sigma) is the model's uncertainty (trained with a Gaussian / Thurstone loss).
    """

    out_dim = 2

    def __init__(self, in_features: int, hidden: int = 1024, **_: Any) -> None:
        super().__init__(nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(0.05), nn.Linear(hidden, 16),
                         nn.ReLU(), nn.Linear(16, 2))


HEADS: dict[str, type[nn.Module]] = {"linear": LinearHead, "mlp": MLPHead, "uncertainty": UncertaintyHead,
                                     "ranknet": RankNetHead}


def build_head(kind: str, in_features: int, hidden: int = 1024) -> nn.Module:
    if kind not in HEADS:
        raise ValueError(f"unknown head {kind!r}; choose from {sorted(HEADS)}")
    return HEADS[kind](in_features, hidden=hidden).float()
