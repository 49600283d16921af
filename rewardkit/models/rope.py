"""Rotary position ids of Qwen-VL backbones, computed for a whole batch at once.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL give every token a 3-D (temporal, height, width) rotary position
("mrope"): text tokens count up by one on all three sections, the tokens of an image of ``t x h x w`` merged
patches take ``start + (t_idx, h_idx, w_idx)``, and the text after the image continues at
``start + max(h, w)``. transformers computes this in ``get_rope_index`` with a Python loop over the samples
of the batch and over the text / image runs of each sample (about a quarter of a batched forward of a small
model). :func:`mrope_position_ids` computes the same tensor with a fixed number of vectorised operations and
returns None for what it does not cover (videos, padding inside a sample, image runs that do not match
``image_grid_thw``), in which case the caller lets the model compute its own positions.

For still images the three models' ``get_rope_index`` agree (Qwen2.5-VL spaces only video frames in time;
Qwen3-VL splits only videos into frames); ``tests/models/test_rope.py`` checks equality with each model's own
``get_rope_index`` for left and right padding and several images of different sizes per sample.
"""

from __future__ import annotations

import torch

__all__ = ["mrope_position_ids", "batch_position_ids", "VERIFIED_MODEL_TYPES"]


def mrope_position_ids(mm_token_type_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       image_grid_thw: torch.Tensor, spatial_merge_size: int) -> torch.Tensor | None:
    """``[3, B, T]`` int64 multimodal rotary positions, equal to transformers' ``get_rope_index(...)[0]`` for
    still images (padding positions 0), or None when the batch holds something this does not cover.

    ``mm_token_type_ids`` ``[B, T]``: 0 text, 1 image (2, video, is not covered); ``attention_mask`` ``[B, T]``
    (None: no padding); ``image_grid_thw`` ``[N, 3]``: the images in the order their tokens appear (row by
    row), as the processor returns it; ``spatial_merge_size``: the vision config's merge size.
    """
    types = mm_token_type_ids
    if types.ndim != 2:
        return None
    if types.device.type == "cpu" and (attention_mask is None or attention_mask.device.type == "cpu") \
            and image_grid_thw.device.type == "cpu":
        return _mrope_numpy(types, attention_mask, image_grid_thw, spatial_merge_size)
    return _mrope_torch(types, attention_mask, image_grid_thw, spatial_merge_size)


