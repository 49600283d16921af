"""Qwen-VL vision attention over a batch of images: one SDPA call per distinct chunk length, not per chunk.

The vision towers of Qwen2-VL, Qwen2.5-VL and Qwen3-VL pack every image of a batch into one sequence and attend
within each image (Qwen2.5-VL: within each window, outside its full-attention blocks). With ``sdpa`` (the
default when the flash-attn package is absent) transformers splits the sequence at the boundaries and calls
SDPA once per image or window, in a Python loop: 16 images are 16 calls per block; a 448-px image in
Qwen2.5-VL's window blocks is 16 calls per block by itself. With a FlashAttention implementation it passes the
boundaries (``cu_seqlens``) to one variable-length call instead.

:func:`grouped_sdpa` takes that variable-length call and runs it with PyTorch's SDPA: the chunks of one length
are stacked on the batch dimension (a view when they are adjacent, as the images of one size in a batch are)
and attended in one call, and each result is written to its place. PyTorch's CPU SDPA kernel computes every
(batch, head) slice on its own, so on CPU each chunk's output is bit for bit the one the per-chunk loop gives
(``tests/models/test_vision_attention.py`` compares the vision tower, the scores and the gradients with
``torch.equal``). On a GPU the kernels SDPA picks may depend on the batch size: not yet measured there (no GPU
run so far); expect equality to float rounding at least.

It is registered with transformers' ``AttentionInterface`` under :data:`NAME` and set on the vision config only
(:func:`set_vision_attention`). The name contains "flash" because that is what the Qwen-VL vision attention
checks before passing ``cu_seqlens`` (``transformers.utils.generic.is_flash_attention_requested``); the
computation is SDPA's, no FlashAttention package is involved, and the language model keeps its own
implementation. Should a transformers version stop passing the boundaries, each call arrives without them and
runs as plain SDPA, per chunk, as before (correct, only not grouped).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: the name under which :func:`grouped_sdpa` is registered ("flash": see the module docstring)
NAME = "rewardkit_flash_grouped_sdpa"
#: what ``set_vision_attention(model, "sdpa")`` restores
STOCK = "sdpa"


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                 cu_seq_lens_k: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query`` / ``key`` / ``value`` ``[1, heads, total, head_dim]`` packed
    chunks with boundaries ``cu_seq_lens_q`` (== ``cu_seq_lens_k``) -> ``([1, total, heads, head_dim], None)``,
    each chunk attending only within itself. Anything else goes to transformers' own SDPA function."""
    kwargs.pop("max_length_q", None)
    kwargs.pop("max_length_k", None)
    packed = (cu_seq_lens_q is not None and attention_mask is None and not is_causal and query.shape[0] == 1
              and (cu_seq_lens_k is None or cu_seq_lens_k is cu_seq_lens_q
                   or torch.equal(cu_seq_lens_k, cu_seq_lens_q))
              and key.shape[1] == query.shape[1])  # no grouped-query heads in the vision towers
    if not packed:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    heads, total, dim = query.shape[1], query.shape[2], query.shape[3]
    bounds, plan = _plan(cu_seq_lens_q)
    if bounds[0] != 0 or bounds[-1] != total:  # transformers' own loop (torch.split) refuses these too
        raise ValueError(f"vision attention boundaries {list(bounds)} do not cover the {total} packed tokens")
    out = query.new_empty(1, total, heads, dim)
    for n, runs, idx in plan:
        if idx is None:  # adjacent chunks: views, no copy
            s, c = runs[0]
            q, k, v = (t[0, :, s:s + c * n].unflatten(1, (c, n)).transpose(0, 1) for t in (query, key, value))
        else:
            c = sum(r[1] for r in runs)
            q, k, v = (t[0].index_select(1, idx).unflatten(1, (c, n)).transpose(0, 1) for t in (query, key, value))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)
        o = o.transpose(1, 2).reshape(c * n, heads, dim)  # chunk by chunk, as the loop's outputs are laid out
        if idx is None:
            out[0, s:s + c * n] = o
        else:
            out[0].index_copy_(0, idx, o)
    return out, None


_PLANS: dict[tuple, list] = {}


def _plan(cu: torch.Tensor) -> tuple[tuple[int, ...], list[tuple[int, list[list[int]], torch.Tensor | None]]]:
    """The boundaries as ints, and ``(length, runs of adjacent chunks [start, count], row index or None when one
    run)`` per distinct chunk length, kept per boundaries (the vision tower passes the same ones to every block,
    and a batch of the same image sizes has the same ones)."""
    bounds = tuple(cu.tolist())
    key = (bounds, cu.device)
    plan = _PLANS.get(key)
    if plan is not None:
        return bounds, plan
    groups: dict[int, list[list[int]]] = {}
    for s, e in zip(bounds[:-1], bounds[1:]):
        n = e - s
        if n < 0:
            raise ValueError(f"vision attention boundaries {list(bounds)} are not increasing")
        if n == 0:
            continue
        runs = groups.setdefault(n, [])
        if runs and runs[-1][0] + runs[-1][1] * n == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    plan = [(n, runs, None if len(runs) == 1 else
             torch.cat([torch.arange(s, s + c * n) for s, c in runs]).to(cu.device)) for n, runs in groups.items()]
    if len(_PLANS) >= 256:
        _PLANS.clear()
    _PLANS[key] = plan
    return bounds, plan


def _register() -> None:
    from transformers import AttentionInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, grouped_sdpa)


def _vision_config(model: nn.Module):
    for name, module in model.named_modules():
        if name.split(".")[-1] == "visual":
            return getattr(module, "config", None)
    return None


def set_vision_attention(model: nn.Module, mode: str) -> bool:
    """``"grouped"``: the vision tower of ``model`` attends through :func:`grouped_sdpa`; ``"sdpa"``: back to
    transformers' SDPA. Only a vision tower running SDPA is switched (eager or a FlashAttention kernel is
    left as it is). Returns whether the tower now runs :func:`grouped_sdpa`."""
    if mode not in ("grouped", STOCK):
        raise ValueError(f"vision_attention must be 'grouped' or 'sdpa', got {mode!r}")
    cfg = _vision_config(model)
    if cfg is None:
        return False
    current = getattr(cfg, "_attn_implementation", None)
    if mode == "grouped" and current == STOCK:
        _register()
        cfg._attn_implementation = NAME
    elif mode == STOCK and current == NAME:
        cfg._attn_implementation = STOCK
    return getattr(cfg, "_attn_implementation", None) == NAME
