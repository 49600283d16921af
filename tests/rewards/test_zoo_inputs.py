"""Zoo rewards on inputs the official packages handle their own way: transparent and palette images.

rewardkit composites transparency on white before any model sees the image (one rule for every reward); the
official aesthetic / ImageReward / HPSv3 / EditReward code does not (docs/zoo.md, "Transparent and palette
images", gives each difference and its measured size). These tests check that such images never crash, score
exactly like their white composite computed here by hand, and that the documented upstream behaviour (the
transcribed official pre-processing) really differs as stated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.testing import random_images

T2I = ["aesthetic", "imagereward", "hpsv2", "hpsv3", "pickscore", "clipscore"]


def _reward_class(name):
    import importlib

    mod = importlib.import_module(f"rewardkit.rewards.{name}")
    return next(v for v in vars(mod).values() if isinstance(v, type) and getattr(v, "name", None) == name)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo-inputs")
    cache: dict = {}

    def get(name):
        if name not in cache:
            cache[name] = _reward_class(name).tiny(str(root))
        return cache[name]

    return get


def _base(h=60, w=92, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) * 127 // (w + h) + 60], -1)
    return np.clip(smooth + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _alpha(h=60, w=92):
    a = np.full((h, w), 255, np.uint8)
    a[:, : w // 2] = 0                                   # left half fully transparent
    a[h // 3: 2 * h // 3, w // 2: 3 * w // 4] = 128      # a half-transparent patch
    return a


def _on_white(rgb: np.ndarray, a: np.ndarray) -> Image.Image:
    """The white composite by hand: rgb * a + 255 * (1 - a), a in [0, 1], rounded."""
    af = a[..., None].astype(np.float64) / 255.0
    return Image.fromarray(np.round(rgb * af + 255.0 * (1.0 - af)).astype(np.uint8), "RGB")


def _transparent_cases():
    rgb, a = _base(), _alpha()
    grey = rgb[..., 0]
    pal = Image.fromarray(rgb).quantize(16)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 0  # palette index 0 transparent
    idx = np.asarray(pal_t)
    pal_rgb = np.asarray(pal.convert("RGB"))
    return {
        "RGBA": (Image.fromarray(np.dstack([rgb, a]), "RGBA"), _on_white(rgb, a)),
        "LA": (Image.fromarray(np.dstack([grey, a]), "LA"), _on_white(np.repeat(grey[..., None], 3, -1), a)),
        "P+transparency": (pal_t, _on_white(pal_rgb, np.where(idx == 0, 0, 255).astype(np.uint8))),
        "P": (pal, Image.fromarray(pal_rgb, "RGB")),
    }


def _assert_same_image(a: Image.Image, b: Image.Image):
    d = np.abs(np.asarray(a, dtype=int) - np.asarray(b, dtype=int))
    assert d.max() <= 1, d.max()  # PIL's compositing rounds in fixed point: at most one level apart


@pytest.mark.parametrize("name", T2I)
def test_transparent_and_palette_images_score_as_their_white_composite(zoo, name, tmp_path):
    from rewardkit import media

    reward = zoo(name)
    cases = _transparent_cases()
    ims, want = [], []
    for kind, (im, composite) in cases.items():
        _assert_same_image(media.to_pil(im), composite)
        path = tmp_path / f"{kind}.png"
        im.save(path)
        ims += [im, str(path)]  # the PIL image and the same image read from a PNG file
        want += [composite, composite]
    prompt = None if not reward.uses_prompt else "a photo"
    out = reward(ims, prompt, on_error="raise")
    assert bool(out.valid.all()) and bool(torch.isfinite(out.scores).all())
    ref = reward(want, prompt).scores
    torch.testing.assert_close(out.scores, ref, atol=1e-4, rtol=1e-4)


def test_editreward_transparent_source_and_edit(zoo):
    reward = zoo("editreward")
    rgba, white = _transparent_cases()["RGBA"]
    plain = random_images(1, size=48, seed=3)[0]
    out = reward([rgba, plain], "make it blue", sources=[[plain], [rgba]], on_error="raise")
    ref = reward([white, plain], "make it blue", sources=[[plain], [white]])
    assert bool(out.valid.all())
    torch.testing.assert_close(out.scores, ref.scores, atol=1e-4, rtol=1e-4)


def _official_clip_transform(im: Image.Image, size: int) -> np.ndarray:
    """openai/CLIP ``clip/clip.py`` ``_transform`` (used by improved-aesthetic-predictor ``simple_inference.py``
    and ImageReward ``ImageReward.py``) on the image *as opened*: ``Resize(size, BICUBIC)`` (torchvision calls
    PIL's ``resize``, which premultiplies alpha and uses nearest for mode ``P``), ``CenterCrop(size)``, then
    ``_convert_image_to_rgb``. Returns uint8 ``[size, size, 3]``."""
    w, h = im.size
    nw, nh = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    im = im.resize((nw, nh), Image.BICUBIC)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return np.asarray(im.crop((left, top, left + size, top + size)).convert("RGB"))


def test_documented_upstream_differences_on_transparent_and_palette_images():
    """The figures of docs/zoo.md: official order vs rewardkit's white composite, in pixels ([0, 1] units)."""
    from rewardkit import media

    rgb, a = _base(300, 460), _alpha(300, 460)
    rgba = Image.fromarray(np.dstack([rgb, a]), "RGBA")
    ours = _official_clip_transform(media.to_pil(rgba), 224) / 255.0  # the same transform on the white composite
    off = _official_clip_transform(rgba, 224) / 255.0
    crop_alpha = _official_clip_transform(Image.fromarray(a, "L").convert("RGB"), 224)[..., 0]
    clear = crop_alpha == 0
    assert clear.mean() > 0.3
    assert off[clear].max() == 0.0 and ours[clear].min() > 0.999  # upstream: black; rewardkit: white
    assert 0.45 < np.abs(off - ours).mean() < 0.6                   # docs: mean |difference| 0.53
    # HPSv3 / EditReward (qwen-vl fetch_image: convert("RGB") first): transparent pixels keep their stored colour
    assert np.array_equal(np.asarray(rgba.convert("RGB")), rgb)
    # palette image: upstream's resize of mode P is nearest-neighbour, rewardkit's (after RGB) bicubic
    pal = Image.fromarray(rgb).quantize(64)
    d = np.abs(_official_clip_transform(pal, 224) / 255.0 - _official_clip_transform(pal.convert("RGB"), 224) / 255.0)
    assert 0.01 < d.mean() < 0.05 and d.max() > 0.1                 # docs: mean 0.022, max 0.19


@pytest.mark.parametrize("kind", ["RGBA", "LA", "P+transparency", "P"])
def test_transformers_clip_processor_composites_on_white_as_rewardkit(kind):
    """docs/zoo.md: PickScore / CLIPScore's official pre-processing is transformers' CLIPImageProcessor, whose
    ``convert_to_rgb`` (transformers/image_transforms.py) composites alpha on white: the same image as
    rewardkit's ``media.to_pil`` (so no difference to document for them)."""
    from transformers.image_transforms import convert_to_rgb

    from rewardkit import media

    im, want = _transparent_cases()[kind]
    _assert_same_image(Image.fromarray(convert_to_rgb(im, return_numpy=True)), want)
    _assert_same_image(media.to_pil(im), want)


# --------------------------------------------------------------------------------------------- empty prompts
def _clip_reference(model_dir, pixels, prompt):
    """transformers' CLIPModel straight from the directory: (cosine, logit_scale) for ``pixels`` and one prompt."""
    import transformers

    model = transformers.CLIPModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    ids = tok([prompt] * len(pixels), padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids, pixel_values=pixels).logits_per_image.diagonal()  # logit_scale * cos
    scale = float(model.logit_scale.exp())
    return logits / scale, scale


@pytest.mark.parametrize("name", ["hpsv2", "pickscore", "clipscore"])
def test_clip_family_scores_an_empty_prompt_as_upstream(zoo, name):
    """The text tower's unconditional input ([start, end] tokens), as open_clip / transformers / hpsv2 score it."""
    reward = zoo(name)
    ims = random_images(2, sizes=[(40, 40), (64, 36)], seed=11)
    if name == "hpsv2":  # the upstream transform (transform.py ResizeMaxSize), not rewardkit's hpsv2_pixels
        from tests.helpers.upstream_preprocess import hpsv2_eval_pixels

        size = int(reward.backbone.model.config.vision_config.image_size)
        pixels = torch.stack([hpsv2_eval_pixels(im, size) for im in ims])
    else:
        import transformers

        pixels = transformers.AutoProcessor.from_pretrained(reward.config.model)(images=ims, return_tensors="pt")[
            "pixel_values"]
    cos, scale = _clip_reference(reward.config.model, pixels, "")
    want = {"hpsv2": cos, "pickscore": scale * cos, "clipscore": 2.5 * cos.clamp(min=0)}[name]
    out = reward(ims, "", on_error="raise")
    assert bool(out.valid.all())
    torch.testing.assert_close(out.scores, want, atol=1e-5, rtol=1e-5)
    if name == "clipscore":  # (2.5 * max(cos, 0) is 0 on this tiny model: check the cosine too)
        torch.testing.assert_close(out.dimensions["cosine"], cos, atol=1e-5, rtol=1e-5)
    other = reward(ims, "a red car")
    assert not torch.allclose(other.dimensions.get("cosine", other.scores), out.dimensions.get("cosine", out.scores))


@pytest.mark.parametrize("name", ["hpsv3", "imagereward"])
def test_empty_prompt_is_scored(zoo, name):
    """Exact values against the official forwards: tests/rewards/test_zoo_hpsv3.py (hpsv3) and tests/rewards/test_zoo_clip.py
    (imagereward) include an empty prompt in their parity batches; here: valid, finite, blank = scored too."""
    reward = zoo(name)
    ims = random_images(2, sizes=[(40, 40), (64, 36)], seed=12)
    out = reward(ims, ["", "   "], on_error="raise")
    assert bool(out.valid.all()) and bool(torch.isfinite(out.scores).all())


def test_judges_of_the_prompt_refuse_an_empty_one(zoo):
    """vqascore, unifiedreward and editreward judge the image against the prompt: empty = NaN + reason."""
    ims = random_images(2, size=40, seed=13)
    for name in ("vqascore", "unifiedreward"):
        out = zoo(name)(ims, ["", "  "], on_error="nan")
        assert not bool(out.valid.any()) and all("prompt is empty" in e for e in out.errors), (name, out.errors)
        assert bool(torch.isnan(out.scores).all())
    out = zoo("editreward")(ims, ["", "add a hat"], sources=[[ims[1]], [ims[0]]], on_error="nan")
    assert out.valid.tolist() == [False, True] and "prompt is empty" in out.errors[0]
    from rewardkit.errors import RewardInputError

    with pytest.raises(RewardInputError, match="prompt is empty"):
        zoo("vqascore")(ims[:1], "")
