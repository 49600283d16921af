"""Tiny, randomly initialised instances of real architectures, built in-process with no network.

For rewardkit's own tests and for users testing their integrations: every model is a real transformers
class (``Qwen2_5_VLForConditionalGeneration``, ``Qwen3VLForConditionalGeneration``, ``CLIPModel``) with a
byte-level BPE tokenizer trained in milliseconds. Builders are deterministic (seeded, without touching the
caller's RNG state) and return models in ``.eval()`` mode.

    >>> from rewardkit.testing import save_tiny_checkpoint
    >>> save_tiny_checkpoint("clip", "/tmp/tiny-clip")        # loadable with from_pretrained
    >>> reward = rewardkit.load_reward("clipscore", model="/tmp/tiny-clip")

Scores from tiny models are meaningless; their shapes, dtypes, code paths and file formats are real.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from ._imports import require

__all__ = [
    "build_tiny_tokenizer",
    "tiny_qwen2_5_vl",
    "tiny_qwen3_vl",
    "tiny_clip",
    "tiny_sd3_pipeline",
    "save_tiny_checkpoint",
    "save_tiny_vllm_checkpoint",
    "TINY_KINDS",
    "random_images",
]

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]

# Handles string and list contents and emits one vision block per image (the processor expands the pad).
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' or 'image' in c %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "Yes No 1 2 3 4 5 good bad image prompt score rate the quality of this picture",
    "user assistant system a cat on a mat. Is the image aligned with the prompt?",
    "a photo of a dog, a red car, two birds on a branch, add a green bowl, the edited image",
    "Score: 4 Rationale: the object is consistent with the reference and the scene.",
]


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_tiny_tokenizer(vocab_size: int = 300, *, specials: list[str] | None = None,
                         extra_tokens: tuple[str, ...] = ("Yes", "No"), clip_style: bool = False):
    """A tiny byte-level BPE ``PreTrainedTokenizerFast`` trained in-process.

    ``clip_style=True`` adds CLIP's ``<|startoftext|>`` / ``<|endoftext|>`` around every encoded text
    (CLIP pools the text embedding at the end-of-text token).
    """
    require("transformers", "hf")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(specials or (["<|startoftext|>", "<|endoftext|>"] if clip_style else QWEN_SPECIALS))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 50, trainer=trainer)
    if clip_style:
        bos, eos = specials[0], specials[1]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B {eos}",
            special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))])
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos,
                                     unk_token=eos, model_max_length=32)
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     additional_special_tokens=specials[1:])
        hf.chat_template = QWEN_CHAT_TEMPLATE
    if extra_tokens:
        hf.add_tokens(list(extra_tokens))  # single-token verdict labels
    return hf


def _qwen_ids(tok) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}


def _qwen_text_config(tok, ids: dict[str, int], hidden_size: int, num_layers: int, **extra: Any) -> dict[str, Any]:
    """Tiny Qwen text config: 2 heads, 1 KV head, mrope sections summing to head_dim / 2."""
    head_dim = hidden_size // 2
    third = head_dim // 2
    mrope = [third - 2 * (third // 3), third // 3, third // 3]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope, **extra.pop("rope", {})}
    return dict(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=2048, rope_parameters=rope, bos_token_id=ids["<|endoftext|>"],
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], **extra)


def _qwen_vision_ids(ids: dict[str, int]) -> dict[str, int]:
    return dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def _tiny_qwen(transformers, tok, config_cls, model_cls, proc_cls, cfg_kwargs, patch: int, seed: int):
    from .models.vlm import image_only_processor

    cfg = config_cls(**cfg_kwargs, tie_word_embeddings=False)
    with _seeded(seed):
        model = model_cls(cfg).eval()
    side = patch * 2  # resize factor = patch x merge
    ip = transformers.Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                               min_pixels=side * side, max_pixels=4 * side * side)
    proc = image_only_processor(proc_cls)(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, proc


def tiny_qwen2_5_vl(seed: int = 0, hidden_size: int = 32, num_layers: int = 1, vision_hidden_size: int = 32):
    """Tiny ``Qwen2_5_VLForConditionalGeneration`` + image-only processor. Returns ``(model, processor)``.

    Images are resized to 28..56 px per side (1..4 merged image tokens per image). Text and vision attention
    have 2 heads each: head size ``hidden_size // 2`` and ``vision_hidden_size // 2``.
    """
    transformers = require("transformers", "hf")
    tok = build_tiny_tokenizer(300)
    ids = _qwen_ids(tok)
    cfg = dict(text_config=_qwen_text_config(tok, ids, hidden_size, num_layers),
               vision_config=dict(depth=1, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                                  num_heads=2, patch_size=14,
                                  spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                                  out_hidden_size=hidden_size, fullatt_block_indexes=[0]),
               **_qwen_vision_ids(ids))
    return _tiny_qwen(transformers, tok, transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration,
                      transformers.Qwen2_5_VLProcessor, cfg, patch=14, seed=seed)


def tiny_qwen3_vl(seed: int = 0, hidden_size: int = 32, num_layers: int = 1):
    """Tiny ``Qwen3VLForConditionalGeneration`` + image-only processor. Returns ``(model, processor)``.

    Images are resized to 32..64 px per side (1..4 merged image tokens per image).
    """
    transformers = require("transformers", "hf")
    tok = build_tiny_tokenizer(300)
    ids = _qwen_ids(tok)
    text = _qwen_text_config(tok, ids, hidden_size, num_layers, head_dim=hidden_size // 2,
                             rope={"mrope_interleaved": True})
    cfg = dict(text_config=text,
               vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden_size,
                                  num_position_embeddings=16, deepstack_visual_indexes=[0]),
               **_qwen_vision_ids(ids))
    return _tiny_qwen(transformers, tok, transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration,
                      transformers.Qwen3VLProcessor, cfg, patch=16, seed=seed)


def tiny_clip(seed: int = 0, image_size: int = 32, projection_dim: int = 16):
    """Tiny ``CLIPModel`` + ``CLIPProcessor`` (PIL image processor). Returns ``(model, processor)``.

    The same class serves PickScore (a CLIP-H checkpoint) and CLIPScore (CLIP ViT-L/14).
    """
    transformers = require("transformers", "hf")
    tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    text_cfg = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, max_position_embeddings=32, projection_dim=projection_dim,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision_cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      image_size=image_size, patch_size=8, projection_dim=projection_dim)
    cfg = transformers.CLIPConfig(text_config=text_cfg, vision_config=vision_cfg, projection_dim=projection_dim)
    with _seeded(seed):
        model = transformers.CLIPModel(cfg).eval()
    ip = transformers.CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                            crop_size={"height": image_size, "width": image_size})
    proc = transformers.CLIPProcessor(image_processor=ip, tokenizer=tok)
    return model, proc


def tiny_sd3_pipeline(seed: int = 0, *, with_t5: bool = True, sd35: bool = True, shift: float = 3.0):
    """Tiny ``StableDiffusion3Pipeline`` (diffusers): SD3 transformer, flow-matching scheduler, VAE, two CLIP
    text encoders with projection and (``with_t5``) a T5 encoder, all randomly initialised, in ``.eval()``.

    Shapes: images 32 x 32 px; the one-block VAE keeps the resolution (latents ``[B, 4, 32, 32]``); the
    transformer patchifies by 2 (256 image tokens). Text: 16 CLIP tokens per encoder (hidden 16 + 16 = 32 =
    ``joint_attention_dim`` = T5 ``d_model``), pooled projections 16 + 16 = 32. ``sd35=True`` uses SD3.5's
    transformer options (a dual-attention layer, RMS q/k norm); ``shift=3.0`` is SD3 / SD3.5's scheduler
    shift. Requires the ``rl`` extra (diffusers).

        >>> pipe = tiny_sd3_pipeline()
        >>> pipe("a cat", num_inference_steps=2, height=32, width=32, guidance_scale=1.0,
        ...      max_sequence_length=8, output_type="pt").images.shape
        torch.Size([1, 3, 32, 32])
    """
    import torch

    transformers = require("transformers", "hf")
    diffusers = require("diffusers", "rl")

    clip_tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    clip_tok.model_max_length = 16  # the CLIP length SD3's pipeline pads to
    clip_cfg = transformers.CLIPTextConfig(
        vocab_size=len(clip_tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=16, projection_dim=16, hidden_act="gelu",
        bos_token_id=clip_tok.bos_token_id, eos_token_id=clip_tok.eos_token_id,
        pad_token_id=clip_tok.pad_token_id)
    with _seeded(seed):
        transformer = diffusers.SD3Transformer2DModel(
            sample_size=32, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
            num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32, pooled_projection_dim=32,
            pos_embed_max_size=32, **(dict(dual_attention_layers=(0,), qk_norm="rms_norm") if sd35 else {}))
        te1 = transformers.CLIPTextModelWithProjection(clip_cfg)
        te2 = transformers.CLIPTextModelWithProjection(clip_cfg)
        vae = diffusers.AutoencoderKL(
            sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
            latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
            shift_factor=0.0609, scaling_factor=1.5035)
        te3 = tok3 = None
        if with_t5:
            tok3 = build_tiny_tokenizer(300, extra_tokens=())
            te3 = transformers.T5EncoderModel(transformers.T5Config(
                vocab_size=len(tok3), d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=tok3.pad_token_id,
                eos_token_id=tok3.eos_token_id))
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae,
        text_encoder=te1, tokenizer=clip_tok, text_encoder_2=te2, tokenizer_2=clip_tok,
        text_encoder_3=te3, tokenizer_3=tok3)
    pipe.set_progress_bar_config(disable=True)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval()  # built from configs, modules start in train mode (dropout in T5)
    return pipe


TINY_KINDS = {
    "qwen2_5_vl": tiny_qwen2_5_vl,
    "qwen3_vl": tiny_qwen3_vl,
    "clip": tiny_clip,
    "sd3": tiny_sd3_pipeline,
}


def save_tiny_checkpoint(kind: str, path: str | Path, **kwargs: Any) -> Path:
    """Write a tiny checkpoint directory that ``from_pretrained`` (and rewardkit's loaders) can read.

    ``kind`` is one of ``TINY_KINDS`` (``"qwen2_5_vl"``, ``"qwen3_vl"``, ``"clip"``, ``"sd3"``); aliases
    ``"pickscore"`` and ``"clipscore"`` write a CLIP checkpoint. ``"sd3"`` writes a diffusers pipeline
    directory (``StableDiffusion3Pipeline.from_pretrained(path)``). Returns the directory.
    """
    kind = {"pickscore": "clip", "clipscore": "clip", "qwen2.5-vl": "qwen2_5_vl", "qwen3-vl": "qwen3_vl", "sd3.5": "sd3"}.get(kind, kind)
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny kind {kind!r}; choose from {sorted(TINY_KINDS)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if kind == "sd3":
        TINY_KINDS[kind](**kwargs).save_pretrained(path, safe_serialization=True)
        return path
    model, proc = TINY_KINDS[kind](**kwargs)
    model.save_pretrained(path, safe_serialization=True)
    if kind == "clip":
        proc.save_pretrained(path)
    else:  # image-only processors: save the parts the loader reads back
        proc.tokenizer.save_pretrained(path)
        proc.image_processor.save_pretrained(path)
    return path


#: The tiny Qwen2.5-VL for vLLM on a GPU: head size 64 in the text and vision towers (vLLM's Triton attention
#: needs >= 32, FlashAttention / FlashInfer take 64) and float16 weights (FlashAttention / FlashInfer need
#: fp16 or bf16); the CPU fixtures keep ``tiny_qwen2_5_vl``'s defaults (head size 16, float32).
VLLM_TINY_QWEN2_5_VL = {"hidden_size": 128, "vision_hidden_size": 128, "num_layers": 1}


def save_tiny_vllm_checkpoint(path: str | Path, *, dtype: str = "float16", seed: int = 0) -> Path:
    """A tiny Qwen2.5-VL checkpoint that every vLLM attention backend accepts (:data:`VLLM_TINY_QWEN2_5_VL`),
    saved in ``dtype`` (``"float16"`` or ``"bfloat16"``), with a complete processor config
    (``processor_config.json`` naming ``Qwen2_5_VLProcessor`` with its image and video processors,
    ``preprocessor_config.json``, ``video_preprocessor_config.json``, ``chat_template.jinja``), so vLLM loads the
    processor as it would a published checkpoint's instead of building one. rewardkit's CPU loaders read it too
    (without torchvision they fall back to the image-only processor)."""
    import json

    import torch

    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype must be 'float16' or 'bfloat16' (what vLLM's GPU attention backends take), "
                         f"got {dtype!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model, proc = tiny_qwen2_5_vl(seed=seed, **VLLM_TINY_QWEN2_5_VL)
    model.to(getattr(torch, dtype)).save_pretrained(path, safe_serialization=True)
    proc.tokenizer.save_pretrained(path)
    proc.image_processor.save_pretrained(path)
    image = {k: v for k, v in proc.image_processor.to_dict().items() if not k.startswith("_")}
    image["image_processor_type"] = "Qwen2VLImageProcessor"
    video = {k: image[k] for k in ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean",
                                   "image_std", "merge_size", "patch_size", "resample", "rescale_factor", "size",
                                   "temporal_patch_size") if k in image}
    video.update(video_processor_type="Qwen2VLVideoProcessor", do_sample_frames=False)
    (path / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    processor_config = {"processor_class": "Qwen2_5_VLProcessor", "image_processor": image, "video_processor": video}
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(proc.tokenizer.chat_template)
    return path


def random_images(n: int, size: int = 32, seed: int = 0, sizes: list[tuple[int, int]] | None = None):
    """``n`` deterministic random RGB PIL images (``sizes`` gives per-image (w, h))."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)] if sizes else (size, size)
        out.append(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB"))
    return out
