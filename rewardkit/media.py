"""Input normalisation: the only place in rewardkit that decodes or converts images.

Every reward receives images in one canonical form: an RGB, 8-bit ``PIL.Image.Image`` with its pixels
loaded. Accepted inputs, per image:

- ``PIL.Image.Image`` in any mode (see conversions below);
- a file path (``str`` or ``os.PathLike``) or raw encoded ``bytes`` / ``bytearray`` / ``memoryview``;
- a numpy array ``HxW`` (grayscale) or ``HxWxC`` with C in {1, 3, 4}: ``uint8`` as is, ``uint16`` scaled by
  1/257, floating point in [0, 1] (either byte order);
- a torch tensor ``CxH×W`` (C in {1, 3, 4}) or ``HxW``: ``uint8`` as is, floating point in [0, 1].

Batches: a list / tuple of the above, a ``BxCxHxW`` tensor, or a ``BxHxWxC`` numpy array. A single image
(not in a list) is a batch of one.

Documented conversions (all lossless for RGB 8-bit input):
- EXIF orientation is applied (``ImageOps.exif_transpose``), so a phone photo is scored upright.
- Animated images (GIF, APNG, WebP) use their **first frame**.
- Transparency (RGBA, LA, P with a transparent index) is composited onto **white**.
- CMYK, YCbCr, LAB, palette, 1-bit and grayscale become RGB via PIL; 16-bit / 32-bit integer grayscale is
  scaled to 8 bits (value / 257); 32-bit float grayscale is read as [0, 1] when its maximum is <= 1, else
  as [0, 255], then clipped.
- Float inputs become uint8 by ``round(x * 255)``, so PIL, uint8 and float versions of one image are
  byte-identical after normalisation.

Two input policies for encoded files, bytes and PIL images (numpy arrays and tensors are decoded the same way
under both): ``"corrected"``, the conversions above (rewardkit's own rewards use it), and ``"official"``, where a
published reward turns the image *as opened* (no EXIF rotation; a file's first frame, a caller's PIL image as it
is) into RGB exactly as its original package does (``convert("RGB")``: alpha dropped, 16-bit clipped at 255; or
that package's own order), passed to :func:`to_pil` as ``official=`` (see docs/zoo.md, "Input policy").

Refused, with a clear reason: corrupt, truncated or zero-byte files (truncated ones even when another library
has set PIL's global ``ImageFile.LOAD_TRUNCATED_IMAGES``, once or on every call from another thread: rewardkit
  decodes strictly, in its own threads only); bytes that are not an image; images
with a zero-size side; images over the pixel limit (a decompression-bomb guard, checked from the header
before decoding; set with :func:`set_max_pixels` or ``REWARDKIT_MAX_PIXELS``; PIL's own
``Image.MAX_IMAGE_PIXELS`` guard also applies to encoded files); images whose aspect ratio (long side /
short side) exceeds :func:`get_max_aspect_ratio` (default 200, Qwen-VL's own limit; set with
:func:`set_max_aspect_ratio` or ``REWARDKIT_MAX_ASPECT_RATIO``), which a shortest-edge resize would blow up
into a huge tensor; closed or lazily opened PIL images whose pixels cannot be read; ``meta`` / sparse
tensors; arrays with NaN / Inf, values outside [0, 1] (floats) or an unrecognised shape / dtype.

:func:`probe_size` reads an input's size without decoding pixels (headers only), and :func:`resized_size`
predicts the size a Hugging Face image processor resizes an image to, so callers can refuse aspect-ratio
bombs before any pixel is decoded or resized.
"""

from __future__ import annotations

import io
import os
import stat
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import RewardInputError

__all__ = [
    "ImageLike",
    "load_image",
    "split_batch",
    "to_pil",
    "pil_to_uint8",
    "pil_to_float",
    "set_max_pixels",
    "get_max_pixels",
    "image_hash",
    "set_max_aspect_ratio",
    "get_max_aspect_ratio",
    "probe_size",
    "resized_size",
    "INPUT_POLICIES",
    "check_input_policy",
]

ImageLike = Any  # PIL.Image | str | os.PathLike | bytes | np.ndarray | torch.Tensor

