"""Documented contracts of ``rewardkit.media`` that the bad-input corpus leaves open (found by mutation testing):
exact limits (pixel count, aspect ratio, float tolerance), the conversion rules as numbers, the size a
processor resizes to, header-only probing, batch splitting, and the small public helpers.

Expected values are hand-computed from the documented rules (``round(x * 255)``, ``value / 257``,
compositing onto white, ...).
"""

from __future__ import annotations

import hashlib
import io
import types

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.errors import RewardInputError


@pytest.fixture(autouse=True)
def _limits():
    yield
    media.set_max_pixels(None)
    media.set_max_aspect_ratio()


def _bad(x, match):
    with pytest.raises(RewardInputError, match=match):
        media.to_pil(x)


def _px(x):
    return np.asarray(media.to_pil(x))


def _png(im, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG", **kw)
    return buf.getvalue()


# ------------------------------------------------------------------ limits
def test_pixel_limit_boundary_and_setter():
    assert media.get_max_pixels() == 178_956_970
    media.set_max_pixels(12)
    assert media.get_max_pixels() == 12
    assert media.to_pil(np.zeros((3, 4), np.uint8)).size == (4, 3)           # exactly the limit: accepted
    _bad(np.zeros((13, 1), np.uint8), r"^image is 1x13 = 13 pixels, over the limit of 12 \(decompression-bomb")
    assert media.probe_size(np.zeros((13, 1), np.uint8)) == (1, 13)         # probing does not check limits
    media.set_max_pixels(None)
    assert media.get_max_pixels() == 178_956_970
    for bad in (0, -5, 2.5, "10"):
        with pytest.raises(ValueError, match="max pixels must be a positive int"):
            media.set_max_pixels(bad)
    assert media.get_max_pixels() == 178_956_970


def test_aspect_ratio_boundary_and_setter():
    assert media.get_max_aspect_ratio() == 200.0
    media.set_max_aspect_ratio(4)
    assert media.get_max_aspect_ratio() == 4.0 and isinstance(media.get_max_aspect_ratio(), float)
    assert media.to_pil(np.zeros((2, 8), np.uint8)).size == (8, 2)           # ratio exactly 4: accepted
    _bad(np.zeros((2, 9), np.uint8), r"^image is 9x2: aspect ratio 4.5 exceeds the limit of 4 \(a model's shortest-edge "
         r"resize would blow it up; change it with rewardkit.media.set_max_aspect_ratio or REWARDKIT_MAX_ASPECT_RATIO\)$")
    _bad(np.zeros((9, 2), np.uint8), "aspect ratio 4.5 exceeds")             # either orientation
    media.set_max_aspect_ratio(None)
    assert media.get_max_aspect_ratio() is None
    assert media.to_pil(np.zeros((1, 1000), np.uint8)).size == (1000, 1)
    media.set_max_aspect_ratio(1)                                           # 1 is allowed: squares only
    _bad(np.zeros((2, 3), np.uint8), "aspect ratio 1.5")
    for bad in (0.99, 0, True, "3", float("nan")):
        with pytest.raises(ValueError, match="max aspect ratio must be a number >= 1 or None"):
            media.set_max_aspect_ratio(bad)
    media.set_max_aspect_ratio()                                            # no argument: the default
    assert media.get_max_aspect_ratio() == 200.0


def test_zero_size_sides():
    _bad(np.zeros((0, 4), np.uint8), r"zero-size side \(4x0\)")
    _bad(Image.new("RGB", (0, 3)), r"zero-size side \(0x3\)")


# ------------------------------------------------------------------ conversions, as numbers
def test_float_rules_round_clip_and_tolerance():
    x = np.array([[0.0, 0.5, 1 / 255, 0.4 / 255, 0.6 / 255, 1.0]])
    assert _px(x)[0, :, 0].tolist() == [0, 128, 1, 0, 1, 255]               # round(x * 255)
    assert _px(np.array([[-0.001, 1.001]]))[0, :, 0].tolist() == [0, 255]   # within 1e-3: clipped
    _bad(np.array([[-0.0011, 0.5]]), r"got \[-0.0011, 0.5\] \(looks like \[-1, 1\]: pass \(x \+ 1\) / 2\)")
    _bad(np.array([[0.0, 1.0011]]), r"got \[0, 1.001\] \(looks like \[0, 255\]: pass uint8 or x / 255\)$")
    _bad(np.array([[0.0, 255.0]]), r"looks like \[0, 255\]")
    _bad(np.array([[0.0, 255.01]]), r"values must lie in \[0, 1\], got \[0, 255\]$")  # no hint above 255
    _bad(np.array([[-1.5, 300.0]]), r"got \[-1.5, 300\]$")                              # no hint for either
    _bad(np.array([[-1.0, 1.0]]), r"got \[-1, 1\] \(looks like \[-1, 1\]")            # -1 itself: the [-1, 1] hint
    _bad(np.array([[-1.5, 0.5]]), r"got \[-1.5, 0.5\]$")                  # neither convention: no hint
    _bad(np.array([[-0.5, 200.0]]), r"got \[-0.5, 200\]$")                # negative and above 1: no hint
    _bad(np.array([[0.5, np.inf]]), "NaN or Inf")
    # a float tensor follows the same rules (CHW layout)
    assert _px(torch.tensor([[[0.5]], [[1.0]], [[0.0]]], dtype=torch.bfloat16))[0, 0].tolist() == [128, 255, 0]
    assert _px(torch.tensor([[[0.25]], [[0.75]], [[1 / 255]]], dtype=torch.float64))[0, 0].tolist() == [64, 191, 1]


def test_integer_rules():
    u16 = np.array([[0, 128, 129, 257 * 100, 65535]], np.uint16)
    assert _px(u16)[0, :, 0].tolist() == [0, 0, 1, 100, 255]                  # round(v / 257)
    assert _px(np.array([[0, 7, 255]], np.int32))[0, :, 0].tolist() == [0, 7, 255]
    assert _px(np.array([[0, 7, 255]], np.int64))[0, :, 1].tolist() == [0, 7, 255]
    _bad(np.array([[0, 256]], np.int32), r"integer image values must lie in \[0, 255\], got \[0, 256\]")
    _bad(np.array([[-1, 3]], np.int16), r"got \[-1, 3\]")
    _bad(np.array([["a", "b"]]), "unsupported array dtype <U1")
    _bad(torch.ones(3, 2, 2, dtype=torch.bool), "boolean arrays are not images")


def test_shapes_and_layouts():
    chw = torch.zeros(3, 2, 5, dtype=torch.uint8)
    chw[0] = 10
    chw[2, 1, 4] = 99
    im = media.to_pil(chw)
    assert im.size == (5, 2) and im.getpixel((4, 1)) == (10, 0, 99)
    assert media.to_pil(torch.full((1, 2, 3), 7, dtype=torch.uint8)).getpixel((2, 1)) == (7, 7, 7)
    _bad(torch.empty(3, 2, 2, device="meta"),
         r"^tensor of shape \(3, 2, 2\) is on the 'meta' device and holds no data$")
    _bad(torch.zeros(3, 2, 2).to_sparse(),
         r"^torch.sparse_coo tensors are not images; pass a dense tensor \(.to_dense\(\)\)$")
    _bad(torch.zeros(3, 2, 2, dtype=torch.complex64), "^complex tensors are not images$")
    param = torch.nn.Parameter(torch.full((3, 2, 2), 0.2))   # a module's weight is a tensor too
    assert media.to_pil(param).getpixel((0, 0)) == (51, 51, 51) and media.probe_size(param) == (2, 2)
    hwc = np.zeros((2, 5, 3), np.uint8)
    hwc[1, 4] = (1, 2, 3)
    assert media.to_pil(hwc).getpixel((4, 1)) == (1, 2, 3)
    # a CHW-looking numpy array is refused only when the last axis cannot be channels
    assert media.to_pil(np.zeros((3, 5, 3), np.uint8)).size == (5, 3)
    _bad(np.zeros((4, 6, 7), np.uint8), r"looks like CxHxW \(transpose it\)")
    _bad(np.zeros((5, 6, 2), np.uint8), r"shape \(5, 6, 2\): expected HxW or a HxWxC array with C in 1, 3, 4")
    _bad(torch.zeros(2, 5, 6), r"shape \(5, 6, 2\): expected HxW or a CxHxW tensor with C in 1, 3, 4")
    _bad(np.zeros((2, 2, 2, 3), np.uint8), r"cannot read an image of shape \(2, 2, 2, 3\)")
    _bad(np.zeros(5, np.uint8), r"cannot read an image of shape \(5,\)")


def test_alpha_is_composited_onto_white():
    rgba = np.zeros((1, 3, 4), np.uint8)
    rgba[0, 0] = (0, 0, 0, 0)       # transparent -> white
    rgba[0, 1] = (10, 20, 30, 255)  # opaque -> itself
    rgba[0, 2] = (0, 0, 0, 51)      # 20 % black over white: 255 * (1 - 0.2) = 204
    want = [[255, 255, 255], [10, 20, 30], [204, 204, 204]]
    assert _px(rgba)[0].tolist() == want
    assert _px(Image.fromarray(rgba, "RGBA"))[0].tolist() == want
    assert _px(torch.from_numpy(rgba).permute(2, 0, 1))[0].tolist() == want
    # premultiplied RGBa: transparent is white too
    assert _px(Image.new("RGBa", (1, 1), (0, 0, 0, 0)))[0, 0].tolist() == [255, 255, 255]
    pa = Image.new("PA", (1, 1))
    pa.putpalette([10, 20, 30] * 256)
    pa.putpixel((0, 0), (0, 0))
    assert _px(pa)[0, 0].tolist() == [255, 255, 255]
    # premultiplied La (PIL converts it only to LA): transparent -> white, opaque grey -> itself, 20 % black -> 204
    la = Image.new("LA", (3, 1))
    for x, px in enumerate([(0, 0), (90, 255), (0, 51)]):
        la.putpixel((x, 0), px)
    assert _px(la.convert("La"))[0].tolist() == [[255] * 3, [90] * 3, [204] * 3]


def test_integer_and_float_pil_modes():
    def im(mode, values):
        out = Image.new(mode, (len(values), 1))
        out.putdata(values)
        return out

    assert _px(im("I;16", [0, 257 * 3, 65535]))[0, :, 0].tolist() == [0, 3, 255]
    # mode I: divided by 257 only when it holds values over 255; else 8-bit values as they are
    assert _px(im("I", [0, 100, 255]))[0, :, 0].tolist() == [0, 100, 255]
    assert _px(im("I", [0, 257 * 100, 256]))[0, :, 0].tolist() == [0, 100, 1]
    assert _px(im("I", [0, 256]))[0, :, 0].tolist() == [0, 1]                 # 256 > 255: scaled
    assert _px(im("I", [0, 100_000, -5]))[0, :, 0].tolist() == [0, 255, 0]   # clipped to [0, 255], no wrap-around
    # mode I;16 is 16-bit whatever its values: always divided by 257
    assert _px(im("I;16", [0, 200]))[0, :, 0].tolist() == [0, 1]
    # mode F: [0, 1] when its maximum is <= 1 (times 255), else [0, 255]; clipped
    assert _px(im("F", [0.0, 0.5, 0.6, 1.0]))[0, :, 0].tolist() == [0, 128, 153, 255]
    assert _px(im("F", [0.0, 1.5, 300.0, -4.0]))[0, :, 0].tolist() == [0, 2, 255, 0]
    _bad(im("F", [0.0, float("nan")]), "^float image contains NaN or Inf$")


def test_caller_objects_are_copied_and_decoded_ones_are_rgb():
    src = Image.new("RGB", (2, 2), (1, 2, 3))
    out = media.to_pil(src)
    assert out is not src and out.tobytes() == src.tobytes()
    out.putpixel((0, 0), (9, 9, 9))
    assert src.getpixel((0, 0)) == (1, 2, 3)
    assert media.load_image(_png(src)).getpixel((1, 1)) == (1, 2, 3) and media.load_image(src).mode == "RGB"
    cmyk = Image.new("CMYK", (1, 1), (0, 255, 255, 0))       # no black, full magenta + yellow: red
    assert media.to_pil(cmyk).getpixel((0, 0)) == (255, 0, 0)


def test_animated_first_frame_even_when_the_caller_seeked(tmp_path):
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 0, 255))]
    p = tmp_path / "a.gif"
    frames[0].save(p, save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert media.to_pil(p).getpixel((0, 0)) == (255, 0, 0)
    im = Image.open(p)
    im.seek(1)
    assert media.to_pil(im).getpixel((0, 0)) == (255, 0, 0)


def test_malformed_exif_does_not_block_the_pixels(monkeypatch):
    def boom(im):
        raise ValueError("bad EXIF")
    monkeypatch.setattr(media.ImageOps, "exif_transpose", boom)
    assert media.to_pil(Image.new("RGB", (3, 2), (5, 6, 7))).getpixel((2, 1)) == (5, 6, 7)


def test_closed_and_unreadable_pil_images():
    im = Image.new("RGB", (4, 4))
    im.close()
    _bad(im, r"^the PIL image is closed \(reopen it or pass the path\)$")
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (3, 3, 3)).save(buf, "PNG")
    lazy = Image.open(io.BytesIO(buf.getvalue()[:50]))
    _bad(lazy, r"^cannot read the PIL image's pixels \(corrupt or truncated\?\): OSError")


