"""The claims of docs/tensors-and-gradients.md that had no test that could fail: processor settings the torch path
cannot follow keep the processor path, ``score_tensor`` under ``no_grad`` and its refusals, Hessel's CLIPScore
gradient where the cosine is negative, differentiable calibration of ``preference``, and the Qwen tensor path
retiring itself when its first check differs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch


# ============================================================================================== docs/tensors-and-gradients.md
@pytest.fixture(scope="module")
def cos_clip(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")


def _pixels(b=4, h=40, w=48, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(b, 3, h, w, generator=g)


def test_processor_settings_the_torch_path_cannot_follow_keep_the_processor_path(tiny_clip_dir, tmp_path, monkeypatch):
    """tensors-and-gradients.md: resampling other than bicubic / bilinear, padding or no rescaling keep a reward on
    the processor path (supports_tensor_input False, float tensors go through PIL); so do numpy arrays and paths."""
    import shutil

    from rewardkit import load_reward, media

    calls = {"pil": 0}
    real = media._to_pil
    monkeypatch.setattr(media, "_to_pil", lambda v, *a: (calls.__setitem__("pil", calls["pil"] + 1), real(v, *a))[1])
    x = _pixels(b=2)
    auto = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")
    assert auto.supports_tensor_input
    auto(x, "a cat")
    assert calls["pil"] == 0
    auto(x.permute(0, 2, 3, 1).numpy(), "a cat")  # a float numpy batch: the processor path
    assert calls["pil"] == 2
    for i, im in enumerate(x):
        media.to_pil(im).save(tmp_path / f"{i}.png")
    auto([str(tmp_path / "0.png"), str(tmp_path / "1.png")], "a cat")
    assert calls["pil"] >= 4
    for change in ({"resample": 0}, {"do_rescale": False}, {"do_pad": True}):
        d = tmp_path / ("clip-" + "-".join(change))
        shutil.copytree(tiny_clip_dir, d)
        cfg_file = d / "processor_config.json"  # transformers 5: the image processor's settings live here
        cfg = json.loads(cfg_file.read_text())
        cfg["image_processor"].update(change)
        cfg_file.write_text(json.dumps(cfg))
        r = load_reward("clipscore", model=str(d), convention="cosine", device="cpu")
        assert not r.supports_tensor_input, change
        before = calls["pil"]
        r(x, "a cat")
        assert calls["pil"] == before + 2, change


def test_score_tensor_under_no_grad_and_its_refusals(cos_clip):
    """tensors-and-gradients.md: score_tensor turns autograd on inside (works under an outer no_grad), returns
    float32 [B] on the input's device for any float dtype, takes one prompt or B, and refuses NaN / Inf, values
    outside [0, 1], and a wrong shape, naming the sample."""
    from rewardkit.errors import RewardInputError

    x = _pixels(b=2).requires_grad_(True)
    with torch.no_grad():
        s = cos_clip.score_tensor(x, "a cat")
    assert s.requires_grad and s.dtype == torch.float32 and s.shape == (2,) and s.device == x.device
    s.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    torch.testing.assert_close(cos_clip.score_tensor(x.detach().double(), ["a cat", "a cat"]).detach(), s.detach(),
                               atol=1e-5, rtol=0)
    edge = _pixels(b=2)
    edge[0, 0, 0, 0], edge[1, 2, 5, 5] = 1.0 + 5e-4, -5e-4           # within the 1e-3 tolerance: clamped
    torch.testing.assert_close(cos_clip.score_tensor(edge, "a cat").detach(),
                               cos_clip.score_tensor(edge.clamp(0, 1), "a cat").detach(), atol=0, rtol=0)
    for value, index in ((float("inf"), 1), (1.5, 0), (-0.2, 1), (1.002, 0), (-0.002, 1)):
        bad = _pixels(b=2)
        bad[index, 1, 2, 3] = value
        with pytest.raises(RewardInputError) as ei:
            cos_clip.score_tensor(bad, "a cat")
        assert ei.value.index == index
    for shape in ((2, 4, 32, 32), (3, 32, 32), (2, 1, 32, 32)):
        with pytest.raises(RewardInputError):
            cos_clip.score_tensor(torch.rand(shape), "a cat")
    with pytest.raises((RewardInputError, ValueError)):
        cos_clip.score_tensor(_pixels(b=2), ["one prompt for two images"])


def test_hessel_clipscore_has_zero_gradient_where_the_cosine_is_negative(tiny_clip_dir, cos_clip):
    """tensors-and-gradients.md: the default Hessel convention 2.5 max(cos, 0) gives no gradient where cos < 0;
    the cosine convention does."""
    from rewardkit import load_reward

    hessel = load_reward("clipscore", model=str(tiny_clip_dir), device="cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(8, 3, 32, 32, generator=g), torch.rand(8, 3, 1, 1, generator=g).expand(8, 3, 32, 32)])
    pairs = [(i, p) for p in ("a red car on a road", "zzz qqq", "blue") for i in range(16)]
    cos = cos_clip.score_tensor(x[[i for i, _ in pairs]], [p for _, p in pairs]).detach()
    assert (cos < 0).any() and (cos > 0).any()
    neg, pos = pairs[int(torch.nonzero(cos < 0)[0])], pairs[int(torch.nonzero(cos > 0)[0])]
    xi = x[[neg[0], pos[0]]].clone().requires_grad_(True)
    pr = [neg[1], pos[1]]
    h = hessel.score_tensor(xi, pr)
    c2 = cos_clip.score_tensor(xi.detach(), pr)
    assert c2[0] < 0 < c2[1]
    torch.testing.assert_close(h.detach(), 2.5 * c2.clamp_min(0), atol=1e-5, rtol=0)
    h.sum().backward()
    assert xi.grad[0].abs().sum() == 0 and xi.grad[1].abs().sum() > 0
    xc = x[[neg[0]]].clone().requires_grad_(True)
    cos_clip.score_tensor(xc, pr[:1]).sum().backward()
    assert xc.grad.abs().sum() > 0


def test_preference_calibration_normalises_differentiably(tmp_path):
    """tensors-and-gradients.md: a preference model with a calibration normalises inside score_tensor:
    "calibration" is (raw - mean) / std (gradient = raw gradient / std), "quantile" the piecewise-linear CDF."""
    from rewardkit import load_reward
    from rewardkit.calibration import calibration_stats
    from rewardkit.models.preference import PreferenceModel
    from rewardkit.rewards.preference import PreferenceReward

    raw_reward = PreferenceReward.tiny(str(tmp_path))
    d = tmp_path / "tiny-preference"
    x = _pixels(b=3, h=32, w=32, seed=2)
    raw = raw_reward(x, "a cat").scores
    stats = calibration_stats(torch.cat([raw, raw + 0.3, raw - 0.2, raw * 1.5]))
    PreferenceModel.save_calibration(raw_reward.model, d, stats)
    xg = x.clone().requires_grad_(True)
    raw_reward.score_tensor(xg, "a cat").sum().backward()
    raw_grad = xg.grad.clone()

    cal = load_reward("preference", model=str(d), normalize="calibration", device="cpu")
    xc = x.clone().requires_grad_(True)
    z = cal.score_tensor(xc, "a cat")
    torch.testing.assert_close(z.detach(), ((raw.double() - stats["mean"]) / stats["std"]).float(), atol=1e-4, rtol=0)
    z.sum().backward()
    torch.testing.assert_close(xc.grad, raw_grad / stats["std"], atol=1e-6, rtol=1e-3)

    qr = load_reward("preference", model=str(d), normalize="quantile", device="cpu")
    qs = sorted((float(k), v) for k, v in stats["quantiles"].items())
    ref = torch.tensor([float(np.interp(float(r), [v for _, v in qs], [q for q, _ in qs])) for r in raw])
    xq = x.clone().requires_grad_(True)
    q = qr.score_tensor(xq, "a cat")
    torch.testing.assert_close(q.detach(), ref.float(), atol=1e-4, rtol=0)
    q.sum().backward()
    assert torch.isfinite(xq.grad).all() and xq.grad.abs().sum() > 0


def test_qwen_tensor_path_retires_itself_when_the_first_check_differs(tmp_path, monkeypatch):
    """tensors-and-gradients.md: on its first call the Qwen-VL tensor path checks its token ids, masks and grid
    against the processor; any difference retires it for that model and the processor path is used instead."""
    from rewardkit import load_reward, media, preprocess
    from rewardkit.rewards.preference import PreferenceReward

    PreferenceReward.tiny(str(tmp_path))
    d = str(tmp_path / "tiny-preference")
    proc = load_reward("preference", model=d, preprocess="processor", device="cpu")
    auto = load_reward("preference", model=d, device="cpu")
    assert auto.supports_tensor_input
    real = preprocess.qwen_pixel_values

    def off_by_one_grid(images, params):
        pv, grid = real(images, params)
        return pv, grid + torch.tensor([0, 0, 2])     # a torch path that disagrees with the processor

    monkeypatch.setattr(preprocess, "qwen_pixel_values", off_by_one_grid)
    x = _pixels(b=2, h=32, w=32, seed=4)
    ref = proc(x, "a cat").scores
    n_pil = {"n": 0}
    to_pil = media.to_pil
    monkeypatch.setattr(media, "to_pil", lambda v: (n_pil.__setitem__("n", n_pil["n"] + 1), to_pil(v))[1])
    torch.testing.assert_close(auto(x, "a cat").scores, ref, atol=1e-5, rtol=0)   # answered by the processor path
    assert auto.model._encoder._tensor_ok is False and not auto.supports_tensor_input
    assert n_pil["n"] >= 2
