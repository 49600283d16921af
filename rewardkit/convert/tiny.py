"""Tiny random checkpoints in the **official** formats and key layouts (for tests and ``Reward.tiny``).

Each writer produces the file a user would download (same container, key names, dtypes, nesting), only with
tiny widths, so the converters and the rewards are exercised end to end without the internet.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch

__all__ = ["openclip_state_dict", "write_tiny_hpsv2", "rating_mlp_state_dict", "write_tiny_aesthetic",
           "save_tiny_bert_tokenizer", "imagereward_state_dict", "write_tiny_imagereward",
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


def save_tiny_bert_tokenizer(path: str | Path) -> Path:
    """A tiny uncased WordPiece tokenizer with BERT's specials (``[PAD]`` = 0, ``[CLS]``, ``[SEP]``, ...), trained
    in-process; the converter adds BLIP's ``[DEC]`` / ``[ENC]`` like it does to ``bert-base-uncased``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    import string

    from ..testing import _CORPUS

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    # the vocabulary is written out, not trained: tokenizers' WordPiece trainer breaks frequency ties in a
    # per-process random order, so a trained vocabulary (and every score of the tiny models) changed from run to
    # run. Specials, each character (the corpus's and ASCII's) alone and as a "##" continuation, then the 120 most
    # frequent words.
    counts: dict[str, int] = {}
    for line in _CORPUS:
        for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(line)):
            counts[word] = counts.get(word, 0) + 1
    chars = sorted({c for w in counts for c in w} | set(string.ascii_lowercase + string.digits + string.punctuation))
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1][:120]
    vocab = {t: i for i, t in enumerate(specials + chars + [f"##{c}" for c in chars] + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                 sep_token="[SEP]", mask_token="[MASK]", model_max_length=512)
    path = Path(path)
    hf.save_pretrained(path)
    return path


def imagereward_state_dict(*, vocab: int, vision_width: int = 32, vision_layers: int = 2, patch: int = 8,
                           image_size: int = 32, text_width: int = 32, text_layers: int = 2, max_positions: int = 40,
                           seed: int = 0) -> "OrderedDict[str, torch.Tensor]":
    """A random ``ImageReward.pt`` state dict (BLIP ViT + med BERT with cross-attention + MLP), original names."""
    gen = torch.Generator().manual_seed(seed)
    sd: OrderedDict[str, torch.Tensor] = OrderedDict()
    v = "blip.visual_encoder."
    grid = image_size // patch
    sd[v + "cls_token"] = _g(gen, 1, 1, vision_width, std=0.5)
    sd[v + "pos_embed"] = _g(gen, 1, grid * grid + 1, vision_width, std=0.5)
    sd[v + "patch_embed.proj.weight"] = _g(gen, vision_width, 3, patch, patch, std=0.05)
    sd[v + "patch_embed.proj.bias"] = _g(gen, vision_width, std=0.1)
    for i in range(vision_layers):
        p = f"{v}blocks.{i}."
        sd[p + "norm1.weight"], sd[p + "norm1.bias"] = _ln(gen, vision_width)
        sd[p + "attn.qkv.weight"] = _g(gen, 3 * vision_width, vision_width, std=vision_width ** -0.5)
        sd[p + "attn.qkv.bias"] = _g(gen, 3 * vision_width, std=0.1)
        sd[p + "attn.proj.weight"] = _g(gen, vision_width, vision_width, std=vision_width ** -0.5)
        sd[p + "attn.proj.bias"] = _g(gen, vision_width, std=0.1)
        sd[p + "norm2.weight"], sd[p + "norm2.bias"] = _ln(gen, vision_width)
        sd[p + "mlp.fc1.weight"] = _g(gen, 4 * vision_width, vision_width, std=vision_width ** -0.5)
        sd[p + "mlp.fc1.bias"] = _g(gen, 4 * vision_width, std=0.1)
        sd[p + "mlp.fc2.weight"] = _g(gen, vision_width, 4 * vision_width, std=(4 * vision_width) ** -0.5)
        sd[p + "mlp.fc2.bias"] = _g(gen, vision_width, std=0.1)
    sd[v + "norm.weight"], sd[v + "norm.bias"] = _ln(gen, vision_width)
    t = "blip.text_encoder."
    sd[t + "embeddings.position_ids"] = torch.arange(max_positions)[None]
    sd[t + "embeddings.word_embeddings.weight"] = _g(gen, vocab, text_width, std=0.5)
    sd[t + "embeddings.position_embeddings.weight"] = _g(gen, max_positions, text_width, std=0.5)
    sd[t + "embeddings.LayerNorm.weight"], sd[t + "embeddings.LayerNorm.bias"] = _ln(gen, text_width)

    def lin(name: str, o: int, i: int) -> None:
        sd[name + ".weight"] = _g(gen, o, i, std=i ** -0.5)
        sd[name + ".bias"] = _g(gen, o, std=0.1)

    for i in range(text_layers):
        p = f"{t}encoder.layer.{i}."
        for att, kv_in in (("attention", text_width), ("crossattention", vision_width)):
            lin(p + att + ".self.query", text_width, text_width)
            lin(p + att + ".self.key", text_width, kv_in)
            lin(p + att + ".self.value", text_width, kv_in)
            lin(p + att + ".output.dense", text_width, text_width)
            sd[p + att + ".output.LayerNorm.weight"], sd[p + att + ".output.LayerNorm.bias"] = _ln(gen, text_width)
        lin(p + "intermediate.dense", 4 * text_width, text_width)
        lin(p + "output.dense", text_width, 4 * text_width)
        sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"] = _ln(gen, text_width)
    lin("blip.vision_proj", 16, vision_width)
    lin("blip.text_proj", 16, text_width)
    for k, val in rating_mlp_state_dict(text_width, None, prefix="mlp.layers.", seed=seed + 1).items():
        sd[k] = val
    return sd


def write_tiny_imagereward(path: str | Path, *, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """``ImageReward.pt``-style file (flat fp32 ``OrderedDict``; vocabulary = tokenizer + ``[DEC]``, ``[ENC]``)
    and a ``med_config.json`` beside it (BERT config of the text encoder, tiny widths)."""
    import json

    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir))) + 2
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(imagereward_state_dict(vocab=vocab, seed=seed), path)
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 128,
           "layer_norm_eps": 1e-12, "max_position_embeddings": 40, "model_type": "bert", "num_attention_heads": 2,
           "num_hidden_layers": 2, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": vocab,
           "encoder_width": 32, "add_cross_attention": True}
    (path.parent / "med_config.json").write_text(json.dumps(med, indent=2), encoding="utf-8")
    return path


