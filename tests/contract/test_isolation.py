"""Issue 9, items 7, 8, 12: inputs that used to escape per-sample isolation, aspect-ratio bombs, and the
small call-level checks (metadata / prompt types, device arguments)."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.errors import ConfigError, RewardInputError
from rewardkit.reward import Reward, RewardBatch, RewardConfig, RewardOutput

GOOD = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8), "RGB")


class MeanPixel(Reward):
    name = "mean-pixel"

    def __init__(self, *a, image_processor=None, **kw):
        super().__init__(*a, **kw)
        self.seen_sizes: list[tuple[int, int]] = []
        if image_processor is not None:
            self.backbone = types.SimpleNamespace(processor=types.SimpleNamespace(image_processor=image_processor))

    def _score(self, batch: RewardBatch) -> RewardOutput:
        self.seen_sizes += [im.size for im in batch.images]
        return RewardOutput(scores=torch.tensor([np.asarray(im, dtype=np.float64).mean() / 255 for im in batch.images]))


def _truncated_lazy_png() -> Image.Image:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return Image.open(io.BytesIO(buf.getvalue()[: len(buf.getvalue()) // 2]))  # header fine, pixels cut


def _closed() -> Image.Image:
    im = Image.new("RGB", (8, 8))
    im.close()
    return im


ESCAPES = {
    "lazy truncated PIL": (_truncated_lazy_png, "truncated"),
    "closed PIL": (_closed, "closed"),
    "meta tensor": (lambda: torch.empty(3, 8, 8, device="meta"), "meta"),
    "sparse tensor": (lambda: torch.rand(3, 8, 8).to_sparse(), "sparse"),
    "sparse csr tensor": (lambda: torch.rand(8, 8).to_sparse_csr(), "sparse"),
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escaping_inputs_are_per_sample_errors(name):
    make, word = ESCAPES[name]
    r = MeanPixel()
    out = r([GOOD, make(), GOOD], "p", on_error="nan", batch_size=2)
    assert out.valid.tolist() == [True, False, True]
    assert word in out.errors[1].lower(), out.errors[1]
    assert torch.isfinite(out.scores[[0, 2]]).all() and torch.isnan(out.scores[1])
    with pytest.raises(RewardInputError) as info:
        r([GOOD, make()], "p")
    assert info.value.index == 1


def test_sources_that_escape_are_per_sample_errors():
    class Edit(MeanPixel):
        tasks = frozenset({"edit"})

    out = Edit()([GOOD, GOOD], "p", sources=[[_closed()], [GOOD]], on_error="nan")
    assert out.valid.tolist() == [False, True]
    assert out.errors[0].startswith("source 0:") and "closed" in out.errors[0]


def test_any_exception_while_normalising_is_the_samples_error(monkeypatch):
    """Even a failure nobody anticipated (here: numpy raising inside the conversion) stays per-sample."""
    class Weird(np.ndarray):
        def __array_finalize__(self, obj):
            if obj is not None and getattr(obj, "_boom", False):
                raise RuntimeError("boom")

    arr = np.zeros((8, 8, 3), dtype=np.float32).view(Weird)
    arr._boom = True
    out = MeanPixel()([GOOD, arr, GOOD], "p", on_error="nan")
    assert out.valid.tolist() == [True, False, True]
    assert "boom" in out.errors[1]


# ------------------------------------------------------------------ item 8: aspect-ratio bombs
@pytest.fixture
def clip_224():
    transformers = pytest.importorskip("transformers")
    return transformers.CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})


def test_aspect_ratio_bound_refuses_per_sample():
    out = MeanPixel()([GOOD, Image.new("RGB", (1, 20000)), Image.new("RGB", (300, 2))], "p", on_error="nan")
    assert out.valid.tolist() == [True, False, True]  # 150:1 is under the default bound of 200
    assert "aspect ratio" in out.errors[1] and "20,000" in out.errors[1]


def test_aspect_ratio_bound_is_configurable():
    try:
        media.set_max_aspect_ratio(100)
        out = MeanPixel()([Image.new("RGB", (300, 2))], "p", on_error="nan")
        assert not out.valid[0] and "limit of 100" in out.errors[0]
        with pytest.raises(ValueError):
            media.set_max_aspect_ratio(0.5)
    finally:
        media.set_max_aspect_ratio()
    assert media.get_max_aspect_ratio() == 200


def test_resized_size_of_a_clip_processor(clip_224):
    assert media.resized_size(clip_224, 1, 20000) == (224, 4_480_000)
    assert media.resized_size(clip_224, 640, 480) == (298, 224)


def test_size_after_the_models_resize_is_refused(clip_224):
    """With the aspect bound off, a 1x20000 image is only 20,000 pixels, but CLIP's 224 shortest-edge resize
    would make it 224 x 4,480,000 (about 1e9 pixels, 3 GB as uint8 RGB): refused from the header, per sample,
    before anything is decoded or resized."""
    bomb = io.BytesIO()
    Image.new("RGB", (1, 20000), (5, 5, 5)).save(bomb, "PNG")
    try:
        media.set_max_aspect_ratio(None)
        r = MeanPixel(image_processor=clip_224)
        assert r._image_processors() == [clip_224]
        out = r([GOOD, bomb.getvalue(), GOOD], "p", on_error="nan")
        assert out.valid.tolist() == [True, False, True]
        assert "224x4480000" in out.errors[1] and "over the limit" in out.errors[1]
        assert r.seen_sizes == [(16, 16), (16, 16)]  # the bomb never reached the model
        # without a processor that blows it up, the same image is fine
        assert MeanPixel()([bomb.getvalue()], "p").valid.all()
    finally:
        media.set_max_aspect_ratio()


def test_qwen_processor_limit_is_checked_per_sample():
    """Above Qwen-VL's own aspect limit (200) its processor raises for the whole chunk: refused per sample
    even when rewardkit's bound is raised."""
    transformers = pytest.importorskip("transformers")
    ip = transformers.Qwen2VLImageProcessorPil()
    try:
        media.set_max_aspect_ratio(1000)
        r = MeanPixel(image_processor=ip)
        out = r([GOOD, Image.new("RGB", (500, 2)), Image.new("RGB", (300, 2))], "p", on_error="nan")
        assert out.valid.tolist() == [True, False, True]
        assert "Qwen-VL" in out.errors[1]
    finally:
        media.set_max_aspect_ratio()


