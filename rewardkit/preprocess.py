"""On-device image pre-processing in torch: the tensor fast path and the gradient path (issue 12).

An RL trainer hands a reward a float tensor ``[B, 3, H, W]`` in [0, 1] that already lives on the GPU. The
processor path copies it to the host, rounds it to 8-bit PIL images and runs the Hugging Face image processor
image by image. The functions here do the same steps in torch, on the tensor's device, for the whole batch at
once, and keep autograd to the pixels:

- :func:`clip_pixel_values`: CLIP-family processors (resize the shortest edge, center crop, normalise);
- :func:`qwen_pixel_values`: Qwen-VL processors (``smart_resize`` to a multiple of ``patch * merge`` inside
  ``[min_pixels, max_pixels]``, normalise, patchify into ``[B * gh * gw, C * T * p * p]`` with ``grid_thw``).

Each takes the processor's parameters as a small frozen dataclass (:func:`clip_params`, :func:`qwen_params`
read them from a transformers image processor and return None for settings the torch path does not
reproduce, in which case rewards stay on the processor path). They are pure functions, reusable by any
CLIP- or Qwen-VL-based reward.

Fidelity: PIL resamples 8-bit images and rounds the result; here resampling runs in fp32 with torch's
antialiased bicubic / bilinear kernels (the same kernels as PIL, ``a = -0.5`` cubic) and is only clamped to
[0, 1]. Pixel values after normalisation differ from the processor's by about 1/255 per pixel of the
[0, 1] range; ``tests/contract/test_tensor_path.py`` bounds the resulting score difference.

The module also holds the plumbing the base class delegates to for float-tensor batches:
:func:`check_pixels` (one vectorised range / NaN check on the device), :func:`tensor_call` (the
``reward(tensor, prompt)`` path) and :func:`score_tensor` (``reward.score_tensor``: gradients to pixels), which
take the reward as a :class:`TensorReward` (the members of :class:`~rewardkit.reward.Reward` they use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Protocol

import torch

if TYPE_CHECKING:  # pragma: no cover
    from ._reward_inputs import RewardBatch
    from ._reward_outputs import RewardOutput

__all__ = [
    "CLIPPreprocess", "QwenPreprocess", "clip_params", "qwen_params", "clip_pixel_values", "qwen_pixel_values",
    "clip_resize_shape", "smart_resize", "resize", "check_pixels", "pixel_stats", "is_float_batch", "tensor_call",
    "score_tensor", "TensorReward",
]

# PIL resampling codes -> torch interpolate modes the torch path reproduces (antialiased, like PIL).
_RESAMPLE = {2: "bilinear", 3: "bicubic"}
_TOL = 1e-3  # as rewardkit.media: floats this far outside [0, 1] are clipped, not refused


# ---------------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class CLIPPreprocess:
    """What a CLIP image processor does, as plain values.

    ``shortest_edge``: resize so the short side has this length (aspect kept), or None with ``size_hw`` set
    to resize to a fixed ``(h, w)``; ``crop_hw``: center crop (None: no crop); ``mean`` / ``std``: per-channel
    normalisation of [0, 1] values (None: none); ``mode``: torch interpolate mode.
    """

    shortest_edge: int | None
    size_hw: tuple[int, int] | None
    crop_hw: tuple[int, int] | None
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    mode: str = "bicubic"


@dataclass(frozen=True)
class QwenPreprocess:
    """What a Qwen-VL (Qwen2-VL / Qwen2.5-VL / Qwen3-VL) image processor does, as plain values."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float] | None
    std: tuple[float, float, float] | None
    mode: str = "bicubic"

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def _get(ip: Any, name: str, default: Any = None) -> Any:
    return getattr(ip, name, default)


def _size_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    if hasattr(value, "keys"):  # transformers SizeDict
        return {k: value[k] for k in value.keys() if value[k] is not None}
    return {k: getattr(value, k) for k in ("shortest_edge", "longest_edge", "height", "width")
            if getattr(value, k, None) is not None}


