"""Bad-input corpus: every entry gets a clear error naming the sample, or a documented conversion.

The corpus is generated here (no binary fixtures). A trivial pixel-statistics reward is the subject, so the
test isolates the base class and media.py: every real reward uses the same plumbing.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.errors import RewardInputError
from rewardkit.reward import Reward, RewardBatch, RewardOutput


class MeanPixel(Reward):
    """Mean of the RGB pixels in [0, 1] (test subject)."""

    name = "mean-pixel"
    tasks = frozenset({"t2i"})

    def _score(self, batch: RewardBatch) -> RewardOutput:
        return RewardOutput(scores=torch.tensor([np.asarray(im, dtype=np.float64).mean() / 255 for im in batch.images]))


class MeanPixelEdit(MeanPixel):
    name = "mean-pixel-edit"
    tasks = frozenset({"edit"})


def _png(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", **kw)
    return buf.getvalue()


def _bomb_png(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR claims width x height (decoding would need width*height pixels)."""
    data = bytearray(_png(Image.new("L", (1, 1))))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr:ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def _exif_rotated_jpeg() -> bytes:
    im = Image.new("RGB", (40, 20), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW on display
    return _jpeg(im, exif=exif)


def _animated_gif() -> bytes:
    frames = [Image.new("P", (16, 16), c) for c in (10, 200)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buf.getvalue()


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8), "RGB")


@dataclass
class Case:
    name: str
    make: Callable[[Any], Any]  # tmp_path -> image input
    error: str | None = None  # substring of the expected error, or None for a documented conversion
    check: Callable[[Image.Image], None] | None = None


def _write(tmp, name, data: bytes):
    p = tmp / name
    p.write_bytes(data)
    return p


def _is_rgb(size=None, pixel=None):
    def check(im: Image.Image):
        assert im.mode == "RGB"
        if size is not None:
            assert im.size == size, im.size
        if pixel is not None:
            assert im.getpixel((0, 0)) == pixel, im.getpixel((0, 0))
    return check


