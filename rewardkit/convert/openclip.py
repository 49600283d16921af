"""OpenCLIP state dict (HPSv2 / HPSv2.1 ``*_compressed.pt``) -> transformers ``CLIPModel``.

OpenCLIP keeps OpenAI CLIP's parameter names. The mapping (the logic of transformers'
``convert_clip_original_pytorch_to_hf.py``): the fused ``attn.in_proj_weight`` / ``in_proj_bias`` split
into q / k / v (rows in that order); ``attn.out_proj`` -> ``self_attn.out_proj``; ``ln_1`` / ``ln_2`` ->
``layer_norm1`` / ``layer_norm2``; ``mlp.c_fc`` / ``mlp.c_proj`` -> ``mlp.fc1`` / ``mlp.fc2``;
``visual.conv1`` -> ``patch_embedding``; ``visual.ln_pre`` -> ``pre_layrnorm`` (sic); ``visual.ln_post`` ->
``post_layernorm``; ``ln_final`` -> ``final_layer_norm``; positional embeddings -> ``position_embedding.weight``;
the projections ``visual.proj`` [W, E] and ``text_projection`` [D, E] are applied as ``x @ P`` in
OpenCLIP, so they become ``Linear`` weights **transposed** ([E, W], [E, D]).
"""

from __future__ import annotations

import re
from typing import Any

import torch

__all__ = ["openclip_to_hf", "clip_config_from_openclip", "VIT_H_14_HEADS"]

#: OpenCLIP ViT-H-14: 16 heads in both towers (vision head width 80, text head width 64).
VIT_H_14_HEADS = (16, 16)
_DEFAULT_HEADS = {1280: 16, 1024: 16, 768: 12, 512: 8}  # width -> heads of the OpenCLIP model configs


def _n_layers(sd: dict[str, torch.Tensor], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in sd for m in [pat.match(k)] if m}
    if not idx:
        raise ValueError(f"no '{prefix}N.' keys: not an OpenCLIP CLIP state dict")
    if idx != set(range(len(idx))):
        raise ValueError(f"layer indices under {prefix} are not contiguous: {sorted(idx)}")
    return len(idx)


def clip_config_from_openclip(sd: dict[str, torch.Tensor], *, vision_heads: int | None = None,
                              text_heads: int | None = None, eos_token_id: int | None = None,
                              bos_token_id: int | None = None, pad_token_id: int | None = None) -> dict[str, Any]:
    """A ``CLIPConfig`` dict read off the tensor shapes (heads cannot be: pass them, or the OpenCLIP defaults
    for the width are used). ``hidden_act`` is exact GELU (OpenCLIP's ViT-H-14; not OpenAI's quick-GELU)."""
    for k in ("visual.conv1.weight", "visual.positional_embedding", "visual.proj", "token_embedding.weight",
              "positional_embedding", "text_projection"):
        if k not in sd:
            raise ValueError(f"missing {k!r}: not an OpenCLIP CLIP state dict (CustomTextCLIP / timm towers are "
                             "not supported)")
    if any(".ls_1." in k or ".ls_2." in k for k in sd):
        raise ValueError("this OpenCLIP model uses layer scale (ls_1 / ls_2), which CLIPModel cannot express")
    vw, _, patch, _ = sd["visual.conv1.weight"].shape
    n_pos = sd["visual.positional_embedding"].shape[0]
    grid = int(round((n_pos - 1) ** 0.5))
    if grid * grid + 1 != n_pos:
        raise ValueError(f"visual.positional_embedding has {n_pos} rows: not a square grid + class token")
    vocab, tw = sd["token_embedding.weight"].shape
    ctx = sd["positional_embedding"].shape[0]
    proj_dim = sd["visual.proj"].shape[1]
    if sd["text_projection"].shape != (tw, proj_dim):
        raise ValueError(f"text_projection {tuple(sd['text_projection'].shape)} does not match ({tw}, {proj_dim})")
    vh = vision_heads or _DEFAULT_HEADS.get(int(vw))
    th = text_heads or _DEFAULT_HEADS.get(int(tw))
    if not vh or not th:
        raise ValueError(f"cannot infer attention heads for widths vision={vw}, text={tw}: pass them explicitly "
                         "(`rewardkit convert hpsv2 --heads VISION,TEXT`; in Python vision_heads= / text_heads=)")
    if vw % vh or tw % th:
        raise ValueError(f"heads do not divide the widths (vision {vw}/{vh}, text {tw}/{th}): give the model's "
                         "heads with `rewardkit convert hpsv2 --heads VISION,TEXT`")
    text = dict(vocab_size=int(vocab), hidden_size=int(tw),
                intermediate_size=int(sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
                num_hidden_layers=_n_layers(sd, "transformer.resblocks."), num_attention_heads=int(th),
                max_position_embeddings=int(ctx), hidden_act="gelu", layer_norm_eps=1e-5,
                projection_dim=int(proj_dim))
    for name, val in (("eos_token_id", eos_token_id), ("bos_token_id", bos_token_id), ("pad_token_id", pad_token_id)):
        if val is not None:
            text[name] = int(val)
    vision = dict(hidden_size=int(vw), intermediate_size=int(sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]),
                  num_hidden_layers=_n_layers(sd, "visual.transformer.resblocks."), num_attention_heads=int(vh),
                  image_size=int(grid * patch), patch_size=int(patch), hidden_act="gelu", layer_norm_eps=1e-5,
                  projection_dim=int(proj_dim))
    return {"text_config": text, "vision_config": vision, "projection_dim": int(proj_dim)}


