"""A call scored in one chunk reads each encoded image's header once (issue 41): the header checks a separate
probe ran before any decode are run by the decode itself, before any pixel is decoded; the reasons, their order
and ``on_error="raise"`` are the same as with the probe (which calls over several chunks still use)."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
from PIL import Image

from rewardkit import media
from rewardkit.errors import RewardInputError
from rewardkit.reward import Reward, RewardOutput


class Red(Reward):
    name = "red"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.scored = 0

    def _score(self, batch):
        self.scored += len(batch)
        return RewardOutput(scores=[im.getpixel((0, 0))[0] / 255 for im in batch.images])

    def _check_sample_metadata(self, meta, sources):
        return "bad metadata" if meta.get("bad") else None


def _png(w: int, h: int, v: int = 7) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((h, w, 3), v, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _files(tmp_path):
    good = _png(8, 6)
    (tmp_path / "good.png").write_bytes(good)
    (tmp_path / "wide.png").write_bytes(_png(64, 2))           # aspect ratio 32 > the bound set below
    (tmp_path / "text.png").write_bytes(b"not an image")
    (tmp_path / "cut.png").write_bytes(good[:20])               # the header itself is cut
    (tmp_path / "big.png").write_bytes(_png(40, 40))            # 1,600 pixels > the limit set below
    (tmp_path / "resized.png").write_bytes(_png(9, 3))          # 3 -> 20: 60 x 20 = 1,200 > the limit
    return {k: str(tmp_path / f"{k}.png") for k in ("good", "wide", "text", "cut", "big", "resized")}


@pytest.fixture
def limits():
    media.set_max_pixels(1_000)
    media.set_max_aspect_ratio(10)
    try:
        yield
    finally:
        media.set_max_pixels(None)
        media.set_max_aspect_ratio()  # the default (None would turn the bound off)


def _with_processor(r):
    r.proc = types.SimpleNamespace(image_processor=types.SimpleNamespace(size={"shortest_edge": 20}, do_resize=True))
    return r


def test_one_chunk_reads_each_header_once(tmp_path, monkeypatch):
    paths = _files(tmp_path)
    opened = []
    real_open = Image.open

    def counted(fp, *a, **k):
        opened.append(fp)
        return real_open(fp, *a, **k)

    monkeypatch.setattr(Image, "open", counted)
    probes = []
    real_probe = media._probe
    monkeypatch.setattr(media, "_probe", lambda x: probes.append(x) or real_probe(x))
    r = Red()
    data = _png(5, 5, 51)
    out = r([paths["good"], data], "p")
    assert out.scores.tolist() == pytest.approx([7 / 255, 51 / 255])
    assert len(opened) == 2 and not probes  # one open per image: the decode's
    opened.clear()
    out = r([paths["good"], data], "p", batch_size=1)  # two chunks: every header is checked before any decode
    assert out.valid.all() and len(opened) == 4 and len(probes) == 2
    probes.clear()
    r([Image.open(paths["good"]), np.zeros((4, 4, 3), np.uint8)], "p")  # not encoded: their size is known
    assert len(probes) == 2


@pytest.mark.parametrize("name", ["wide", "text", "cut", "big", "resized"])
def test_the_reasons_are_the_probes(tmp_path, limits, name):
    paths = _files(tmp_path)
    with open(paths[name], "rb") as f:
        raw = f.read()
    for x in (paths[name], raw):
        one = _with_processor(Red())([x], "p", on_error="nan")  # deferred: the decode checks the header
        two = _with_processor(Red())([x, paths["good"]], "p", on_error="nan", batch_size=1)  # the probe
        assert not one.valid[0] and one.errors[0] == two.errors[0], (one.errors, two.errors)
        r = _with_processor(Red())
        with pytest.raises(RewardInputError) as exc:
            r([paths["good"], x], "p")
        assert exc.value.index == 1 and str(exc.value).endswith(two.errors[0]) and r.scored == 0
    if name == "cut":
        assert two.errors[0].startswith("corrupt or truncated image (unreadable header: ")


def test_the_first_reason_in_order_is_kept(tmp_path, limits):
    paths = _files(tmp_path)
    r = Red()
    # a bad image and bad metadata: the image's reason, as when its header is checked first
    out = r([paths["big"]], "p", metadata=[{"bad": True}], on_error="nan")
    assert out.errors[0].startswith("image is 40x40 = 1,600 pixels")
    out = r([paths["good"]], "p", metadata=[{"bad": True}], on_error="nan")
    assert out.errors == ["bad metadata"]
    out = r([paths["big"]], " ", on_error="nan")  # the prompt is checked before the image
    assert out.errors == ["prompt is empty"]


def test_a_reward_that_replaces_the_header_check_or_the_decode_keeps_the_probe(tmp_path):
    paths = _files(tmp_path)
    seen = []

    class OwnCheck(Red):
        def _check_image_size(self, x):
            seen.append(x)
            return "refused by the reward" if x == paths["wide"] else super()._check_image_size(x)

    class OwnDecode(Red):
        def decode_image(self, x):  # the one-argument form a subclass may have written
            seen.append(("decode", x))
            return super().decode_image(x)

    out = OwnCheck()([paths["wide"]], "p", on_error="nan")
    assert out.errors == ["refused by the reward"] and seen == [paths["wide"]]
    seen.clear()
    out = OwnDecode()([paths["good"]], "p")
    assert out.valid.all() and seen == [("decode", paths["good"])]