# 178,956,970 pixels is PIL's own hard DecompressionBombError threshold (2x its warning limit).
_DEFAULT_MAX_PIXELS = int(os.environ.get("REWARDKIT_MAX_PIXELS", 178_956_970))
_max_pixels = _DEFAULT_MAX_PIXELS
# Qwen2-VL's smart_resize refuses long / short > 200; a CLIP shortest-edge resize of a 1x20000 image would
# otherwise build a 224 x 4,480,000 tensor. None disables the bound.
_DEFAULT_MAX_ASPECT = float(os.environ.get("REWARDKIT_MAX_ASPECT_RATIO", 200))
_max_aspect: float | None = _DEFAULT_MAX_ASPECT
_FLOAT_TOL = 1e-3  # floats slightly outside [0, 1] from resampling are clipped, not refused
_lock = threading.Lock()

#: how a published reward turns encoded files, bytes and PIL images into RGB (docs/zoo.md, "Input policy"):
#: "official" = as its original package does (the default of every published reward), "corrected" = rewardkit's
#: conversions (EXIF rotation, 16-bit scaled by 1/257, transparency composited on white)
INPUT_POLICIES = ("official", "corrected")


def check_input_policy(policy: Any) -> str:
    """``policy`` if it is one of :data:`INPUT_POLICIES`, else ``ValueError`` naming them."""
    if policy not in INPUT_POLICIES:
        raise ValueError(f"input_policy must be one of {INPUT_POLICIES}, got {policy!r} ('official': the images as "
                         "the original package reads them; 'corrected': EXIF rotation applied, 16-bit scaled, "
                         "transparency composited on white)")
    return policy


def set_max_pixels(n: int | None) -> None:
    """Largest image (width x height) accepted; ``None`` restores the default (178,956,970)."""
    global _max_pixels
    if n is not None and (not isinstance(n, int) or n <= 0):
        raise ValueError(f"max pixels must be a positive int, got {n!r}")
    with _lock:
        _max_pixels = _DEFAULT_MAX_PIXELS if n is None else n


def get_max_pixels() -> int:
    return _max_pixels


def set_max_aspect_ratio(r: float | None = 200.0) -> None:
    """Largest accepted aspect ratio (long side / short side); ``None`` disables the bound.

    Call with no argument to restore the default (200, or ``REWARDKIT_MAX_ASPECT_RATIO``)."""
    global _max_aspect
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not r >= 1.0):
        raise ValueError(f"max aspect ratio must be a number >= 1 or None, got {r!r}")
    with _lock:
        _max_aspect = None if r is None else float(r)


def get_max_aspect_ratio() -> float | None:
    return _max_aspect


class _Bad(Exception):
    """Internal: a per-image problem, turned into RewardInputError with the sample index by callers."""


def _is_tensor(x: Any) -> bool:
    # torch is a core dependency but importing it is cheap only once; check the type name first.
    return type(x).__module__.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


def _check_size(w: int, h: int) -> None:
    if w <= 0 or h <= 0:
        raise _Bad(f"image has a zero-size side ({w}x{h})")
    if w * h > _max_pixels:
        raise _Bad(
            f"image is {w}x{h} = {w * h:,} pixels, over the limit of {_max_pixels:,} "
            "(decompression-bomb guard; raise it with rewardkit.media.set_max_pixels or REWARDKIT_MAX_PIXELS)"
        )
    bound = _max_aspect
    if bound is not None and max(w, h) > bound * min(w, h):
        raise _Bad(
            f"image is {w}x{h}: aspect ratio {max(w, h) / min(w, h):,.1f} exceeds the limit of {bound:g} "
            "(a model's shortest-edge resize would blow it up; change it with "
            "rewardkit.media.set_max_aspect_ratio or REWARDKIT_MAX_ASPECT_RATIO)"
        )


def check_resized_size(w: int, h: int, image_processor: Any) -> None:
    """Refuse (``_Bad``) an image whose size after ``image_processor``'s own resize exceeds the pixel limit,
    or that the processor itself would refuse (Qwen-VL's smart_resize: aspect ratio over 200), so one such
    image cannot fail the processor call of a whole chunk."""
    if _is_qwen_processor(image_processor) and max(w, h) > _QWEN_MAX_RATIO * min(w, h):
        raise _Bad(f"image is {w}x{h}: aspect ratio {max(w, h) / min(w, h):,.1f} is over {_QWEN_MAX_RATIO}, which "
                   "the model's (Qwen-VL) image processor refuses")
    out = resized_size(image_processor, w, h)
    if out is not None and out[0] * out[1] > _max_pixels:
        raise _Bad(
            f"image is {w}x{h}; the model's processor would resize it to {out[0]}x{out[1]} = "
            f"{out[0] * out[1]:,} pixels, over the limit of {_max_pixels:,} (aspect-ratio bomb guard)"
        )


