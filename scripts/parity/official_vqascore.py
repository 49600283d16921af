"""VQAScore parity against the PyPI release of t2v-metrics (3.0), official side (its own environment,
transformers 4.49.0 as it pins).

``python official_vqascore.py INPUTS OUT``:

1. writes a tiny Qwen2.5-VL model directory ``OUT/judge`` (config, weights, Qwen2-VL image processor, a small
   byte-level BPE tokenizer with Qwen's special tokens, Qwen2.5-VL-Instruct's chat template), standing in for
   ``Qwen/Qwen2.5-VL-7B-Instruct``;
2. imports ``t2v_metrics.models.vqascore_models.qwen2vl_model`` without the package ``__init__`` files (they require
   an ``ffmpeg`` binary and import every other scorer: OpenAI, Gemini, LLaVA, InternVideo...), points the
   ``qwen2.5-vl-7b`` entry of its ``QWEN2_VL_MODELS`` table at that directory for the model and the processor,
   with float32 and sdpa attention instead of bf16 + flash-attention 2 (which needs CUDA);
3. scores with ``Qwen2VLModel(model_name='qwen2.5-vl-7b', device='cpu').forward(paths, texts)``: its default
   question ``Does this image show "{}"?``, P("Yes") under the full softmax of the first generated position.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs, write_scores  # noqa: E402
from official_hpsv3 import CHAT_TEMPLATE, QWEN_PRE_TOKENIZER, SPECIALS  # noqa: E402


def write_judge(d: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import (Qwen2TokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor, Qwen2VLImageProcessor)

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = QWEN_PRE_TOKENIZER(pre_tokenizers)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['Does this image show "a cat on a mat"? Please answer Yes or No.',
                             "system user assistant You are a helpful assistant. a photo of a red car"] * 30,
                            trainer=trainer)
    hf = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                                 additional_special_tokens=SPECIALS[1:], model_max_length=32768)
    hf.add_tokens(["Yes", "No"])  # single-token answers, as in Qwen's vocabulary
    hf.chat_template = CHAT_TEMPLATE
    ip = Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136,
                               max_pixels=12845056)
    Qwen2_5_VLProcessor(image_processor=ip, tokenizer=hf, chat_template=CHAT_TEMPLATE).save_pretrained(d)
    ids = {t: hf.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg = Qwen2_5_VLConfig(
        vocab_size=len(hf), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=8192, tie_word_embeddings=False,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                       "fullatt_block_indexes": [1]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(d, safe_serialization=True)


def _bare_package(name: str) -> None:
    """Register package ``name`` without running its ``__init__`` (submodules import as usual)."""
    parent, _, _ = name.rpartition(".")
    if parent and parent not in sys.modules:
        _bare_package(parent)
    if parent:
        loc = [str(Path(sys.modules[parent].__path__[0]) / name.rpartition(".")[2])]
    else:
        loc = list(importlib.util.find_spec(name).submodule_search_locations)
    pkg = types.ModuleType(name)
    pkg.__path__ = loc
    sys.modules[name] = pkg


def _official_scorer(judge: Path, dtype: str = "float32"):
    """t2v_metrics' ``Qwen2VLModel('qwen2.5-vl-7b')`` on the judge directory (its ``QWEN2_VL_MODELS`` entry pointed
    there, ``dtype`` and sdpa attention instead of bf16 + flash-attention 2). Its ``device_map="auto"`` places the
    model on a CUDA device when there is one, whatever ``device=`` says."""
    import torch

    _bare_package("t2v_metrics.models.vqascore_models")
    from t2v_metrics.models.vqascore_models import qwen2vl_model as Q

    entry = Q.QWEN2_VL_MODELS["qwen2.5-vl-7b"]
    entry["tokenizer"]["path"] = str(judge)
    entry["model"].update(path=str(judge), torch_dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return Q.Qwen2VLModel(model_name="qwen2.5-vl-7b", device="cpu", checkpoint=str(judge))


def load_scorer(out_dir: str, dtype: str = "float32"):
    """``f(image_paths, prompt) -> [score]``: ``Qwen2VLModel('qwen2.5-vl-7b').forward(paths, [prompt] * n)`` (the
    call ``main`` scores with; it loops over the pairs itself) on the judge ``main`` wrote in OUT (for
    benchmarks/peers.py)."""
    warnings.filterwarnings("ignore")
    scorer = _official_scorer(Path(out_dir).resolve() / "judge", dtype)

    def score(paths: list, prompt: str) -> list:
        return [float(x) for x in scorer.forward(list(paths), [prompt] * len(paths)).tolist()]
    return score


def main(inputs: str, out_dir: str) -> None:
    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    judge = out / "judge"
    write_judge(judge)
    scorer = _official_scorer(judge)
    images, prompts = read_inputs(inputs)
    scores: dict = {}
    for im in images:
        for j, prompt in enumerate(prompts):
            try:
                scores[key(im, j)] = float(scorer.forward([im["path"]], [prompt])[0])
            except Exception as exc:  # noqa: BLE001 - recorded: the official path crashed on this input
                scores[key(im, j)] = f"{type(exc).__name__}: {exc}"[:300]
    from importlib.metadata import version

    write_scores(out / "official.json", scores, package="t2v-metrics", version=version("t2v-metrics"),
                 call="t2v_metrics qwen2vl_model.Qwen2VLModel('qwen2.5-vl-7b').forward(paths, texts)")
    print(f"  official: {sum(isinstance(v, float) for v in scores.values())} scores, "
          f"{sum(not isinstance(v, float) for v in scores.values())} crashes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
