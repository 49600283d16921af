"""Building blocks of the published rewards (``hpsv2``, ``aesthetic``, ``imagereward``): their MLP heads and
their exact image preprocessing, written from the published recipes (see docs/zoo.md for sources).

Preprocessing returns float32 ``[B, 3, S, S]`` pixel tensors. Each recipe has a PIL entry point (the ordinary
call: ``hpsv2_pixels``, ``openai_clip_pixels``) and a torch one on float ``[B, 3, H, W]`` tensors in [0, 1]
(``hpsv2_pixel_values``, ``openai_clip_pixel_values``: on the tensor's device, differentiable, what
``Reward.score_tensor`` uses).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["RatingMLP", "hpsv2_transform", "hpsv2_pixels", "hpsv2_pixel_values", "hpsv2_resize_shape",
           "openai_clip_pixels", "openai_clip_pixel_values", "openai_clip_resize_shape", "CLIP_MEAN", "CLIP_STD",
           "to_unit_tensor", "HubModelUnavailableError", "hub_unavailable", "hub_unavailable_message",
           "looks_like_hub_id", "INPUT_POLICY_DOC", "official_convert_rgb", "official_qwen_vl_rgb",
           "official_hf_clip_rgb", "official_hpsv2_rgb", "official_openai_clip_rgb"]

# ---------------------------------------------------------------------------------------------- hub access
#: text of the errors transformers / huggingface_hub raise when a hub model cannot be fetched
_HUB_SIGNS = ("offline", "Offline", "connect", "resolve", "LocalEntryNotFound", "cannot find the requested files",
              "Max retries", "hub", "huggingface.co")


class HubModelUnavailableError(OSError):
    """A model named by hub id could not be loaded (offline, unreachable, not in the cache). The message names
    the id, how to pass a local copy (``model=DIR`` / ``--model DIR``) and ``HF_HUB_OFFLINE``. An ``OSError``,
    as the error it replaces."""


def hub_unavailable_message(model: str | None) -> str:
    where = f"{model!r}" if model else "the reward's default hub model"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    state = ("HF_HUB_OFFLINE=1 is set, so nothing is downloaded" if offline
             else "the Hub could not be reached (set HF_HUB_OFFLINE=1 to never try)")
    dl = f"hf download {model} --local-dir DIR" if model else "hf download ORG/NAME --local-dir DIR"
    local = ""
    if model and not Path(model).is_absolute() and "/" in model:
        local = f" (and there is no folder {model!r} under {Path.cwd()})"
    return (f"could not load {where} from the Hugging Face Hub{local}: {state}. Download it on a connected machine "
            f"({dl}), copy DIR here and pass it: model=DIR in Python, --model DIR on the command line")


def looks_like_hub_id(model: Any) -> bool:
    """``org/name`` (letters, digits, ``-``, ``_``, ``.``): what the Hub accepts as a repository id; a backend
    spec (``vllm:...``), ``tiny:...`` or an absolute / home path is not one."""
    import re

    return isinstance(model, str) and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model) is not None


def hub_unavailable(exc: BaseException, model: str | None) -> HubModelUnavailableError | None:
    """``exc`` (raised while loading ``model``) as a :class:`HubModelUnavailableError` when it is a failure to
    reach the Hub for a model that is not a local directory; None otherwise (re-raise ``exc`` as it is)."""
    if isinstance(exc, HubModelUnavailableError):
        return exc
    if not isinstance(exc, OSError) or not looks_like_hub_id(model) or Path(str(model)).expanduser().exists():
        return None
    text = f"{type(exc).__name__}: {exc}"
    if not any(s in text for s in _HUB_SIGNS):
        return None
    return HubModelUnavailableError(hub_unavailable_message(model) + f"\n  ({text.splitlines()[0][:300]})")

# ------------------------------------------------------------------------- input policy (docs/zoo.md)
#: the ``input_policy`` field's comment in every published reward's config
INPUT_POLICY_DOC = ('"official": files, bytes and PIL images reach the model as the original package reads them '
                    '(no EXIF rotation, its own RGB conversion); "corrected": rewardkit\'s (EXIF rotation, 16-bit '
                    'scaled by 1/257, transparency on white)')


def official_convert_rgb(im: Any) -> Any:
    """PIL's ``im.convert("RGB")`` on the image as opened (what HPSv3 / EditReward, VQAScore and UnifiedReward 2.0 /
    edit do): alpha dropped (transparent pixels show their stored colour), 16-bit gray clipped at 255."""
    return im.convert("RGB")


def official_qwen_vl_rgb(im: Any) -> Any:
    """qwen-vl-utils ``to_rgb`` (``vision_process.py``; what ``process_vision_info`` applies in UnifiedReward's
    transformers scripts, t2i and think): an ``RGBA`` image pasted on white with its alpha as the mask, any other
    mode ``convert("RGB")`` (``LA`` and transparent palettes lose their alpha)."""
    from PIL import Image

    if im.mode == "RGBA":
        out = Image.new("RGB", im.size, (255, 255, 255))
        out.paste(im, mask=im.split()[3])
        return out
    return im.convert("RGB")


def official_hf_clip_rgb(im: Any) -> Any:
    """transformers' ``image_transforms.convert_to_rgb`` (what ``CLIPImageProcessor`` applies for PickScore and
    CLIPScore): RGB as is; any other mode ``convert("RGBA")`` then alpha-composited on white (16-bit clipped)."""
    from PIL import Image

    if im.mode == "RGB":
        return im.convert("RGB")
    rgba = im.convert("RGBA")
    bg = Image.new("RGBA", rgba.size, (255, 255, 255))
    return Image.alpha_composite(bg, rgba).convert("RGB")


def official_hpsv2_rgb(im: Any) -> Any:
    """HPSv2's ``_convert_to_rgb_or_rgba`` (``hpsv2/src/open_clip/transform.py``, hpsv2 1.2.0): ``RGBA`` is kept,
    every other mode ``convert("RGB")``. A four-channel tensor then fails the three-channel ViT (the official call
    crashes), so an ``RGBA`` image is refused (NaN + reason) rather than given a number the package never gives."""
    if im.mode == "RGBA":
        from .. import media

        raise media._Bad("the official hpsv2 pre-processing keeps RGBA images as 4 channels and its ViT fails on "
                         "them (no official score exists); convert the image yourself, or load the reward with "
                         "input_policy='corrected' (transparency composited on white)")
    return im.convert("RGB")


def official_openai_clip_rgb(im: Any, size: int = 224) -> Any:
    """OpenAI CLIP's ``_transform`` order (``clip/clip.py``; ImageReward ``ImageReward.py``, the aesthetic predictor):
    torchvision ``Resize(size, BICUBIC)`` and ``CenterCrop(size)`` on the image *as opened*, *then*
    ``convert("RGB")``. The result is the official ``size x size`` RGB crop, which :func:`openai_clip_pixels`
    leaves unchanged (no resize, a whole-image crop). For an RGB image that is the same resize and crop as
    :func:`openai_clip_pixels` on the plain image, bit for bit; for any other mode the resize runs in that mode
    (PIL premultiplies alpha for RGBA / LA, resizes palette images nearest-neighbour and 16-bit gray in 16 bits).
    Decoding straight to the crop keeps only ``size x size`` pixels per image alive in a chunk and skips a
    full-size RGB copy (issue 41)."""
    from PIL import Image

    w, h = im.size
    nh, nw = openai_clip_resize_shape(h, w, size)
    out = im
    if (nw, nh) != (w, h):  # torchvision's resize returns the image itself at the target size
        out = out.resize((nw, nh), Image.BICUBIC)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    if (left, top, nw, nh) != (0, 0, size, size):
        out = out.crop((left, top, left + size, top + size))
    # an RGB result is already the conversion's copy, unless it is the caller's own image (then rewardkit.media
    # copies it: never hands it out)
    return out if out.mode == "RGB" else out.convert("RGB")


#: OpenAI CLIP normalisation (HPSv2, ImageReward and the aesthetic predictor all use it).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class RatingMLP(nn.Module):
    """The 5-layer rating MLP shared by the LAION aesthetic predictor v2 and ImageReward.

    ``[B, in_features] -> [B, 1]`` through widths 1024, 128, 64, 16. ``activation=None`` is the published
    activation-free stack (``Linear, Dropout, Linear, Dropout, Linear, Dropout, Linear, Linear``: parameter
    keys ``layers.{0,2,4,6,7}``, ImageReward and the aesthetic ``linearMSE`` file); ``"relu"`` is the aesthetic
    ``reluMSE`` variant (``layers.{0,3,6,9,11}``). Dropout is inactive at inference.
    """

    WIDTHS = (1024, 128, 64, 16)

    def __init__(self, in_features: int = 768, activation: str | None = None, dropout: float = 0.0,
                 widths: Sequence[int] = WIDTHS) -> None:
        super().__init__()
        if activation not in (None, "relu"):
            raise ValueError(f"activation must be None or 'relu', got {activation!r}")
        w = [int(in_features), *[int(x) for x in widths]]
        mods: list[nn.Module] = []
        for i in range(len(w) - 1):
            mods.append(nn.Linear(w[i], w[i + 1]))
            if activation == "relu":
                mods.append(nn.ReLU())
            if i < len(w) - 2:
                mods.append(nn.Dropout(dropout))
        mods.append(nn.Linear(w[-1], 1))
        self.layers = nn.Sequential(*mods)
        self.activation = activation

    @staticmethod
    def linear_indices(activation: str | None, n_linear: int = 5) -> list[int]:
        """Indices of the Linear layers inside ``layers`` (the checkpoint keys)."""
        return RatingMLP(8, activation, widths=(4,) * (n_linear - 1)).linear_positions()

    def linear_positions(self) -> list[int]:
        return [i for i, m in enumerate(self.layers) if isinstance(m, nn.Linear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .direct_forward import sequential_mlp

        return sequential_mlp(self.layers, x)  # self.layers(x), without a module call per layer


def to_unit_tensor(image: Any) -> torch.Tensor:
    """An RGB PIL image -> float32 ``[3, H, W]`` in [0, 1] (torchvision's ``ToTensor``)."""
    arr = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


def _normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x - m) / s


