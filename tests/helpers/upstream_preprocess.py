"""Upstream image pre-processing, transcribed step by step for the parity tests (numpy / PIL / plain torch).

These are the *expected* side of the pre-processing checks: they import nothing from rewardkit, so a bug in
``rewardkit.models.zoo`` (the recipe both the ordinary call and ``score_tensor`` run) cannot also be in the
reference. Each function names the upstream lines it transcribes; torchvision is not a dependency, so its
calls are written out as what they compute (the torchvision source each one follows is named too).
"""

from __future__ import annotations

import numpy as np
import torch

#: OpenAI CLIP's normalisation (openai/CLIP ``clip/clip.py`` line 85; HPSv2's ``OPENAI_DATASET_MEAN`` / ``_STD``
#: in ``hpsv2/src/open_clip/constants.py``; ImageReward ``ImageReward/ImageReward.py`` line 36)
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def _to_tensor(img) -> torch.Tensor:
    """torchvision ``ToTensor`` of an RGB PIL image: uint8 HWC -> float CHW / 255 (written with numpy)."""
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.astype(np.float32) / 255.0).permute(2, 0, 1).contiguous()


def _normalize(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(OPENAI_MEAN, dtype=x.dtype).view(3, 1, 1)
    std = torch.tensor(OPENAI_STD, dtype=x.dtype).view(3, 1, 1)
    return (x - mean) / std


def hpsv2_eval_pixels(img, size: int = 224) -> torch.Tensor:
    """HPSv2's evaluation transform for one image (a PIL image, or a float ``[3, H, W]`` tensor in [0, 1], which
    skips ``ToTensor``) -> ``[3, size, size]``.

    Transcribed from tgxs002/HPSv2 @866735e:
    - ``hpsv2/src/open_clip/factory.py`` lines 368-375: ``light_augmentation=True`` (as ``hpsv2/img_score.py``
      line 33 passes it) builds ``image_transform(..., is_train=False, resize_longest_max=True)``;
    - ``hpsv2/src/open_clip/transform.py`` lines 141-156: ``_convert_to_rgb_or_rgba``, ``ToTensor()``,
      ``ResizeMaxSize(image_size, fill=0)``, ``normalize``;
    - ``transform.py`` lines 37-49 (``ResizeMaxSize.forward``): ``scale = max_size / float(max(h, w))``; only if
      ``scale != 1.0``: ``new_size = round(dim * scale)`` per side, ``F.resize(img, new_size, BICUBIC)`` on the
      tensor, then ``F.pad(padding=[pad_w//2, pad_h//2, pad_w - pad_w//2, pad_h - pad_h//2], fill=0)``
      (left, top, right, bottom).
    torchvision's ``F.resize`` of a float tensor with BICUBIC is ``torch.nn.functional.interpolate(mode="bicubic",
    align_corners=False, antialias=True)`` (torchvision >= 0.17, where ``antialias`` defaults to True; the
    unpinned ``torchvision`` of HPSv2's requirements.txt installs such a version today), no clamping for floats.
    Before 0.17 (HPSv2 was released in 2023) a tensor was resized without antialiasing: on a 1024x1024
    natural-like image resized to 224 the two differ by 0.019 per pixel on average (max 0.12, [0, 1] units), so
    this reference is today's official package, not necessarily the one HPSv2 was trained and published with.
    The upstream quirk is kept: no pad when the longest side already equals ``size`` (only square images pass).
    """
    x = img.detach().float() if isinstance(img, torch.Tensor) else _to_tensor(img)
    height, width = x.shape[1:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        new_size = tuple(round(dim * scale) for dim in (height, width))
        x = torch.nn.functional.interpolate(x[None], size=new_size, mode="bicubic", align_corners=False,
                                            antialias=True)[0]
        pad_h, pad_w = size - new_size[0], size - new_size[1]
        canvas = torch.zeros(3, size, size, dtype=x.dtype)  # fill=0: black before normalisation
        top, left = pad_h // 2, pad_w // 2
        canvas[:, top:top + new_size[0], left:left + new_size[1]] = x
        x = canvas
    return _normalize(x)


def openai_clip_eval_pixels(img, size: int = 224) -> torch.Tensor:
    """OpenAI CLIP's ``_transform(n_px)`` for one PIL image -> ``[3, size, size]`` (also ImageReward's and the LAION
    aesthetic predictor's pre-processing).

    Transcribed from openai/CLIP @d05afc4 ``clip/clip.py`` lines 79-86 (``Resize(n_px, interpolation=BICUBIC)``,
    ``CenterCrop(n_px)``, ``_convert_image_to_rgb``, ``ToTensor()``, ``Normalize(...)``); THUDM/ImageReward
    @c1392c6 ``ImageReward/ImageReward.py`` lines 30-37 is the same ``_transform``. On a PIL image torchvision's
    ``Resize(int)`` sets the shorter side to ``n_px`` and the longer to ``int(n_px * long / short)``
    (``_compute_resized_output_size``), skips the resize when the size is unchanged, and calls PIL's
    ``Image.resize((w, h), BICUBIC)``; ``CenterCrop`` crops at ``int(round((side - n_px) / 2.0))``
    (``torchvision/transforms/functional.py``, ``center_crop``).
    """
    from PIL import Image

    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
    if (nw, nh) != (w, h):
        img = img.resize((nw, nh), Image.BICUBIC)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    img = img.crop((left, top, left + size, top + size))
    return _normalize(_to_tensor(img))
