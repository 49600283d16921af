"""On-device tensor fast path (issue 12): float [B, 3, H, W] tensors are pre-processed in torch, matching the
processor path within a documented bound, chosen automatically, validated in one vectorised check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rewardkit import load_reward, media, preprocess
from rewardkit.errors import RewardInputError

# 24 varied sizes (h, w): squares, portrait / landscape up to 1:8, odd sizes, smaller and larger than the
# models' input sizes; one image each (a tensor batch shares one size; batches are tested below).
SIZES = [(512, 512), (224, 224), (100, 300), (300, 100), (37, 53), (640, 480), (480, 640), (1024, 256),
         (256, 1024), (20, 20), (15, 120), (333, 777), (224, 225), (64, 512), (801, 800), (50, 50), (128, 96),
         (96, 128), (700, 300), (23, 31), (57, 57), (400, 90), (90, 400), (1000, 999)]

# Documented bounds (docs/tensor-path.md, README): |tensor path - processor path| on natural-like images.
PIXEL_MAX = 0.01    # per pre-processed pixel, in [0, 1] units (measured 0.0065)
PIXEL_MEAN = 0.002  # mean over pixels (measured 0.0010-0.0015: mostly the 8-bit rounding PIL adds)
COSINE_MAX = 2e-3   # CLIP cosine (clipscore convention=cosine; measured 6.7e-4); pickscore: logit_scale x this
PREFERENCE_MAX = 5e-3  # raw reward of the tiny Qwen2.5-VL preference model (scores ~0.1-0.5; measured 1.6e-3)


def natural_like(b: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Smooth random images (low-frequency colour fields plus mild texture), float32 [b, 3, h, w] in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(b, 3, max(2, h // 16), max(2, w // 16), generator=g)
    x = torch.nn.functional.interpolate(base, size=(h, w), mode="bicubic", align_corners=False)
    x = x + 0.03 * torch.randn(b, 3, h, w, generator=g)
    return x.clamp(0, 1)


@pytest.fixture(scope="module")
def clip_pair(tiny_clip_dir):
    auto = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    proc = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", preprocess="processor")
    return auto, proc


@pytest.fixture(scope="module")
def preference_pair(tmp_path_factory):
    from rewardkit.rewards.preference import PreferenceReward

    auto = PreferenceReward.tiny(str(tmp_path_factory.mktemp("pref")))
    proc = PreferenceReward(model=auto.config.model, device="cpu", preprocess="processor")
    return auto, proc


# ---------------------------------------------------------------------------------------------- pure functions
def test_geometry_matches_transformers():
    from transformers.image_transforms import get_resize_output_image_size
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    for h, w in SIZES + [(1, 150), (3000, 17), (28, 28), (29, 27)]:
        ref = get_resize_output_image_size(np.zeros((3, h, w)), 224, default_to_square=False,
                                           input_data_format="channels_first")
        assert preprocess.clip_resize_shape(h, w, 224) == tuple(ref)
        for lo, hi in ((56 * 56, 28 * 28 * 1280), (784, 3136), (1024, 4096)):
            for f in (28, 32):
                assert preprocess.smart_resize(h, w, f, lo, hi) == hf_smart_resize(h, w, f, lo, hi)
    with pytest.raises(ValueError, match="aspect ratio"):
        preprocess.smart_resize(1, 300, 28, 784, 3136)


def test_params_from_processors():
    import transformers

    cp = preprocess.clip_params(transformers.CLIPImageProcessorPil())
    assert cp.shortest_edge == 224 and cp.crop_hw == (224, 224) and cp.mode == "bicubic"
    qp = preprocess.qwen_params(transformers.Qwen2VLImageProcessorPil())
    assert (qp.patch_size, qp.merge_size, qp.temporal_patch_size) == (14, 2, 2)
    assert (qp.min_pixels, qp.max_pixels) == (56 * 56, 28 * 28 * 1280)
    # settings the torch path does not reproduce: None, so rewards stay on the processor path
    assert preprocess.clip_params(transformers.CLIPImageProcessorPil(resample=0)) is None  # nearest
    assert preprocess.clip_params(transformers.CLIPImageProcessorPil(do_rescale=False)) is None


def test_clip_pixel_values_match_the_processor():
    """Realistic CLIP processor (224 shortest edge + 224 crop) over the 24 sizes."""
    import transformers

    ip = transformers.CLIPImageProcessorPil()
    p = preprocess.clip_params(ip)
    std = torch.tensor(ip.image_std).view(3, 1, 1)
    for k, (h, w) in enumerate(SIZES):
        x = natural_like(1, h, w, seed=k)
        mine = preprocess.clip_pixel_values(x, p)[0]
        ref = torch.from_numpy(np.asarray(ip(images=[media.to_pil(x[0])])["pixel_values"][0]))
        diff = ((mine - ref) * std).abs()  # back to [0, 1] pixel units
        assert mine.shape == ref.shape == (3, 224, 224)
        assert float(diff.max()) < PIXEL_MAX and float(diff.mean()) < PIXEL_MEAN, (h, w, float(diff.max()))


def test_qwen_pixel_values_match_the_processor():
    """Realistic Qwen2-VL processor (min 56^2, max 28^2 * 1280 pixels) over the 24 sizes: same grid, same
    patch layout, pixels within the bound."""
    import transformers

    ip = transformers.Qwen2VLImageProcessorPil()
    p = preprocess.qwen_params(ip)
    for k, (h, w) in enumerate(SIZES):
        x = natural_like(1, h, w, seed=100 + k)
        pv, grid = preprocess.qwen_pixel_values(x, p)
        ref = ip(images=[media.to_pil(x[0])], return_tensors="pt")
        assert torch.equal(grid, ref["image_grid_thw"]), (h, w)
        assert pv.shape == ref["pixel_values"].shape
        diff = (pv - ref["pixel_values"]).abs() * 0.2613  # ~std: back to [0, 1] units
        assert float(diff.max()) < PIXEL_MAX * 1.05 and float(diff.mean()) < PIXEL_MEAN, (h, w)


def test_qwen_patch_layout_is_exact_without_resampling():
    """An 8-bit image already at a valid size is not resampled: pixel values equal the processor's exactly
    (this pins the patchify order, temporal repeat and normalisation)."""
    import transformers

    ip = transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112)
    p = preprocess.qwen_params(ip)
    g = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, (2, 3, 56, 112), generator=g, dtype=torch.uint8)
    x = u8.float() / 255
    pv, grid = preprocess.qwen_pixel_values(x, p)
    ref = ip(images=[media.to_pil(u) for u in u8], return_tensors="pt")
    assert torch.equal(grid, ref["image_grid_thw"])
    torch.testing.assert_close(pv, ref["pixel_values"], atol=1e-5, rtol=0)


def test_check_pixels_is_one_vectorised_check():
    x = torch.rand(5, 3, 8, 8)
    x[1, 0, 0, 0] = float("nan")
    x[2, 1, 2, 3] = float("inf")
    x[3] = x[3] * 2 - 1  # [-1, 1]
    x[4] = x[4] * 255
    reasons = preprocess.check_pixels(x)
    assert reasons[0] is None
    assert "NaN" in reasons[1] and "NaN" in reasons[2]
    assert "[-1, 1]" in reasons[3] and "[0, 255]" in reasons[4]
    assert preprocess.check_pixels(torch.rand(2, 3, 4, 4).clamp(0, 1) + 5e-4) == [None, None]  # tolerance


def test_pixel_stats_are_each_samples_finiteness_min_and_max():
    """Per sample, in order: (all finite, min, max), as Python's min / max over that sample's values; NaN or Inf
    anywhere in a sample marks it (and only it) not finite."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(4, 3, 5, 7, generator=g) * torch.tensor([1.0, 2.0, 0.5, 3.0]).view(4, 1, 1, 1) - 0.25
    x[2, 1, 3, 4] = float("-inf")
    x[3, 0, 0, 0] = float("nan")
    got = preprocess.pixel_stats(x)
    assert len(got) == 4
    for i in range(2):
        vals = x[i].reshape(-1).tolist()
        assert got[i] == (True, min(vals), max(vals))
    assert got[2][0] is False and got[2][1] == float("-inf")
    assert got[3][0] is False
    assert preprocess.pixel_stats(torch.zeros(0, 3, 4, 4)) == []


