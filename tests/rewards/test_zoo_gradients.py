"""Gradients to pixels for the published rewards (issue 15): ``hpsv2``, ``aesthetic`` and ``imagereward`` run a
torch port of their own PIL pre-processing in ``score_tensor`` (rewardkit.models.zoo), ``hpsv3`` the Qwen-VL
tensor path. Checked here on tiny converted checkpoints (the conformance builders, ``Reward.tiny``):

- the torch pixels match the upstream recipe within the resampling difference, and a wrong recipe (centre crop
  instead of pad, pad on the wrong side, bilinear instead of bicubic, floor instead of round for the crop
  offset) misses by far more, at the pixel level and in score;
- ``score_tensor`` and the ordinary call both equal the score of the upstream pixels, within that difference,
  for three aspect ratios.

The expected pixels are never rewardkit's: they come from tests/helpers/upstream_preprocess.py, a step-by-step
transcription of HPSv2's ``ResizeMaxSize`` transform and OpenAI CLIP's ``_transform`` (upstream files and lines
cited there), so a bug in ``rewardkit.models.zoo`` (which both the call and ``score_tensor`` run) fails here.
- gradients reach the pixels (finite, non-zero, each sample's own), the reward weights stay frozen, finite
  differences agree (float64 ``gradcheck`` of the pre-processing; float32 directional differences end to end);
- the AlignProp adapter accepts them.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewardkit import media
from rewardkit.errors import RewardInputError
from rewardkit.models import zoo
from rewardkit.preprocess import resize
from tests.helpers.upstream_preprocess import hpsv2_eval_pixels, openai_clip_eval_pixels

PROMPTS = ["a red apple on a table", "two birds on a branch"]
# (h, w): landscape 3:4, tall 4:1, near-square 40x44 whose centre-crop offset is a rounding case
# (resized to 32x35: offset round(1.5) = 2, not 3 // 2 = 1)
SIZES = [(48, 64), (200, 50), (40, 44)]
S = 32  # the tiny models' image size

# |torch port - PIL recipe| in pre-processed pixels ([0, 1] units) on 8-bit natural-like images, 10 sizes from
# 33x120 to 300x90 (measured: max 0.0042, mean 0.0012; HPSv2 is exact: its recipe is torch upstream too)
PIXEL_MAX = 0.006
PIXEL_MEAN = 0.002
# |score_tensor - call| on those images (measured max: hpsv2 0 (k / 255 inputs), aesthetic 3.9e-5,
# imagereward 2.2e-4; the tiny models' scores: hpsv2 cosines ~0.1-0.3, aesthetic ~-0.06, imagereward ~0.07)
SCORE_TOL = {"hpsv2": 1e-5, "aesthetic": 1e-4, "imagereward": 3e-4}
MEAN = torch.tensor(zoo.CLIP_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(zoo.CLIP_STD).view(1, 3, 1, 1)


# ---------------------------------------------------------------------------------------------- inputs
def natural_like(b: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Smooth colour fields plus mild texture, rounded to 8-bit values (k / 255): float32 [b, 3, h, w]."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(b, 3, max(2, h // 16), max(2, w // 16), generator=g)
    x = F.interpolate(base, size=(h, w), mode="bicubic", align_corners=False)
    x = x + 0.03 * torch.randn(b, 3, h, w, generator=g)
    return (x.clamp(0, 1) * 255).round() / 255


def blocks(h: int, w: int, seed: int, b: int = 3) -> torch.Tensor:
    """Random 8-bit colour blocks of b x b pixels: sharp edges, where bicubic and bilinear differ most."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (1, 3, -(-h // b), -(-w // b)), generator=g).float() / 255
    return base.repeat_interleave(b, 2).repeat_interleave(b, 3)[..., :h, :w].contiguous()


def pil(x: torch.Tensor) -> list:
    return [media.to_pil(xi) for xi in x]


