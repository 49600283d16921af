"""A tiny random GenEval detector checkpoint in mmdet 2.x's Mask2Former (Swin) key layout and container
(``{"state_dict": ..., "meta": ...}``), for tests and ``GenEval.tiny``.

The names and shapes follow mmdet's modules (``mmdet/models/backbones/swin.py``, ``mmdet/models/plugins/
msdeformattn_pixel_decoder.py``, ``mmdet/models/dense_heads/mask2former_head.py``; mmcv's ``ConvModule`` names its
GroupNorm ``gn``, its ``MultiheadAttention`` wraps ``nn.MultiheadAttention`` as ``attn``, its ``FFN`` holds
``layers.0.0`` / ``layers.1``), written independently of the converter's key map.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

__all__ = ["mmdet_mask2former_state_dict", "write_tiny_geneval_detector", "swin_relative_position_index"]


def swin_relative_position_index(window: int) -> torch.Tensor:
    """The ``relative_position_index`` buffer mmdet's ``WindowMSA`` computes and saves (mmdet/models/backbones/
    swin.py: ``double_step_seq(2 * W - 1, W, 1, W)``, plus its transpose, flipped along the last axis)."""
    seq = (torch.arange(0, (2 * window - 1) * window, 2 * window - 1)[:, None] + torch.arange(window)[None, :])
    coords = seq.reshape(1, -1)
    return (coords + coords.T).flip(1).contiguous()


def mmdet_mask2former_state_dict(*, embed: int = 16, depths=(1, 1, 2, 1), heads=(1, 2, 2, 4), window: int = 7,
                                 feat: int = 32, attn_heads: int = 4, enc_layers: int = 1, enc_ffn: int = 64,
                                 dec_layers: int = 2, dec_ffn: int = 64, queries: int = 12, classes: int = 80,
                                 cls_std: float = 1.0, seed: int = 0, meta: bool = False
                                 ) -> "OrderedDict[str, torch.Tensor]":
    """``meta=True``: shapes only (tensors on the meta device), for checking the map at the published sizes."""
    gen = torch.Generator().manual_seed(seed)
    sd: OrderedDict[str, torch.Tensor] = OrderedDict()

    def g(*shape: int, std: float = 0.05) -> torch.Tensor:
        if meta:
            return torch.empty(*shape, device="meta")
        return torch.randn(*shape, generator=gen) * std

    def norm(prefix: str, d: int) -> None:
        sd[f"{prefix}.weight"], sd[f"{prefix}.bias"] = 1.0 + g(d, std=0.1), g(d, std=0.1)

    def linear(prefix: str, out: int, inp: int, bias: bool = True, std: float = 0.05) -> None:
        sd[f"{prefix}.weight"] = g(out, inp, std=std)
        if bias:
            sd[f"{prefix}.bias"] = g(out, std=std)

    sd["backbone.patch_embed.projection.weight"] = g(embed, 3, 4, 4, std=0.2)
    sd["backbone.patch_embed.projection.bias"] = g(embed)
    norm("backbone.patch_embed.norm", embed)
    dims = [embed * 2 ** i for i in range(len(depths))]
    index = swin_relative_position_index(window)
    for i, (depth, d) in enumerate(zip(depths, dims)):
        for j in range(depth):
            p = f"backbone.stages.{i}.blocks.{j}"
            norm(f"{p}.norm1", d)
            sd[f"{p}.attn.w_msa.relative_position_bias_table"] = g((2 * window - 1) ** 2, heads[i], std=0.5)
            sd[f"{p}.attn.w_msa.relative_position_index"] = index.clone()
            linear(f"{p}.attn.w_msa.qkv", 3 * d, d, std=0.2)
            linear(f"{p}.attn.w_msa.proj", d, d, std=0.2)
            norm(f"{p}.norm2", d)
            linear(f"{p}.ffn.layers.0.0", 4 * d, d, std=0.2)
            linear(f"{p}.ffn.layers.1", d, 4 * d, std=0.1)
        if i < len(depths) - 1:
            norm(f"backbone.stages.{i}.downsample.norm", 4 * d)
            linear(f"backbone.stages.{i}.downsample.reduction", 2 * d, 4 * d, bias=False, std=0.2)
        norm(f"backbone.norm{i}", d)
    pd = "panoptic_head.pixel_decoder"
    for k in range(3):  # input_convs.0 takes the coarsest level (1/32), .2 the 1/8 one
        sd[f"{pd}.input_convs.{k}.conv.weight"] = g(feat, dims[3 - k], 1, 1, std=0.3)
        sd[f"{pd}.input_convs.{k}.conv.bias"] = g(feat)
        norm(f"{pd}.input_convs.{k}.gn", feat)
    for layer in range(enc_layers):
        p = f"{pd}.encoder.layers.{layer}"
        linear(f"{p}.attentions.0.sampling_offsets", attn_heads * 3 * 4 * 2, feat, std=0.2)
        linear(f"{p}.attentions.0.attention_weights", attn_heads * 3 * 4, feat, std=0.2)
        linear(f"{p}.attentions.0.value_proj", feat, feat, std=0.2)
        linear(f"{p}.attentions.0.output_proj", feat, feat, std=0.2)
        linear(f"{p}.ffns.0.layers.0.0", enc_ffn, feat, std=0.2)
        linear(f"{p}.ffns.0.layers.1", feat, enc_ffn, std=0.2)
        norm(f"{p}.norms.0", feat)
        norm(f"{p}.norms.1", feat)
    sd[f"{pd}.level_encoding.weight"] = g(3, feat, std=0.5)
    sd[f"{pd}.lateral_convs.0.conv.weight"] = g(feat, dims[0], 1, 1, std=0.3)
    norm(f"{pd}.lateral_convs.0.gn", feat)
    sd[f"{pd}.output_convs.0.conv.weight"] = g(feat, feat, 3, 3, std=0.1)
    norm(f"{pd}.output_convs.0.gn", feat)
    sd[f"{pd}.mask_feature.weight"] = g(feat, feat, 1, 1, std=0.3)
    sd[f"{pd}.mask_feature.bias"] = g(feat)
    h = "panoptic_head"
    sd[f"{h}.query_embed.weight"] = g(queries, feat, std=1.0)
    sd[f"{h}.query_feat.weight"] = g(queries, feat, std=1.0)
    sd[f"{h}.level_embed.weight"] = g(3, feat, std=0.5)
    for layer in range(dec_layers):
        p = f"{h}.transformer_decoder.layers.{layer}"
        for a in (0, 1):
            sd[f"{p}.attentions.{a}.attn.in_proj_weight"] = g(3 * feat, feat, std=0.2)
            sd[f"{p}.attentions.{a}.attn.in_proj_bias"] = g(3 * feat)
            linear(f"{p}.attentions.{a}.attn.out_proj", feat, feat, std=0.2)
        linear(f"{p}.ffns.0.layers.0.0", dec_ffn, feat, std=0.2)
        linear(f"{p}.ffns.0.layers.1", feat, dec_ffn, std=0.2)
        for n in range(3):
            norm(f"{p}.norms.{n}", feat)
    norm(f"{h}.transformer_decoder.post_norm", feat)
    linear(f"{h}.cls_embed", classes + 1, feat, std=cls_std)
    for j in (0, 2, 4):
        linear(f"{h}.mask_embed.{j}", feat, feat, std=0.5)
    return sd


def write_tiny_geneval_detector(path: str | Path, *, seed: int = 0, **kwargs) -> Path:
    """``torch.save`` of ``{"state_dict": ..., "meta": {...}}`` as mmcv's ``save_checkpoint`` writes it (plain
    values in ``meta``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"meta": {"mmdet_version": "2.25.0", "epoch": 50, "iter": 368750},
           "state_dict": mmdet_mask2former_state_dict(seed=seed, **kwargs)}
    torch.save(obj, str(path))
    return path
