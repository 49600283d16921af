"""Zoo rewards on inputs the official packages handle their own way: EXIF-rotated, 16-bit, transparent and
palette images (docs/zoo.md, "Input policy").

By default (``input_policy="official"``) a published reward reads files, bytes and PIL images as its original
package does; the reference here is that package's reading transcribed in the test (``Image.open(path)`` and its
own conversion, or transformers' real ``convert_to_rgb``), never rewardkit's code path. ``input_policy="corrected"``
keeps rewardkit's rules (EXIF rotation, 16-bit / 257, transparency composited on white), checked against the
corrected images computed here by hand.
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


class _policy:
    """``with _policy(reward, "corrected"):`` the same loaded reward under another input policy."""

    def __init__(self, reward, policy):
        self.reward, self.policy = reward, policy

    def __enter__(self):
        self.prev = self.reward.config.input_policy
        self.reward.config.input_policy = self.policy
        return self.reward

    def __exit__(self, *exc):
        self.reward.config.input_policy = self.prev


@pytest.mark.parametrize("name", T2I)
def test_transparent_and_palette_images_score_as_their_white_composite(zoo, name, tmp_path):
    """input_policy="corrected": transparency composited on white, for every input form."""
    with _policy(zoo(name), "corrected") as reward:
        _check_white_composites(reward, tmp_path)


def _check_white_composites(reward, tmp_path):
    from rewardkit import media

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


# ------------------------------------------------------------------------------ input policies (issue 36)
def _policy_inputs(tmp_path) -> dict:
    """The input kinds where the official packages and rewardkit's corrected decoding part, as files."""
    rgb, a = _base(), _alpha()
    out = {}
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise
    Image.fromarray(rgb).save(tmp_path / "exif6.png", exif=exif)
    out["exif6"] = tmp_path / "exif6.png"
    Image.fromarray((rgb.astype(np.uint16).mean(-1) * 257).astype(np.uint16)).save(tmp_path / "gray16.png")
    out["gray16"] = tmp_path / "gray16.png"
    for kind in ("RGBA", "LA", "P+transparency"):
        im = _transparent_cases()[kind][0]
        im.save(tmp_path / f"{kind}.png")
        out[kind] = tmp_path / f"{kind}.png"
    return out


def _corrected_by_hand(kind, path) -> Image.Image:
    """rewardkit's corrected reading, computed here: EXIF rotation, 16-bit / 257, alpha composited on white."""
    if kind == "exif6":
        return Image.fromarray(np.rot90(_base(), k=-1).copy())
    if kind == "gray16":
        g = np.round(np.asarray(Image.open(path), dtype=np.float64) / 257.0).astype(np.uint8)
        return Image.fromarray(np.repeat(g[..., None], 3, -1))
    return _transparent_cases()[kind][1]


def _official_reading(name, reward, path):
    """What each original package makes of ``Image.open(path)`` before its resize (transcribed; the reference):
    hpsv3 ``hpsv3/dataset/utils.py`` fetch_image ``image_obj.convert("RGB")`` (EditReward, t2v_metrics the same);
    hpsv2 1.2.0 ``_convert_to_rgb_or_rgba`` (RGBA kept: its ViT then fails, None here); OpenAI CLIP's ``_transform``
    for aesthetic / imagereward (resize and crop as opened, then RGB); transformers' own ``convert_to_rgb`` for
    PickScore / CLIPScore. EXIF is applied by none of them."""
    im = Image.open(path)
    if name in ("aesthetic", "imagereward"):
        size = reward.image_size if name == "imagereward" else int(reward.backbone.model.config.vision_config.image_size)
        return Image.fromarray(_official_clip_transform(im, size))
    if name in ("pickscore", "clipscore"):
        from transformers.image_transforms import convert_to_rgb

        return Image.fromarray(convert_to_rgb(im, return_numpy=True))
    if name == "hpsv2" and im.mode == "RGBA":
        return None
    return im.convert("RGB")


@pytest.mark.parametrize("name", T2I + ["vqascore"])
def test_official_input_policy_is_the_default_and_reads_images_as_the_package(zoo, name, tmp_path):
    """Default: each input kind scores like the original package's reading of the file (no EXIF rotation, 16-bit
    clipped, alpha dropped / on black / on white as each package does), from a path, bytes and the PIL image as
    opened. input_policy="corrected": like the hand-made corrected image. The two differ on every kind."""
    reward = zoo(name)
    assert reward.config.input_policy == "official"
    prompt = None if not reward.uses_prompt else "a photo"
    for kind, path in _policy_inputs(tmp_path).items():
        ref = _official_reading(name, reward, path)
        forms = [str(path), path.read_bytes(), Image.open(path)]
        out = reward(forms, prompt, on_error="nan")
        if ref is None:  # hpsv2 on RGBA: the official call crashes, so no number (NaN + reason)
            assert not bool(out.valid.any()) and "input_policy='corrected'" in out.errors[0], out.errors
        else:
            assert bool(out.valid.all()), (kind, out.errors)
            want = reward([ref], prompt).scores.expand(3)
            torch.testing.assert_close(out.scores, want, atol=1e-5, rtol=1e-5, msg=f"{name} {kind}")
        with _policy(reward, "corrected"):
            fixed = reward(forms, prompt, on_error="raise").scores
        want = reward([_corrected_by_hand(kind, path)], prompt).scores.expand(3)
        torch.testing.assert_close(fixed, want, atol=1e-4, rtol=1e-4, msg=f"{name} {kind} corrected")
        same = name in ("pickscore", "clipscore") and kind in ("RGBA", "LA", "P+transparency")  # white in both
        if ref is not None and not same:
            with _policy(reward, "corrected"):  # the policy matters here (the cosine: clipscore's 2.5 max(cos, 0) is
                fixed = reward(forms[:1], prompt).dimensions.get("cosine", fixed)  # 0 on the tiny model)
            off = out.dimensions.get("cosine", out.scores)
            assert abs(float(fixed[0]) - float(off[0])) > 1e-7, (name, kind)


