"""CLIP-family dual encoders (OpenAI CLIP, OpenCLIP-converted checkpoints such as PickScore_v1).

Shared by the CLIP-based rewards; loads through ``transformers`` ``from_pretrained`` from a hub id or a
local directory, so the tiny test checkpoints exercise exactly the path real weights take.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from .._imports import require
from .vlm import from_pretrained_safetensors, refuse_pickled_side_files, resolve_device, resolve_dtype

__all__ = ["CLIPBackbone", "TEXT_CLEANING", "openclip_clean"]


def openclip_clean(text: str) -> str:
    """The text cleaning OpenCLIP's ``SimpleTokenizer`` (and OpenAI CLIP's ``clip.tokenize``) applies before
    BPE: ``ftfy.fix_text``, HTML entities unescaped twice, surrounding whitespace stripped, every whitespace run
    made one space (``basic_clean`` + ``whitespace_clean`` of ``open_clip/tokenizer.py``; lower-casing is left to
    the transformers CLIP tokenizer, which does it too). ftfy repairs mojibake (``cafÃ©`` -> ``café``) and
    straightens curly quotes, so without this step such prompts get other token ids than the model saw."""
    import html
    import re

    ftfy = require("ftfy", "hf", purpose="OpenCLIP text cleaning (HPSv2)")
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip()


#: ``text_cleaning=`` options of :class:`CLIPBackbone`: None (the tokenizer's own normalisation only) or
#: "openclip" (:func:`openclip_clean` first, as the OpenCLIP / OpenAI CLIP tokenizers do)
TEXT_CLEANING = {None: None, "openclip": openclip_clean}


class CLIPBackbone:
    """Image and text embeddings from a ``CLIPModel`` checkpoint.

    Args:
        model: hub id or local directory of a ``CLIPModel`` checkpoint.
        processor: hub id or directory of its processor (default: ``model``).
        device, dtype: where and in which precision the encoders run; similarities are computed in fp32.
        text_cleaning: None, or "openclip" for checkpoints trained with OpenCLIP's tokenizer (HPSv2), whose
            cleaning (:func:`openclip_clean`) runs before the transformers tokenizer.

    The weights are frozen (``requires_grad=False``): gradients only ever flow to input pixels. Safe to use
    from several threads: the shared fast tokenizer (whose truncation / padding settings are mutable state)
    is only used under a lock; the forward passes run concurrently.
    """

    def __init__(self, model: str, processor: str | None = None, *, device: Any = None, dtype: Any = None,
                 trust_remote_code: bool = False, text_cleaning: str | None = None):
        transformers = require("transformers", "hf", purpose="CLIP-based rewards")
        if text_cleaning not in TEXT_CLEANING:
            raise ValueError(f"text_cleaning must be one of {sorted(TEXT_CLEANING, key=str)}, got {text_cleaning!r}")
        self._clean = TEXT_CLEANING[text_cleaning]
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        self.model = from_pretrained_safetensors(transformers.CLIPModel, model, dtype=self.dtype,
                                                 trust_remote_code=trust_remote_code)
        self.model.to(self.device).eval()
        self.model.requires_grad_(False)  # a reward: never trained through, gradients go to pixels only
        refuse_pickled_side_files(processor or model)
        self.processor = transformers.AutoProcessor.from_pretrained(processor or model,
                                                                    trust_remote_code=trust_remote_code)
        tok = self.processor.tokenizer
        self.max_length = min(int(getattr(tok, "model_max_length", 77) or 77),
                              int(self.model.config.text_config.max_position_embeddings))
        self._tok_lock = threading.Lock()
        from ..preprocess import clip_params

        #: the image processor as torch pre-processing parameters (None: float tensors take the processor path)
        self.tensor_params = clip_params(self.processor.image_processor)
        #: PIL images: batched pixel values equal to the processor's (models/pil_pixels.py); None until the
        #: first batch has been checked against the processor, False when it differed
        self._fast_pixels: bool | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state.pop("_tok_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tok_lock = threading.Lock()

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().float().exp())

    def to(self, device: Any) -> "CLIPBackbone":
        import torch

        self.device = torch.device(device)
        self.model.to(self.device)
        return self

    def embed_images(self, images: Any):
        """``images``: B RGB PIL images, or a float tensor ``[B, 3, H, W]`` in [0, 1] (pre-processed in torch on
        its device, differentiable) -> L2-normalised fp32 embeddings ``[B, D]``."""
        import torch

        if isinstance(images, torch.Tensor):
            from ..preprocess import clip_pixel_values

            if self.tensor_params is None:
                raise ValueError("this CLIP image processor's settings are not reproduced by the torch path")
            pix = clip_pixel_values(images.to(self.device), self.tensor_params)
        else:
            pix = self._pil_pixel_values(list(images))
        from .direct_forward import clip_image_features

        # get_image_features' values (within rounding: the last layer runs the pooled row only), through the tower's
        # submodules when that is the same computation
        feats = clip_image_features(self.model, pix.to(self.device, self.dtype))
        return torch.nn.functional.normalize(feats.float(), dim=-1)

    def _pil_pixel_values(self, images: list[Any]):
        """The processor's ``pixel_values`` for PIL ``images``, built for the whole batch at once when the
        batched path reproduces this processor (checked bit for bit on the first batch)."""
        import torch

        from .pil_pixels import clip_pil_pixel_values

        ip = self.processor.image_processor
        fast = None if self._fast_pixels is False else clip_pil_pixel_values(images, ip)
        if fast is not None and self._fast_pixels:
            return fast
        ref = ip(images=images, return_tensors="pt")["pixel_values"]
        if fast is not None and self._fast_pixels is None:
            self._fast_pixels = bool(fast.shape == ref.shape and fast.dtype == ref.dtype and torch.equal(fast, ref))
        return ref

    def tokenize(self, texts: Sequence[str]):
        """``texts``: T strings -> (``input_ids``, ``attention_mask``) ``[T, L]`` (truncated to the text window,
        padded), number of texts that were truncated. Holds the tokenizer lock: a fast tokenizer keeps its
        truncation / padding settings as shared mutable state, so two threads tokenizing with different
        settings (here: the counting pass) would corrupt each other's batches."""
        tok = self.processor.tokenizer
        # the same texts give the same rows: kept per (texts, tokenizer, cleaning, window), so a repeated prompt
        # skips the cleaning (ftfy) and the tokenizer call (issue 41: ~2.5 ms of a batch-1 HPSv2 call)
        key = (tuple(texts), id(tok), self._clean, self.max_length)
        cache = self.__dict__.setdefault("_tok_cache", {})
        hit = cache.get(key)
        if hit is None:
            cleaned = [self._clean(t) for t in texts] if self._clean is not None else list(texts)
            with self._tok_lock:
                enc = tok(cleaned, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
                truncated = 0
                if enc["input_ids"].shape[1] >= self.max_length:  # some text filled the window: count the cut ones
                    full = tok(cleaned, truncation=False)["input_ids"]
                    truncated = sum(len(ids) > self.max_length for ids in full)
            hit = (enc["input_ids"], enc["attention_mask"], truncated)
            if len(cache) >= 1024:
                cache.clear()
            cache[key] = hit
        return hit[0].clone(), hit[1].clone(), hit[2]

    def embed_texts(self, texts: Sequence[str]):
        """``texts``: T strings -> (L2-normalised fp32 embeddings ``[T, D]``, number truncated)."""
        import torch

        input_ids, attention_mask, truncated = self.tokenize(texts)
        feats = self.model.get_text_features(input_ids=input_ids.to(self.device),
                                             attention_mask=attention_mask.to(self.device))
        feats = getattr(feats, "pooler_output", feats)
        return torch.nn.functional.normalize(feats.float(), dim=-1), truncated

    def cosine(self, images: Any, prompts: Sequence[str]):
        """Cosine similarity of each image with its prompt -> (``[B]`` fp32 on the model's device, number of
        truncated prompts). ``images``: as :meth:`embed_images`.

        Each distinct prompt is encoded once per call (a broadcast prompt costs one text forward).
        """
        import torch

        uniq = list(dict.fromkeys(prompts))
        text_emb, truncated = self.embed_texts(uniq)
        idx = torch.tensor([uniq.index(p) for p in prompts], device=text_emb.device)
        img_emb = self.embed_images(images)
        return (img_emb * text_emb[idx]).sum(-1), truncated
