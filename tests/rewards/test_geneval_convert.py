"""``rewardkit convert geneval``: the mmdet Mask2Former key map on a tiny random state dict in mmdet's key layout
(rewardkit.convert.tiny_geneval), the 2x2 patch-merging permutation against a transcription of mmdet's
``PatchMerging``, the checkpoint read through the pickle scan, and mmdet's instance post-processing by hand."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rewardkit.convert.geneval import mask2former_config_from_mmdet, mmdet_to_hf, unfold_to_concat  # noqa: E402
from rewardkit.convert.tiny_geneval import mmdet_mask2former_state_dict  # noqa: E402
from rewardkit.rewards._geneval_detect import instance_postprocess, mask2bbox, resize_shape  # noqa: E402
from tests.helpers.geneval_official import mmdet_patch_merging  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _import_mask2former():
    """transformers' lazy Mask2Former / Swin modules import in the setup, not in the first test's call."""
    return transformers.Mask2FormerForUniversalSegmentation, transformers.SwinConfig, transformers.CLIPModel


def _model(sd):
    kw = mask2former_config_from_mmdet(sd)
    cfg = transformers.Mask2FormerConfig(**{**kw, "backbone_config": transformers.SwinConfig(
        **{k: v for k, v in kw["backbone_config"].items() if k != "model_type"})})
    state = mmdet_to_hf(sd, kw)
    m = transformers.Mask2FormerForUniversalSegmentation(cfg).eval()
    missing, unexpected = m.load_state_dict(state, strict=False)
    return m, state, missing, unexpected


def test_key_map_places_every_mmdet_tensor_and_fills_every_parameter():
    sd = mmdet_mask2former_state_dict()
    m, state, missing, unexpected = _model(sd)
    assert unexpected == [] and missing == ["criterion.empty_weight"]  # a loss buffer, not in mmdet's file
    kw = mask2former_config_from_mmdet(sd)
    assert kw["decoder_layers"] == 3 and kw["num_attention_heads"] == 4 and kw["num_queries"] == 12
    assert kw["backbone_config"]["depths"] == [1, 1, 2, 1] and kw["backbone_config"]["window_size"] == 7
    # the split of mmdet's fused qkv: rows q | k | v
    qkv = sd["backbone.stages.2.blocks.1.attn.w_msa.qkv.weight"]
    pre = "model.pixel_level_module.encoder.swin.encoder.layers.2.blocks.1.attention."
    assert torch.equal(torch.cat([state[pre + f"{n}_proj.weight"] for n in "qkv"]), qkv)
    ip = sd["panoptic_head.transformer_decoder.layers.1.attentions.1.attn.in_proj_weight"]
    pre = "model.transformer_module.decoder.layers.1.self_attn."
    assert torch.equal(torch.cat([state[pre + f"{n}_proj.weight"] for n in "qkv"]), ip)
    # an unplaced tensor is an error, not silently dropped
    with pytest.raises(ValueError, match="does not place"):
        mmdet_to_hf({**sd, "panoptic_head.extra.weight": torch.zeros(1)}, kw)


def test_patch_merging_equals_mmdets_unfold_layout():
    sd = mmdet_mask2former_state_dict(seed=3)
    m, _, _, _ = _model(sd)
    hf = m.model.pixel_level_module.encoder.swin.encoder.layers[1].downsample  # stage 1 -> 2, C = 32
    x = torch.randn(2, 6 * 8, 32, generator=torch.Generator().manual_seed(0))
    want = mmdet_patch_merging(x, (6, 8), sd["backbone.stages.1.downsample.norm.weight"],
                               sd["backbone.stages.1.downsample.norm.bias"],
                               sd["backbone.stages.1.downsample.reduction.weight"])
    with torch.no_grad():
        got = hf(x, (6, 8))
    assert torch.allclose(got, want, atol=1e-5)
    # the planted bug: copying the weights without the permutation gives other features
    with torch.no_grad():
        hf.reduction.weight.copy_(sd["backbone.stages.1.downsample.reduction.weight"])
        assert not torch.allclose(hf(x, (6, 8)), want, atol=1e-3)
    perm = unfold_to_concat(torch.arange(8.0))  # C = 2: mmdet index c * 4 + 2 * dy + dx
    assert perm.tolist() == [0, 4, 2, 6, 1, 5, 3, 7]


def test_swin_final_layernorm_is_unused():
    m, _, _, _ = _model(mmdet_mask2former_state_dict())
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = m(pixel_values=x)
        m.model.pixel_level_module.encoder.swin.layernorm.weight.mul_(3.0)
        b = m(pixel_values=x)
    assert torch.equal(a.class_queries_logits, b.class_queries_logits)
    assert torch.equal(a.masks_queries_logits, b.masks_queries_logits)


def test_convert_reads_the_pickle_through_the_scan(tmp_path, tiny_clip_dir):
    from rewardkit.convert import convert
    from rewardkit.convert._io import UnsafeCheckpointError
    from rewardkit.convert.tiny_geneval import write_tiny_geneval_detector

    src = write_tiny_geneval_detector(tmp_path / "m2f.pth")
    out = convert("geneval", src, tmp_path / "out", clip=str(tiny_clip_dir))
    assert (out / "detector" / "model.safetensors").is_file() and (out / "clip" / "model.safetensors").is_file()
    bad = tmp_path / "bad.pth"
    torch.save({"state_dict": {}, "meta": {"x": torch.nn.Linear(1, 1)}}, str(bad))
    with pytest.raises(UnsafeCheckpointError):
        convert("geneval", bad, tmp_path / "out2", clip=str(tiny_clip_dir))


def test_mmdet_post_processing_by_hand():
    # mmcv's imrescale into 1333 x 800: 512 x 512 -> 800 x 800; 480 x 640 (h x w) -> 800 x 1067
    assert resize_shape(512, 512) == (800, 800) and resize_shape(480, 640) == (800, 1067)
    assert resize_shape(100, 1000) == (133, 1333)
    masks = torch.zeros(3, 5, 6, dtype=torch.bool)
    masks[0, 1:3, 2:5] = True
    masks[2, 4, 0] = True
    assert mask2bbox(masks).tolist() == [[2, 1, 5, 3], [0, 0, 0, 0], [0, 4, 1, 5]]
    # 2 queries, 2 classes + no-object; query 0 favours class 1
    cls = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]])
    logit = torch.full((2, 4, 4), -3.0)
    logit[0, :2, :2] = 1.0  # query 0: a 2 x 2 mask, sigmoid(1) inside
    res = instance_postprocess(cls, logit, max_per_image=4)
    p = torch.softmax(cls, -1)[:, :2]
    got = {(int(l), round(float(b[4]), 6)): b[:4].tolist() for l, b in zip(res["labels"], res["boxes"])}
    s0 = float(torch.sigmoid(torch.tensor(1.0)))
    assert got[(1, round(float(p[0, 1]) * s0, 6))] == [0, 0, 2, 2]
    assert got[(0, round(float(p[0, 0]) * s0, 6))] == [0, 0, 2, 2]
    # query 1 has an empty mask: score 0 (no pixel above 0), box all zeros
    assert got[(0, 0.0)] == [0, 0, 0, 0]


def test_opencv_bilinear_emulation_by_hand():
    """mmcv resizes with OpenCV's INTER_LINEAR on uint8: a 2x2 image to 4x4, computed by hand (taps at
    (d + 0.5) / 2 - 0.5, clamped at the borders; 11-bit weights; rounding to the nearest level)."""
    import numpy as np

    from rewardkit.rewards._geneval_detect import cv2_bilinear_u8

    a = np.array([[0, 100], [200, 40]], dtype=np.uint8)[:, :, None]
    assert cv2_bilinear_u8(a, 4, 4)[:, :, 0].tolist() == [[0, 25, 75, 100], [50, 59, 76, 85],
                                                          [150, 126, 79, 55], [200, 160, 80, 40]]


def test_key_map_at_the_published_swin_s_sizes_on_meta():
    """GenEval's detector (mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco): Swin-S (96, depths 2-2-18-2, heads
    3-6-12-24, window 7), 256 channels, 8 heads, 6 encoder and 9 decoder layers, 100 queries, 80 classes."""
    from rewardkit.convert.hpsv2 import check_against_class

    sd = mmdet_mask2former_state_dict(embed=96, depths=(2, 2, 18, 2), heads=(3, 6, 12, 24), feat=256, attn_heads=8,
                                      enc_layers=6, enc_ffn=1024, dec_layers=9, dec_ffn=2048, queries=100, meta=True)
    kw = mask2former_config_from_mmdet(sd)
    assert kw["backbone_config"]["num_heads"] == [3, 6, 12, 24] and kw["decoder_layers"] == 10
    assert (kw["num_attention_heads"], kw["encoder_layers"], kw["num_queries"], kw["num_labels"]) == (8, 6, 100, 80)
    cfg = transformers.Mask2FormerConfig(**{**kw, "backbone_config": transformers.SwinConfig(
        **{k: v for k, v in kw["backbone_config"].items() if k != "model_type"})})
    state = mmdet_to_hf(sd, kw)
    state["criterion.empty_weight"] = torch.empty(81, device="meta")
    check_against_class(transformers.Mask2FormerForUniversalSegmentation, cfg, state)
