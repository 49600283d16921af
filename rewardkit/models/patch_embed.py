"""Qwen-VL patch embeddings computed as the matrix product they are.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL embed the vision patches with an ``nn.Conv3d`` whose kernel equals its
stride, given one patch at a time (``[N, C, T, P, P]`` in, ``[N, D, 1, 1, 1]`` out): each output is a linear
map of the flattened patch. transformers offers the same computation as an opt-in fusion
(``from_pretrained(..., fusion_config={"patch_embeddings": True})``, ``transformers/fusion_mapping.py``:
``F.linear`` of the patch viewed as ``[N, C*T*P*P]`` with the weight viewed as ``[D, C*T*P*P]``), but it
registers the fusion process-wide: every later load of the class is fused too, and the model type's checkpoint
conversion mapping changes. Here the one module of one model is switched in place (:func:`set_patch_embed`):
its class becomes :class:`PatchwiseConv3d`, a ``Conv3d`` with the same parameters, state dict and repr, whose
forward is that product. Nothing is copied and saving is unchanged.

Numbers: bit for bit transformers' fused forward (``tests/models/test_patch_embed.py`` loads the model with
``fusion_config`` in a separate process); within float rounding of the convolution, whose summation order
differs (about 3e-6 on patch embeddings of magnitude 1). Speed: one matrix product instead of oneDNN's
convolution, 3.2x faster for 256 patches on a CPU core (0.21 vs 0.69 ms); on some GPU / cuDNN / dtype
combinations the convolution is slower by orders of magnitude (transformers issue #45750).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PATCH_EMBED_MODES = ("linear", "conv")


def check_patch_embed(mode: str) -> str:
    """``mode`` when it is one of :data:`PATCH_EMBED_MODES`, else a ``ValueError`` (callers check before loading
    any weights)."""
    if mode not in PATCH_EMBED_MODES:
        raise ValueError(f"patch_embed must be one of {PATCH_EMBED_MODES}, got {mode!r}")
    return mode


def is_patchwise(conv: nn.Module) -> bool:
    """A 3-D convolution that never overlaps: kernel == stride, no padding, no dilation, one group."""
    return (isinstance(conv, nn.Conv3d) and tuple(conv.stride) == tuple(conv.kernel_size)
            and conv.padding in ((0, 0, 0), "valid") and tuple(conv.dilation) == (1, 1, 1) and conv.groups == 1)


class PatchwiseConv3d(nn.Conv3d):
    """``nn.Conv3d`` (kernel == stride) that computes an input of exactly one kernel's size as a matrix product;
    any other input goes to the convolution. Made by :func:`set_patch_embed`, not constructed directly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5 and tuple(x.shape[2:]) == tuple(self.kernel_size):
            n = x.shape[0]
            out = F.linear(x.reshape(n, -1), self.weight.reshape(self.out_channels, -1), self.bias)
            return out.view(n, self.out_channels, 1, 1, 1)
        return super().forward(x)


def _patch_convs(model: nn.Module):
    for name, module in model.named_modules():
        if not name.split(".")[-1] == "patch_embed":
            continue
        proj = getattr(module, "proj", None)
        proj = getattr(proj, "base_layer", proj)  # a peft LoRA layer wraps the convolution
        if is_patchwise(proj):
            yield proj


def set_patch_embed(model: nn.Module, mode: str) -> int:
    """Switch the vision patch embeddings of ``model`` (any module named ``patch_embed`` with a non-overlapping
    ``proj`` Conv3d) to ``"linear"`` (:class:`PatchwiseConv3d`) or back to ``"conv"`` (``nn.Conv3d``).
    Returns how many modules qualify (0: the model has no such patch embedding; nothing changes)."""
    cls = PatchwiseConv3d if check_patch_embed(mode) == "linear" else nn.Conv3d
    n = 0
    for conv in _patch_convs(model):
        if type(conv) in (nn.Conv3d, PatchwiseConv3d):  # never replace a subclass someone else made
            conv.__class__ = cls
        n += 1
    return n
