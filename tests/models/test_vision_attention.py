"""Qwen-VL vision attention grouped by chunk length (rewardkit.models.vision_attention): bit for bit
transformers' per-chunk SDPA loop, in fewer kernel calls."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rewardkit.models.vision_attention import NAME, grouped_sdpa, set_vision_attention
from rewardkit.testing import TINY_KINDS, random_images

transformers = pytest.importorskip("transformers")


class _Attn(nn.Module):
    is_causal = False
    num_key_value_groups = 1


def _stock_loop(q, k, v, bounds, scaling):
    """transformers' non-flash branch of the Qwen-VL vision attention, as written there
    (models/qwen2_5_vl/modeling_qwen2_5_vl.py, Qwen2_5_VLVisionAttention.forward): split at the boundaries,
    one ``sdpa_attention_forward`` per chunk, concatenated."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lengths = (bounds[1:] - bounds[:-1]).tolist()
    splits = [torch.split(t, lengths, dim=2) for t in (q, k, v)]
    outs = [sdpa_attention_forward(_Attn(), a, b, c, attention_mask=None, scaling=scaling, dropout=0.0,
                                   is_causal=False)[0] for a, b, c in zip(*splits)]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("lengths", [[16, 16, 16, 16], [16, 4, 16, 16, 1, 16, 4], [7], [64, 16, 8, 16, 8]])
def test_grouped_sdpa_equals_transformers_per_chunk_loop(lengths):
    torch.manual_seed(0)
    bounds = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    total = int(bounds[-1])
    q, k, v = (torch.randn(1, 2, total, 8) for _ in range(3))
    want = _stock_loop(q, k, v, bounds, 8 ** -0.5)
    got, none = grouped_sdpa(_Attn(), q, k, v, None, scaling=8 ** -0.5, is_causal=False, cu_seq_lens_q=bounds,
                             cu_seq_lens_k=bounds, max_length_q=max(lengths), max_length_k=max(lengths))
    assert none is None and got.shape == want.shape == (1, total, 2, 8)
    assert torch.equal(got, want)
    # an empty chunk (which transformers' loop cannot take) is skipped
    with_empty = torch.cat([bounds[:1], bounds])  # a first chunk of length 0
    assert torch.equal(grouped_sdpa(_Attn(), q, k, v, None, scaling=8 ** -0.5, cu_seq_lens_q=with_empty)[0], want)
    # a second call with the same boundaries uses the kept plan: same result
    assert torch.equal(grouped_sdpa(_Attn(), q, k, v, None, scaling=8 ** -0.5, cu_seq_lens_q=bounds)[0], want)
    # an in-place change of the boundaries is seen (the plan is kept per boundary values)
    if len(lengths) > 1 and lengths[0] > 1:
        bounds[1] -= 1
        want2 = _stock_loop(q, k, v, bounds, 8 ** -0.5)
        assert torch.equal(grouped_sdpa(_Attn(), q, k, v, None, scaling=8 ** -0.5, cu_seq_lens_q=bounds)[0], want2)


def test_boundaries_that_do_not_cover_the_tokens_are_refused():
    q = torch.randn(1, 2, 10, 8)
    for bad in ([0, 4, 8], [2, 6, 10], [0, 6, 4, 10]):
        with pytest.raises(ValueError, match="vision attention boundaries"):
            grouped_sdpa(_Attn(), q, q, q, None, cu_seq_lens_q=torch.tensor(bad, dtype=torch.int32))


def test_without_boundaries_it_is_transformers_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8) for _ in range(3))
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    for kw in ({"attention_mask": None}, {"attention_mask": mask}):
        want = sdpa_attention_forward(_Attn(), q, k, v, scaling=0.3, **kw)[0]
        assert torch.equal(grouped_sdpa(_Attn(), q, k, v, scaling=0.3, **kw)[0], want)


def _windowed_qwen2_5_vl():
    """The tiny Qwen2.5-VL with a second vision block that attends within windows (block 0: windows of 4x4
    patches; block 1: whole images), so both kinds of boundaries are exercised."""
    vlm, _ = TINY_KINDS["qwen2_5_vl"]()
    cfg = copy.deepcopy(vlm.config)
    cfg.vision_config.depth = 2
    cfg.vision_config.fullatt_block_indexes = [1]
    torch.manual_seed(3)
    return transformers.Qwen2_5_VLForConditionalGeneration(cfg).eval()