def _compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """fp32, or float64 kept as is (so gradients of the torch recipes can be checked in double precision)."""
    return x if x.dtype == torch.float64 else x.float()


def hpsv2_resize_shape(h: int, w: int, size: int = 224) -> tuple[int, int]:
    """``(h, w)`` after HPSv2's ``ResizeMaxSize``: the longest side to ``size``, the other ``round(side * scale)``
    (Python's round, as upstream). Raises ValueError when a side would round to 0 (aspect ratio over
    ``2 * size``: upstream crashes there too)."""
    scale = size / float(max(h, w))
    nh, nw = round(h * scale), round(w * scale)
    if nh < 1 or nw < 1:
        raise ValueError(f"a {w}x{h} image has a side of 0 pixels after HPSv2's resize to {size} "
                         f"(aspect ratio {max(h, w) / min(h, w):.0f} is over {2 * size})")
    return nh, nw


def hpsv2_pixel_values(x: torch.Tensor, size: int = 224, mean: Sequence[float] = CLIP_MEAN,
                       std: Sequence[float] = CLIP_STD) -> torch.Tensor:
    """HPSv2's evaluation transform on a batch: float ``[B, 3, H, W]`` in [0, 1] -> fp32 ``[B, 3, size, size]``
    (float64 for float64 input).

    OpenCLIP ``ResizeMaxSize`` as HPSv2 applies it (after ``ToTensor``, so torchvision's resize of a float
    tensor, i.e. ``interpolate(mode="bicubic", antialias=True)``, one joint call, no clamping): the longest side
    to ``size`` (:func:`hpsv2_resize_shape`), then a centred zero pad (black, before normalisation; left / top
    get ``pad // 2``), then CLIP mean / std. Upstream skips the pad when the longest side is already ``size``,
    which only works for square images (a non-square one crashes the ViT); here such images are padded too.
    Differentiable in ``x`` (runs on ``x``'s device).

    This is the whole recipe for both paths: the ordinary call runs it on the 8-bit decoded image (as
    ``hpsv2.score`` does), ``score_tensor`` on the caller's float tensor, so the two differ only by the 8-bit
    rounding of the input (none for a tensor of ``k / 255`` values).
    """
    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected a [B, 3, H, W] image tensor, got {tuple(x.shape)}")
    x = _compute_dtype(x)
    h, w = int(x.shape[-2]), int(x.shape[-1])
    if max(h, w) != size:
        h, w = hpsv2_resize_shape(h, w, size)
        x = torch.nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False, antialias=True)
    ph, pw = size - h, size - w
    if ph or pw:
        x = torch.nn.functional.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=0.0)
    return _normalize(x, mean, std)


