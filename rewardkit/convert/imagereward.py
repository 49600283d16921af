"""ImageReward (``ImageReward.pt`` + ``med_config.json``) -> transformers ``BlipVisionModel`` + ``BlipTextModel``
(with cross-attention) + the rating MLP.

``ImageReward.pt`` is ``torch.save(model.state_dict())``: a flat dict with ``blip.visual_encoder.*`` (BLIP's
timm-style ViT-L/16), ``blip.text_encoder.*`` (BLIP's "med" BERT with cross-attention, already in the names
transformers' ``BlipTextModel`` uses), ``blip.vision_proj`` / ``blip.text_proj`` (unused by the score) and
``mlp.layers.*``. The ViT names map as in transformers' ``convert_blip_original_pytorch_to_hf.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from .._imports import require
from ._io import check_dst, read_checkpoint, state_dict_from, write_converted
from .aesthetic import mlp_from_state_dict
from .hpsv2 import check_against_class

__all__ = ["convert_imagereward", "MED_CONFIG", "MEAN", "STD", "HEAD_FILE", "DEFAULT_TOKENIZER"]

HEAD_FILE = "imagereward_head.safetensors"
DEFAULT_TOKENIZER = "bert-base-uncased"
#: ImageReward's published reward normalisation: ``(r - MEAN) / STD``
MEAN = 0.16717362830052426
STD = 1.0333394966054072
#: ``train/src/config/med_config.json`` of ImageReward (BERT-base with cross-attention); ``encoder_width`` is
#: overridden to the ViT width at load time, as ImageReward does.
MED_CONFIG = {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
              "max_position_embeddings": 512, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "vocab_size": 30524}
MAX_LENGTH = 35  # ImageReward pads / truncates prompts to 35 tokens

_VIT = [
    (r"^blip\.visual_encoder\.cls_token$", "embeddings.class_embedding"),
    (r"^blip\.visual_encoder\.pos_embed$", "embeddings.position_embedding"),
    (r"^blip\.visual_encoder\.patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.mlp\.fc([12])\.", r"encoder.layers.\1.mlp.fc\2."),
    (r"^blip\.visual_encoder\.norm\.", "post_layernorm."),
]
_DROPPED = re.compile(r"^blip\.(vision_proj|text_proj)\.|position_ids$|^blip\.(itm_head|temp|image_queue|text_queue)")


def _split(sd: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    vision, text, head, unknown = {}, {}, {}, []
    for k, v in sd.items():
        if _DROPPED.search(k):
            continue
        if k.startswith("mlp."):
            head[k[len("mlp."):]] = v.float()
            continue
        if k.startswith("blip.text_encoder."):
            text[k[len("blip.text_encoder."):]] = v
            continue
        for pat, rep in _VIT:
            if re.search(pat, k):
                vision[re.sub(pat, rep, k)] = v
                break
        else:
            unknown.append(k)
    if unknown:
        raise ValueError(f"unexpected ImageReward tensors: {unknown[:8]}")
    if not vision or not text or not head:
        raise ValueError("not an ImageReward state dict (needs blip.visual_encoder.*, blip.text_encoder.* and mlp.*)")
    return vision, text, head


def _prepare_tokenizer(transformers: Any, name: str) -> Any:
    tok = transformers.AutoTokenizer.from_pretrained(name)
    # BLIP's init_tokenizer: bert-base-uncased + [DEC] as bos + [ENC] as an additional special token (30524)
    if "[DEC]" not in tok.get_vocab():
        tok.add_special_tokens({"bos_token": "[DEC]"})
    if "[ENC]" not in tok.get_vocab():
        tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]}, replace_extra_special_tokens=False)
    tok.model_max_length = MAX_LENGTH
    return tok


def blip_configs(transformers: Any, vision: dict, text: dict, med: dict, tok: Any, *, vision_heads: int | None = None,
                 tokenizer_name: str = "") -> tuple[Any, Any]:
    """(``BlipVisionConfig``, ``BlipTextConfig``) read off the (renamed) tensor shapes, ``med_config`` for what
    shapes cannot say (heads, eps, activation); the text vocabulary checked against ``tok``."""
    vw = vision["embeddings.patch_embedding.weight"].shape[0]
    patch = vision["embeddings.patch_embedding.weight"].shape[-1]
    n_pos = vision["embeddings.position_embedding"].shape[1]
    grid = int(round((n_pos - 1) ** 0.5))
    n_vl = 1 + max(int(k.split(".")[2]) for k in vision if k.startswith("encoder.layers."))
    vcfg = transformers.BlipVisionConfig(
        hidden_size=int(vw), intermediate_size=int(vision["encoder.layers.0.mlp.fc1.weight"].shape[0]),
        num_hidden_layers=n_vl, num_attention_heads=int(vision_heads or vw // 64), image_size=int(grid * patch),
        patch_size=int(patch), layer_norm_eps=1e-6, hidden_act="gelu")

    vocab, tw = text["embeddings.word_embeddings.weight"].shape
    if len(tok) != vocab:
        raise ValueError(f"tokenizer {tokenizer_name!r} (+[DEC], [ENC]) has {len(tok)} tokens but the checkpoint's "
                         f"embedding has {vocab}: wrong tokenizer")
    n_tl = 1 + max(int(k.split(".")[2]) for k in text if k.startswith("encoder.layer."))
    tcfg = transformers.BlipTextConfig(
        vocab_size=int(vocab), hidden_size=int(tw),
        intermediate_size=int(text["encoder.layer.0.intermediate.dense.weight"].shape[0]),
        num_hidden_layers=n_tl, num_attention_heads=int(med["num_attention_heads"]),
        max_position_embeddings=int(text["embeddings.position_embeddings.weight"].shape[0]),
        layer_norm_eps=float(med["layer_norm_eps"]), hidden_act=med["hidden_act"], encoder_hidden_size=int(vw),
        is_decoder=True,  # builds the cross-attention modules; the reward calls forward(is_decoder=False)
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, sep_token_id=tok.sep_token_id)
    return vcfg, tcfg


def convert_imagereward(src: str | Path, dst: str | Path, *, med_config: str | Path | None = None,
                        tokenizer: str = DEFAULT_TOKENIZER, vision_heads: int | None = None,
                        overwrite: bool = False) -> Path:
    """Convert ``ImageReward.pt`` to ``dst`` (``vision/``, ``text/``, tokenizer, head, ``rewardkit.json``).

    ``med_config``: the ``med_config.json`` shipped with ImageReward (JSON; default: its published values).
    ``tokenizer``: ``bert-base-uncased`` or a directory; ``[DEC]`` / ``[ENC]`` are added as BLIP does.
    ``vision_heads``: ViT heads (default width / 64 = 16 for ViT-L).
    """
    transformers = require("transformers", "hf", purpose="rewardkit convert imagereward")
    st = require("safetensors.torch", "hf")
    src = Path(src)
    check_dst(dst, overwrite)
    med = dict(MED_CONFIG)
    if med_config is not None:
        med.update(json.loads(Path(med_config).read_text(encoding="utf-8")))
    vision, text, head = _split(state_dict_from(read_checkpoint(src)))
    act, in_features, widths = mlp_from_state_dict(head)
    if act is not None:
        raise ValueError("ImageReward's MLP has no activations; this head has ReLUs")

    tok = _prepare_tokenizer(transformers, tokenizer)
    vcfg, tcfg = blip_configs(transformers, vision, text, med, tok, vision_heads=vision_heads, tokenizer_name=tokenizer)
    tw = tcfg.hidden_size
    grid_size = vcfg.image_size
    if in_features != tw:
        raise ValueError(f"MLP takes {in_features} features but the text encoder width is {tw}")
    check_against_class(transformers.BlipVisionModel, vcfg, vision)
    check_against_class(lambda c: transformers.BlipTextModel(c, add_pooling_layer=False), tcfg, text)

    def write(tmp: Path) -> dict[str, Any]:
        for sub, cfg, state in (("vision", vcfg, vision), ("text", tcfg, text)):
            (tmp / sub).mkdir()
            st.save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / sub / "model.safetensors"),
                         metadata={"format": "pt"})
            cfg.save_pretrained(tmp / sub)
        tok.save_pretrained(tmp / "tokenizer")
        st.save_file({k: v.contiguous() for k, v in head.items()}, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        return {"head": {"file": HEAD_FILE, "activation": None, "in_features": in_features, "widths": widths},
                "normalization": {"mean": MEAN, "std": STD}, "max_length": MAX_LENGTH,
                "image_size": int(grid_size)}

    return write_converted(dst, "imagereward", write, source=src, overwrite=overwrite, variant="ImageReward-v1.0")