def test_decoder_errors_become_per_image_reasons(tmp_path, monkeypatch):
    _bad(b"\x89PNG\r\n\x1a\n" + b"\0" * 30, "^bytes is not a recognised image format$")
    (tmp_path / "x.png").write_bytes(b"text")
    _bad(tmp_path / "x.png", f"^file {tmp_path / 'x.png'} is not a recognised image format$")
    _bad(str(tmp_path / "nope.png"), "^file not found: ")
    _bad(bytearray(), "^empty bytes")
    _bad(memoryview(b""), "^empty bytes")
    _bad(b"", r"^empty bytes \(zero-length input\)$")
    _bad(42, "^unsupported image type int$")
    _bad(None, "^image is None$")
    _bad("  ", "^empty path$")
    monkeypatch.setattr(media, "_to_pil_unchecked", lambda x, *a: (_ for _ in ()).throw(MemoryError()))
    _bad(1, "^out of memory while decoding the image$")
    monkeypatch.setattr(media, "_to_pil_unchecked", lambda x, *a: (_ for _ in ()).throw(KeyError("k")))
    _bad(1, r"^cannot read the image \(KeyError: 'k'\)$")


def test_path_like_objects_with_bytes_paths(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(_png(Image.new("RGB", (3, 2), (1, 2, 3))))

    class BytesPath:
        def __fspath__(self):
            return bytes(p)

    assert media.to_pil(BytesPath()).getpixel((2, 1)) == (1, 2, 3)
    assert media.probe_size(BytesPath()) == (3, 2)


def test_pil_bomb_guard_while_reading_pixels(monkeypatch):
    def bomb(im, owned):
        raise Image.DecompressionBombError("too many pixels")
    monkeypatch.setattr(media, "_pil_to_rgb_unchecked", bomb)
    _bad(Image.new("RGB", (2, 2)), r"^image is over PIL's decompression-bomb limit \(too many pixels\)$")


def test_pil_bomb_guard_on_encoded_files(monkeypatch):
    data = _png(Image.new("L", (40, 40)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)   # PIL raises above 2 x 100 pixels
    media.set_max_pixels(10_000)
    _bad(data, r"^image is over the limit of 200 pixels \(decompression-bomb guard; PIL: ")
    with pytest.raises(RewardInputError, match=r"^image is over the limit of 200 pixels"):
        media.probe_size(data)
    media.set_max_pixels(150)   # the smaller of ours and PIL's hard limit is named
    with pytest.raises(RewardInputError, match=r"^image is over the limit of 150 pixels"):
        media.probe_size(data)


# ------------------------------------------------------------------ probing
def test_probe_size_reads_headers_only(tmp_path):
    png = _png(Image.new("RGB", (7, 3)))
    (tmp_path / "a.png").write_bytes(png)
    assert media.probe_size(png) == (7, 3)
    assert media.probe_size(bytearray(png)) == (7, 3)
    assert media.probe_size(tmp_path / "a.png") == (7, 3) == media.probe_size(str(tmp_path / "a.png"))
    assert media.probe_size(Image.new("L", (5, 2))) == (5, 2)
    assert media.probe_size(np.zeros((3, 7), np.uint8)) == (7, 3)
    assert media.probe_size(np.zeros((3, 7, 4), np.uint8)) == (7, 3)
    assert media.probe_size(torch.zeros(3, 7)) == (7, 3)
    assert media.probe_size(torch.zeros(1, 3, 7)) == (7, 3)
    truncated = png[:60]  # header intact, pixels cut: probes fine (the decoder refuses it later)
    assert media.probe_size(truncated) == (7, 3)
    for x, match in [(np.zeros((1, 2, 3, 4)), r"cannot read an image of shape \(1, 2, 3, 4\)"),
                     (torch.zeros(1, 1, 2, 3), r"cannot read an image of shape \(1, 1, 2, 3\)"),
                     (None, "^image is None$"), (3.5, "^unsupported image type float$"), (" ", "^empty path$"),
                     (b"", "empty bytes"), (tmp_path, "is a directory"), (tmp_path / "nope.png", "file not found"),
                     (b"not an image", "^bytes is not a recognised image format$"),
                     (str(tmp_path / "zero.png"), "empty file")]:
        (tmp_path / "zero.png").write_bytes(b"")
        with pytest.raises(RewardInputError, match=match):
            media.probe_size(x)
    (tmp_path / "t.png").write_bytes(b"text")
    with pytest.raises(RewardInputError, match=f"^file {tmp_path / 't.png'} is not a recognised image format$"):
        media.probe_size(tmp_path / "t.png")
    with pytest.raises(RewardInputError, match=r"^corrupt or truncated image \(unreadable header: "):
        media.probe_size(png[:20])


# ------------------------------------------------------------------ the size after a processor's resize
def _ip(**size):
    return types.SimpleNamespace(size=size, do_resize=True)


def test_resized_size_rules():
    assert media.resized_size(None, 10, 20) is None
    assert media.resized_size(types.SimpleNamespace(size={"shortest_edge": 5}, do_resize=False), 10, 20) == (10, 20)
    assert media.resized_size(types.SimpleNamespace(do_resize=True), 10, 20) is None            # no size
    qwen = types.SimpleNamespace(size={"shortest_edge": 5}, merge_size=2, patch_size=14)
    assert media.resized_size(qwen, 10, 20) is None                                              # own budget
    assert media.resized_size(_ip(height=7, width=9), 100, 1) == (9, 7)
    assert media.resized_size(_ip(shortest_edge=224), 448, 896) == (224, 448)
    assert media.resized_size(_ip(shortest_edge=224), 300, 100) == (672, 224)
    assert media.resized_size(_ip(shortest_edge=10), 3, 7) == (10, 23)          # int(7 * 10 / 3) = 23 (floor)
    # shortest_edge capped by longest_edge: the long side is scaled to longest_edge instead
    assert media.resized_size(_ip(shortest_edge=100, longest_edge=150), 50, 100) == (75, 150)
    assert media.resized_size(_ip(shortest_edge=100, longest_edge=200), 50, 100) == (100, 200)  # at the cap
    assert media.resized_size(_ip(longest_edge=40), 100, 10) == (40, 4)
    assert media.resized_size(_ip(longest_edge=40), 1000, 10) == (40, 1)                        # at least 1
    assert media.resized_size(_ip(shortest_edge=4), 1, 1000) == (4, 4000)
    assert media.resized_size(_ip(longest_edge=2), 1, 1000) == (1, 2)
    assert media.resized_size(_ip(crop_size=3), 10, 20) is None                                 # unknown rule
    assert media.resized_size(_ip(height=0, width=5, shortest_edge=0), 10, 20) is None          # 0 = unset
    # transformers' SizeDict: attributes, not keys
    sd = types.SimpleNamespace(shortest_edge=20, longest_edge=None, height=None, width=None)
    assert media.resized_size(types.SimpleNamespace(size=sd), 10, 40) == (20, 80)


def test_check_resized_size():
    media.set_max_pixels(100)
    media.check_resized_size(10, 10, _ip(height=10, width=10))           # exactly the limit
    media.check_resized_size(2, 5, _ip(shortest_edge=4))                 # 4x10 = 40
    with pytest.raises(media._Bad, match=r"resize it to 4x40 = 160 pixels"):
        media.check_resized_size(1, 10, _ip(shortest_edge=4))
    with pytest.raises(media._Bad, match=r"resize it to 40x4 = 160 pixels"):
        media.check_resized_size(10, 1, _ip(shortest_edge=4))
    with pytest.raises(media._Bad, match=r"^image is 1x1; the model's processor would resize it to 10x11 = 110 pixels"):
        media.check_resized_size(1, 1, _ip(height=11, width=10))
    media.check_resized_size(1000, 1000, None)                           # no processor: nothing to check
    qwen = types.SimpleNamespace(size={}, merge_size=2, patch_size=14)
    media.set_max_pixels(None)
    media.check_resized_size(200, 1, qwen)                               # ratio exactly 200
    media.check_resized_size(400, 2, qwen)
    with pytest.raises(media._Bad, match="aspect ratio 201.0 is over 200"):
        media.check_resized_size(2, 402, qwen)
    with pytest.raises(media._Bad, match=r"^image is 1x201: aspect ratio 201.0 is over 200, which the model's"):
        media.check_resized_size(1, 201, qwen)


# ------------------------------------------------------------------ batches and helpers
def test_split_batch_forms():
    t4 = torch.arange(2 * 3 * 2 * 2, dtype=torch.uint8).reshape(2, 3, 2, 2)
    parts = media.split_batch(t4)
    assert len(parts) == 2 and torch.equal(parts[1], t4[1])
    t3, t2 = torch.zeros(3, 2, 2), torch.zeros(2, 2)
    assert media.split_batch(t3)[0] is t3 and media.split_batch(t2)[0] is t2 and len(media.split_batch(t3)) == 1
    a4 = np.zeros((3, 2, 2, 3), np.uint8)
    assert len(media.split_batch(a4)) == 3 and media.split_batch(a4)[0].shape == (2, 2, 3)
    a3, a2 = np.zeros((2, 2, 3)), np.zeros((2, 2))
    assert media.split_batch(a3)[0] is a3 and media.split_batch(a2)[0] is a2
    im = Image.new("RGB", (1, 1))
    for single in (im, "x.png", b"\x89PNG", bytearray(b"x"), memoryview(b"x")):
        assert media.split_batch(single) == [single]
    assert media.split_batch((im, im)) == [im, im] and isinstance(media.split_batch((im,)), list)
    assert media.split_batch(x for x in [im, im]) == [im, im]
    with pytest.raises(RewardInputError, match="^images is None$"):
        media.split_batch(None)
    with pytest.raises(RewardInputError, match=r"image tensor must be CxHxW or BxCxHxW, got shape \(1, 1, 1, 1, 1\)"):
        media.split_batch(torch.zeros(1, 1, 1, 1, 1))
    with pytest.raises(RewardInputError, match=r"image tensor must be .*got shape \(4,\)"):
        media.split_batch(torch.zeros(4))
    with pytest.raises(RewardInputError, match=r"image array must be HxWxC or BxHxWxC, got shape \(4,\)"):
        media.split_batch(np.zeros(4))
    for bad, name in (({"a": im}, "dict"), ({1}, "set")):
        with pytest.raises(RewardInputError, match=f"must be a list or batch tensor, got {name}"):
            media.split_batch(bad)
    with pytest.raises(RewardInputError, match="^unsupported images type int$"):
        media.split_batch(3)
    with pytest.raises(RewardInputError, match=r"cannot split the image batch tensor \(torch.strided, cpu\): "
                                               r"RuntimeError: no unbind$"):
        media.split_batch(Tensor._make_subclass(Tensor, torch.zeros(1, 3, 2, 2)))


class Tensor(torch.Tensor):
    """A 4-D tensor whose unbind fails (as some layouts may); named and placed so media treats it as a tensor."""

    __module__ = "torch.rewardkit_test"

    def unbind(self, dim=0):
        raise RuntimeError("no unbind")


def test_pil_tensors_and_hash():
    im = Image.fromarray(np.array([[[0, 51, 255], [1, 2, 3]]], np.uint8), "RGB")   # H=1, W=2
    u8 = media.pil_to_uint8(im)
    assert u8.dtype == torch.uint8 and u8.shape == (3, 1, 2) and u8.is_contiguous()
    assert u8[:, 0, 0].tolist() == [0, 51, 255] and u8[:, 0, 1].tolist() == [1, 2, 3]
    f = media.pil_to_float(im)
    assert f.dtype == torch.float32 and torch.allclose(f[:, 0, 0], torch.tensor([0.0, 0.2, 1.0]))
    want = hashlib.blake2b(b"2x1:RGB" + im.tobytes(), digest_size=16).hexdigest()
    assert media.image_hash(im) == want and len(want) == 32
    assert media.image_hash(media.to_pil(np.asarray(im))) == want                   # same pixels, same hash
    assert media.image_hash(im.convert("RGBA")) != want                             # the mode is part of it
    flat = Image.frombytes("RGB", (1, 2), im.tobytes())
    assert media.image_hash(flat) != want                                           # so is the size


def test_big_endian_16_bit_greys_are_scaled_not_clipped():
    # catches "I;16B" left out of the 16-bit modes: PIL's own convert clips 32896 to 255; 32896 / 257 = 128
    im = Image.frombytes("I;16B", (2, 1), bytes([0x80, 0x80, 0xFF, 0xFF]))
    assert np.asarray(media.load_image(im)).tolist() == [[[128, 128, 128], [255, 255, 255]]]


def test_paths_that_cannot_be_stat_ed_are_file_not_found_in_the_probe_and_the_decoder(tmp_path):
    """The encoded-source check stats a path once on its usual path (issue 41, item 4); a path whose stat fails
    still gets pathlib's answer, ``Path.exists()`` False, so "file not found": a path through a regular file
    (ENOTDIR) and a path with a NUL byte (ValueError), expected from the pathlib documentation, not our code."""
    (tmp_path / "f.png").write_bytes(b"x")
    for p in (tmp_path / "f.png" / "inner.png", str(tmp_path / "a\x00b.png")):
        with pytest.raises(RewardInputError, match="^file not found: "):
            media.probe_size(p)
        _bad(p, "^file not found: ")