def _count_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(q, *a, **kw):
        calls.append(q.shape[0])
        return real(q, *a, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_vision_tower_bit_for_bit_in_fewer_calls(kind, monkeypatch):
    vlm = _windowed_qwen2_5_vl() if kind == "qwen2_5_vl" else TINY_KINDS[kind]()[0].eval()
    vc = vlm.config.vision_config
    per = vc.patch_size ** 2 * vc.temporal_patch_size * vc.in_channels
    # four images of three sizes (in patches): several chunks of one length, not all adjacent; windows of 16
    # and 8 patches for Qwen2.5-VL's windowed block
    grid = torch.tensor([[1, 8, 8], [1, 4, 6], [1, 8, 8], [1, 6, 4]])
    torch.manual_seed(4)
    pixels = torch.randn(int(grid.prod(-1).sum()), per)
    visual = vlm.model.visual
    calls = _count_sdpa(monkeypatch)
    with torch.no_grad():
        assert set_vision_attention(vlm, "sdpa") is False and visual.config._attn_implementation == "sdpa"
        want = visual(pixels, grid_thw=grid)
        stock_calls = len(calls)
        calls.clear()
        assert set_vision_attention(vlm, "grouped") is True and visual.config._attn_implementation == NAME
        got = visual(pixels, grid_thw=grid)
    want_h = getattr(want, "pooler_output", want)
    got_h = getattr(got, "pooler_output", got)
    assert torch.equal(got_h, want_h)
    if kind == "qwen2_5_vl":  # block 0: 4 + 2 + 4 + 2 windows of 16 or 8 patches; block 1: the 4 images
        assert stock_calls == 12 + 4 and len(calls) == 2 + 2
    else:  # one block: 4 images of 64, 24, 64, 24 patches
        assert stock_calls == 4 * vc.depth and len(calls) == 2 * vc.depth
    # saving does not carry the switch: the config written is the stock one
    assert "rewardkit" not in vlm.config.to_json_string()


def test_preference_model_groups_by_default_and_leaves_other_implementations(tmp_path):
    from rewardkit import load_reward
    from rewardkit.models.preference import PreferenceModel

    torch.manual_seed(0)
    m = PreferenceModel.from_backbone("tiny:qwen2_5_vl").eval()
    assert m.vision_attention == "grouped"
    m.save_pretrained(tmp_path / "model")
    r = load_reward("preference", model=str(tmp_path / "model"), device="cpu")
    assert r.model.vision_attention == "grouped"
    ims = random_images(6, sizes=[(56, 56), (32, 32), (56, 56), (40, 64), (56, 56), (33, 47)])
    got = r(ims, "a cat").scores
    r.model.vision_attention = "sdpa"
    assert r.model.vision_attention == "sdpa"
    assert torch.equal(r(ims, "a cat").scores, got)
    with pytest.raises(ValueError, match="vision_attention must be"):
        r.model.vision_attention = "flash"
    # a backbone running eager attention keeps it
    vlm, proc = TINY_KINDS["qwen2_5_vl"]()
    vlm.config.vision_config._attn_implementation = "eager"
    eager = PreferenceModel(vlm, proc)
    assert eager.vision_attention == "sdpa" and vlm.model.visual.config._attn_implementation == "eager"


def test_training_gradients_are_unchanged():
    vlm = _windowed_qwen2_5_vl().train()
    vc = vlm.config.vision_config
    grid = torch.tensor([[1, 8, 8], [1, 4, 6], [1, 8, 8]])
    torch.manual_seed(5)
    pixels = torch.randn(int(grid.prod(-1).sum()), vc.patch_size ** 2 * vc.temporal_patch_size * vc.in_channels)
    grads = {}
    for mode in ("sdpa", "grouped"):
        vlm.zero_grad(set_to_none=True)
        set_vision_attention(vlm, mode)
        out = vlm.model.visual(pixels, grid_thw=grid)
        h = getattr(out, "pooler_output", out)
        (h.square().sum()).backward()
        grads[mode] = {n: p.grad.clone() for n, p in vlm.model.visual.named_parameters() if p.grad is not None}
    assert grads["sdpa"].keys() == grads["grouped"].keys() and grads["sdpa"]
    for n in grads["sdpa"]:
        assert torch.equal(grads["sdpa"][n], grads["grouped"][n]), n