def _block(sd: dict[str, torch.Tensor], src: str, dst: str, out: dict[str, torch.Tensor]) -> None:
    w, b = sd[f"{src}.attn.in_proj_weight"], sd[f"{src}.attn.in_proj_bias"]
    for name, wi, bi in zip(("q", "k", "v"), w.chunk(3, 0), b.chunk(3, 0)):
        out[f"{dst}.self_attn.{name}_proj.weight"] = wi.clone()
        out[f"{dst}.self_attn.{name}_proj.bias"] = bi.clone()
    pairs = {"attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
             "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for s, d in pairs.items():
        for p in ("weight", "bias"):
            out[f"{dst}.{d}.{p}"] = sd[f"{src}.{s}.{p}"]


def openclip_to_hf(sd: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """OpenCLIP tensor names -> ``CLIPModel`` tensor names (every source tensor used exactly once)."""
    out: dict[str, torch.Tensor] = {}
    nt, nv = config["text_config"]["num_hidden_layers"], config["vision_config"]["num_hidden_layers"]
    for i in range(nt):
        _block(sd, f"transformer.resblocks.{i}", f"text_model.encoder.layers.{i}", out)
    for i in range(nv):
        _block(sd, f"visual.transformer.resblocks.{i}", f"vision_model.encoder.layers.{i}", out)
    out["text_model.embeddings.token_embedding.weight"] = sd["token_embedding.weight"]
    out["text_model.embeddings.position_embedding.weight"] = sd["positional_embedding"]
    for p in ("weight", "bias"):
        out[f"text_model.final_layer_norm.{p}"] = sd[f"ln_final.{p}"]
        out[f"vision_model.pre_layrnorm.{p}"] = sd[f"visual.ln_pre.{p}"]
        out[f"vision_model.post_layernorm.{p}"] = sd[f"visual.ln_post.{p}"]
    out["text_projection.weight"] = sd["text_projection"].t().contiguous()
    out["visual_projection.weight"] = sd["visual.proj"].t().contiguous()
    out["vision_model.embeddings.class_embedding"] = sd["visual.class_embedding"]
    out["vision_model.embeddings.patch_embedding.weight"] = sd["visual.conv1.weight"]
    out["vision_model.embeddings.position_embedding.weight"] = sd["visual.positional_embedding"]
    out["logit_scale"] = sd["logit_scale"].reshape(()) if "logit_scale" in sd else torch.tensor(4.6052)
    used = {k for k in sd if not k.endswith("attn_mask")}
    consumed = set()
    for i in range(nt):
        consumed |= {k for k in sd if k.startswith(f"transformer.resblocks.{i}.")}
    for i in range(nv):
        consumed |= {k for k in sd if k.startswith(f"visual.transformer.resblocks.{i}.")}
    consumed |= {"token_embedding.weight", "positional_embedding", "text_projection", "visual.proj", "logit_scale",
                 "visual.class_embedding", "visual.conv1.weight", "visual.positional_embedding"}
    consumed |= {f"{m}.{p}" for m in ("ln_final", "visual.ln_pre", "visual.ln_post") for p in ("weight", "bias")}
    left = sorted(used - consumed)
    if left:
        raise ValueError(f"unexpected OpenCLIP tensors (architecture not supported): {left[:8]}")
    return out
