"""Tiny random checkpoints in the **official** formats and key layouts (for tests and ``Reward.tiny``).

Each writer produces the file a user would download (same container, key names, dtypes, nesting), only with
tiny widths, so the converters and the rewards are exercised end to end without the internet.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

__all__ = ["openclip_state_dict", "write_tiny_hpsv2", "rating_mlp_state_dict", "write_tiny_aesthetic",
           "save_tiny_clip_tokenizer"]


def _g(gen: torch.Generator, *shape: int, std: float = 0.02) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _ln(gen: torch.Generator, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    return 1.0 + _g(gen, d, std=0.1), _g(gen, d, std=0.1)


def _resblocks(sd: dict, gen: torch.Generator, prefix: str, n: int, width: int, mlp: int) -> None:
    for i in range(n):
        p = f"{prefix}{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = _ln(gen, width)
        sd[p + "attn.in_proj_weight"] = _g(gen, 3 * width, width, std=width ** -0.5)
        sd[p + "attn.in_proj_bias"] = _g(gen, 3 * width, std=0.1)
        sd[p + "attn.out_proj.weight"] = _g(gen, width, width, std=width ** -0.5)
        sd[p + "attn.out_proj.bias"] = _g(gen, width, std=0.1)
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = _ln(gen, width)
        sd[p + "mlp.c_fc.weight"] = _g(gen, mlp, width, std=width ** -0.5)
        sd[p + "mlp.c_fc.bias"] = _g(gen, mlp, std=0.1)
        sd[p + "mlp.c_proj.weight"] = _g(gen, width, mlp, std=mlp ** -0.5)
        sd[p + "mlp.c_proj.bias"] = _g(gen, width, std=0.1)


def openclip_state_dict(*, vocab: int, context: int, width: int = 32, layers: int = 2, vision_width: int = 32,
                        vision_layers: int = 2, patch: int = 8, image_size: int = 32, embed_dim: int = 16,
                        seed: int = 0) -> "OrderedDict[str, torch.Tensor]":
    """A random OpenCLIP ``CLIP`` (ViT tower + text transformer) state dict with OpenCLIP's key names."""
    gen = torch.Generator().manual_seed(seed)
    sd: OrderedDict[str, torch.Tensor] = OrderedDict()
    sd["positional_embedding"] = _g(gen, context, width, std=0.01)
    sd["text_projection"] = _g(gen, width, embed_dim, std=width ** -0.5)
    sd["logit_scale"] = torch.tensor(4.6052)
    grid = image_size // patch
    sd["visual.class_embedding"] = _g(gen, vision_width, std=vision_width ** -0.5)
    sd["visual.positional_embedding"] = _g(gen, grid * grid + 1, vision_width, std=vision_width ** -0.5)
    sd["visual.proj"] = _g(gen, vision_width, embed_dim, std=vision_width ** -0.5)
    sd["visual.conv1.weight"] = _g(gen, vision_width, 3, patch, patch, std=0.05)
    sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"] = _ln(gen, vision_width)
    _resblocks(sd, gen, "visual.transformer.resblocks.", vision_layers, vision_width, 4 * vision_width)
    sd["visual.ln_post.weight"], sd["visual.ln_post.bias"] = _ln(gen, vision_width)
    _resblocks(sd, gen, "transformer.resblocks.", layers, width, 4 * width)
    sd["token_embedding.weight"] = _g(gen, vocab, width)
    sd["ln_final.weight"], sd["ln_final.bias"] = _ln(gen, width)
    return sd


def save_tiny_clip_tokenizer(path: str | Path) -> Path:
    """A tiny CLIP-style tokenizer (``<|startoftext|> ... <|endoftext|>``, 32 tokens of context)."""
    from ..testing import build_tiny_tokenizer

    path = Path(path)
    build_tiny_tokenizer(300, clip_style=True, extra_tokens=()).save_pretrained(path)
    return path


def write_tiny_hpsv2(path: str | Path, *, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """``HPS_v2.1_compressed.pt``-style file: ``torch.save({'state_dict': fp16 OpenCLIP state dict})``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    sd = openclip_state_dict(vocab=len(tok), context=int(tok.model_max_length), seed=seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": OrderedDict((k, v.half()) for k, v in sd.items())}, path)
    return path


def rating_mlp_state_dict(in_features: int, activation: str | None, *, prefix: str = "layers.",
                          seed: int = 0) -> "OrderedDict[str, torch.Tensor]":
    """Random weights of the published rating MLP (widths 1024, 128, 64, 16, 1) under ``prefix``."""
    from ..models.zoo import RatingMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mlp = RatingMLP(in_features, activation)
    return OrderedDict((prefix + k[len("layers."):], v.detach().clone()) for k, v in mlp.state_dict().items())


def write_tiny_aesthetic(path: str | Path, *, in_features: int, activation: str | None = None, seed: int = 0) -> Path:
    """``sac+logos+ava1-l14-linearMSE.pth``-style file: a flat fp32 ``OrderedDict`` of ``layers.*``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rating_mlp_state_dict(in_features, activation, seed=seed), path)
    return path