def upstream_pixels(name: str, x: torch.Tensor) -> torch.Tensor:
    """The expected pixels ``[B, 3, S, S]`` of a k / 255 batch, by the upstream recipe transcribed in
    tests/helpers/upstream_preprocess.py (HPSv2: transform.py ResizeMaxSize; others: clip.py ``_transform`` on PIL)."""
    if name == "hpsv2":
        return torch.stack([hpsv2_eval_pixels(im, S) for im in pil(x)])
    return torch.stack([openai_clip_eval_pixels(im, S) for im in pil(x)])


def unnorm(p: torch.Tensor) -> torch.Tensor:
    return p * STD  # normalised pixel differences back to [0, 1] units


# ---------------------------------------------------------------------------------------------- wrong recipes
def hps_pad_bottom_right(x: torch.Tensor) -> torch.Tensor:
    nh, nw = zoo.hpsv2_resize_shape(x.shape[-2], x.shape[-1], S)
    y = F.interpolate(x, (nh, nw), mode="bicubic", antialias=True)
    return (F.pad(y, (0, S - nw, 0, S - nh)) - MEAN) / STD


def hps_bilinear(x: torch.Tensor) -> torch.Tensor:
    nh, nw = zoo.hpsv2_resize_shape(x.shape[-2], x.shape[-1], S)
    y = F.interpolate(x, (nh, nw), mode="bilinear", antialias=True)
    pw, ph = S - nw, S - nh
    return (F.pad(y, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)) - MEAN) / STD