_QWEN_MAX_RATIO = 200  # transformers' smart_resize raises above this


def _is_qwen_processor(ip: Any) -> bool:
    return hasattr(ip, "merge_size") and hasattr(ip, "patch_size")


def _size_get(size: Any, key: str) -> int | None:
    v = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return int(v) if v else None


def resized_size(image_processor: Any, w: int, h: int) -> tuple[int, int] | None:
    """``(width, height)`` a Hugging Face image processor resizes a ``w x h`` image to, before any crop;
    None when the processor bounds the result itself (Qwen-VL's pixel budget) or its rule is unknown.

    Rules (transformers' ``size`` dict): ``shortest_edge`` (optionally capped by ``longest_edge``) scales
    the short side to that length (CLIP); ``height`` + ``width`` is a fixed size; ``longest_edge`` alone
    scales the long side.
    """
    if image_processor is None:
        return None
    if getattr(image_processor, "do_resize", True) is False:
        return (w, h)
    if _is_qwen_processor(image_processor):
        return None  # Qwen-VL smart_resize: total pixels within max_pixels whatever the shape
    size = getattr(image_processor, "size", None)
    if size is None:
        return None
    short, long_, hh, ww = (_size_get(size, k) for k in ("shortest_edge", "longest_edge", "height", "width"))
    if hh and ww:
        return (ww, hh)
    if short:
        scale = short / min(w, h)
        if long_ and max(w, h) * scale > long_:
            scale = long_ / max(w, h)
        return (max(1, int(w * scale)), max(1, int(h * scale)))
    if long_:
        scale = long_ / max(w, h)
        return (max(1, int(w * scale)), max(1, int(h * scale)))
    return None


def _check_encoded_source(data: bytes | None, path: Path | None) -> None:
    """The clear messages for encoded input that cannot be an image: empty bytes, a missing / empty file, a
    folder (shared by the header probe and the decoder)."""
    if data is not None and len(data) == 0:
        raise _Bad("empty bytes (zero-length input)")
    if path is not None:
        # one stat for the usual case, a non-empty regular file (issue 41: this runs twice per image, in the
        # header probe and the decode); anything else takes the checks below, which give its message / error
        try:
            st = path.stat()
        except (OSError, ValueError):
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode) and st.st_size != 0:
            return
        if not path.exists():
            raise _Bad(f"file not found: {path}")
        if path.is_dir():
            raise _Bad(f"is a directory, not an image: {path}")
        if path.stat().st_size == 0:
            raise _Bad(f"empty file (0 bytes): {path}")


