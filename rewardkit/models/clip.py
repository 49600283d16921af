"""CLIP-family dual encoders (OpenAI CLIP, OpenCLIP-converted checkpoints such as PickScore_v1).

Shared by the CLIP-based rewards; loads through ``transformers`` ``from_pretrained`` from a hub id or a
local directory, so the tiny test checkpoints exercise exactly the path real weights take.
"""

from __future__ import annotations

from typing import Any, Sequence

from .._imports import require
from .vlm import from_pretrained_safetensors, refuse_pickled_side_files, resolve_device, resolve_dtype

__all__ = ["CLIPBackbone"]


class CLIPBackbone:
    """Image and text embeddings from a ``CLIPModel`` checkpoint.

    Args:
        model: hub id or local directory of a ``CLIPModel`` checkpoint.
        processor: hub id or directory of its processor (default: ``model``).
        device, dtype: where and in which precision the encoders run; similarities are computed in fp32.
    """

    def __init__(self, model: str, processor: str | None = None, *, device: Any = None, dtype: Any = None,
                 trust_remote_code: bool = False):
        transformers = require("transformers", "hf", purpose="CLIP-based rewards")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.model = from_pretrained_safetensors(transformers.CLIPModel, model, dtype=self.dtype,
                                                 trust_remote_code=trust_remote_code)
        self.model.to(self.device).eval()
        refuse_pickled_side_files(processor or model)
        self.processor = transformers.AutoProcessor.from_pretrained(processor or model,
                                                                    trust_remote_code=trust_remote_code)
        tok = self.processor.tokenizer
        self.max_length = min(int(getattr(tok, "model_max_length", 77) or 77),
                              int(self.model.config.text_config.max_position_embeddings))

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().float().exp())

    def to(self, device: Any) -> "CLIPBackbone":
        import torch

        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def embed_images(self, images: Sequence[Any]):
        """``images``: B RGB PIL images -> L2-normalised fp32 embeddings ``[B, D]``."""
        import torch

        pix = self.processor.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        feats = self.model.get_image_features(pixel_values=pix.to(self.device, self.dtype))
        feats = getattr(feats, "pooler_output", feats)  # transformers 5 may return an output object
        return torch.nn.functional.normalize(feats.float(), dim=-1)

    def embed_texts(self, texts: Sequence[str]):
        """``texts``: T strings -> (L2-normalised fp32 embeddings ``[T, D]``, number truncated)."""
        import torch

        enc = self.processor.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                       return_tensors="pt")
        truncated = 0
        if enc["input_ids"].shape[1] >= self.max_length:  # some text filled the window: count the cut ones
            full = self.processor.tokenizer(list(texts), truncation=False)["input_ids"]
            truncated = sum(len(ids) > self.max_length for ids in full)
        feats = self.model.get_text_features(input_ids=enc["input_ids"].to(self.device),
                                             attention_mask=enc["attention_mask"].to(self.device))
        feats = getattr(feats, "pooler_output", feats)
        return torch.nn.functional.normalize(feats.float(), dim=-1), truncated

    def cosine(self, images: Sequence[Any], prompts: Sequence[str]):
        """Cosine similarity of each image with its prompt -> (``[B]`` fp32, number of truncated prompts).

        Each distinct prompt is encoded once per call (a broadcast prompt costs one text forward).
        """
        import torch

        uniq = list(dict.fromkeys(prompts))
        text_emb, truncated = self.embed_texts(uniq)
        idx = torch.tensor([uniq.index(p) for p in prompts], device=text_emb.device)
        img_emb = self.embed_images(images)
        return (img_emb * text_emb[idx]).sum(-1), truncated