def _channels(v: Any) -> tuple[float, float, float] | None:
    if v is None:
        return None
    vals = [float(v)] * 3 if isinstance(v, (int, float)) else [float(x) for x in v]
    return tuple(vals) if len(vals) == 3 else None


def _common(ip: Any) -> tuple[str, tuple | None, tuple | None] | None:
    """Resample mode, mean, std shared by both processor kinds; None when the torch path cannot follow."""
    resample = _get(ip, "resample", 3)
    mode = _RESAMPLE.get(int(resample) if resample is not None else 2)  # PIL backend default: bilinear
    if mode is None:
        return None
    if _get(ip, "do_rescale", True):
        if abs(float(_get(ip, "rescale_factor", 1 / 255)) - 1 / 255) > 1e-12:
            return None
    else:  # the processor would feed 0..255 values to the model: not a setting we reproduce
        return None
    if _get(ip, "do_pad", False):
        return None
    mean = std = None
    if _get(ip, "do_normalize", True):
        mean, std = _channels(_get(ip, "image_mean")), _channels(_get(ip, "image_std"))
        if mean is None or std is None or min(std) <= 0:
            return None
    return mode, mean, std


def clip_params(image_processor: Any) -> CLIPPreprocess | None:
    """Read a CLIP-style image processor (``CLIPImageProcessor[Pil]`` and alike); None if unsupported."""
    common = _common(image_processor)
    if common is None:
        return None
    mode, mean, std = common
    shortest = size_hw = crop = None
    if _get(image_processor, "do_resize", True):
        size = _size_dict(_get(image_processor, "size"))
        if "shortest_edge" in size and "longest_edge" not in size:
            shortest = int(size["shortest_edge"])
        elif "height" in size and "width" in size:
            size_hw = (int(size["height"]), int(size["width"]))
        else:
            return None
    if _get(image_processor, "do_center_crop", False):
        cs = _size_dict(_get(image_processor, "crop_size"))
        if "height" not in cs or "width" not in cs:
            return None
        crop = (int(cs["height"]), int(cs["width"]))
    return CLIPPreprocess(shortest_edge=shortest, size_hw=size_hw, crop_hw=crop, mean=mean, std=std, mode=mode)


def qwen_params(image_processor: Any) -> QwenPreprocess | None:
    """Read a Qwen-VL image processor (``Qwen2VLImageProcessor[Pil]``); None if unsupported."""
    ip = image_processor
    patch, merge, temporal = _get(ip, "patch_size"), _get(ip, "merge_size"), _get(ip, "temporal_patch_size")
    if not (patch and merge and temporal) or not _get(ip, "do_resize", True):
        return None
    size = _size_dict(_get(ip, "size"))
    lo = size.get("shortest_edge", _get(ip, "min_pixels"))
    hi = size.get("longest_edge", _get(ip, "max_pixels"))
    if lo is None or hi is None:
        return None
    common = _common(ip)
    if common is None:
        return None
    mode, mean, std = common
    return QwenPreprocess(patch_size=int(patch), merge_size=int(merge), temporal_patch_size=int(temporal),
                          min_pixels=int(lo), max_pixels=int(hi), mean=mean, std=std, mode=mode)


# ---------------------------------------------------------------------------------------------- geometry
def clip_resize_shape(h: int, w: int, shortest_edge: int) -> tuple[int, int]:
    """``(h, w)`` after resizing the short side to ``shortest_edge``; the long side is truncated to an int
    (the convention of transformers' ``get_resize_output_image_size`` with ``default_to_square=False``)."""
    if w <= h:
        return int(shortest_edge * h / w), shortest_edge
    return shortest_edge, int(shortest_edge * w / h)