CORPUS = [
    # --- refused: corrupt / empty / not an image
    Case("truncated png file", lambda t: _write(t, "trunc.png", _png(RGB)[:60]), "truncated"),
    Case("truncated jpeg bytes", lambda t: _jpeg(RGB)[: len(_jpeg(RGB)) // 2], "truncated"),
    Case("garbage after png signature", lambda t: b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "not a recognised image"),
    Case("zero-byte file", lambda t: _write(t, "empty.png", b""), "empty file"),
    Case("zero-length bytes", lambda t: b"", "empty bytes"),
    Case("text bytes", lambda t: b"hello, I am not an image", "not a recognised image"),
    Case("text file with .png name", lambda t: _write(t, "fake.png", b"just text"), "not a recognised image"),
    Case("missing file", lambda t: t / "does-not-exist.png", "file not found"),
    Case("directory path", lambda t: t, "is a directory"),
    Case("empty path string", lambda t: "  ", "empty path"),
    Case("None", lambda t: None, "image is None"),
    Case("unsupported type", lambda t: {"image": 1}, "unsupported image type"),
    # --- refused: size
    Case("decompression-bomb header", lambda t: _bomb_png(100_000, 100_000), "over the limit"),
    Case("zero-size numpy", lambda t: np.zeros((0, 10, 3), np.uint8), "zero-size"),
    # --- refused: arrays / tensors
    Case("numpy float NaN", lambda t: np.full((8, 8, 3), np.nan, np.float32), "NaN or Inf"),
    Case("tensor with Inf", lambda t: torch.full((3, 8, 8), float("inf")), "NaN or Inf"),
    Case("tensor in [-1, 1]", lambda t: torch.linspace(-1, 1, 192).reshape(3, 8, 8), "[-1, 1]"),
    Case("float tensor in [0, 255]", lambda t: torch.full((3, 8, 8), 128.0), "[0, 255]"),
    Case("numpy CHW layout", lambda t: np.zeros((3, 16, 16), np.uint8), "looks like CxHxW"),
    Case("five channels", lambda t: np.zeros((8, 8, 5), np.uint8), "expected HxW"),
    Case("boolean mask", lambda t: np.ones((8, 8), bool), "boolean"),
    Case("int array out of range", lambda t: np.full((4, 4, 3), 300, np.int32), "[0, 255]"),
    Case("complex tensor", lambda t: torch.zeros(3, 4, 4, dtype=torch.complex64), "complex"),
    # --- documented conversions
    Case("CMYK jpeg", lambda t: _jpeg(RGB.convert("CMYK")), check=_is_rgb((24, 24))),
    Case("palette png", lambda t: _png(RGB.convert("P")), check=_is_rgb((24, 24))),
    Case("palette with transparency -> white", lambda t: _png(Image.new("P", (4, 4), 0), transparency=0),
         check=_is_rgb((4, 4), (255, 255, 255))),
    Case("16-bit grayscale png", lambda t: _png(Image.fromarray(np.full((6, 6), 65535, np.uint16))),
         check=_is_rgb((6, 6), (255, 255, 255))),
    Case("RGBA transparent -> white", lambda t: Image.new("RGBA", (5, 5), (0, 0, 0, 0)),
         check=_is_rgb((5, 5), (255, 255, 255))),
    Case("RGBA opaque keeps colour", lambda t: Image.new("RGBA", (5, 5), (10, 20, 30, 255)),
         check=_is_rgb((5, 5), (10, 20, 30))),
    Case("LA grayscale+alpha", lambda t: Image.new("LA", (5, 5), (0, 0)), check=_is_rgb((5, 5), (255, 255, 255))),
    Case("grayscale L", lambda t: Image.new("L", (7, 3), 77), check=_is_rgb((7, 3), (77, 77, 77))),
    Case("1-bit", lambda t: Image.new("1", (7, 3), 1), check=_is_rgb((7, 3), (255, 255, 255))),
    Case("EXIF-rotated jpeg is upright", lambda t: _exif_rotated_jpeg(), check=_is_rgb((20, 40))),
    Case("animated gif -> first frame", lambda t: _animated_gif(), check=_is_rgb((16, 16))),
    Case("uint16 RGB array", lambda t: np.full((4, 4, 3), 257 * 9, np.uint16), check=_is_rgb((4, 4), (9, 9, 9))),
    Case("float16 tensor", lambda t: torch.full((3, 4, 4), 0.5, dtype=torch.float16), check=_is_rgb((4, 4), (128, 128, 128))),
    Case("grayscale HW tensor", lambda t: torch.zeros(5, 6), check=_is_rgb((6, 5), (0, 0, 0))),
    Case("single-channel HWC array", lambda t: np.full((5, 6, 1), 3, np.uint8), check=_is_rgb((6, 5), (3, 3, 3))),
    Case("float slightly above 1 is clipped", lambda t: np.full((2, 2, 3), 1.0004, np.float32),
         check=_is_rgb((2, 2), (255, 255, 255))),
]


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 20
    assert sum(c.error is not None for c in CORPUS) >= 15


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_bad_input(case: Case, tmp_path):
    reward = MeanPixel()
    good = RGB
    bad = case.make(tmp_path)
    images = [good, bad, good]
    if case.error is not None:
        with pytest.raises(RewardInputError) as info:
            reward(images, "a prompt")
        assert info.value.index == 1, "the error must name the offending sample"
        assert case.error in str(info.value), str(info.value)
        out = reward(images, "a prompt", on_error="nan")
        assert out.valid.tolist() == [True, False, True]
        assert torch.isnan(out.scores[1]) and case.error in out.errors[1]
        assert torch.isfinite(out.scores[[0, 2]]).all()
    else:
        im = media.to_pil(bad)
        case.check(im)
        out = reward(images, "a prompt")
        assert out.valid.all()


def test_bomb_limit_is_configurable():
    media.set_max_pixels(100)
    try:
        with pytest.raises(RewardInputError, match="over the limit of 100"):
            MeanPixel()([np.zeros((20, 20, 3), np.uint8)], "p")
    finally:
        media.set_max_pixels(None)
    assert MeanPixel()([np.zeros((20, 20, 3), np.uint8)], "p").valid.all()
    with pytest.raises(ValueError):
        media.set_max_pixels(0)


# ----------------------------------------------------------------- call-level problems (always raise)
@pytest.mark.parametrize("kwargs, message", [
    (dict(images=[RGB, RGB], prompt=["a"]), "2 images but 1 prompts"),
    (dict(images=[RGB], prompt=None), "needs a prompt"),
    (dict(images=[RGB], prompt=b"bytes"), "decode it first"),
    (dict(images=[RGB], prompt=42), "string or a list of strings"),
    (dict(images=[RGB], prompt="p", metadata=[{}, {}]), "1 images but 2 metadata"),
    (dict(images=[RGB], prompt="p", metadata={"intent": "strict"}), "list of per-sample dicts"),
    (dict(images=None, prompt="p"), "images is None"),
    (dict(images=torch.zeros(2, 2, 3, 4, 4), prompt="p"), "CxHxW or BxCxHxW"),
    (dict(images=[RGB], prompt="p", sources=[[RGB]]), "does not take sources"),
])
def test_call_level_errors(kwargs, message):
    with pytest.raises(RewardInputError, match=message.replace("[", r"\[")):
        MeanPixel()(**kwargs)


@pytest.mark.parametrize("prompt, message", [("", "prompt is empty"), ("   ", "prompt is empty"),
                                             (None, "prompt must be a string"), (3, "prompt must be a string")])
def test_bad_prompt_in_list(prompt, message):
    out = MeanPixel()([RGB, RGB], ["fine", prompt], on_error="nan")
    assert out.valid.tolist() == [True, False] and message in out.errors[1]
    with pytest.raises(RewardInputError, match="sample 1"):
        MeanPixel()([RGB, RGB], ["fine", prompt])


def test_sources_rules():
    edit = MeanPixelEdit()
    with pytest.raises(RewardInputError, match="needs sources"):
        edit([RGB], "p")
    with pytest.raises(RewardInputError, match="1 images but 2 source entries"):
        edit([RGB], "p", sources=[[RGB], [RGB]])
    out = edit([RGB, RGB, RGB], "p", sources=[[RGB], [RGB, RGB], []], on_error="nan")
    assert out.valid.tolist() == [True, False, False]
    assert "takes one" in out.errors[1] and "at least one source" in out.errors[2]
    out = edit([RGB], "p", sources=[b"junk"], on_error="nan")
    assert "source 0" in out.errors[0]
    assert edit([RGB], "p", sources=[RGB]).valid.all()  # a bare image is a list of one


def test_on_error_and_batch_size_are_validated():
    with pytest.raises(ValueError, match="on_error"):
        MeanPixel()([RGB], "p", on_error="ignore")
    with pytest.raises(ValueError, match="batch_size"):
        MeanPixel()([RGB], "p", batch_size=0)


def test_caller_image_is_not_modified():
    im = Image.new("RGBA", (4, 4), (1, 2, 3, 0))
    MeanPixel()([im], "p")
    assert im.mode == "RGBA" and im.getpixel((0, 0)) == (1, 2, 3, 0)


# ----------------------------------------------------------------- one rule per input, whatever the path
LONE = "a cat \udc80 on a mat"   # a lone surrogate: what json.loads("\"\\udc80\"") or surrogateescape give


def test_lone_surrogate_is_that_samples_input_error():
    """Bug: a lone surrogate in one prompt failed the whole call (the tokenizer's TypeError inside _score)."""
    out = MeanPixel()([RGB, RGB], ["fine", LONE], on_error="nan")
    assert out.valid.tolist() == [True, False] and "lone surrogate '\\udc80' at position 6" in out.errors[1]
    with pytest.raises(RewardInputError, match="sample 1.*not valid Unicode"):
        MeanPixel()([RGB, RGB], ["fine", LONE])


def test_lone_surrogate_real_reward_server_and_cli(tiny_clip_dir, tmp_path):
    """The same through a real tokenizer (tiny CLIP), the server (a per-sample error, not HTTP 500) and
    ``rewardkit score --jsonl`` (exit 3: some samples invalid; before: exit 1)."""
    import json

    from rewardkit import load_reward

    clip = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    out = clip([RGB, RGB], ["a red square", LONE], on_error="nan")
    assert out.valid.tolist() == [True, False] and "lone surrogate" in out.errors[1]
    x = torch.rand(2, 3, 24, 24)  # the tensor path checks prompts the same way
    out = clip(x, ["a red square", LONE], on_error="nan")
    assert out.valid.tolist() == [True, False] and "lone surrogate" in out.errors[1]

    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")
    from rewardkit.serve.server import ServerConfig, serve_in_thread

    handle = serve_in_thread(clip, ServerConfig(max_batch=8, max_wait_ms=5.0))
    try:
        img = __import__("base64").b64encode(_png(RGB)).decode()
        body = '{"images": ["%s", "%s"], "prompt": ["a red square", "a \\udc80 cat"]}' % (img, img)
        resp = httpx.post(handle.url + "/score", content=body.encode(), timeout=30,
                          headers={"Content-Type": "application/json"})
        assert resp.status_code == 200, resp.text
        got = resp.json()
        assert got["valid"] == [True, False] and "lone surrogate" in got["errors"][1]
    finally:
        handle.stop()

    from rewardkit.cli import main

    (tmp_path / "a.png").write_bytes(_png(RGB))
    items = tmp_path / "items.jsonl"
    items.write_text('{"prompt": "a red square", "image": "a.png"}\n{"prompt": "bad \\udc80 x", "image": "a.png"}\n')
    rc = main(["score", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--jsonl", str(items),
               "--output", str(tmp_path / "out.jsonl")])
    assert rc == 3
    recs = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["valid"] for r in recs] == [True, False] and "lone surrogate" in recs[1]["error"]


class TensorMean(MeanPixel):
    """Takes float [B, 3, H, W] tensors as they are (the tensor fast path): score = their mean."""

    name = "tensor-mean"

    @property
    def supports_tensor_input(self) -> bool:
        return True

    def _score(self, batch: RewardBatch) -> RewardOutput:
        if isinstance(batch.images, torch.Tensor):
            return RewardOutput(scores=batch.images.float().mean(dim=(1, 2, 3)))
        return super()._score(batch)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_tensor_batch_is_scored_like_its_float32_values(dtype):
    """Bug: a 4-D float8 tensor crashed the tensor path (no aminmax kernel for float8). It is widened to float32
    (exactly: every float8 value is a float32 value) and scored like the float32 tensor of the same values."""
    x8 = torch.rand(3, 3, 8, 8).to(dtype)
    x32 = x8.float()
    got = TensorMean()(x8, "p")
    assert got.valid.all() and torch.equal(got.scores, TensorMean()(x32, "p").scores)
    assert got.scores.tolist() == pytest.approx(x32.mean(dim=(1, 2, 3)).tolist())
    bad = x32.clone()
    bad[1] = 2.0
    out = TensorMean()(bad.to(dtype), "p", on_error="nan")
    assert out.valid.tolist() == [True, False, True] and "[0, 1]" in out.errors[1]


def test_non_dict_metadata_is_per_sample_on_both_paths():
    """Bug: a metadata entry that is not a dict was that sample's error on the PIL path but failed the whole call
    on the tensor path."""
    x = torch.rand(2, 3, 8, 8)
    for images in (x, [RGB, RGB]):
        out = TensorMean()(images, "p", metadata=[{}, 5], on_error="nan")
        assert out.valid.tolist() == [True, False] and "metadata entries must be dicts" in out.errors[1]
        with pytest.raises(RewardInputError, match="sample 1"):
            TensorMean()(images, "p", metadata=[{}, 5])


def _truncated(fmt: str) -> bytes:
    im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8), "RGB")
    data = _png(im) if fmt == "png" else _jpeg(im, quality=95)
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_truncated_images_refused_even_when_pil_is_told_to_accept_them(fmt):
    """Bug: another library setting PIL's global ``ImageFile.LOAD_TRUNCATED_IMAGES = True`` made rewardkit score
    half-decoded images. rewardkit decodes strictly in its own threads; the host's setting is kept for its own
    decoding (in this thread outside rewardkit, and in other threads meanwhile)."""
    import threading

    from PIL import ImageFile

    data = _truncated(fmt)
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        out = MeanPixel()([RGB, data], "p", on_error="nan")
        assert out.valid.tolist() == [True, False] and "truncated" in out.errors[1], out.errors
        assert bool(ImageFile.LOAD_TRUNCATED_IMAGES)           # the host's setting is unchanged for the host
        Image.open(io.BytesIO(data)).load()                    # ... which still accepts it outside rewardkit
        seen = []

        def host_thread():
            Image.open(io.BytesIO(data)).load()  # would raise OSError if rewardkit's strictness leaked
            seen.append(True)

        ts = [threading.Thread(target=host_thread) for _ in range(4)]
        for t in ts:
            t.start()
        outs = [MeanPixel()([data] * 4, "p", on_error="nan") for _ in range(3)]
        for t in ts:
            t.join(10)
        assert seen == [True] * 4 and all(not o.valid.any() for o in outs)
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = old