def _mrope_torch(types: torch.Tensor, attention_mask: torch.Tensor | None, image_grid_thw: torch.Tensor,
                 spatial_merge_size: int) -> torch.Tensor | None:
    """:func:`mrope_position_ids` in torch operations (tensors on an accelerator)."""
    b, t = types.shape
    dev = types.device
    mask = torch.ones((b, t), dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
    img = (types == 1) & mask
    grid = image_grid_thw.to(device=dev, dtype=torch.long).reshape(-1, 3)
    # each sample's tokens must be one contiguous block (left or right padding): a run of image tokens broken
    # by padding would be one run for transformers (it drops padding first) and two here
    n_valid = mask.sum(1)
    first = mask.to(torch.int8).argmax(1)
    last = (t - 1) - mask.flip(1).to(torch.int8).argmax(1)
    prev = torch.nn.functional.pad(img[:, :-1], (1, 0), value=False)
    starts = img & ~prev  # first token of each run of image tokens
    n_runs = int(starts.sum())
    gm = grid.clone()
    gm[:, 1:] = gm[:, 1:] // spatial_merge_size  # (t, h, w) in merged patches, as the language model sees them
    sizes = gm.prod(-1)
    checks = torch.stack([((types != 0) & (types != 1) & mask).any(),
                          ((n_valid > 0) & (last - first + 1 != n_valid)).any()])
    if n_runs != grid.shape[0] or bool(checks.any()):
        return None
    if n_runs == 0:
        return None  # text only: the model's own positions (no image grid to follow)
    run = (starts.reshape(-1).cumsum(0).reshape(b, t) - 1).clamp_min(0)  # image index of each token (row major)
    if not torch.equal(torch.bincount(run[img], minlength=n_runs), sizes):
        return None
    c = mask.long().cumsum(1) - 1  # index among the sample's non-padding tokens
    adv = torch.maximum(grid[:, 1], grid[:, 2]) // spatial_merge_size  # how far the text after an image moves on
    shift = torch.zeros((b, t), dtype=torch.long, device=dev)
    shift[starts] = adv - sizes  # an image's tokens advance the text by `adv`, not by their count
    after = shift.cumsum(1)  # at a text token: the sum over the images before it
    text_pos = c + after
    # image tokens: start + (t_idx, h_idx, w_idx) of their place j in the image's t x h x w grid
    start_c = c[starts]  # per image, in run order
    base = start_c + after[starts] - (adv - sizes)
    k = run[img]
    j = c[img] - start_c[k]
    hw = gm[k, 1] * gm[k, 2]
    w = gm[k, 2]
    rel = torch.stack([j // hw, (j // w) % gm[k, 1], j % w])  # [3, n_image_tokens]
    pos = text_pos.masked_fill(~mask, 0).unsqueeze(0).repeat(3, 1, 1)
    pos[:, img] = base[k].unsqueeze(0) + rel
    return pos


def _mrope_numpy(types: torch.Tensor, attention_mask: torch.Tensor | None, image_grid_thw: torch.Tensor,
                 merge: int) -> torch.Tensor | None:
    """:func:`mrope_position_ids` for CPU tensors: the same integer steps in numpy, whose per-operation cost is
    a fraction of torch's on the small tensors of a batch's positions (about a tenth of the time; issue 41)."""
    import numpy as np

    ty = types.numpy() if types.dtype == torch.int64 else types.to(torch.int64).numpy()
    b, t = ty.shape
    mask = np.ones((b, t), dtype=bool) if attention_mask is None else attention_mask.numpy().astype(bool)
    img = (ty == 1) & mask
    grid = image_grid_thw.to(torch.int64).numpy().reshape(-1, 3)
    n_valid = mask.sum(1)
    first = mask.argmax(1)
    last = (t - 1) - mask[:, ::-1].argmax(1)
    starts = img.copy()
    starts[:, 1:] &= ~img[:, :-1]  # first token of each run of image tokens
    n_runs = int(starts.sum())
    gm = grid.copy()
    gm[:, 1:] //= merge
    sizes = gm.prod(-1)
    if n_runs != grid.shape[0] or bool(((ty != 0) & (ty != 1) & mask).any()) \
            or bool(((n_valid > 0) & (last - first + 1 != n_valid)).any()):
        return None
    if n_runs == 0:
        return None
    run = np.maximum(starts.reshape(-1).cumsum() - 1, 0).reshape(b, t)
    k = run[img]
    if not np.array_equal(np.bincount(k, minlength=n_runs), sizes):
        return None
    c = mask.cumsum(1, dtype=np.int64) - 1
    adv = np.maximum(grid[:, 1], grid[:, 2]) // merge
    shift = np.zeros((b, t), dtype=np.int64)
    shift[starts] = adv - sizes
    after = shift.cumsum(1)
    text_pos = c + after
    start_c = c[starts]
    base = start_c + after[starts] - (adv - sizes)
    j = c[img] - start_c[k]
    hw = gm[k, 1] * gm[k, 2]
    w = gm[k, 2]
    pos = np.repeat(np.where(mask, text_pos, 0)[None], 3, axis=0)
    pos[0][img] = base[k] + j // hw
    pos[1][img] = base[k] + (j // w) % gm[k, 1]
    pos[2][img] = base[k] + j % w
    return torch.from_numpy(pos)


#: model types whose ``get_rope_index`` :func:`mrope_position_ids` reproduces for still images (tests/models/test_rope.py)
VERIFIED_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl"})


def batch_position_ids(config, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       inputs: dict) -> torch.Tensor | None:
    """The ``position_ids`` a verified Qwen-VL backbone (``config``) would compute itself for this batch of
    processor ``inputs``, or None (another model type, videos, no images, ...: let the model compute them)."""
    if getattr(config, "model_type", None) not in VERIFIED_MODEL_TYPES \
            or inputs.get("pixel_values_videos") is not None or inputs.get("video_grid_thw") is not None:
        return None
    types, grid = inputs.get("mm_token_type_ids"), inputs.get("image_grid_thw")
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    if types is None or grid is None or not merge or types.shape != input_ids.shape:
        return None
    return mrope_position_ids(types, attention_mask, grid, int(merge))


_VISION_CACHE: dict = {}


def vision_layout_kwargs(vlm, inputs: dict) -> dict:
    """Precomputed layout tensors of the vision tower for this batch's ``image_grid_thw``, as the model's own
    ``image_*`` keyword arguments (transformers' ``accepts_precomputed_kwargs``): rotary position ids, attention
    boundaries and, for Qwen2.5-VL, the window order. Each is what the vision tower would compute itself with
    the same ``transformers.vision_utils`` function (a Python loop over the images); they are cached per grid,
    so repeated batches of the same image sizes skip the work. Empty for other models or older transformers."""
    config = vlm.config
    model_type = getattr(config, "model_type", None)
    grid = inputs.get("image_grid_thw")
    if model_type not in VERIFIED_MODEL_TYPES or grid is None or inputs.get("pixel_values") is None:
        return {}
    try:
        from transformers import vision_utils as vu
        from transformers.utils.generic import accepts_precomputed_kwargs  # noqa: F401  (the feature we use)
    except ImportError:  # pragma: no cover - transformers without precomputed vision kwargs
        return {}
    vc = config.vision_config
    merge = int(vc.spatial_merge_size)
    window = int(getattr(vc, "window_size", 0) or 0) if model_type == "qwen2_5_vl" else 0
    patch = int(vc.patch_size)
    key = (model_type, merge, window, patch, str(grid.device), tuple(grid.reshape(-1).tolist()))
    hit = _VISION_CACHE.get(key)
    if hit is None:
        # normal tensors even under inference_mode: a cached one may later index a forward that trains
        with torch.inference_mode(False):
            g = grid.clone()
            cu = vu.get_vision_cu_seqlens(g)
            # the longest chunk: read only by a FlashAttention-style vision attention (rewardkit's grouped SDPA
            # included), which would otherwise compute it on every forward
            hit = {"image_position_ids": vu.get_vision_position_ids(g, merge), "image_cu_seqlens": cu,
                   "image_max_seqlen": int((cu[1:] - cu[:-1]).max())}
            if model_type == "qwen2_5_vl":
                index, cu_window = vu.get_vision_window_index(g, merge, window, patch)
                hit.update(image_window_index=index, image_cu_window_seqlens=cu_window,
                           image_max_window_seqlen=int((cu_window[1:] - cu_window[:-1]).max()))
        if len(_VISION_CACHE) >= 64:
            _VISION_CACHE.clear()
        _VISION_CACHE[key] = hit
    return dict(hit)