def hpsv2_transform(x: torch.Tensor, size: int = 224, mean: Sequence[float] = CLIP_MEAN,
                    std: Sequence[float] = CLIP_STD) -> torch.Tensor:
    """:func:`hpsv2_pixel_values` on one float ``[3, H, W]`` image in [0, 1] -> ``[3, size, size]``."""
    if x.ndim != 3 or x.shape[0] != 3:
        raise ValueError(f"expected a [3, H, W] image tensor, got {tuple(x.shape)}")
    return hpsv2_pixel_values(x[None], size, mean, std)[0]


def hpsv2_pixels(images: Sequence[Any], size: int = 224) -> torch.Tensor:
    """B RGB PIL images -> HPSv2 pixel values ``[B, 3, size, size]`` (see :func:`hpsv2_transform`)."""
    if not images:
        return torch.zeros(0, 3, size, size)
    return torch.stack([hpsv2_transform(to_unit_tensor(im), size) for im in images])


def openai_clip_pixels(images: Sequence[Any], size: int = 224, mean: Sequence[float] = CLIP_MEAN,
                       std: Sequence[float] = CLIP_STD) -> torch.Tensor:
    """OpenAI CLIP's ``_transform`` (used by ImageReward and the LAION aesthetic predictor) -> ``[B, 3, S, S]``.

    torchvision ``Resize(size, BICUBIC)`` on the PIL image (shorter side to ``size``, longer side
    ``int(size * long / short)``), ``CenterCrop(size)`` (offsets ``int(round((side - size) / 2))``), RGB,
    ``ToTensor``, mean / std. (transformers' ``CLIPImageProcessor`` differs in rounding and resampling.)

    The crops are gathered as one ``uint8 [B, S, S, 3]`` array and converted, scaled and normalised in place on the
    whole batch: the same element-wise fp32 operations as ``ToTensor`` (``div(255)``) and ``Normalize`` (``sub_``
    then ``div_`` by per-channel tensors), so the values are those of the per-image transform, bit for bit, without
    its per-image tensors and the final stack. Images already ``size x size`` (decoded straight to the crop by
    :func:`official_openai_clip_rgb`) are neither resized nor copied by a crop.
    """
    from PIL import Image

    if not images:
        return torch.zeros(0, 3, size, size)
    crops = []
    for im in images:
        w, h = im.size
        nh, nw = openai_clip_resize_shape(h, w, size)
        if (nw, nh) != (w, h):
            im = im.resize((nw, nh), Image.BICUBIC)
        top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
        if (left, top, nw, nh) != (0, 0, size, size):
            im = im.crop((left, top, left + size, top + size))
        crops.append(np.asarray(im if im.mode == "RGB" else im.convert("RGB"), dtype=np.uint8))
    u8 = torch.from_numpy(np.stack(crops))  # [B, S, S, 3]
    x = torch.empty(u8.shape[0], 3, size, size)  # contiguous NCHW, as ToTensor's permute(...).contiguous()
    x.copy_(u8.permute(0, 3, 1, 2))
    x.div_(255.0)
    m, s = _channel_stats(tuple(mean), tuple(std), x.dtype)
    return x.sub_(m).div_(s)