def test_truncated_images_refused_while_another_thread_keeps_setting_pil_flag():
    """Bug: a host loader that assigns ``ImageFile.LOAD_TRUNCATED_IMAGES = True`` on every call (from its own
    thread) replaced rewardkit's per-thread flag between its check and its decode: about two thirds of the
    truncated PNGs / JPEGs decoded here were accepted. Every later assignment is now stored per-thread aware."""
    import threading

    from PIL import ImageFile

    data = [_truncated("png"), _truncated("jpeg")]
    old = ImageFile.LOAD_TRUNCATED_IMAGES
    stop = threading.Event()
    host_ok = []

    def host_loader():
        while not stop.is_set():
            ImageFile.LOAD_TRUNCATED_IMAGES = True
            Image.open(io.BytesIO(data[1])).load()  # the host's own lenient decode still works
            host_ok.append(True)
            ImageFile.LOAD_TRUNCATED_IMAGES = False

    t = threading.Thread(target=host_loader)
    t.start()
    try:
        outs = [MeanPixel()(data, "p", on_error="nan") for _ in range(60)]
    finally:
        stop.set()
        t.join(10)
        ImageFile.LOAD_TRUNCATED_IMAGES = old
    accepted = sum(int(o.valid.sum()) for o in outs)
    assert accepted == 0 and host_ok, (accepted, len(host_ok))
    assert all("truncated" in e for o in outs for e in o.errors)


@pytest.mark.parametrize("dtype", [">u2", ">f4", ">f8", ">i4"])
def test_big_endian_arrays_read_like_native_ones(dtype):
    """Bug: a big-endian uint16 array (FITS, network data) was refused as 'integer values outside [0, 255]'."""
    rng = np.random.default_rng(1)
    if dtype == ">u2":
        native = rng.integers(0, 65536, (8, 8, 3)).astype("=u2")
    elif dtype == ">i4":
        native = rng.integers(0, 256, (8, 8, 3)).astype("=i4")
    else:
        native = rng.random((8, 8, 3)).astype("=" + dtype[1:])
    big = native.astype(dtype)
    assert big.dtype.byteorder == ">" and np.array_equal(big, native)
    a, b = MeanPixel()([native, big], "p").scores.tolist()
    assert a == b
    assert np.array_equal(np.asarray(media.to_pil(big)), np.asarray(media.to_pil(native)))