# ---------------------------------------------------------------------------------------------- rewards
def test_clip_rewards_tensor_path_matches_processor_path(clip_pair, tiny_clip_dir):
    auto, proc = clip_pair
    assert auto.supports_tensor_input and not proc.supports_tensor_input
    pick = load_reward("pickscore", model=str(tiny_clip_dir))
    pick_proc = load_reward("pickscore", model=str(tiny_clip_dir), preprocess="processor")
    scale = pick.backbone.logit_scale
    worst = 0.0
    for k, (h, w) in enumerate(SIZES):
        x = natural_like(1, h, w, seed=k)
        prompts = ["a red apple on a table"]
        a, b = auto(x, prompts), proc(x, prompts)
        assert a.valid.all() and b.valid.all()
        worst = max(worst, float((a.scores - b.scores).abs().max()))
        if k % 4 == 0:  # pickscore shares the backbone path: a subset suffices
            pa, pb = pick(x, prompts).scores, pick_proc(x, prompts).scores
            assert float((pa - pb).abs().max()) < scale * COSINE_MAX, (h, w)
    assert worst < COSINE_MAX, worst


def test_preference_tensor_path_matches_processor_path(preference_pair):
    auto, proc = preference_pair
    assert auto.supports_tensor_input and not proc.supports_tensor_input
    for k, (h, w) in enumerate(SIZES):
        x = natural_like(1, h, w, seed=50 + k)
        a, b = auto(x, "a red apple"), proc(x, "a red apple")
        assert a.valid.all() and b.valid.all()
        assert float((a.scores - b.scores).abs().max()) < PREFERENCE_MAX, (h, w, a.scores, b.scores)
    assert auto.model._encoder._tensor_ok is True  # checked once against the processor's ids and grid


