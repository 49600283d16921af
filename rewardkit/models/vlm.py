"""Loading Hugging Face vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, ...) and processors.

The stock ``AutoProcessor`` of the Qwen-VL family builds a video processor that needs torchvision, which
cannot be installed beside a CPU torch from PyPI. :func:`load_processor` falls back to an image-only
processor (``AutoTokenizer`` + the PIL image processor), which is all a reward model needs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .._imports import require
from ..errors import RewardkitError
# device helpers are shared with the contract (rewardkit.reward), so they live at its level; importable from here
from ..devices import device_arg, resolve_device  # noqa: F401

__all__ = ["load_vlm", "load_processor", "image_only_processor", "resolve_dtype", "resolve_device", "device_arg",
           "PickledWeightsError", "require_safetensors", "refuse_pickled_side_files",
           "from_pretrained_safetensors"]


class PickledWeightsError(RewardkitError, OSError):
    """A checkpoint (weights, adapter, head or a processor's side file) exists only in a pickle-based format.
    rewardkit reads safetensors / JSON / text only and never unpickles what it loads."""


_CONVERT_HINT = ("rewardkit loads safetensors files only (it never unpickles downloaded bytes). Convert the "
                 "checkpoint once in a trusted environment: load it, then save_pretrained(..., "
                 "safe_serialization=True), which writes *.safetensors.")
# Pickle-based formats: torch.save (zip or legacy), raw pickle, joblib.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
# Files a processor never reads (trainer / weight artefacts that often sit beside it in a hub repo).
_NOT_PROCESSOR_FILES = re.compile(r"^(pytorch_model.*\.bin|adapter_model\.bin|training_args\.bin|optimizer\.pt|"
                                  r"scheduler\.pt|scaler\.pt|rng_state.*\.pth|model.*\.(bin|pt|pth|ckpt))$")


def require_safetensors(path: str | Path, name: str, what: str) -> Path:
    """``path/name`` when it exists; a :class:`PickledWeightsError` when only a pickled variant of it is there
    (same stem, pickle suffix); ``FileNotFoundError`` when neither is."""
    path = Path(path)
    f = path / name
    if f.is_file():
        return f
    stem = name.rsplit(".", 1)[0]
    pickled = sorted(p.name for p in path.glob(f"{stem}*") if p.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if pickled:
        raise PickledWeightsError(f"{path}: the {what} is only present as {', '.join(pickled)} (pickle), not "
                                  f"{name}. {_CONVERT_HINT}")
    raise FileNotFoundError(f"{path}: no {name} ({what})")


def refuse_pickled_side_files(path: str | Path, what: str = "processor") -> None:
    """Refuse a local ``what`` directory holding pickle-format files a processor could read (anything with a
    pickle suffix except known weight / trainer artefacts). Hub ids are not checked here (their processors
    are read from JSON / text files)."""
    p = Path(path)
    if not p.is_dir():
        return
    bad = sorted(f.name for f in p.iterdir()
                 if f.is_file() and f.suffix in PICKLE_SUFFIXES and not _NOT_PROCESSOR_FILES.match(f.name))
    if bad:
        raise PickledWeightsError(f"{p}: the {what} directory holds pickle-format file(s) {', '.join(bad)}; "
                                  f"rewardkit never unpickles what it loads: remove them or convert them to "
                                  "JSON / safetensors.")


def from_pretrained_safetensors(cls: Any, path: str, **kwargs: Any):
    """``cls.from_pretrained(path, use_safetensors=True, ...)`` with a clear :class:`PickledWeightsError` when a
    checkpoint only has pickled weights: rewardkit never unpickles downloaded bytes."""
    p = Path(path)
    if p.is_dir() and not any(p.glob("*.safetensors")):
        pickled = sorted(f.name for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
        if pickled:
            raise PickledWeightsError(f"{path}: weights only as {', '.join(pickled)} (pickle), no *.safetensors. "
                                      f"{_CONVERT_HINT}")
    try:
        return cls.from_pretrained(path, use_safetensors=True, **kwargs)
    except OSError as exc:
        if "safetensors" not in str(exc) or isinstance(exc, PickledWeightsError):
            raise
        raise PickledWeightsError(f"{exc}\n{_CONVERT_HINT}") from None

_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
           "bfloat16": "bfloat16", "bf16": "bfloat16", "auto": "auto"}


def resolve_dtype(dtype: Any):
    """``"bf16"`` / ``"bfloat16"`` / ``torch.bfloat16`` / None -> a torch dtype (None -> float32)."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = _DTYPES.get(str(dtype).lower().replace("torch.", ""))
    if key is None or key == "auto":
        raise ValueError(f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16")
    return getattr(torch, key)


_IMAGE_ONLY_CACHE: dict[type, type] = {}


def image_only_processor(proc_cls: type) -> type:
    """A subclass of a Qwen-VL processor class that carries no video processor (no torchvision needed)."""
    if proc_cls in _IMAGE_ONLY_CACHE:
        return _IMAGE_ONLY_CACHE[proc_cls]
    from transformers.processing_utils import ProcessorMixin

    class ImageOnly(proc_cls):  # type: ignore[misc, valid-type]
        attributes = ["image_processor", "tokenizer"]

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
            self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
            self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
            self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    ImageOnly.__name__ = ImageOnly.__qualname__ = proc_cls.__name__ + "ImageOnly"
    _IMAGE_ONLY_CACHE[proc_cls] = ImageOnly
    return ImageOnly


def _processor_class_for(config: Any) -> type:
    import transformers

    mt = getattr(config, "model_type", "")
    name = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
            "qwen3_vl_moe": "Qwen3VLProcessor", "qwen3_5": "Qwen3VLProcessor", "qwen3_5_moe": "Qwen3VLProcessor"}.get(mt)
    if name is None:
        raise ValueError(f"no image-only processor fallback for model_type {mt!r}")
    return getattr(transformers, name)


def load_processor(path: str, *, trust_remote_code: bool = False, **kwargs: Any):
    """``AutoProcessor`` when it works; otherwise tokenizer + PIL image processor in an image-only processor."""
    transformers = require("transformers", "hf")
    refuse_pickled_side_files(path)
    try:
        return transformers.AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    except (ImportError, AttributeError, OSError, ValueError, TypeError) as exc:
        first_error = exc
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    try:
        proc_cls = _processor_class_for(config)
    except ValueError:
        raise first_error from None
    tok = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    ip = transformers.AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    if type(ip).__name__ == "Qwen2VLImageProcessor":  # torchvision backend slipped through
        ip = transformers.Qwen2VLImageProcessorPil(**ip.to_dict())
    return image_only_processor(proc_cls)(image_processor=ip, tokenizer=tok,
                                          chat_template=getattr(tok, "chat_template", None))


def load_vlm(path: str, *, device: Any = None, dtype: Any = None, trust_remote_code: bool = False,
             attn_implementation: str | None = None):
    """Load an ``AutoModelForImageTextToText`` checkpoint (hub id or local directory) and its processor.

    Returns ``(model, processor)`` with the model in eval mode on ``device``.
    """
    transformers = require("transformers", "hf")
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = from_pretrained_safetensors(transformers.AutoModelForImageTextToText, path, **kwargs)
    model.to(resolve_device(device)).eval()
    processor = load_processor(path, trust_remote_code=trust_remote_code)
    return model, processor
