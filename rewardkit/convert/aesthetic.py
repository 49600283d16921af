"""LAION aesthetic predictor v2 (``sac+logos+ava1-l14-linearMSE.pth`` / ``...-reluMSE.pth``) -> a directory
holding the CLIP ViT-L/14 it was trained on (``CLIPModel`` safetensors + processor) and the MLP head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .._imports import require
from ._io import check_dst, read_checkpoint, state_dict_from, write_converted

__all__ = ["convert_aesthetic", "mlp_from_state_dict", "DEFAULT_CLIP", "HEAD_FILE"]

DEFAULT_CLIP = "openai/clip-vit-large-patch14"
HEAD_FILE = "aesthetic_head.safetensors"


def mlp_from_state_dict(sd: dict[str, torch.Tensor], prefix: str = "layers.") -> tuple[str | None, int, list[int]]:
    """(activation, in_features, widths) of a :class:`~rewardkit.models.zoo.RatingMLP` state dict, read off
    its keys: Linear layers at ``{0,2,4,6,7}`` = activation-free, ``{0,3,6,9,11}`` = ReLU."""
    from ..models.zoo import RatingMLP

    idx = sorted({int(k[len(prefix):].split(".")[0]) for k in sd if k.startswith(prefix) and k.endswith(".weight")})
    for act in (None, "relu"):
        if idx == RatingMLP.linear_indices(act, len(idx)):
            shapes = [tuple(sd[f"{prefix}{i}.weight"].shape) for i in idx]
            if shapes[-1][0] != 1 or any(shapes[j][0] != shapes[j + 1][1] for j in range(len(shapes) - 1)):
                raise ValueError(f"MLP layer shapes do not chain: {shapes}")
            return act, shapes[0][1], [s[0] for s in shapes[:-1]]
    raise ValueError(f"unrecognised MLP layout: Linear layers at {prefix}{idx} (expected the aesthetic "
                     "linearMSE {0,2,4,6,7} or reluMSE {0,3,6,9,11} layout)")


def convert_aesthetic(src: str | Path, dst: str | Path, *, clip: str = DEFAULT_CLIP, overwrite: bool = False) -> Path:
    """Convert an aesthetic-predictor ``.pth`` (flat ``layers.*`` state dict; saved on ``cuda:0`` upstream, read
    on the CPU) into ``dst``, together with the CLIP checkpoint ``clip`` (hub id or directory, safetensors)."""
    transformers = require("transformers", "hf", purpose="rewardkit convert aesthetic")
    st = require("safetensors.torch", "hf")
    from ..models.vlm import from_pretrained_safetensors

    src = Path(src)
    check_dst(dst, overwrite)
    sd = state_dict_from(read_checkpoint(src))
    act, in_features, widths = mlp_from_state_dict(sd)
    head = {k: v.float().contiguous() for k, v in sd.items() if k.startswith("layers.")}
    extra = sorted(set(sd) - set(head))
    if extra:
        raise ValueError(f"unexpected tensors beside the MLP: {extra[:6]}")
    model = from_pretrained_safetensors(transformers.CLIPModel, clip, dtype=torch.float32)
    if model.config.projection_dim != in_features:
        raise ValueError(f"the MLP takes {in_features}-d embeddings but {clip} projects to "
                         f"{model.config.projection_dim}: wrong CLIP model (the predictor uses ViT-L/14)")
    proc = transformers.AutoProcessor.from_pretrained(clip)

    def write(tmp: Path) -> dict[str, Any]:
        model.save_pretrained(tmp, safe_serialization=True)
        proc.save_pretrained(tmp)
        st.save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        return {"head": {"file": HEAD_FILE, "activation": act, "in_features": in_features, "widths": widths}}

    variant = "relu" if act == "relu" else "linear"
    return write_converted(dst, "aesthetic", write, source=src, overwrite=overwrite, variant=variant, clip=clip)
