"""GenEval's detector (mmdet 2.x ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth``) ->
a directory with a transformers ``Mask2FormerForUniversalSegmentation`` (``detector/``) and the CLIP ViT-L/14
GenEval classifies colours with (``clip/``).

The key map below was written from mmdet 2.x's module names (``mmdet/models/backbones/swin.py``: ``patch_embed``,
``stages.i.blocks.j.{norm1, attn.w_msa.{qkv, proj, relative_position_bias_table}, norm2, ffn.layers.{0.0, 1}}``,
``stages.i.downsample.{norm, reduction}``, ``norm{i}``; ``mmdet/models/plugins/msdeformattn_pixel_decoder.py``:
``input_convs.i.{conv, gn}``, ``encoder.layers.i.{attentions.0.*, ffns.0.layers.*, norms.*}``, ``level_encoding``,
``lateral_convs`` / ``output_convs`` ``.i.{conv, gn}``, ``mask_feature``; ``mmdet/models/dense_heads/
mask2former_head.py``: ``transformer_decoder.layers.i.{attentions.0 (cross), attentions.1 (self), ffns.0, norms.0-2}``,
``transformer_decoder.post_norm``, ``query_embed``, ``query_feat``, ``level_embed``, ``cls_embed``,
``mask_embed.{0, 2, 4}``) and transformers' names. Two tensors change layout, not only name:

- mmdet's Swin fuses q, k, v (``attn.w_msa.qkv``, rows q | k | v) and its decoder self-attention keeps
  ``nn.MultiheadAttention``'s ``in_proj``: both are split into transformers' ``q_proj`` / ``k_proj`` / ``v_proj``;
- mmdet's ``PatchMerging`` gathers each 2x2 neighbourhood with ``nn.Unfold`` (feature index ``c * 4 + 2 * dy + dx``)
  where transformers' Swin concatenates the four pixels (index ``p * C + c``, pixels in the order (0,0), (1,0),
  (0,1), (1,1)): ``downsample.norm`` and ``downsample.reduction`` are permuted back (the inverse of mmdet's
  ``correct_unfold_reduction_order`` / ``correct_unfold_norm_order`` in ``mmdet/models/utils/ckpt_convert.py``).

mmdet's buffers (``relative_position_index``) are dropped (transformers computes them). transformers' Swin has a
final ``layernorm`` the backbone output never uses: it is written as the identity (weight 1, bias 0).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from .._imports import require
from ._io import check_dst, read_checkpoint, state_dict_from, write_converted

__all__ = ["convert_geneval", "mmdet_to_hf", "mask2former_config_from_mmdet", "DEFAULT_CLIP", "unfold_to_concat"]

DEFAULT_CLIP = "openai/clip-vit-large-patch14"
_HEAD = "panoptic_head."
_BB = "model.pixel_level_module.encoder."
_PD = "model.pixel_level_module.decoder."
_TM = "model.transformer_module."


def unfold_to_concat(t: torch.Tensor) -> torch.Tensor:
    """Permute the last axis (4C features of a 2x2 patch) from mmdet's ``nn.Unfold`` order (``c * 4 + 2 * dy + dx``)
    to transformers' Swin order (``p * C + c``, p over (dy, dx) = (0,0), (1,0), (0,1), (1,1))."""
    *lead, n = t.shape
    c = n // 4
    q = t.reshape(*lead, c, 4).transpose(-1, -2)  # [..., 4 (2*dy+dx), C]
    return q[..., [0, 2, 1, 3], :].reshape(*lead, n)  # p = (0,0), (1,0), (0,1), (1,1) -> q = 0, 2, 1, 3


def _count(sd: dict[str, torch.Tensor], pattern: str) -> int:
    rx = re.compile(pattern)
    found = {int(m.group(1)) for k in sd for m in [rx.match(k)] if m}
    return max(found) + 1 if found else 0