#: (mean, std, dtype) -> their ``[1, C, 1, 1]`` CPU tensors, built once instead of twice per call (issue 41); only
#: ever read (operands of ``sub_`` / ``div_``), and ordinary tensors even when first built under inference mode
_CHANNEL_STATS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _channel_stats(mean: tuple, std: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    key = (mean, std, dtype)
    got = _CHANNEL_STATS.get(key)
    if got is None:
        with torch.inference_mode(False):
            got = _CHANNEL_STATS[key] = (torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1),
                                         torch.tensor(std, dtype=dtype).view(1, -1, 1, 1))
    return got


def openai_clip_resize_shape(h: int, w: int, size: int = 224) -> tuple[int, int]:
    """``(h, w)`` after torchvision ``Resize(size)``: the shorter side to ``size``, the longer
    ``int(size * long / short)`` (truncated)."""
    return (int(size * h / w), size) if w <= h else (size, int(size * w / h))


def openai_clip_pixel_values(x: torch.Tensor, size: int = 224, mean: Sequence[float] = CLIP_MEAN,
                             std: Sequence[float] = CLIP_STD) -> torch.Tensor:
    """:func:`openai_clip_pixels` in torch, for gradients: float ``[B, 3, H, W]`` in [0, 1] (any float dtype and
    device) -> fp32 ``[B, 3, size, size]`` (float64 for float64 input) on ``x``'s device, differentiable in ``x``.

    Same geometry as the PIL recipe (:func:`openai_clip_resize_shape`; ``CenterCrop`` offsets
    ``int(round((side - size) / 2))``, Python's round, which differs from ``(side - size) // 2`` when
    ``side - size`` is 3 mod 4); the bicubic resize is :func:`rewardkit.preprocess.resize` (PIL's antialiased
    ``a = -0.5`` kernel, horizontal pass then vertical, each saturated to [0, 1] as PIL's 8-bit passes are).
    Residual difference to the PIL recipe: PIL resamples 8-bit images in fixed point and rounds after each
    pass; this runs in fp32. Measured on 8-bit natural-like images (sizes 33x120 to 1024x768, resized to 32 and
    to 224): at most 0.0042 per pixel of the [0, 1] range, 0.0012 on average; up to 0.008 (natural) / 0.055
    (sharp-edged blocks, isolated pixels) on tall images, where PIL's pass order differs (see
    docs/tensors-and-gradients.md for the score differences).
    """
    from ..preprocess import resize

    if x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"expected a [B, 3, H, W] image tensor, got {tuple(x.shape)}")
    h, w = int(x.shape[-2]), int(x.shape[-1])
    nh, nw = openai_clip_resize_shape(h, w, size)
    x = resize(_compute_dtype(x), (nh, nw), "bicubic")
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return _normalize(x[..., top:top + size, left:left + size], mean, std)


def clip_image_embeddings(model: Any, pixels: torch.Tensor) -> torch.Tensor:
    """``CLIPModel.get_image_features`` on ready pixel values ``[B, 3, S, S]`` -> L2-normalised fp32 ``[B, D]``
    (the model's device and dtype are used; its values within float rounding, run through the tower's submodules
    directly, the last layer for the pooled row only:
    :func:`rewardkit.models.direct_forward.clip_image_features`)."""
    from .direct_forward import clip_image_features

    p = next(model.parameters())
    feats = clip_image_features(model, pixels.to(p.device, p.dtype))
    return torch.nn.functional.normalize(feats.float(), dim=-1)