def test_tensor_path_is_chosen_automatically(clip_pair, preference_pair, monkeypatch):
    """Float [B, 3, H, W] tensors never reach PIL; other inputs (and preprocess='processor') do."""
    auto, proc = clip_pair
    pref, _ = preference_pair
    x = natural_like(3, 40, 60, seed=1)
    calls = {"pil": 0}
    real = media._to_pil

    def spy(v, *args):  # the official input policy passes its conversion as a second argument
        calls["pil"] += 1
        return real(v, *args)

    monkeypatch.setattr(media, "_to_pil", spy)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        auto(x.to(dtype), "a cat")
        pref(x.to(dtype), "a cat")
    assert calls["pil"] == 0
    proc(x, "a cat")
    assert calls["pil"] == 3
    auto(list(x), "a cat")  # a list of CHW tensors: the processor path
    auto((x * 255).round().to(torch.uint8), "a cat")  # uint8: the processor path
    assert calls["pil"] == 9


def test_tensor_path_dtypes_and_chunking(clip_pair):
    auto, _ = clip_pair
    x = natural_like(5, 48, 64, seed=3)
    ref = auto(x, "a cat").scores
    for dtype, tol in ((torch.float64, 1e-5), (torch.float16, 5e-3), (torch.bfloat16, 2e-2)):
        torch.testing.assert_close(auto(x.to(dtype), "a cat").scores, ref, atol=tol, rtol=0)
    torch.testing.assert_close(auto(x, "a cat", batch_size=2).scores, ref, atol=1e-5, rtol=0)
    non_contig = x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)  # same values, other strides
    torch.testing.assert_close(auto(non_contig, "a cat").scores, ref, atol=1e-6, rtol=0)


def test_tensor_path_isolates_bad_samples(clip_pair):
    auto, _ = clip_pair
    x = natural_like(4, 32, 32, seed=4)
    good = auto(x, ["a", "b", "c", "d"])
    bad = x.clone()
    bad[1, 0, 3, 3] = float("nan")
    bad[2] = bad[2] * 2 - 1
    out = auto(bad, ["a", "b", "c", "d"], on_error="nan")
    assert out.valid.tolist() == [True, False, False, True]
    assert "NaN" in out.errors[1] and "[-1, 1]" in out.errors[2]
    torch.testing.assert_close(out.scores[[0, 3]], good.scores[[0, 3]], atol=1e-6, rtol=0)
    with pytest.raises(RewardInputError) as exc:
        auto(bad, ["a", "b", "c", "d"])
    assert exc.value.index == 1
    bad_prompt = auto(x, ["a", "b\ud800", "c", "d"], on_error="nan")  # a lone surrogate: that sample's error
    assert bad_prompt.valid.tolist() == [True, False, True, True]
    empty_prompt = auto(x, ["a", "", "c", "d"], on_error="nan")  # CLIP rewards score "" as their packages do
    assert empty_prompt.valid.all()
    assert len(auto(x[:0], [])) == 0


def test_tensor_path_refuses_oversized_images(clip_pair):
    auto, _ = clip_pair
    old = media.get_max_pixels()
    media.set_max_pixels(1000)
    try:
        out = auto(torch.rand(2, 3, 40, 40), "a cat", on_error="nan")
    finally:
        media.set_max_pixels(old)
    assert not out.valid.any() and "over the limit" in out.errors[0]


def test_gpu_benchmark_script_dry_run(capsys):
    """benchmarks/gpu/tensor_path.py runs unchanged; --dry-run takes the same code path on the CPU."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "tensor_path.py"
    ns = runpy.run_path(str(script), run_name="bench")
    assert ns["main"](["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert '"ratio"' in out and '"input_ratio"' in out and "max_abs_score_diff" in out


def test_tensor_path_refuses_what_the_processor_path_refuses_for_size(tiny_clip_dir):
    """The aspect-ratio bound and the size after the model's own resize apply to float tensors too."""
    from rewardkit import load_reward, media

    reward = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    wide = torch.rand(2, 3, 4, 1200)  # aspect 300 > the default bound of 200
    out = reward(wide, "a cat", on_error="nan")
    assert not out.valid.any() and "aspect" in out.errors[0]
    old = media.get_max_pixels()
    try:
        # 32-px shortest-edge resize of 16 x 400 -> 32 x 800 = 25,600 pixels; the input itself is 6,400
        media.set_max_pixels(10_000)
        out = reward(torch.rand(1, 3, 16, 400), "a cat", on_error="nan")
        assert not out.valid[0] and "resize" in out.errors[0].lower(), out.errors[0]
    finally:
        media.set_max_pixels(old)