def tiny_qwen2_vl(seed: int = 0, hidden_size: int = 32, num_layers: int = 1):
    """Tiny ``Qwen2VLForConditionalGeneration`` + image-only processor (HPSv3's backbone family)."""
    import transformers

    from ..testing import _qwen_ids, _qwen_text_config, _qwen_vision_ids, _tiny_qwen, build_tiny_tokenizer

    tok = build_tiny_tokenizer(300)
    ids = _qwen_ids(tok)
    cfg = dict(text_config=_qwen_text_config(tok, ids, hidden_size, num_layers),
               vision_config=dict(depth=1, embed_dim=32, hidden_size=hidden_size, num_heads=2, mlp_ratio=2,
                                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
               **_qwen_vision_ids(ids))
    return _tiny_qwen(transformers, tok, transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration,
                      transformers.Qwen2VLProcessor, cfg, patch=14, seed=seed)


def _to_legacy_qwen2_vl(name: str) -> str:
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def write_tiny_hpsv3(root: str | Path, *, seed: int = 0) -> tuple[Path, Path]:
    """An ``HPSv3.safetensors``-style file (bare full state dict, transformers-4.45 Qwen2-VL key names,
    embeddings resized to len(tokenizer) + 1 for ``<|Reward|>``, ``rm_head.{0,3,5}``) and a tiny "base model"
    directory (config + tokenizer + image processor, like ``Qwen/Qwen2-VL-7B-Instruct`` minus its weights).
    Returns ``(checkpoint, base_dir)``."""
    from safetensors.torch import save_file

    from ..models.preference import RankNetHead

    root = Path(root)
    base = root / "base"
    model, proc = tiny_qwen2_vl(seed=seed)
    model.config.save_pretrained(base)
    proc.tokenizer.save_pretrained(base)
    proc.image_processor.save_pretrained(base)
    n = len(proc.tokenizer) + 1  # + <|Reward|>
    model.resize_token_embeddings(n, mean_resizing=False)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.get_input_embeddings().weight[-1] = _g(gen, model.config.text_config.hidden_size, std=0.5)
    sd = {_to_legacy_qwen2_vl(k): v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 2)
        head = RankNetHead(model.config.text_config.hidden_size, hidden=1024)
    for k, v in head.state_dict().items():
        sd[f"rm_head.{k}"] = v.detach().clone().contiguous()
    ckpt = root / "HPSv3.safetensors"
    save_file(sd, str(ckpt))
    return ckpt, base


def write_tiny_editreward(root: str | Path, *, seed: int = 0) -> tuple[Path, Path]:
    """An EditReward-style ``model.safetensors`` (tiny Qwen2.5-VL in current key names, embeddings resized to
    len(tokenizer) + 1, ``rm_heads.head_{0,1}.{0,3,5}``) and a tiny base directory. Returns (file, base_dir)."""
    from safetensors.torch import save_file

    from ..models.preference import RankNetHead
    from ..testing import tiny_qwen2_5_vl

    root = Path(root)
    base = root / "base"
    model, proc = tiny_qwen2_5_vl(seed=seed)
    model.config.save_pretrained(base)
    proc.tokenizer.save_pretrained(base)
    proc.image_processor.save_pretrained(base)
    model.resize_token_embeddings(len(proc.tokenizer) + 1, mean_resizing=False)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.get_input_embeddings().weight[-1] = _g(gen, model.config.text_config.hidden_size, std=0.5)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for h in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 2 + h)
            head = RankNetHead(model.config.text_config.hidden_size, hidden=1024)
        for k, v in head.state_dict().items():
            sd[f"rm_heads.head_{h}.{k}"] = v.detach().clone().contiguous()
    ckpt = root / "model.safetensors"
    save_file(sd, str(ckpt))
    return ckpt, base
