"""The reward server's wire format: request fields -> images, prompts, sources, metadata (see
:mod:`rewardkit.serve.server`), and the pixel count of each image read from its header, before anything is decoded.

``IMG`` is one of

- a base64 string of an encoded file (PNG, JPEG, WebP, ...), decoded by :mod:`rewardkit.media`;
- ``{"data": base64, "shape": [H, W] | [H, W, C], "dtype": "uint8"}``: raw pixels, C in 1, 3, 4;
- ``{"data": base64, "shape": [3, H, W], "dtype": "float32" | "float16" | "bfloat16"}``: a float image in
  [0, 1], channels first, little-endian, exactly the tensor an RL host holds (scored by the reward's tensor
  path, bit for bit as in-process).

The binary body (:mod:`rewardkit.serve.binary`) carries the same images without base64; its images reach
:func:`decode_image` as :class:`~rewardkit.serve.binary.BinaryImage` and come out the same. The checks both
bodies share (:class:`HTTPError`, the JSON bounds, a raw image's shape and pixel limit) are
:mod:`rewardkit.serve.checks`'.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

import numpy as np

from .binary import BinaryImage
from .checks import HTTPError, check_raw, loads_json  # noqa: F401 - loads_json re-exported


def _b64(data: Any, where: str) -> bytes:
    if not isinstance(data, str):
        raise HTTPError(400, f"{where}: 'data' must be a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPError(400, f"{where}: 'data' is not valid base64") from None


def decode_image(obj: Any, where: str) -> Any:
    """One wire image -> what :mod:`rewardkit.media` accepts (bytes or an ``[H, W, C]`` uint8 array), or a
    float ``[3, H, W]`` torch tensor for the float form.

    Raises :class:`HTTPError` (400) for a malformed entry; pixel-level problems (corrupt files, bombs) are
    left to the reward call, which reports them per sample.
    """
    if isinstance(obj, BinaryImage):  # a binary body's image: checked against its descriptor when parsed
        if "encoded" in obj.desc:
            return bytes(obj.data)
        return from_raw(obj.data, obj.desc["shape"], obj.desc.get("dtype", "uint8"))
    if isinstance(obj, str):
        try:
            return base64.b64decode(obj, validate=True)
        except (binascii.Error, ValueError):
            raise HTTPError(400, f"{where}: not valid base64") from None
    if not isinstance(obj, dict):
        raise HTTPError(400, f"{where}: an image is a base64 string or {{'data', 'shape', 'dtype'}}, "
                             f"got {type(obj).__name__}")
    unknown = set(obj) - {"data", "shape", "dtype"}
    if unknown:
        raise HTTPError(400, f"{where}: unknown keys {sorted(unknown)} (expected data, shape, dtype)")
    shape, dtype = obj.get("shape"), obj.get("dtype", "uint8")
    expected = check_raw(shape, dtype, where)
    raw = _b64(obj.get("data"), where)
    if len(raw) != expected:
        raise HTTPError(400, f"{where}: {len(raw)} bytes do not match shape {shape} and dtype {dtype} "
                             f"({expected} bytes)")
    return from_raw(raw, shape, dtype)


def from_raw(raw: Any, shape: list[int], dtype: str) -> Any:
    """Checked raw bytes (``bytes`` or a ``memoryview``) -> a uint8 array ``[H, W(, C)]`` (read in place) or
    a float ``[3, H, W]`` torch tensor (copied into native byte order)."""
    if dtype == "uint8":
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    import torch

    if dtype == "bfloat16":  # numpy has no bfloat16: carry the 16-bit patterns, reinterpret in torch
        t = torch.from_numpy(np.frombuffer(raw, dtype="<i2").astype(np.int16)).view(torch.bfloat16)
    else:  # little-endian on the wire; astype copies into native order (writable, owned)
        le = "<f4" if dtype == "float32" else "<f2"
        t = torch.from_numpy(np.frombuffer(raw, dtype=le).astype(np.dtype(le).newbyteorder("=")))
    return t.reshape(shape)


def pixel_count(img: Any) -> int:
    """Pixels ``img`` (a decoded wire image) will occupy once decoded, read from its header or shape. An
    encoded file that PIL cannot open, or one over :mod:`rewardkit.media`'s per-image limit, counts 0: the
    reward refuses it per sample before decoding it."""
    from .. import media

    if isinstance(img, (bytes, bytearray)):
        from PIL import Image

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(img)) as im:  # reads the header only
                    w, h = im.size
        except Exception:  # noqa: BLE001 - corrupt or refused: reported per sample by the reward
            return 0
        return 0 if w * h > media.get_max_pixels() else w * h
    if isinstance(img, np.ndarray):
        return int(img.shape[0] * img.shape[1])
    shape = getattr(img, "shape", None)
    if shape is not None and len(shape) == 3:  # float [3, H, W]
        return int(shape[1] * shape[2])
    return 0


def is_float_image(img: Any) -> bool:
    return not isinstance(img, (bytes, bytearray, np.ndarray))


def image_list(body: dict, key: str, limit: int, required: bool = True) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list) or (required and not value):
        raise HTTPError(400, f"'{key}' must be a non-empty list of images")
    if len(value) > limit:
        raise HTTPError(413, f"'{key}' has {len(value)} images; this server takes at most {limit} per request")
    return [decode_image(x, f"{key}[{i}]") for i, x in enumerate(value)]


def prompts(body: dict, n: int, uses_prompt: bool) -> list[Any]:
    prompt = body.get("prompt")
    if prompt is None and not uses_prompt:
        return [None] * n
    if isinstance(prompt, str):
        return [prompt] * n
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        if len(prompt) != n:
            raise HTTPError(400, f"got {n} images but {len(prompt)} prompts (send one string to broadcast)")
        return list(prompt)
    raise HTTPError(400, "'prompt' must be a string or a list of strings")


def sources(body: dict, n: int, limit: int) -> list[list[Any]] | None:
    value = body.get("sources")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise HTTPError(400, f"'sources' must be a list with one list of images per sample ({n})")
    for i, entry in enumerate(value):
        if not isinstance(entry, list):
            raise HTTPError(400, f"sources[{i}] must be a list of images")
    total = sum(len(entry) for entry in value)  # in all, not per sample: n * limit images would pass otherwise
    if total > limit:
        raise HTTPError(413, f"'sources' has {total} source images; this server takes at most {limit} per request "
                             "(send fewer samples per request)")
    out = []
    for i, entry in enumerate(value):
        out.append([decode_image(x, f"sources[{i}][{j}]") for j, x in enumerate(entry)])
    return out


def metadata(body: dict, n: int) -> list[dict] | None:
    value = body.get("metadata")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n or not all(m is None or isinstance(m, dict) for m in value):
        raise HTTPError(400, f"'metadata' must be a list of {n} objects (or null entries)")
    return [m or {} for m in value]
