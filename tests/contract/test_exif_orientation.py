"""EXIF orientation: every tag value 1-8 gives exactly the upright pixels, from bytes, a path and an open PIL image.

The expected pixels come from PIL's Transpose semantics written out in numpy (and checked against PIL's own
operations), on an asymmetric image where any wrong rotation or flip changes the array.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from rewardkit import media


# ------------------------------------------------------------------ EXIF orientation
# PIL's Transpose semantics written out in numpy on an H x W x 3 array (EXIF 2.3 orientation tag 0x0112):
# the stored pixels must be transformed like this to display upright.
EXIF_TO_UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],                     # mirror left-right
    3: lambda a: a[::-1, ::-1],                  # rotate 180
    4: lambda a: a[::-1, :],                     # mirror top-bottom
    5: lambda a: a.transpose(1, 0, 2),           # transpose (mirror about the main diagonal)
    6: lambda a: np.rot90(a, k=-1),              # rotate 90 clockwise
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # transverse (mirror about the anti-diagonal)
    8: lambda a: np.rot90(a, k=1),               # rotate 90 counter-clockwise
}


def _asymmetric(h=5, w=7):
    """Every pixel distinct, no symmetry: any wrong rotation or flip changes the array."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 30 + 5, y * 40 + 3, (x * 7 + y * 11) % 256], -1).astype(np.uint8)


def _png_with_orientation(arr, orientation):
    im = Image.fromarray(arr, "RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="PNG", exif=exif)   # PNG: lossless, so the comparison is exact
    return buf.getvalue()


def test_exif_reference_table_is_pil_transpose():
    """The written-out table agrees with PIL's own Transpose operations (so it is not a tautology)."""
    a = _asymmetric()
    im = Image.fromarray(a)
    T = Image.Transpose
    pil = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE, 6: T.ROTATE_270,
           7: T.TRANSVERSE, 8: T.ROTATE_90}
    for o, op in pil.items():
        assert np.array_equal(np.asarray(im.transpose(op)), EXIF_TO_UPRIGHT[o](a)), o
    # and the explicit corner moves for the three rotations
    h, w = a.shape[:2]
    assert np.array_equal(EXIF_TO_UPRIGHT[6](a)[0, -1], a[0, 0])        # top-left goes to top-right
    assert np.array_equal(EXIF_TO_UPRIGHT[8](a)[-1, 0], a[0, 0])        # top-left goes to bottom-left
    assert np.array_equal(EXIF_TO_UPRIGHT[3](a)[-1, -1], a[0, 0])       # top-left goes to bottom-right
    assert EXIF_TO_UPRIGHT[6](a).shape == (w, h, 3)


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_exact_pixels(orientation, tmp_path):
    a = _asymmetric()
    data = _png_with_orientation(a, orientation)
    want = EXIF_TO_UPRIGHT[orientation](a)
    for src in (data, _write(tmp_path / "x.png", data), Image.open(io.BytesIO(data))):
        got = np.asarray(media.load_image(src))
        assert got.shape == want.shape and np.array_equal(got, want), (orientation, type(src))


def _write(path, data):
    path.write_bytes(data)
    return path


def test_one_copy_of_a_callers_image_none_of_a_decoded_one(monkeypatch):
    """Decoding copies no more than it must: a caller's RGB PIL image is copied once (never handed out: rewards
    may resize in place), an image decoded here not at all, and an upright image does not go through
    ``exif_transpose`` (which returns a copy even when there is nothing to turn). A 1024-px image is 3 MB a copy."""
    copies = []
    real_copy = Image.Image.copy

    def counting_copy(self):
        copies.append(self.size)
        return real_copy(self)

    monkeypatch.setattr(Image.Image, "copy", counting_copy)
    mine = Image.fromarray(_asymmetric(), "RGB")
    out = media.load_image(mine)
    assert out is not mine and np.array_equal(np.asarray(out), np.asarray(mine)) and len(copies) == 1
    out.putpixel((0, 0), (1, 2, 3))
    assert mine.getpixel((0, 0)) != (1, 2, 3)  # the caller's image is untouched
    copies.clear()
    buf = io.BytesIO()
    Image.fromarray(_asymmetric(), "RGB").save(buf, format="PNG")
    media.load_image(buf.getvalue())
    assert copies == []
    rotated = media.load_image(_png_with_orientation(_asymmetric(), 6))  # turned: a new image, still no copy
    assert np.array_equal(np.asarray(rotated), EXIF_TO_UPRIGHT[6](_asymmetric())) and copies == []


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_official_reading_ignores_exif_and_carries_none_on(orientation, tmp_path):
    """A published reward's official reading (``official=``, no EXIF rotation, as the original packages'
    ``Image.open``) gives the stored pixels from bytes, a path and an open PIL image; the result carries no
    orientation, so a later corrected decode of it (a judge backend's) does not turn it either."""
    a = _asymmetric()
    data = _png_with_orientation(a, orientation)
    for src in (data, _write(tmp_path / "x.png", data), Image.open(io.BytesIO(data))):
        got = media.load_image(src, official=lambda im: im.convert("RGB"))
        assert np.array_equal(np.asarray(got), a), type(src)
        assert np.array_equal(np.asarray(media.load_image(got)), a), type(src)
