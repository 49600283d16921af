"""``pixel_values`` for decoded PIL images, batched and equal to the PIL image processors', bit for bit.

transformers' PIL image processors (``Qwen2VLImageProcessorPil``, ``CLIPImageProcessorPil``) handle one image
at a time: numpy array -> PIL image -> resize -> numpy -> (center crop) -> rescale in float64 -> float32 ->
normalise (-> Qwen: patchify). Here the only step that needs PIL, the resize, is kept (the same
``Image.resize`` call, skipped when the size does not change, as PIL itself skips it; the images of a batch
are resized side by side on :mod:`rewardkit._threads`' pool, PIL releasing the GIL), and the rest runs for
all images of one size at once: the rescale and normalisation of 8-bit values through a 256-entry table per
channel computed with the processor's own float operations (so every value is the processor's, bit for bit),
then the crop (CLIP) as slicing. Qwen: the patch layout is made while the values are still 8-bit (one
transpose of bytes), then one table look-up in that layout and one block copy, which repeats the frame
``temporal_patch_size`` times, into the single output array (no array per image, no concatenation).

:func:`pil_pixel_values` is the Qwen-VL form, :func:`clip_pil_pixel_values` the CLIP form.

Unlike :func:`rewardkit.preprocess.qwen_pixel_values` (float tensors, resized in torch, within a tolerance)
this path is exact; ``InputEncoder`` still checks its first batch against the processor.
"""

from __future__ import annotations

from typing import Any, Sequence

import functools

import numpy as np
import torch

from .._threads import map_images

__all__ = ["pil_pixel_values", "clip_pil_pixel_values", "rescale_normalize_table"]


def rescale_normalize_table(scale: float, mean: Sequence[float] | None, std: Sequence[float] | None) -> torch.Tensor:
    """``[3, 256]`` float32: what the PIL processor makes of each 8-bit value of each channel.

    transformers' ``rescale`` multiplies in float64 and casts to float32; ``normalize`` subtracts the float32
    mean and divides by the float32 std in float32 (``image_transforms.rescale`` / ``normalize``)."""
    return _table(float(scale), None if mean is None else tuple(mean), None if std is None else tuple(std)).clone()


@functools.lru_cache(maxsize=16)
def _table(scale: float, mean: tuple | None, std: tuple | None) -> torch.Tensor:
    v = torch.from_numpy((np.arange(256, dtype=np.float64) * scale).astype(np.float32))
    table = v.unsqueeze(0).expand(3, 256).clone()
    if mean is not None:
        m = torch.from_numpy(np.asarray(mean, dtype=np.float32)).view(3, 1)
        s = torch.from_numpy(np.asarray(std, dtype=np.float32)).view(3, 1)
        table = (table - m) / s
    return table


def _usable_table(images: Sequence[Any], image_processor: Any, params: Any) -> torch.Tensor | None:
    """The rescale/normalise table (cached; read only) when this path reproduces ``image_processor`` on
    ``images`` (parsed ``params``, RGB conversion on, bilinear or bicubic resize, RGB PIL images), else None."""
    from PIL import Image

    if params is None or getattr(image_processor, "do_convert_rgb", True) is False:
        return None
    resample = getattr(image_processor, "resample", None)
    if resample is None or int(resample) not in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC):
        return None
    if not all(isinstance(im, Image.Image) and im.mode == "RGB" for im in images):
        return None
    return _table(float(getattr(image_processor, "rescale_factor", 1 / 255)), params.mean, params.std)


def _resized(images: list[Any], sizes: list[tuple[int, int]], resample: int) -> list[Any]:
    """``images`` resized to their ``(height, width)`` in ``sizes`` with PIL's ``resize`` (the processor's own
    call; skipped where the size does not change), the resizes side by side on the pre-processing pool (PIL
    releases the GIL)."""
    out = list(images)
    todo = [i for i, im in enumerate(images) if sizes[i] != (im.height, im.width)]

    def resize(i: int) -> Any:
        hh, ww = sizes[i]
        return images[i].resize((ww, hh), resample=resample)

    for i, im in zip(todo, map_images(resize, todo)):
        out[i] = im
    return out