def test_real_clip_reward_finds_its_processor(tiny_clip_dir):
    from rewardkit import load_reward

    r = load_reward("clipscore", model=str(tiny_clip_dir), device="cpu")
    ips = r._image_processors()
    assert len(ips) == 1 and hasattr(ips[0], "size")


# ------------------------------------------------------------------ item 12
def test_metadata_of_the_wrong_type_is_a_clear_error():
    for bad in (123, 1.5, "intent", b"x", {"a"}):
        with pytest.raises(RewardInputError, match="metadata must be a list"):
            MeanPixel()([GOOD], "p", metadata=bad)


def test_a_bad_metadata_entry_is_that_samples_error():
    out = MeanPixel()([GOOD, GOOD, GOOD], "p", metadata=[{}, 7, None], on_error="nan")
    assert out.valid.tolist() == [True, False, True] and "metadata entries must be dicts" in out.errors[1]
    with pytest.raises(RewardInputError) as info:
        MeanPixel()([GOOD, GOOD], "p", metadata=[{}, "x"])
    assert info.value.index == 1


@pytest.mark.parametrize("prompt", [{"a": 1}, {"a cat"}, frozenset({"a cat"}), {"a": "x"}.keys()])
def test_prompt_as_dict_or_set_is_refused(prompt):
    with pytest.raises(RewardInputError, match="prompt must be a string or a list"):
        MeanPixel()([GOOD], prompt)


def _device_reward():
    from dataclasses import dataclass

    @dataclass
    class Cfg(RewardConfig):
        device: str | None = None

    class DevReward(MeanPixel):
        Config = Cfg

    return DevReward


@pytest.mark.parametrize("device, stored", [(torch.device("cpu"), "cpu"), (torch.device("cuda", 1), "cuda:1"),
                                            (0, "cuda:0"), (3, "cuda:3"), ("cpu", "cpu"), (None, None)])
def test_device_arguments_rl_trainers_pass(device, stored):
    cls = _device_reward()
    assert cls(device=device).config.device == stored
    assert cls({"device": device}).config.device == stored