def _open_encoded(data: bytes | None, path: Path | None, header_check: Any = None) -> Image.Image:
    """Open and decode encoded input. ``header_check``: None, or a callable ``(w, h)`` run on the header's size
    before any pixel is decoded; it stands for a :func:`_probe` the caller skipped (one header read instead of
    two), so a header that cannot be read is then reported in the probe's words."""
    src = path if path is not None else io.BytesIO(data or b"")
    _check_encoded_source(data, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if header_check is None:
                im = Image.open(src)
            else:
                im = _open_header(src, path)
            # Size comes from the header: refuse bombs before decoding a single pixel.
            _check_size(*im.size)
            if header_check is not None:
                header_check(*im.size)
            if getattr(im, "is_animated", False):
                im.seek(0)  # documented: first frame
            im.load()
    except _Bad:
        raise
    except Image.DecompressionBombError as exc:
        # PIL's own guard (Image.MAX_IMAGE_PIXELS) fired while reading the header.
        raise _Bad(f"image is over the limit of {min(_max_pixels, 2 * (Image.MAX_IMAGE_PIXELS or 0)):,} pixels "
                   f"(decompression-bomb guard; PIL: {exc})") from None
    except UnidentifiedImageError:
        where = f"file {path}" if path is not None else "bytes"
        raise _Bad(f"{where} is not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise _Bad(f"corrupt or truncated image: {exc}") from None
    return im


def _open_header(src: Any, path: Path | None) -> Image.Image:
    """``Image.open(src)`` with :func:`_probe`'s errors (the header read that a deferred probe stands for)."""
    try:
        return Image.open(src)
    except (_Bad, Image.DecompressionBombError, UnidentifiedImageError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise _Bad(f"corrupt or truncated image (unreadable header: {type(exc).__name__}: {exc})") from None


_ORIENTATION = 0x0112  # the EXIF Orientation tag


def _pil_to_rgb(im: Image.Image, owned: bool = False, official: Any = None) -> Image.Image:
    """Canonical RGB copy of ``im``; ``owned=True`` when ``im`` was decoded here (no defensive copy needed).
    ``official``: None for rewardkit's corrected conversions, else the published reward's own conversion of the
    image as opened (see :func:`_official_rgb`).

    A caller's PIL image may be lazily opened (its pixels are read here, from a file that may be truncated)
    or already closed: any failure to read its pixels is a per-image ``_Bad``."""
    _check_size(*im.size)
    try:
        if official is not None:
            return _official_rgb(im, official)
        return _pil_to_rgb_unchecked(im, owned)
    except _Bad:
        raise
    except Image.DecompressionBombError as exc:
        raise _Bad(f"image is over PIL's decompression-bomb limit ({exc})") from None
    except (OSError, ValueError, SyntaxError, EOFError, AttributeError, IndexError, TypeError) as exc:
        closed = "closed" in str(exc).lower()
        what = "the PIL image is closed (reopen it or pass the path)" if closed else \
            f"cannot read the PIL image's pixels (corrupt or truncated?): {type(exc).__name__}: {exc}"
        raise _Bad(what) from None


def _official_rgb(im: Image.Image, official: Any) -> Image.Image:
    """``official(im)`` on the image as opened: no EXIF rotation, no frame change, no mode conversion first (the
    original packages call ``Image.open`` and hand the result to their transform). The result must be a new RGB
    image; its ``info`` is emptied so that no EXIF orientation travels with it (a later corrected decode, e.g. a
    judge backend's, must not turn it)."""
    out = official(im)
    if not isinstance(out, Image.Image) or out.mode != "RGB":
        raise TypeError(f"an official image conversion returned {type(out).__name__} "
                        f"{getattr(out, 'mode', '')!r}, not an RGB PIL image")
    if out is im:
        out = im.copy()  # never hand out the caller's object
    out.load()
    out.info = {}
    return out


def _pil_to_rgb_unchecked(im: Image.Image, owned: bool) -> Image.Image:
    if getattr(im, "is_animated", False) and im.tell() != 0:
        im.seek(0)
    src = im
    try:
        # exif_transpose returns a copy even when there is nothing to turn: asked only when there is
        if im.getexif().get(_ORIENTATION, 1) not in (None, 1):
            im = ImageOps.exif_transpose(im) or im
    except Exception:  # a malformed EXIF block must not make the pixels unusable
        pass
    mode = im.mode
    if mode == "RGB":
        out = im
    elif mode in ("RGBA", "LA", "RGBa", "La", "PA") or (mode == "P" and "transparency" in im.info):
        rgba = (im.convert("LA") if mode == "La" else im).convert("RGBA")  # PIL has no direct La -> RGBA
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        out = Image.alpha_composite(bg, rgba).convert("RGB")
    elif mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(im, dtype=np.float64)
        scale = 257.0 if (mode.startswith("I;16") or arr.max(initial=0) > 255) else 1.0
        arr = np.clip(np.round(arr / scale), 0, 255).astype(np.uint8)
        out = Image.fromarray(arr, "L").convert("RGB")
    elif mode == "F":
        arr = np.asarray(im, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise _Bad("float image contains NaN or Inf")
        arr = arr * 255.0 if arr.max(initial=0) <= 1.0 else arr
        out = Image.fromarray(np.clip(np.round(arr), 0, 255).astype(np.uint8), "L").convert("RGB")
    else:  # 1, L, P, CMYK, YCbCr, LAB, HSV
        out = im.convert("RGB")
    if out is src and not owned:
        out = src.copy()  # never hand out the caller's object (one copy): rewards may resize it in place
    out.load()
    return out


def _float_to_uint8(arr: np.ndarray) -> np.ndarray:
    if not np.isfinite(arr).all():
        raise _Bad("image array contains NaN or Inf")
    lo, hi = float(arr.min(initial=0.0)), float(arr.max(initial=0.0))
    if lo < -_FLOAT_TOL or hi > 1.0 + _FLOAT_TOL:
        # a hint only where the range fits the convention (values in [-1.5, 0.5] are neither)
        if -1.0 - _FLOAT_TOL <= lo < 0 and hi <= 1.0 + _FLOAT_TOL:
            hint = " (looks like [-1, 1]: pass (x + 1) / 2)"
        elif lo >= -_FLOAT_TOL and hi <= 255.0 + _FLOAT_TOL:
            hint = " (looks like [0, 255]: pass uint8 or x / 255)"
        else:
            hint = ""
        raise _Bad(f"float image values must lie in [0, 1], got [{lo:.4g}, {hi:.4g}]{hint}")
    return np.round(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)


def _array_to_pil(arr: np.ndarray, layout: str) -> Image.Image:
    """``arr`` is HW, HWC (layout 'hwc') or CHW (layout 'chw')."""
    if arr.ndim == 3 and layout == "chw":
        arr = np.transpose(arr, (1, 2, 0))
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (3, 4)):
        want = "CxHxW tensor" if layout == "chw" else "HxWxC array"
        raise _Bad(f"cannot read an image of shape {tuple(arr.shape)}: expected HxW or a {want} with C in 1, 3, 4")
    h, w = arr.shape[:2]
    _check_size(w, h)
    if arr.dtype.byteorder not in ("=", "|"):  # big-endian (">u2", e.g. from FITS / network data): as native
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype == np.uint8:
        u8 = arr
    elif arr.dtype == np.uint16:
        u8 = np.round(arr.astype(np.float64) / 257.0).astype(np.uint8)
    elif arr.dtype == np.bool_:
        raise _Bad("boolean arrays are not images; convert masks to uint8 first")
    elif np.issubdtype(arr.dtype, np.floating):
        u8 = _float_to_uint8(arr.astype(np.float64))
    elif np.issubdtype(arr.dtype, np.integer):
        if arr.min(initial=0) < 0 or arr.max(initial=0) > 255:
            raise _Bad(f"integer image values must lie in [0, 255], got [{arr.min()}, {arr.max()}]")
        u8 = arr.astype(np.uint8)
    else:
        raise _Bad(f"unsupported array dtype {arr.dtype}")
    u8 = np.ascontiguousarray(u8)
    if u8.ndim == 2:
        return Image.fromarray(u8, "L").convert("RGB")
    if u8.shape[2] == 4:
        return _pil_to_rgb(Image.fromarray(u8, "RGBA"))
    return Image.fromarray(u8, "RGB")


def _tensor_to_numpy(t: Any) -> np.ndarray:
    t = t.detach()
    if t.is_meta:
        raise _Bad(f"tensor of shape {tuple(t.shape)} is on the 'meta' device and holds no data")
    if t.layout != __import__("torch").strided:
        raise _Bad(f"{t.layout} tensors are not images; pass a dense tensor (.to_dense())")
    if t.is_complex():
        raise _Bad("complex tensors are not images")
    if t.dtype.is_floating_point and t.dtype not in (__import__("torch").float32, __import__("torch").float64):
        t = t.float()  # bf16 / fp16 have no numpy dtype
    return t.cpu().numpy()


def to_pil(x: ImageLike, official: Any = None) -> Image.Image:
    """Convert one image of any accepted kind to canonical RGB PIL; raises ``RewardInputError``.

    ``official``: None (rewardkit's corrected conversions), or a function from a PIL image as opened to an RGB
    PIL image, the conversion of a published reward's original package, applied to files, bytes and PIL images
    (arrays and tensors are decoded as always)."""
    try:
        return _to_pil(x, official)
    except _Bad as exc:
        raise RewardInputError(str(exc)) from None


class _TruncatedFlag:
    """Stands in for PIL's module global ``ImageFile.LOAD_TRUNCATED_IMAGES`` once a host program has set it:
    everywhere it reads as the value the host set, except in a thread that is decoding for rewardkit
    (:func:`_strict_decoding`), where it reads False. PIL consults the global at decode time (``if
    LOAD_TRUNCATED_IMAGES:``), so this is the only per-thread way to keep truncated files refused here without
    changing what the host's own decoding does in its other threads."""

    _local = threading.local()

    def __init__(self, value: Any) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return False if getattr(_TruncatedFlag._local, "strict", False) else bool(self.value)

    def __repr__(self) -> str:
        return repr(bool(self))

    def __eq__(self, other: Any) -> bool:
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))


_flag_lock = threading.Lock()


class _ImageFileModule(types.ModuleType):
    """The class given to ``PIL.ImageFile`` (a plain module otherwise): every later assignment of
    ``LOAD_TRUNCATED_IMAGES`` (a host library that sets it in its loader, on every call, from any thread) stores
    a :class:`_TruncatedFlag`, so the value is never a plain True while rewardkit decodes in another thread."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "LOAD_TRUNCATED_IMAGES" and not isinstance(value, _TruncatedFlag):
            value = _TruncatedFlag(value)
        super().__setattr__(name, value)


def _guard_truncated_flag() -> None:
    """Install :class:`_ImageFileModule` on ``PIL.ImageFile`` once (idempotent, thread-safe); where that module
    is not a plain module, wrap the current value only (a later plain assignment is then read as set)."""
    from PIL import ImageFile

    if isinstance(ImageFile, _ImageFileModule) and isinstance(ImageFile.LOAD_TRUNCATED_IMAGES, _TruncatedFlag):
        return
    with _flag_lock:
        if type(ImageFile) is types.ModuleType:
            ImageFile.__class__ = _ImageFileModule
        flag = ImageFile.LOAD_TRUNCATED_IMAGES
        if not isinstance(flag, _TruncatedFlag):
            ImageFile.LOAD_TRUNCATED_IMAGES = _TruncatedFlag(flag)  # type: ignore[assignment]


class _strict_decoding:
    """``with _strict_decoding():`` truncated images are refused in this thread, whatever another library set
    ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` to (re-entrant, thread-safe)."""

    def __enter__(self) -> None:
        _guard_truncated_flag()
        self._prev = getattr(_TruncatedFlag._local, "strict", False)
        _TruncatedFlag._local.strict = True

    def __exit__(self, *exc: Any) -> None:
        _TruncatedFlag._local.strict = self._prev


def _to_pil(x: ImageLike, official: Any = None, header_check: Any = None) -> Image.Image:
    """One input -> canonical RGB PIL. Anything that goes wrong is a per-image ``_Bad`` (never a raw error).
    ``header_check``: for encoded input (a path or bytes, :func:`_is_encoded`), a callable ``(w, h)`` run on the
    header's size before any pixel is decoded (see :func:`_open_encoded`); ignored for other inputs."""
    try:
        with _strict_decoding():
            return _to_pil_unchecked(x, official, header_check)
    except _Bad:
        raise
    except MemoryError:
        raise _Bad("out of memory while decoding the image") from None
    except Exception as exc:  # noqa: BLE001 -- one sample's failure must not take down the batch
        raise _Bad(f"cannot read the image ({type(exc).__name__}: {exc})") from None


def probe_size(x: ImageLike) -> tuple[int, int]:
    """``(width, height)`` of one input without decoding its pixels (encoded files: the header only).

    Raises ``RewardInputError`` for inputs that are not images at all; a file whose pixel data is corrupt
    may still probe fine (the error then comes when it is decoded)."""
    try:
        return _probe(x)
    except _Bad as exc:
        raise RewardInputError(str(exc)) from None


def _probe(x: ImageLike) -> tuple[int, int]:
    try:
        if isinstance(x, Image.Image):
            return x.size
        if isinstance(x, (str, os.PathLike)):
            s = os.fspath(x)
            s = s.decode() if isinstance(s, bytes) else s
            if not s.strip():
                raise _Bad("empty path")
            path = Path(s).expanduser()
            data = None
        elif isinstance(x, (bytes, bytearray, memoryview)):
            path, data = None, bytes(x)
        elif isinstance(x, np.ndarray):
            if x.ndim == 2:
                return (x.shape[1], x.shape[0])
            if x.ndim == 3:
                return (x.shape[1], x.shape[0])
            raise _Bad(f"cannot read an image of shape {tuple(x.shape)}")
        elif _is_tensor(x):
            if x.ndim == 2:
                return (int(x.shape[1]), int(x.shape[0]))
            if x.ndim == 3:
                return (int(x.shape[2]), int(x.shape[1]))
            raise _Bad(f"cannot read an image of shape {tuple(x.shape)}")
        elif x is None:
            raise _Bad("image is None")
        else:
            raise _Bad(f"unsupported image type {type(x).__name__}")
        # encoded: open lazily, read the header, close (no pixels decoded)
        _check_encoded_source(data, path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path if path is not None else io.BytesIO(data)) as im:
                return im.size
    except _Bad:
        raise
    except Image.DecompressionBombError as exc:
        raise _Bad(f"image is over the limit of {min(_max_pixels, 2 * (Image.MAX_IMAGE_PIXELS or 0)):,} pixels "
                   f"(decompression-bomb guard; PIL: {exc})") from None
    except UnidentifiedImageError:
        raise _Bad(f"{'file ' + str(path) if path is not None else 'bytes'} is not a recognised image format") from None
    except Exception as exc:  # noqa: BLE001
        raise _Bad(f"corrupt or truncated image (unreadable header: {type(exc).__name__}: {exc})") from None


def _is_encoded(x: Any) -> bool:
    """Whether ``x`` is encoded input (a path or bytes): its size is known only from its header."""
    return isinstance(x, (str, os.PathLike, bytes, bytearray, memoryview))


def _to_pil_unchecked(x: ImageLike, official: Any = None, header_check: Any = None) -> Image.Image:
    if isinstance(x, Image.Image):
        return _pil_to_rgb(x, official=official)
    if isinstance(x, (str, os.PathLike)):
        s = os.fspath(x)
        if isinstance(s, bytes):
            s = s.decode()
        if not s.strip():
            raise _Bad("empty path")
        # close the file (animated images keep it open)
        with _open_encoded(None, Path(s).expanduser(), header_check) as im:
            return _pil_to_rgb(im, owned=True, official=official)
    if isinstance(x, (bytes, bytearray, memoryview)):
        with _open_encoded(bytes(x), None, header_check) as im:
            return _pil_to_rgb(im, owned=True, official=official)
    if isinstance(x, np.ndarray):
        if x.ndim == 3 and x.shape[0] in (1, 3, 4) and x.shape[2] not in (1, 3, 4):
            raise _Bad(f"numpy images must be HxWxC; got shape {x.shape}, which looks like CxHxW (transpose it)")
        return _array_to_pil(x, "hwc")
    if _is_tensor(x):
        return _array_to_pil(_tensor_to_numpy(x), "chw")
    if x is None:
        raise _Bad("image is None")
    raise _Bad(f"unsupported image type {type(x).__name__}")


def split_batch(images: Any) -> list[Any]:
    """Turn any accepted batch form into a list of per-image items (not yet decoded).

    A BxCxHxW tensor or a BxHxWxC array is split along B; a single image becomes a list of one.
    Raises ``RewardInputError`` (call-level) for things that are not a batch of images at all.
    """
    if images is None:
        raise RewardInputError("images is None")
    if isinstance(images, (list, tuple)):
        return list(images)
    if _is_tensor(images):
        if images.ndim == 4:
            try:
                return list(images.unbind(0))
            except Exception as exc:  # noqa: BLE001 -- e.g. a sparse layout that cannot be split
                raise RewardInputError(f"cannot split the image batch tensor ({images.layout}, "
                                       f"{images.device}): {type(exc).__name__}: {exc}") from None
        if images.ndim in (2, 3):
            return [images]
        raise RewardInputError(f"image tensor must be CxHxW or BxCxHxW, got shape {tuple(images.shape)}")
    if isinstance(images, np.ndarray):
        if images.ndim == 4:
            return list(images)
        if images.ndim in (2, 3):
            return [images]
        raise RewardInputError(f"image array must be HxWxC or BxHxWxC, got shape {images.shape}")
    if isinstance(images, (Image.Image, str, os.PathLike, bytes, bytearray, memoryview)):
        return [images]
    if isinstance(images, (dict, set)):
        raise RewardInputError(f"images must be a list or batch tensor, got {type(images).__name__}")
    try:
        return list(images)  # generators, datasets columns
    except TypeError:
        raise RewardInputError(f"unsupported images type {type(images).__name__}") from None


def load_image(x: ImageLike, official: Any = None) -> Image.Image:
    """Public alias of :func:`to_pil` for users who want rewardkit's decoding rules in their own code."""
    return to_pil(x, official)


def pil_to_uint8(im: Image.Image):
    """RGB PIL -> torch uint8 tensor ``(3, H, W)``."""
    import torch

    return torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()


def pil_to_float(im: Image.Image):
    """RGB PIL -> torch float32 tensor ``(3, H, W)`` in [0, 1]."""
    return pil_to_uint8(im).float().div_(255.0)


def image_hash(im: Image.Image) -> str:
    """Content hash of a canonical image (size + pixels): equal pixels, equal hash, whatever the source."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(f"{im.width}x{im.height}:{im.mode}".encode())
    h.update(im.tobytes())
    return h.hexdigest()