def smart_resize(h: int, w: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's target size: both sides multiples of ``factor``, area within ``[min_pixels, max_pixels]``,
    aspect ratio kept as closely as possible (sides rounded to the nearest multiple, then scaled down with
    floor or up with ceil when the area is out of bounds). Raises ValueError for aspect ratios over 200."""
    if max(h, w) / min(h, w) > 200:
        raise ValueError(f"aspect ratio {max(h, w) / min(h, w):.1f} is over Qwen-VL's limit of 200")
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb = math.ceil(h * beta / factor) * factor
        wb = math.ceil(w * beta / factor) * factor
    return hb, wb


def resize(x: torch.Tensor, hw: tuple[int, int], mode: str = "bicubic") -> torch.Tensor:
    """``x`` ``[B, C, H, W]`` float in [0, 1] -> ``[B, C, h, w]`` in [0, 1] (antialiased, PIL's kernels)."""
    h, w = int(x.shape[-2]), int(x.shape[-1])
    # Two separable passes, horizontal first, each saturated to [0, 1]: PIL clips its 8-bit intermediate
    # image between the passes, which matters where cubic overshoot meets high-contrast detail (max per-pixel
    # difference on noise images 0.09 with one joint pass, 0.006 this way).
    if w != hw[1]:
        x = _saturate(torch.nn.functional.interpolate(x, size=(h, hw[1]), mode=mode, align_corners=False,
                                                      antialias=True))
    if h != hw[0]:
        x = _saturate(torch.nn.functional.interpolate(x, size=(hw[0], hw[1]), mode=mode, align_corners=False,
                                                      antialias=True))
    return x  # same size: unchanged, as PIL


def _saturate(y: torch.Tensor) -> torch.Tensor:
    return y.clamp(0.0, 1.0) if y.requires_grad else y.clamp_(0.0, 1.0)  # in place when no graph needs y


def _center_crop(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Center crop ``[B, C, H, W]`` to ``hw``; a side shorter than the crop is zero-padded first (as the
    processor does: top / left offsets ``(H - h) // 2``, padding split with the larger half after)."""
    ch, cw = hw
    h, w = x.shape[-2:]
    if h < ch or w < cw:
        ph, pw = max(ch - h, 0), max(cw - w, 0)
        top, left = math.ceil(ph / 2), math.ceil(pw / 2)
        x = torch.nn.functional.pad(x, (left, pw - left, top, ph - top))
        h, w = x.shape[-2:]
    top, left = (h - ch) // 2, (w - cw) // 2
    return x[..., top:top + ch, left:left + cw]


def _normalise(x: torch.Tensor, mean: tuple | None, std: tuple | None) -> torch.Tensor:
    if mean is None:
        return x
    scale = torch.tensor([1.0 / v for v in std], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    shift = torch.tensor([-m / v for m, v in zip(mean, std)], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return torch.addcmul(shift, x, scale)  # (x - mean) / std in one pass


# ---------------------------------------------------------------------------------------------- pipelines
def clip_pixel_values(x: torch.Tensor, p: CLIPPreprocess) -> torch.Tensor:
    """``x`` ``[B, 3, H, W]`` float in [0, 1] (any float dtype, any device) -> fp32 ``pixel_values``
    ``[B, 3, crop_h, crop_w]`` on the same device, as the CLIP processor computes them."""
    x = x.float()
    if p.shortest_edge is not None:
        x = resize(x, clip_resize_shape(int(x.shape[-2]), int(x.shape[-1]), p.shortest_edge), p.mode)
    elif p.size_hw is not None:
        x = resize(x, p.size_hw, p.mode)
    if p.crop_hw is not None:
        x = _center_crop(x, p.crop_hw)
    return _normalise(x, p.mean, p.std)


def qwen_pixel_values(x: torch.Tensor, p: QwenPreprocess) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[B, 3, H, W]`` float in [0, 1] -> (fp32 ``pixel_values`` ``[B * gh * gw, 3 * T * ps * ps]`` on
    ``x``'s device, int64 ``image_grid_thw`` ``[B, 3]`` on the CPU), as the Qwen-VL processor computes them
    for B single images (each frame repeated ``T = temporal_patch_size`` times)."""
    b, c = int(x.shape[0]), int(x.shape[1])
    h, w = smart_resize(int(x.shape[-2]), int(x.shape[-1]), p.factor, p.min_pixels, p.max_pixels)
    x = _normalise(resize(x.float(), (h, w), p.mode), p.mean, p.std)
    ps, m, t = p.patch_size, p.merge_size, p.temporal_patch_size
    gh, gw = h // ps, w // ps
    # [B, C, gh/m, m, ps, gw/m, m, ps] -> [B, gh/m, gw/m, m, m, C, ps, ps]: merge groups stay contiguous
    patches = x.reshape(b, c, gh // m, m, ps, gw // m, m, ps).permute(0, 2, 5, 3, 6, 1, 4, 7)
    patches = patches.unsqueeze(6).expand(*patches.shape[:6], t, ps, ps)  # repeat the frame in time
    pixel_values = patches.reshape(b * gh * gw, c * t * ps * ps)
    grid = torch.tensor([[1, gh, gw]] * b, dtype=torch.long)
    return pixel_values, grid


# ---------------------------------------------------------------------------------------------- validation
def is_float_batch(x: Any) -> bool:
    """True for a dense floating-point torch tensor ``[B, 3, H, W]`` (what the tensor path takes)."""
    return (isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.ndim == 4 and x.shape[1] == 3
            and x.layout == torch.strided and x.device.type != "meta")


def _computable(x: torch.Tensor) -> torch.Tensor:
    """``x`` in a float dtype torch computes with: the 1-byte float8 formats (no min / max, resize or
    normalisation kernels) are widened to float32, exactly (every float8 value is a float32 value); other
    dtypes are returned as they are (no copy)."""
    return x.float() if x.element_size() == 1 else x


def range_reason(lo: float, hi: float) -> str:
    """The message ``rewardkit.media`` gives for float pixels outside [0, 1] (with the same hints)."""
    hint = " (looks like [-1, 1]: pass (x + 1) / 2)" if -1.0 - _TOL <= lo < 0 else ""
    hint = hint or (" (looks like [0, 255]: pass uint8 or x / 255)" if hi <= 255.0 + _TOL else "")
    return f"float image values must lie in [0, 1], got [{lo:.4g}, {hi:.4g}]{hint}"


def pixel_stats(x: torch.Tensor) -> list[tuple[bool, float, float]]:
    """Per sample of ``x`` ``[B, ...]``: (all finite, min, max), computed on ``x``'s device in one vectorised
    pass and brought to the host as one ``[B, 3]`` transfer."""
    if x.shape[0] == 0:
        return []
    with torch.no_grad():
        # min / max propagate NaN and show +-Inf, so one aminmax pass is also the finiteness check
        rows = x.detach().reshape(x.shape[0], -1)
        if rows.device.type == "cpu":
            # on CPU a whole-tensor aminmax per row is vectorised; the same reduction along dim=1 is not (14 vs
            # 1.0 ms for 8 x 3 x 512 x 512 fp32 on one thread, issue 41): the values are the same (min / max)
            stats = torch.stack([torch.stack(torch.aminmax(r)) for r in rows]).float().tolist()
        else:
            lo, hi = torch.aminmax(rows, dim=1)
            stats = torch.stack([lo, hi], 1).float().cpu().tolist()
    return [(math.isfinite(a) and math.isfinite(b), a, b) for a, b in stats]


def _reasons(stats: list[tuple[bool, float, float]]) -> list[str | None]:
    out: list[str | None] = []
    for ok, lo, hi in stats:
        if not ok:
            out.append("image array contains NaN or Inf")
        elif lo < -_TOL or hi > 1.0 + _TOL:
            out.append(range_reason(lo, hi))
        else:
            out.append(None)
    return out


def check_pixels(x: torch.Tensor) -> list[str | None]:
    """One vectorised check of ``x`` ``[B, C, H, W]`` on its device: per sample, None or the reason it is
    refused (NaN / Inf, values outside [0, 1] beyond a 1e-3 tolerance). One ``[B, 3]`` transfer to the host."""
    return _reasons(pixel_stats(x))


def _validate(images: torch.Tensor, reward: Any = None) -> tuple[list[str | None], bool]:
    """(per-sample reasons, whether accepted values stray outside [0, 1] within the tolerance: clamp them)."""
    n = int(images.shape[0])
    size_err = _size_reason(int(images.shape[-2]), int(images.shape[-1]), reward) if n else None
    if size_err is not None:
        return [size_err] * n, False
    stats = pixel_stats(images)
    reasons = _reasons(stats)
    clamp = any(r is None and (lo < 0.0 or hi > 1.0) for r, (_, lo, hi) in zip(reasons, stats))
    return reasons, clamp


# ---------------------------------------------------------------------------------------------- plumbing
class TensorReward(Protocol):
    """What :func:`tensor_call` and :func:`score_tensor` use of a reward; :class:`rewardkit.reward.Reward`
    implements it. Named here so that this module needs nothing of ``rewardkit.reward``, which imports it."""

    name: str
    differentiable: bool
    thread_safe: bool
    default_batch_size: int | None
    dimensions: tuple[str, ...]
    _lock: Any

    @property
    def supports_score_tensor(self) -> bool: ...
    def _prompts(self, prompt: Any, n: int) -> list[Any]: ...
    def _metadata_entries(self, metadata: Any, n: int) -> tuple[list[dict[str, Any]], list[str | None]]: ...
    def _check_prompt(self, p: Any) -> str | None: ...
    def _check_sample_metadata(self, meta: dict[str, Any], sources: Any) -> str | None: ...
    def _check_resized_size(self, w: int, h: int) -> None: ...
    def _call_scope(self) -> ContextManager[Any]: ...
    def _run(self, sub: RewardBatch) -> RewardOutput: ...
    def _score(self, batch: RewardBatch) -> RewardOutput: ...


def _size_reason(h: int, w: int, reward: Any = None) -> str | None:
    """The PIL path's size checks for a ``[.., H, W]`` batch: pixel limit, aspect ratio and, with ``reward``,
    the size after each of its image processors' resize (the same rules as ``Reward._check_image_size``)."""
    from . import media

    try:
        media._check_size(w, h)
        if reward is not None:  # the reward's own resize rules, overrides included (HPSv2: a side that rounds to 0)
            reward._check_resized_size(w, h)
    except media._Bad as exc:
        return str(exc)
    return None


def tensor_call(reward: TensorReward, images: torch.Tensor, prompt: Any, *, metadata: Any, batch_size: int | None,
                on_error: str, progress: bool) -> "RewardOutput":
    """``reward(images, prompt)`` for a float ``[B, 3, H, W]`` tensor: validated on its device, chunks handed to
    ``reward._score`` as ``RewardBatch(images=<tensor chunk>)``; nothing is converted to PIL or copied to the
    host. Same errors, chunking, locking and output as the processor path."""
    from .errors import RewardInputError
    from ._reward_inputs import RewardBatch
    from ._reward_outputs import RewardOutput, scatter

    images = _computable(images.detach())  # __call__ never builds a graph (gradients: score_tensor)
    n = int(images.shape[0])
    prompts = reward._prompts(prompt, n)
    # a metadata entry that is not a dict is that sample's error, as on the PIL path
    metas, meta_errors = reward._metadata_entries(metadata, n)
    pix_err, clamp = _validate(images, reward)
    errors: list[str | None] = []
    for i in range(n):
        err = meta_errors[i] or reward._check_prompt(prompts[i]) or pix_err[i] \
            or reward._check_sample_metadata(metas[i], None)
        if err is not None and on_error == "raise":
            raise RewardInputError(err, index=i)
        errors.append(err)
    ok = [i for i in range(n) if errors[i] is None]
    chunk = batch_size or reward.default_batch_size or max(len(ok), 1)
    starts = range(0, len(ok), chunk)
    if progress and len(starts) > 1:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"{reward.name or type(reward).__name__}", unit="batch", delay=1.0)
    contiguous = len(ok) == n
    parts = []
    with reward._call_scope():
        for s in starts:
            sel = ok[s:s + chunk]
            # a slice is a view (no copy); only a batch with refused samples gathers the good ones
            pix = images[s:s + chunk] if contiguous else images[torch.tensor(sel, device=images.device)]
            pix = pix.clamp(0.0, 1.0) if clamp else pix  # (a copy: only when some value strays, within 1e-3)
            parts.append(reward._run(RewardBatch(images=pix, prompts=[prompts[i] for i in sel],
                                                 metadata=[metas[i] for i in sel], indices=sel)))
    scored = RewardOutput.concat(parts) if parts else RewardOutput(scores=torch.zeros(0))
    return scatter(scored, ok, errors, n, reward.dimensions)


def score_tensor(reward: TensorReward, images: torch.Tensor, prompt: Any, *, batch_size: int | None = None) -> torch.Tensor:
    """Scores ``[B]`` (fp32, on ``images.device``) with autograd to ``images``; see ``Reward.score_tensor``."""
    from .errors import RewardInputError
    from ._reward_inputs import RewardBatch
    from ._reward_outputs import RewardOutput

    if not reward.differentiable:
        raise TypeError(f"reward {reward.name!r} is not differentiable (reward.differentiable is False); "
                        "rewards with gradients to pixels: the `grad` column of `rewardkit ls` (clipscore, "
                        "pickscore, preference, hpsv2, hpsv3, aesthetic, imagereward)")
    if not is_float_batch(images):
        what = f"{type(images).__name__}" + (f" {images.dtype} {tuple(images.shape)}" if isinstance(images, torch.Tensor) else "")
        raise RewardInputError(f"score_tensor takes a float tensor [B, 3, H, W] in [0, 1], got {what}")
    if not reward.supports_score_tensor:
        raise RewardInputError(f"reward {reward.name!r}: its image processor has settings the torch "
                               "pre-processing does not reproduce, so it cannot give gradients to pixels")
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    images = _computable(images)
    n = int(images.shape[0])
    prompts = reward._prompts(prompt, n)
    pix_err, clamp = _validate(images, reward)
    for i in range(n):
        err = reward._check_prompt(prompts[i]) or pix_err[i]
        if err is not None:  # a NaN score would poison a loss: refuse loudly instead
            raise RewardInputError(err, index=i)
    if n == 0:
        return torch.zeros(0, device=images.device)
    chunk = batch_size or n
    lock = reward._lock if not reward.thread_safe else None
    # autograd on for everything that touches the pixels: the slice, the clamp, the model and the final cat (any
    # of them under an outer no_grad would cut the graph)
    with torch.enable_grad():
        outs = []
        for s in range(0, n, chunk):
            pix = images[s:s + chunk]
            batch = RewardBatch(images=pix.clamp(0.0, 1.0) if clamp else pix, prompts=prompts[s:s + chunk])
            if lock is not None:
                with lock:
                    out = reward._score(batch)
            else:
                out = reward._score(batch)
            if not isinstance(out, RewardOutput) or len(out) != len(batch):
                raise RuntimeError(f"{type(reward).__name__}._score returned a bad output for score_tensor")
            bad = [i for i, v in enumerate(out.valid.tolist()) if not v]
            if bad:
                raise RuntimeError(f"reward {reward.name!r} gave no score for sample {s + bad[0]}: {out.errors[bad[0]]}")
            outs.append(out.scores.to(images.device))
        return torch.cat(outs)