def pil_pixel_values(images: Sequence[Any], image_processor: Any) -> dict[str, torch.Tensor] | None:
    """``{"pixel_values": [sum of patches, C*T*p*p] float32, "image_grid_thw": [N, 3] int64}`` for RGB PIL
    ``images`` as ``image_processor`` (a Qwen-VL PIL image processor) computes them, or None when its
    settings are outside what this reproduces (the caller then runs the processor)."""
    from ..preprocess import qwen_params, smart_resize

    images = list(images)
    if type(image_processor).__name__ != "Qwen2VLImageProcessorPil" or not images:
        return None
    p = qwen_params(image_processor)
    table = _usable_table(images, image_processor, p)
    if table is None:
        return None
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    shapes = []
    for im in images:
        w, h = im.size
        if (h, w) not in sizes:
            sizes[(h, w)] = smart_resize(h, w, p.factor, p.min_pixels, p.max_pixels)
        shapes.append(sizes[(h, w)])
    resized = _resized(images, shapes, int(image_processor.resample))
    ps, m, t = p.patch_size, p.merge_size, p.temporal_patch_size
    counts = [(hh // ps) * (ww // ps) for hh, ww in shapes]
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    # one output array, each image's patches written straight into its rows (no per-image tensors, no cat)
    out = np.empty((starts[-1], 3 * t * ps * ps), dtype=np.float32)
    flat_table = table.reshape(-1).numpy()
    for hw in dict.fromkeys(shapes):  # each distinct size once, in first-seen order
        idx = [i for i, s in enumerate(shapes) if s == hw]
        n, (hh, ww) = len(idx), hw
        gh, gw = hh // ps, ww // ps
        # the 8-bit RGB values of the n images (what np.asarray gives, without an array per image), moved into
        # the patch layout while still 8-bit: [n, bh, bw, mh, mw, c, ph, pw] (merge-block order, channel, row,
        # column), i.e. one row of c * ph * pw values per patch
        u8 = np.frombuffer(b"".join(resized[i].tobytes() for i in idx), dtype=np.uint8)
        u8 = np.ascontiguousarray(u8.reshape(n, gh // m, m, ps, gw // m, m, ps, 3).transpose(0, 1, 4, 2, 5, 7, 3, 6))
        # rescale + normalise, exactly as the processor: one table look-up per value (channel c's at c * 256)
        offsets = np.tile(np.repeat(_CHANNEL_OFFSETS, ps * ps), gh * gw)  # one image's, for every image
        x = np.take(flat_table, u8.reshape(n, -1) + offsets).reshape(n, gh * gw, 3, 1, ps * ps)
        # the frame repeated `t` times per patch, as the processor repeats a still image: [.., c, t, ph * pw]
        if idx == list(range(idx[0], idx[0] + n)):  # consecutive images (e.g. all of one size): one copy
            out[starts[idx[0]]:starts[idx[0] + n]].reshape(n, gh * gw, 3, t, ps * ps)[...] = x
        else:
            for j, i in enumerate(idx):
                out[starts[i]:starts[i + 1]].reshape(gh * gw, 3, t, ps * ps)[...] = x[j]
    pixel_values = torch.from_numpy(out)
    grid = torch.tensor([[1, h // ps, w // ps] for h, w in shapes], dtype=torch.long)
    return {"pixel_values": pixel_values, "image_grid_thw": grid}


_CHANNEL_OFFSETS = np.array([0, 256, 512], dtype=np.int16)  # row of each channel in the flattened [3, 256] table


def _table_lookup(arrays: list[np.ndarray], table: torch.Tensor) -> torch.Tensor:
    """``n`` uint8 ``[H, W, 3]`` arrays of one size -> float32 ``[n, 3, H, W]`` through the per-channel table."""
    h, w = arrays[0].shape[:2]
    idx = np.stack(arrays).reshape(len(arrays), h * w * 3) + np.tile(_CHANNEL_OFFSETS, h * w)
    x = np.take(table.reshape(-1).numpy(), idx).reshape(len(arrays), h, w, 3)
    return torch.from_numpy(x).permute(0, 3, 1, 2)


def clip_pil_pixel_values(images: Sequence[Any], image_processor: Any) -> torch.Tensor | None:
    """``[B, 3, crop_h, crop_w]`` float32 ``pixel_values`` for RGB PIL ``images`` as a CLIP PIL image
    processor (``CLIPImageProcessorPil``: resize the shortest edge, center crop, rescale, normalise) computes
    them, or None when its settings are outside what this reproduces (the caller then runs the processor)."""
    from ..preprocess import clip_params, clip_resize_shape

    images = list(images)
    if type(image_processor).__name__ != "CLIPImageProcessorPil" or not images:
        return None
    p = clip_params(image_processor)
    table = _usable_table(images, image_processor, p)
    if table is None:
        return None
    targets = []
    for im in images:
        w, h = im.size
        if p.shortest_edge is not None:
            hh, ww = clip_resize_shape(h, w, p.shortest_edge)
        elif p.size_hw is not None:
            hh, ww = p.size_hw
        else:
            hh, ww = h, w
        if p.crop_hw is not None and (hh < p.crop_hw[0] or ww < p.crop_hw[1]):
            return None  # the processor pads first: not reproduced here
        targets.append((hh, ww))
    resized = _resized(images, targets, int(image_processor.resample))
    arrays = []
    for (hh, ww), im in zip(targets, resized):
        a = np.asarray(im)
        if p.crop_hw is not None:
            ch, cw = p.crop_hw
            top, left = (hh - ch) // 2, (ww - cw) // 2
            a = a[top:top + ch, left:left + cw]
        arrays.append(a)
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        return None  # no crop and different sizes: the processor could not stack them either
    return _table_lookup(arrays, table).contiguous()