def mask2former_config_from_mmdet(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    """transformers ``Mask2FormerConfig`` keyword arguments read off an mmdet Mask2Former (Swin) state dict."""
    stages = _count(sd, r"backbone\.stages\.(\d+)\.")
    if stages == 0 or f"{_HEAD}query_feat.weight" not in sd:
        raise ValueError("not an mmdet Mask2Former Swin checkpoint: no backbone.stages.* / panoptic_head.query_feat "
                         "tensors (GenEval's detector is mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco)")
    depths = [_count(sd, rf"backbone\.stages\.{i}\.blocks\.(\d+)\.") for i in range(stages)]
    heads = [int(sd[f"backbone.stages.{i}.blocks.0.attn.w_msa.relative_position_bias_table"].shape[1])
             for i in range(stages)]
    table = int(sd["backbone.stages.0.blocks.0.attn.w_msa.relative_position_bias_table"].shape[0])
    window = (int(round(math.sqrt(table))) + 1) // 2
    embed_dim, _, patch, _ = sd["backbone.patch_embed.projection.weight"].shape
    mlp_ratio = sd["backbone.stages.0.blocks.0.ffn.layers.0.0.weight"].shape[0] / embed_dim
    hidden = int(sd[f"{_HEAD}query_feat.weight"].shape[1])
    aw = sd[f"{_HEAD}pixel_decoder.encoder.layers.0.attentions.0.attention_weights.weight"].shape[0]
    levels = int(sd[f"{_HEAD}pixel_decoder.level_encoding.weight"].shape[0])
    points = 4  # transformers' pixel decoder samples 4 points per level and head (as GenEval's config)
    if aw % (levels * points):
        raise ValueError(f"deformable attention with {aw} weights per query does not fit {levels} levels x 4 points")
    backbone = {"model_type": "swin", "image_size": 224, "patch_size": int(patch), "embed_dim": int(embed_dim),
                "depths": depths, "num_heads": heads, "window_size": window, "mlp_ratio": float(mlp_ratio),
                "qkv_bias": f"backbone.stages.0.blocks.0.attn.w_msa.qkv.bias" in sd, "drop_path_rate": 0.0,
                "out_features": [f"stage{i + 1}" for i in range(stages)]}
    return {"backbone_config": backbone, "num_labels": int(sd[f"{_HEAD}cls_embed.weight"].shape[0]) - 1,
            "hidden_dim": hidden, "feature_size": hidden, "mask_feature_size": hidden,
            "num_queries": int(sd[f"{_HEAD}query_feat.weight"].shape[0]),
            "encoder_layers": _count(sd, rf"{re.escape(_HEAD)}pixel_decoder\.encoder\.layers\.(\d+)\."),
            "decoder_layers": _count(sd, rf"{re.escape(_HEAD)}transformer_decoder\.layers\.(\d+)\.") + 1,
            "num_attention_heads": aw // (levels * points),
            "encoder_feedforward_dim": int(sd[f"{_HEAD}pixel_decoder.encoder.layers.0.ffns.0.layers.0.0.weight"].shape[0]),
            "dim_feedforward": int(sd[f"{_HEAD}transformer_decoder.layers.0.ffns.0.layers.0.0.weight"].shape[0]),
            "common_stride": 4, "feature_strides": [4 * 2 ** i for i in range(stages)]}


def mmdet_to_hf(sd: dict[str, torch.Tensor], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The mmdet Mask2Former state dict in transformers' names and layouts (module docstring). Every source
    tensor must be used, else ValueError naming the leftovers."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(k: str) -> torch.Tensor:
        if k not in sd:
            raise ValueError(f"mmdet checkpoint lacks {k!r}")
        used.add(k)
        return sd[k]

    def put(dst: str, src: str) -> None:
        out[dst] = take(src)

    def qkv(prefix: str, w: torch.Tensor, b: torch.Tensor | None, names=("q_proj", "k_proj", "v_proj")) -> None:
        for name, wi, bi in zip(names, w.chunk(3, 0), (b.chunk(3, 0) if b is not None else (None,) * 3)):
            out[f"{prefix}{name}.weight"] = wi
            if bi is not None:
                out[f"{prefix}{name}.bias"] = bi

    bb = cfg["backbone_config"]
    sw = f"{_BB}swin."
    for p in ("weight", "bias"):
        put(f"{sw}embeddings.patch_embeddings.projection.{p}", f"backbone.patch_embed.projection.{p}")
        put(f"{sw}embeddings.norm.{p}", f"backbone.patch_embed.norm.{p}")
    for i, depth in enumerate(bb["depths"]):
        for j in range(depth):
            s, d = f"backbone.stages.{i}.blocks.{j}.", f"{sw}encoder.layers.{i}.blocks.{j}."
            for p in ("weight", "bias"):
                put(f"{d}layernorm_before.{p}", f"{s}norm1.{p}")
                put(f"{d}layernorm_after.{p}", f"{s}norm2.{p}")
                put(f"{d}attention.o_proj.{p}", f"{s}attn.w_msa.proj.{p}")
                put(f"{d}mlp.fc1.{p}", f"{s}ffn.layers.0.0.{p}")
                put(f"{d}mlp.fc2.{p}", f"{s}ffn.layers.1.{p}")
            put(f"{d}attention.relative_position_bias.relative_position_bias_table",
                f"{s}attn.w_msa.relative_position_bias_table")
            qkv(f"{d}attention.", take(f"{s}attn.w_msa.qkv.weight"),
                take(f"{s}attn.w_msa.qkv.bias") if bb["qkv_bias"] else None)
            _check_index(take(f"{s}attn.w_msa.relative_position_index"), int(bb["window_size"]), s)
        if i < len(bb["depths"]) - 1:
            s, d = f"backbone.stages.{i}.downsample.", f"{sw}encoder.layers.{i}.downsample."
            out[f"{d}reduction.weight"] = unfold_to_concat(take(f"{s}reduction.weight"))
            for p in ("weight", "bias"):
                out[f"{d}norm.{p}"] = unfold_to_concat(take(f"{s}norm.{p}"))
        for p in ("weight", "bias"):
            put(f"{_BB}hidden_states_norms.stage{i + 1}.{p}", f"backbone.norm{i}.{p}")
    last = int(bb["embed_dim"]) * 2 ** (len(bb["depths"]) - 1)
    out[f"{sw}layernorm.weight"] = torch.ones(last)  # unused by the backbone's outputs (module docstring)
    out[f"{sw}layernorm.bias"] = torch.zeros(last)

    pd = f"{_HEAD}pixel_decoder."
    levels = int(sd[f"{pd}level_encoding.weight"].shape[0])
    for i in range(levels):
        for p in ("weight", "bias"):
            put(f"{_PD}input_projections.{i}.0.{p}", f"{pd}input_convs.{i}.conv.{p}")
            put(f"{_PD}input_projections.{i}.1.{p}", f"{pd}input_convs.{i}.gn.{p}")
    out[f"{_PD}level_embed"] = take(f"{pd}level_encoding.weight")
    for i in range(cfg["encoder_layers"]):
        s, d = f"{pd}encoder.layers.{i}.", f"{_PD}encoder.layers.{i}."
        for p in ("weight", "bias"):
            for name in ("sampling_offsets", "attention_weights", "value_proj", "output_proj"):
                put(f"{d}self_attn.{name}.{p}", f"{s}attentions.0.{name}.{p}")
            put(f"{d}self_attn_layer_norm.{p}", f"{s}norms.0.{p}")
            put(f"{d}fc1.{p}", f"{s}ffns.0.layers.0.0.{p}")
            put(f"{d}fc2.{p}", f"{s}ffns.0.layers.1.{p}")
            put(f"{d}final_layer_norm.{p}", f"{s}norms.1.{p}")
    for p in ("weight", "bias"):
        put(f"{_PD}mask_projection.{p}", f"{pd}mask_feature.{p}")
    n_fpn = _count(sd, rf"{re.escape(pd)}lateral_convs\.(\d+)\.")
    if n_fpn != 1:  # GenEval's detector: 4 backbone levels, 3 in the deformable encoder, 1 FPN level
        raise ValueError(f"expected one FPN level (lateral_convs.0) as in GenEval's Mask2Former, found {n_fpn}")
    for p in ("weight", "bias"):
        put(f"{_PD}adapter_1.1.{p}", f"{pd}lateral_convs.0.gn.{p}")
        put(f"{_PD}layer_1.1.{p}", f"{pd}output_convs.0.gn.{p}")
    put(f"{_PD}adapter_1.0.weight", f"{pd}lateral_convs.0.conv.weight")  # no bias: mmdet's ConvModule with GN
    put(f"{_PD}layer_1.0.weight", f"{pd}output_convs.0.conv.weight")

    td = f"{_HEAD}transformer_decoder."
    put(f"{_TM}queries_embedder.weight", f"{_HEAD}query_embed.weight")
    put(f"{_TM}queries_features.weight", f"{_HEAD}query_feat.weight")
    put(f"{_TM}level_embed.weight", f"{_HEAD}level_embed.weight")
    for i in range(cfg["decoder_layers"] - 1):
        s, d = f"{td}layers.{i}.", f"{_TM}decoder.layers.{i}."
        # mmdet's operation_order is (cross_attn, norm, self_attn, norm, ffn, norm): attentions.0 is the cross
        # attention, norms.0 / 1 / 2 follow the cross attention / the self attention / the FFN
        for p in ("weight", "bias"):
            put(f"{d}cross_attn.in_proj_{p}", f"{s}attentions.0.attn.in_proj_{p}")
            put(f"{d}cross_attn.out_proj.{p}", f"{s}attentions.0.attn.out_proj.{p}")
            put(f"{d}self_attn.out_proj.{p}", f"{s}attentions.1.attn.out_proj.{p}")
            put(f"{d}cross_attn_layer_norm.{p}", f"{s}norms.0.{p}")
            put(f"{d}self_attn_layer_norm.{p}", f"{s}norms.1.{p}")
            put(f"{d}final_layer_norm.{p}", f"{s}norms.2.{p}")
            put(f"{d}fc1.{p}", f"{s}ffns.0.layers.0.0.{p}")
            put(f"{d}fc2.{p}", f"{s}ffns.0.layers.1.{p}")
        qkv(f"{d}self_attn.", take(f"{s}attentions.1.attn.in_proj_weight"), take(f"{s}attentions.1.attn.in_proj_bias"))
    for p in ("weight", "bias"):
        put(f"{_TM}decoder.layernorm.{p}", f"{td}post_norm.{p}")
        put(f"class_predictor.{p}", f"{_HEAD}cls_embed.{p}")
        for j in range(3):
            put(f"{_TM}decoder.mask_predictor.mask_embedder.{j}.0.{p}", f"{_HEAD}mask_embed.{2 * j}.{p}")
    left = sorted(set(sd) - used)
    if left:
        raise ValueError(f"mmdet tensors the key map does not place: {left[:8]}{' ...' if len(left) > 8 else ''}")
    return {k: v.float().contiguous() for k, v in out.items()}


def _check_index(index: torch.Tensor, window: int, where: str) -> None:
    """mmdet saves its Swin ``relative_position_index`` buffer; transformers computes its own. The two agree for
    mmdet's standard index (flattened ``(dy + W - 1) * (2W - 1) + (dx + W - 1)``): anything else is refused."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
    want = rel[..., 0] * (2 * window - 1) + rel[..., 1]
    if tuple(index.shape) != tuple(want.shape) or not torch.equal(index.long(), want):
        raise ValueError(f"{where}attn.w_msa.relative_position_index is not mmdet's standard index for a {window}x"
                         f"{window} window: this checkpoint's relative positions would be read differently")


def convert_geneval(src: str | Path, dst: str | Path, *, clip: str = DEFAULT_CLIP, overwrite: bool = False) -> Path:
    """Convert GenEval's mmdet Mask2Former checkpoint (``{'state_dict': ..., 'meta': ...}``) into ``dst``, with the
    CLIP model ``clip`` (hub id or directory, safetensors; GenEval uses OpenAI's ViT-L/14)."""
    transformers = require("transformers", "hf", purpose="rewardkit convert geneval")
    from ..models.vlm import from_pretrained_safetensors
    from .hpsv2 import check_against_class

    src = Path(src)
    check_dst(dst, overwrite)
    sd = state_dict_from(read_checkpoint(src), "state_dict")
    kw = mask2former_config_from_mmdet(sd)
    cfg = transformers.Mask2FormerConfig(**{**kw, "backbone_config": transformers.SwinConfig(
        **{k: v for k, v in kw["backbone_config"].items() if k != "model_type"})})
    state = mmdet_to_hf(sd, kw)
    with torch.device("meta"):
        ref = transformers.Mask2FormerForUniversalSegmentation(cfg)
    for k, v in ref.state_dict().items():  # loss-only buffers (criterion.empty_weight) are not in mmdet's file
        if k.startswith("criterion."):
            state.setdefault(k, _criterion_buffer(k, v, cfg))
    check_against_class(transformers.Mask2FormerForUniversalSegmentation, cfg, state)
    model = from_pretrained_safetensors(transformers.CLIPModel, clip, dtype=torch.float32)
    proc = transformers.AutoProcessor.from_pretrained(clip)

    def write(tmp: Path) -> dict[str, Any]:
        det = tmp / "detector"
        det.mkdir()
        m = transformers.Mask2FormerForUniversalSegmentation(cfg)
        m.load_state_dict(state, strict=True)
        m.save_pretrained(det, safe_serialization=True)
        model.save_pretrained(tmp / "clip", safe_serialization=True)
        proc.save_pretrained(tmp / "clip")
        return {"detector": "detector", "clip_dir": "clip"}

    return write_converted(dst, "geneval", write, source=src, overwrite=overwrite, clip=clip,
                           detector_arch="mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco")


def _criterion_buffer(key: str, like: torch.Tensor, cfg: Any) -> torch.Tensor:
    """transformers' loss weights (never used at inference): its own defaults."""
    w = torch.ones(like.shape)
    w[-1] = float(cfg.no_object_weight)
    return w
