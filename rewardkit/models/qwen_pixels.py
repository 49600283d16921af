"""Qwen-VL ``pixel_values`` for decoded PIL images, batched in torch and equal to the PIL image processor's.

transformers' ``Qwen2VLImageProcessorPil`` handles one image at a time: numpy array -> PIL image -> resize
-> numpy -> rescale in float64 -> float32 -> normalise -> patchify. :func:`pil_pixel_values` keeps the only
step that needs PIL, the resize (the same ``Image.resize`` call, skipped when the size does not change, as PIL
itself skips it), and does the rest for all images of one size at once: the rescale and normalisation of
8-bit values through a 256-entry table per channel computed with the processor's own float operations
(so every value is the processor's, bit for bit), then the patch layout as one reshape / permute.

Unlike :func:`rewardkit.preprocess.qwen_pixel_values` (float tensors, resized in torch, within a tolerance)
this path is exact; ``InputEncoder`` still checks its first batch against the processor.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["pil_pixel_values", "rescale_normalize_table"]


def rescale_normalize_table(scale: float, mean: Sequence[float] | None, std: Sequence[float] | None) -> torch.Tensor:
    """``[3, 256]`` float32: what the PIL processor makes of each 8-bit value of each channel.

    transformers' ``rescale`` multiplies in float64 and casts to float32; ``normalize`` subtracts the float32
    mean and divides by the float32 std in float32 (``image_transforms.rescale`` / ``normalize``)."""
    v = torch.from_numpy((np.arange(256, dtype=np.float64) * scale).astype(np.float32))
    table = v.unsqueeze(0).expand(3, 256).clone()
    if mean is not None:
        m = torch.from_numpy(np.asarray(mean, dtype=np.float32)).view(3, 1)
        s = torch.from_numpy(np.asarray(std, dtype=np.float32)).view(3, 1)
        table = (table - m) / s
    return table


def pil_pixel_values(images: Sequence[Any], image_processor: Any) -> dict[str, torch.Tensor] | None:
    """``{"pixel_values": [sum of patches, C*T*p*p] float32, "image_grid_thw": [N, 3] int64}`` for RGB PIL
    ``images`` as ``image_processor`` (a Qwen-VL PIL image processor) computes them, or None when its
    settings are outside what this reproduces (the caller then runs the processor)."""
    from PIL import Image

    from ..preprocess import qwen_params, smart_resize

    if type(image_processor).__name__ not in ("Qwen2VLImageProcessorPil",) or not images:
        return None
    p = qwen_params(image_processor)
    if p is None or getattr(image_processor, "do_convert_rgb", True) is False:
        return None
    resample = getattr(image_processor, "resample", None)
    if resample is None or int(resample) not in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC):
        return None
    if not all(isinstance(im, Image.Image) and im.mode == "RGB" for im in images):
        return None
    scale = float(getattr(image_processor, "rescale_factor", 1 / 255))
    table = rescale_normalize_table(scale, p.mean, p.std)
    arrays, shapes = [], []
    for im in images:
        w, h = im.size
        hh, ww = smart_resize(h, w, p.factor, p.min_pixels, p.max_pixels)
        if (hh, ww) != (h, w):
            im = im.resize((ww, hh), resample=int(resample))
        arrays.append(np.asarray(im))
        shapes.append((hh, ww))
    ps, m, t = p.patch_size, p.merge_size, p.temporal_patch_size
    chunks: list[torch.Tensor | None] = [None] * len(images)
    flat_table = table.reshape(-1).numpy()
    offsets = np.array([0, 256, 512], dtype=np.int16)
    for hw in dict.fromkeys(shapes):  # each distinct size once, in first-seen order
        idx = [i for i, s in enumerate(shapes) if s == hw]
        # rescale + normalise, exactly as the processor: one table look-up per value ([n, H, W, 3] -> [n, 3, H, W])
        x = torch.from_numpy(np.take(flat_table, np.stack([arrays[i] for i in idx]).astype(np.int16) + offsets))
        x = x.permute(0, 3, 1, 2)
        n, c = len(idx), 3
        gh, gw = hw[0] // ps, hw[1] // ps
        patches = x.reshape(n, c, gh // m, m, ps, gw // m, m, ps).permute(0, 2, 5, 3, 6, 1, 4, 7)
        patches = patches.unsqueeze(6).expand(*patches.shape[:6], t, ps, ps)
        flat = patches.reshape(n, gh * gw, c * t * ps * ps)
        for j, i in enumerate(idx):
            chunks[i] = flat[j]
    pixel_values = torch.cat(chunks) if len(chunks) > 1 else chunks[0].contiguous()
    grid = torch.tensor([[1, h // ps, w // ps] for h, w in shapes], dtype=torch.long)
    return {"pixel_values": pixel_values, "image_grid_thw": grid}