def test_arrays_tensors_and_rgb_images_do_not_depend_on_the_policy(zoo):
    """numpy / torch inputs are decoded as always (uint16 arrays scaled by 1/257 under both policies), and a plain
    RGB image scores the same under both."""
    reward = zoo("aesthetic")
    rgb = _base()
    inputs = [rgb, torch.from_numpy(rgb).permute(2, 0, 1).contiguous(), (rgb.astype(np.uint16) * 257),
              Image.fromarray(rgb)]
    a = reward(inputs).scores
    with _policy(reward, "corrected"):
        b = reward(inputs).scores
    assert torch.equal(a, b)


def test_unifiedreward_reads_images_as_each_templates_scripts(zoo):
    """t2i / think (transformers scripts, qwen-vl-utils ``to_rgb``): RGBA pasted on white with its alpha as the mask,
    LA ``convert("RGB")``; 2.0 / edit (the vLLM client): ``convert("RGB")`` for both. Transcribed here."""
    from rewardkit.rewards.unifiedreward import UnifiedReward

    t2i = zoo("unifiedreward")
    v2 = UnifiedReward(judge=t2i.judge, template="2.0")
    rgba, la = _transparent_cases()["RGBA"][0], _transparent_cases()["LA"][0]
    pasted = Image.new("RGB", rgba.size, (255, 255, 255))
    pasted.paste(rgba, mask=rgba.split()[3])
    assert np.array_equal(np.asarray(t2i.decode_image(rgba)), np.asarray(pasted))
    assert np.array_equal(np.asarray(v2.decode_image(rgba)), np.asarray(rgba.convert("RGB")))
    for r in (t2i, v2):
        assert np.array_equal(np.asarray(r.decode_image(la)), np.asarray(la.convert("RGB")))
        with _policy(r, "corrected"):
            _assert_same_image(r.decode_image(rgba), _transparent_cases()["RGBA"][1])


def test_input_policy_is_settable_and_checked(zoo, tmp_path):
    """load_reward keyword, a config dict, `--set input_policy=...` on the command line; a wrong value is refused.
    rewardkit's own rewards have no such option and keep the corrected reading."""
    import argparse

    from rewardkit import load_reward
    from rewardkit.commands.score import reward_kwargs
    from rewardkit.rewards.aesthetic import Aesthetic

    model = zoo("aesthetic").config.model
    assert load_reward("aesthetic", model=model, input_policy="corrected").config.input_policy == "corrected"
    assert Aesthetic({"model": model, "input_policy": "corrected"}).config.input_policy == "corrected"
    assert reward_kwargs(argparse.Namespace(overrides=["input_policy=corrected"])) == {"input_policy": "corrected"}
    with pytest.raises(ValueError, match="input_policy must be one of"):
        load_reward("aesthetic", model=model, input_policy="exif")
    from rewardkit.rewards.preference import PreferenceRewardConfig

    assert not hasattr(PreferenceRewardConfig(), "input_policy")


def test_server_decodes_with_the_rewards_policy(zoo, tmp_path):
    """The server decodes wire bytes with the reward's own policy (an EXIF file stays unrotated by default)."""
    from rewardkit.serve.batch import _decode

    reward = zoo("hpsv2")
    data = _policy_inputs(tmp_path)["exif6"].read_bytes()
    assert np.array_equal(np.asarray(_decode(data, reward)), _base())
    with _policy(reward, "corrected"):
        assert np.array_equal(np.asarray(_decode(data, reward)), np.rot90(_base(), k=-1))


def test_editreward_transparent_source_and_edit(zoo):
    """EditReward's fetch_image ``convert("RGB")``s edits and sources (official, the default: alpha dropped);
    corrected: both composited on white."""
    reward = zoo("editreward")
    rgba, white = _transparent_cases()["RGBA"]
    plain = random_images(1, size=48, seed=3)[0]
    out = reward([rgba, plain], "make it blue", sources=[[plain], [rgba]], on_error="raise")
    dropped = rgba.convert("RGB")
    ref = reward([dropped, plain], "make it blue", sources=[[plain], [dropped]])
    assert bool(out.valid.all())
    torch.testing.assert_close(out.scores, ref.scores, atol=1e-5, rtol=1e-5)
    with _policy(reward, "corrected"):
        out = reward([rgba, plain], "make it blue", sources=[[plain], [rgba]], on_error="raise")
    ref = reward([white, plain], "make it blue", sources=[[plain], [white]])
    torch.testing.assert_close(out.scores, ref.scores, atol=1e-4, rtol=1e-4)
    assert float(out.scores[0]) != float(reward([dropped], "make it blue", sources=[[plain]]).scores[0])


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