def clip_crop(x: torch.Tensor, mode: str = "bicubic", floor: bool = False) -> torch.Tensor:
    nh, nw = zoo.openai_clip_resize_shape(x.shape[-2], x.shape[-1], S)
    y = resize(x, (nh, nw), mode)
    t, l = ((nh - S) // 2, (nw - S) // 2) if floor else (int(round((nh - S) / 2)), int(round((nw - S) / 2)))
    return (y[..., t:t + S, l:l + S] - MEAN) / STD


WRONG = {
    "hpsv2": {"centre crop": lambda x: zoo.openai_clip_pixel_values(x, S), "pad bottom-right": hps_pad_bottom_right,
              "bilinear": hps_bilinear},
    "clip": {"pad (HPSv2)": lambda x: zoo.hpsv2_pixel_values(x, S), "bilinear": lambda x: clip_crop(x, "bilinear")},
}


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def zoo_rewards(tmp_path_factory):
    from rewardkit.rewards.aesthetic import Aesthetic
    from rewardkit.rewards.hpsv2 import HPSv2
    from rewardkit.rewards.hpsv3 import HPSv3
    from rewardkit.rewards.imagereward import ImageReward

    root = str(tmp_path_factory.mktemp("zoo-grad"))
    return {"hpsv2": HPSv2.tiny(root), "aesthetic": Aesthetic.tiny(root), "imagereward": ImageReward.tiny(root),
            "hpsv3": HPSv3.tiny(root)}


def _prompts(reward, n: int):
    return None if not reward.uses_prompt else PROMPTS[:n] if n <= len(PROMPTS) else [PROMPTS[0]] * n


def score_from_pixels(name: str, reward, pixels: torch.Tensor, prompt: str) -> float:
    """The reward's score for ready pixel values [1, 3, S, S] (the upstream recipe's, or a hand-made wrong one).

    Only the network is the reward's; everything between pixels and score is written here: HPSv2 (hpsv2/img_score.py
    lines 78-81: the diagonal of image_features @ text_features.T, both L2-normalised) and the aesthetic predictor
    (L2-normalised CLIP image embedding into the MLP) through transformers' own ``CLIPModel.get_image_features``
    / ``get_text_features``; ImageReward's BLIP forward is the reward's (checked against a reference forward in
    tests/rewards/test_zoo_clip.py), then ``(raw - mean) / std`` (ImageReward/ImageReward.py line 134)."""
    def image_embedding(model):
        feats = model.get_image_features(pixel_values=pixels)
        return F.normalize(getattr(feats, "pooler_output", feats).float(), dim=-1)

    with torch.no_grad():
        if name == "hpsv2":
            from transformers import AutoTokenizer

            model = reward.backbone.model
            ids = AutoTokenizer.from_pretrained(reward.config.model)([prompt], padding=True, return_tensors="pt")
            text = model.get_text_features(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
            text = F.normalize(getattr(text, "pooler_output", text).float(), dim=-1)
            return float((image_embedding(model) * text).sum(-1)[0])
        if name == "aesthetic":
            return float(reward.head(image_embedding(reward.backbone.model))[0, 0])
        return float((reward.raw_scores(pixels, [prompt])[0] - reward.mean) / reward.std)


def _params(reward) -> list[torch.nn.Parameter]:
    mods = [v for v in vars(reward).values() if isinstance(v, torch.nn.Module)]
    mods += [v.model for v in vars(reward).values() if isinstance(getattr(v, "model", None), torch.nn.Module)]
    params = [p for m in mods for p in m.parameters()]
    assert params, "found no reward parameters to check"
    return params


# ---------------------------------------------------------------------------------------------- pre-processing
def test_hpsv2_torch_pixels_are_its_recipe():
    """HPSv2 resizes the float tensor after ToTensor upstream: on 8-bit values both of rewardkit's paths (the
    torch recipe of score_tensor, the PIL-decoding one of calls) equal the transcribed upstream transform
    (hpsv2/src/open_clip/transform.py ResizeMaxSize, in tests/helpers/upstream_preprocess.py), and each wrong recipe
    misses by a lot."""
    for k, (h, w) in enumerate(SIZES):
        for x in (natural_like(1, h, w, k), blocks(h, w, k)):
            ref = upstream_pixels("hpsv2", x)
            torch.testing.assert_close(zoo.hpsv2_pixel_values(x, S), ref, atol=1e-6, rtol=0)
            torch.testing.assert_close(zoo.hpsv2_pixels(pil(x), S), ref, atol=1e-6, rtol=0)
            for name, wrong in WRONG["hpsv2"].items():
                assert float(unnorm(wrong(x) - ref).abs().max()) > 2 * PIXEL_MAX, (name, h, w)  # vs <= 1e-6


def test_openai_clip_torch_pixels_match_the_pil_recipe():
    """Aesthetic / ImageReward: against OpenAI CLIP's ``_transform`` transcribed on PIL (clip/clip.py lines 79-86,
    in tests/helpers/upstream_preprocess.py) the torch port is within the resampling difference and rewardkit's PIL
    recipe is exact; bilinear, the pad recipe and a floor-rounded crop offset are not."""
    for k, (h, w) in enumerate(SIZES + [(64, 48), (50, 200), (33, 120), (96, 96)]):
        x = natural_like(1, h, w, k)
        ref = upstream_pixels("clip", x)
        torch.testing.assert_close(zoo.openai_clip_pixels(pil(x), S), ref, atol=1e-6, rtol=0)
        d = unnorm(zoo.openai_clip_pixel_values(x, S) - ref).abs()
        assert float(d.max()) <= PIXEL_MAX and float(d.mean()) <= PIXEL_MEAN, (h, w, float(d.max()), float(d.mean()))
        xb = blocks(h, w, k)
        refb = upstream_pixels("clip", xb)
        assert float(unnorm(zoo.openai_clip_pixel_values(xb, S) - refb).abs().mean()) <= PIXEL_MEAN
        for name, wrong in WRONG["clip"].items():
            if h != w or name == "bilinear":  # (a square image has nothing to pad or crop)
                assert float(unnorm(wrong(xb) - refb).abs().mean()) > 5 * PIXEL_MEAN, (name, h, w)
    # the crop offset: round((35 - 32) / 2) = 2 (torchvision), not 1
    x = natural_like(1, 40, 44, 2)
    ref = upstream_pixels("clip", x)
    assert float(unnorm(clip_crop(x, floor=True) - ref).abs().max()) > 5 * PIXEL_MAX


def test_torch_pixels_gradcheck_float64():
    """Finite differences in float64 on every input pixel of both torch recipes (downscale on both axes, pad,
    crop); inputs away from 0 and 1 so the saturation between resize passes is inactive."""
    g = torch.Generator().manual_seed(0)
    x = (0.3 + 0.4 * torch.rand(1, 3, 12, 9, generator=g, dtype=torch.float64)).requires_grad_(True)
    assert zoo.hpsv2_pixel_values(x, 8).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda t: zoo.hpsv2_pixel_values(t, 8), (x,), eps=1e-6, atol=1e-7)
    assert torch.autograd.gradcheck(lambda t: zoo.openai_clip_pixel_values(t, 8), (x,), eps=1e-6, atol=1e-7)


def test_hpsv2_refuses_a_side_that_rounds_to_zero():
    with pytest.raises(ValueError, match="0 pixels"):
        zoo.hpsv2_resize_shape(1, 500, 224)


# ---------------------------------------------------------------------------------------------- scores
@pytest.mark.parametrize("name", ["hpsv2", "aesthetic", "imagereward"])
def test_score_tensor_matches_the_call(zoo_rewards, name):
    """score_tensor (torch port) and the ordinary call (PIL recipe) for three aspect ratios both equal the score of
    the upstream recipe's pixels (tests/helpers/upstream_preprocess.py; the ordinary call within float noise, score_tensor
    within the stated tolerance); the ordinary call on a float tensor still takes the PIL recipe (identical to
    passing PIL images)."""
    reward = zoo_rewards[name]
    assert reward.differentiable and reward.supports_score_tensor and not reward.supports_tensor_input
    tol = SCORE_TOL[name]
    for k, (h, w) in enumerate(SIZES):
        x = natural_like(1, h, w, k)
        prompt = None if not reward.uses_prompt else PROMPTS[0]
        call = reward(x, prompt).scores
        torch.testing.assert_close(call, reward(pil(x), prompt).scores, atol=0, rtol=0)
        want = score_from_pixels(name, reward, upstream_pixels(name, x), PROMPTS[0])
        assert abs(float(call[0]) - want) <= 1e-5, (h, w, float(call[0]), want)
        got = reward.score_tensor(x, prompt)
        assert abs(float(got[0]) - want) <= tol, (h, w, float(got[0]), want)
        # a wrong recipe by hand: far outside the tolerance
        wrong = WRONG["hpsv2"]["centre crop"] if name == "hpsv2" else WRONG["clip"]["pad (HPSv2)"]
        assert abs(score_from_pixels(name, reward, wrong(x), PROMPTS[0]) - float(call[0])) > 10 * tol, (h, w)
        if name == "hpsv2":  # the other wrong recipes also miss by far more than the (float-noise) tolerance
            for wname in ("pad bottom-right", "bilinear"):
                got_w = score_from_pixels(name, reward, WRONG["hpsv2"][wname](x), PROMPTS[0])
                assert abs(got_w - float(call[0])) > 10 * tol, (wname, h, w)
    if name == "hpsv2":  # arbitrary floats: the call rounds them to 8 bits first, score_tensor does not
        x = (natural_like(1, 48, 64, 0) + 1e-3 * torch.randn(1, 3, 48, 64, generator=torch.Generator().manual_seed(9))).clamp(0, 1)
        assert abs(float(reward.score_tensor(x, PROMPTS[0])[0]) - float(reward(x, PROMPTS[0]).scores[0])) <= 1e-3


def test_hpsv3_score_tensor_is_its_tensor_path(zoo_rewards):
    reward = zoo_rewards["hpsv3"]
    x = natural_like(2, 40, 56, 0)
    torch.testing.assert_close(reward.score_tensor(x, PROMPTS), reward(x, PROMPTS).scores, atol=1e-5, rtol=0)
    # the processor path (PIL + the Qwen-VL processor) within the preference tolerance of tests/contract/test_tensor_path.py
    torch.testing.assert_close(reward.score_tensor(x, PROMPTS), reward(pil(x), PROMPTS).scores, atol=5e-3, rtol=0)


# ---------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", ["hpsv2", "aesthetic", "imagereward", "hpsv3"])
def test_gradients_reach_pixels_and_never_weights(zoo_rewards, name):
    reward = zoo_rewards[name]
    g = torch.Generator().manual_seed(0)
    x = (0.25 + 0.5 * torch.rand(2, 3, 40, 56, generator=g)).requires_grad_(True)
    scores = reward.score_tensor(x, _prompts(reward, 2))
    assert scores.shape == (2,) and scores.dtype == torch.float32 and scores.requires_grad
    scores.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and float(x.grad.abs().sum()) > 0
    x2 = x.detach().clone().requires_grad_(True)
    reward.score_tensor(x2, _prompts(reward, 2))[0].backward()  # each sample's score: its own pixels only
    assert float(x2.grad[0].abs().sum()) > 0 and float(x2.grad[1].abs().sum()) == 0
    assert all(not p.requires_grad and p.grad is None for p in _params(reward))
    # under an outer no_grad (an RL rollout) score_tensor still differentiates; calls never build a graph
    with torch.no_grad():
        assert reward.score_tensor(x.detach().requires_grad_(True), _prompts(reward, 2)).requires_grad
    assert not reward(x, _prompts(reward, 2)).scores.requires_grad


@pytest.mark.parametrize("name", ["hpsv2", "aesthetic", "imagereward"])
def test_gradient_agrees_with_finite_differences(zoo_rewards, name):
    """Directional derivative along a random unit direction, autograd vs central differences (float32 end to
    end: the models load in fp32 at most). HPSv3 is left out: its tiny Qwen-VL hardly depends on the pixels
    (directional derivative ~1e-7, below float32 differences) and its loader has no float64."""
    reward = zoo_rewards[name]
    prompt = _prompts(reward, 1)
    x = 0.3 + 0.4 * torch.rand(1, 3, 36, 44, generator=torch.Generator().manual_seed(1))
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    v = v / v.norm()
    xg = x.clone().requires_grad_(True)
    reward.score_tensor(xg, prompt).sum().backward()
    analytic = float((xg.grad * v).sum())
    eps = 1e-2
    with torch.no_grad():
        numeric = (float(reward.score_tensor(x + eps * v, prompt).sum())
                   - float(reward.score_tensor(x - eps * v, prompt).sum())) / (2 * eps)
    assert abs(analytic) > 1e-5, analytic
    assert abs(analytic - numeric) <= 0.02 * abs(analytic) + 1e-6, (analytic, numeric)


@pytest.mark.parametrize("name,gain", [("hpsv2", 0.3), ("aesthetic", 0.02), ("imagereward", 0.05)])
def test_alignprop_style_ascent_raises_the_published_score(zoo_rewards, name, gain):
    """12 Adam steps on the pixels through score_tensor (torch port) raise the ordinary call's score (PIL
    recipe): what the port optimises is the published score. (Measured gains: 0.95, 0.041, 0.091.)"""
    reward = zoo_rewards[name]
    prompt = None if not reward.uses_prompt else PROMPTS[0]
    logits = torch.randn(1, 3, 40, 48, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=0.05)
    start = float(reward(torch.sigmoid(logits).detach(), prompt).scores[0])
    history = []
    for _ in range(12):
        score = reward.score_tensor(torch.sigmoid(logits), prompt)
        history.append(float(score.detach()[0]))
        opt.zero_grad()
        (-score.sum()).backward()
        opt.step()
    final = float(reward(torch.sigmoid(logits).detach(), prompt).scores[0])
    assert final > start + gain, (start, final, history)
    assert sum(b > a for a, b in zip(history, history[1:])) >= 9, history


def test_size_checks_follow_each_recipe(zoo_rewards):
    """The base class's size-after-resize guard uses each recipe's own resize: ImageReward scales the short side
    up (a 140x20 image becomes 224x32), HPSv2 the long side down (32x5)."""
    x = natural_like(1, 20, 140, 0)
    media.set_max_pixels(3000)
    try:
        with pytest.raises(RewardInputError, match="resize"):
            zoo_rewards["imagereward"].score_tensor(x, PROMPTS[0])
        with pytest.raises(RewardInputError, match="resize"):
            zoo_rewards["imagereward"](x, PROMPTS[0])
        assert zoo_rewards["hpsv2"].score_tensor(x, PROMPTS[0]).shape == (1,)
        assert bool(zoo_rewards["hpsv2"](x, PROMPTS[0]).valid[0])
    finally:
        media.set_max_pixels(None)


def test_score_tensor_refuses_bad_input(zoo_rewards):
    x = natural_like(3, 32, 40, 0)
    x[1, 0, 0, 0] = float("nan")
    for name in ("hpsv2", "aesthetic", "imagereward"):
        reward = zoo_rewards[name]
        with pytest.raises(RewardInputError) as exc:
            reward.score_tensor(x, None if not reward.uses_prompt else "a cat")
        assert exc.value.index == 1
        with pytest.raises(RewardInputError, match="float tensor"):
            reward.score_tensor((x[:1].nan_to_num() * 255).to(torch.uint8), "a cat")


@pytest.mark.parametrize("name", ["hpsv2", "aesthetic", "imagereward", "hpsv3"])
def test_alignprop_adapter_accepts_them(zoo_rewards, name):
    from rewardkit.integrations.ddpo import ddpo_reward_fn

    reward = zoo_rewards[name]
    imgs = (0.25 + 0.5 * torch.rand(2, 3, 32, 40, generator=torch.Generator().manual_seed(3))).requires_grad_(True)
    rewards, meta = ddpo_reward_fn(reward, alignprop=True)(imgs, tuple(PROMPTS), ({}, {}))
    assert rewards.requires_grad and meta["valid_fraction"] == 1.0
    (10 - rewards.mean()).backward()
    assert imgs.grad is not None and float(imgs.grad.abs().sum()) > 0


def test_ls_marks_them_differentiable():
    from rewardkit.commands.ls import describe_rewards

    rows = {r["name"]: r for r in describe_rewards()}
    assert all(rows[n]["differentiable"] for n in ("hpsv2", "aesthetic", "imagereward", "hpsv3"))


# ---------------------------------------------------------------------------------------------- differentiable zoo
@pytest.fixture(scope="module")
def hpsv2_tiny(tmp_path_factory):
    from rewardkit.rewards.hpsv2 import HPSv2

    return HPSv2.tiny(str(tmp_path_factory.mktemp("hpsv2")))


def test_hpsv2_score_tensor_refuses_a_side_that_rounds_to_zero_as_input_error(hpsv2_tiny):
    """The tiny HPSv2 works at 32 px: a 1 x 70 image resizes to round(32 / 70) = 0 rows (aspect ratio 70, under the
    default bound of 200). The ordinary call makes it that sample's error; score_tensor raised a bare ValueError
    from inside the pre-processing instead of the RewardInputError naming the sample that it documents."""
    from rewardkit.errors import RewardInputError

    x = torch.full((2, 3, 1, 70), 0.5)
    out = hpsv2_tiny(x, "a cat", on_error="nan")
    assert not bool(out.valid[0]) and "0 pixels" in out.errors[0]
    with pytest.raises(RewardInputError, match="0 pixels") as exc:
        hpsv2_tiny.score_tensor(x.requires_grad_(True), "a cat")
    assert exc.value.index == 0
    ok = torch.full((1, 3, 2, 70), 0.5, requires_grad=True)  # round(64 / 70) = 1 row: accepted
    hpsv2_tiny.score_tensor(ok, "a cat").sum().backward()
    assert ok.grad is not None and torch.isfinite(ok.grad).all()