def test_bad_device_argument_is_a_config_error():
    with pytest.raises(ConfigError):
        _device_reward()(device=-1)
    with pytest.raises(ConfigError):
        _device_reward()(device=1.5)


def test_load_reward_accepts_torch_device(tiny_clip_dir):
    from rewardkit import load_reward

    r = load_reward("clipscore", model=str(tiny_clip_dir), device=torch.device("cpu"))
    assert r.device == torch.device("cpu") and r.config.device == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_torch_is_a_clear_message(tiny_clip_dir):
    from rewardkit import load_reward
    from rewardkit.models.vlm import resolve_device

    for dev in ("cuda", "cuda:1", 0, torch.device("cuda")):
        with pytest.raises(ValueError, match="device='cuda.*(CPU-only build|no CUDA device)"):
            resolve_device(dev)
    with pytest.raises(ValueError, match="pass device='cpu'"):
        load_reward("clipscore", model=str(tiny_clip_dir), device="cuda")
    with pytest.raises(ValueError, match="pass device='cpu'"):
        MeanPixel().to("cuda")
    clip = load_reward("clipscore", model=str(tiny_clip_dir), device="cpu")  # overrides to() itself
    for dev in ("cuda", 0, torch.device("cuda:0")):
        with pytest.raises(ValueError, match="pass device='cpu'"):
            clip.to(dev)
    assert clip.to(torch.device("cpu")).device == torch.device("cpu")


def test_subclass_to_receives_a_resolved_device():
    seen = []

    class Mover(MeanPixel):
        def to(self, device):
            seen.append(device)
            return self

    Mover().to("cpu")
    Mover().to(torch.device("cpu"))
    assert seen == [torch.device("cpu")] * 2


# ------------------------------------------------------------------ item 9: decode per chunk
def test_images_are_decoded_per_chunk(monkeypatch):
    """Memory follows batch_size: when a chunk is scored, only that chunk's images have been decoded."""
    decoded = []
    real = media._to_pil
    monkeypatch.setattr(media, "_to_pil", lambda x, *a: decoded.append(1) or real(x, *a))
    at_score = []

    class Spy(MeanPixel):
        def _score(self, batch):
            at_score.append(len(decoded))
            return super()._score(batch)

    paths = [GOOD] * 9 + [_closed()] + [GOOD] * 3
    out = Spy()(paths, "p", batch_size=4, on_error="nan")
    assert at_score == [4, 8, 13]  # chunk 3 refilled past the bad sample: 9th, 11th, 12th, 13th
    assert out.valid.sum() == 12 and not out.valid[9]


def test_real_clip_reward_refuses_what_its_resize_would_blow_up(tiny_clip_dir):
    """End to end through a registered reward: the image passes the raw pixel limit, its resized size does not."""
    from rewardkit import load_reward

    r = load_reward("clipscore", model=str(tiny_clip_dir), device="cpu")
    ip = r._image_processors()[0]
    w, h = media.resized_size(ip, 1, 20000)
    assert w * h > 20000
    try:
        media.set_max_aspect_ratio(None)
        media.set_max_pixels(max(20000, w * h - 1))
        out = r([GOOD, Image.new("RGB", (1, 20000), (9, 9, 9))], "a photo", on_error="nan")
        assert out.valid.tolist() == [True, False]
        assert f"{w}x{h}" in out.errors[1] and "aspect-ratio bomb" in out.errors[1]
    finally:
        media.set_max_aspect_ratio()
        media.set_max_pixels(None)


@pytest.mark.slow
def test_a_scored_chunk_is_released_before_the_next_is_decoded(monkeypatch):
    """While the next chunk is decoded, no image of an already scored chunk is alive (peak = one chunk)."""
    import gc
    import weakref

    refs: list = []
    real = media._to_pil

    def decode(x, *a):
        gc.collect()
        alive = sum(r() is not None for r in refs)
        assert alive == 0, f"{alive} images of scored chunks still alive while decoding the next chunk"
        return real(x, *a)

    monkeypatch.setattr(media, "_to_pil", decode)

    class Spy(MeanPixel):
        def _score(self, batch):
            refs.extend(weakref.ref(im) for im in batch.images)
            return super()._score(batch)

    out = Spy()([np.full((8, 8, 3), i, dtype=np.uint8) for i in range(10)], "p", batch_size=3)
    assert out.valid.all() and len(refs) == 10
