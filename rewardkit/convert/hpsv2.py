"""HPSv2 / HPSv2.1 (``HPS_v2_compressed.pt``, ``HPS_v2.1_compressed.pt``) -> a ``CLIPModel`` directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._imports import require
from ._io import check_dst, read_checkpoint, state_dict_from, write_converted
from .openclip import clip_config_from_openclip, openclip_to_hf

__all__ = ["convert_hpsv2", "DEFAULT_TOKENIZER", "check_against_class"]

#: the OpenCLIP ViT-H-14 tokenizer (OpenAI CLIP BPE) with transformers files
DEFAULT_TOKENIZER = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def check_against_class(model_cls: Any, config: Any, state: dict[str, Any]) -> None:
    """The converted tensors must be exactly the parameters of ``model_cls(config)`` (names and shapes);
    built on the meta device, so free for any size."""
    import torch

    with torch.device("meta"):
        ref = model_cls(config)
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    bad = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    if missing or unexpected or bad:
        raise ValueError(f"converted weights do not fit {model_cls.__name__}: missing {missing[:6]}, "
                         f"unexpected {unexpected[:6]}, wrong shapes {[(k, got[k], want[k]) for k in bad[:4]]}")


def _version_from_name(src: Path) -> str:
    name = src.name.lower()
    return "v2.1" if "2.1" in name else "v2.0" if "v2" in name else "unknown"


def convert_hpsv2(src: str | Path, dst: str | Path, *, tokenizer: str = DEFAULT_TOKENIZER, version: str | None = None,
                  vision_heads: int | None = None, text_heads: int | None = None, dtype: str | None = None,
                  overwrite: bool = False) -> Path:
    """Convert an HPSv2 OpenCLIP ViT-H-14 checkpoint (``{'state_dict': ...}``, fp16) to ``dst``.

    ``tokenizer``: hub id or directory of the OpenCLIP tokenizer in transformers format. ``version``:
    ``v2.0`` / ``v2.1`` (default: read from the file name). ``dtype``: ``float16`` / ``float32`` to cast the
    weights (default: keep the checkpoint's). Heads default to ViT-H-14's 16 / 16.
    """
    import torch

    transformers = require("transformers", "hf", purpose="rewardkit convert hpsv2")
    st = require("safetensors.torch", "hf")
    src = Path(src)
    check_dst(dst, overwrite)
    sd = state_dict_from(read_checkpoint(src), "state_dict")
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    cfg = clip_config_from_openclip(sd, vision_heads=vision_heads, text_heads=text_heads,
                                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                    pad_token_id=tok.pad_token_id)
    if len(tok) > cfg["text_config"]["vocab_size"]:
        raise ValueError(f"tokenizer {tokenizer!r} has {len(tok)} tokens but the checkpoint's embedding has "
                         f"{cfg['text_config']['vocab_size']}: wrong tokenizer")
    state = openclip_to_hf(sd, cfg)
    if dtype is not None:
        from ..models.vlm import resolve_dtype

        dt = resolve_dtype(dtype)
        state = {k: v.to(dt) for k, v in state.items()}
    config = transformers.CLIPConfig(**cfg)
    check_against_class(transformers.CLIPModel, config, state)
    max_len = min(int(getattr(tok, "model_max_length", 77) or 77), cfg["text_config"]["max_position_embeddings"])
    tok.model_max_length = max_len
    size = cfg["vision_config"]["image_size"]

    def write(tmp: Path) -> dict[str, Any]:
        st.save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                     metadata={"format": "pt"})
        config.save_pretrained(tmp)
        ip = transformers.CLIPImageProcessorPil(size={"shortest_edge": size},
                                                crop_size={"height": size, "width": size})
        transformers.CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(tmp)
        return {"image_size": size, "preprocessing": "hpsv2-resize-longest-pad"}

    return write_converted(dst, "hpsv2", write, source=src, overwrite=overwrite,
                           variant=version or _version_from_name(src), dtype=str(next(iter(state.values())).dtype).replace("torch.", ""),
                           torch_version=torch.__version__)
