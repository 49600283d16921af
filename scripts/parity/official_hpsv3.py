"""HPSv3 parity, official side (runs in the hpsv3 package's environment, transformers 4.45.2 as it pins).

``python official_hpsv3.py INPUTS OUT``:

1. writes a tiny Qwen2-VL base model directory ``OUT/base`` (config, weights, processor: Qwen2-VL's image
   processor, a small byte-level BPE tokenizer with Qwen's special tokens and Qwen2-VL-Instruct's chat
   template), standing in for ``Qwen/Qwen2-VL-7B-Instruct``;
2. writes ``OUT/HPSv3_tiny.yaml``: the package's ``config/HPSv3_7B.yaml`` with ``model_name_or_path`` set to that
   directory, float32 instead of bf16 (the comparison is at full precision; rewardkit's ``dtype=`` covers bf16),
   sdpa attention and no DeepSpeed;
3. builds the model with the package's own ``hpsv3.train.create_model_and_processor`` (adds ``<|Reward|>``,
   resizes the embeddings, builds the ranknet ``rm_head``), perturbs every weight (seeded) and saves the state
   dict as ``OUT/HPSv3.safetensors`` (the published file is the full-model state dict, transformers-4.45 names);
4. scores with ``HPSv3RewardInferencer(config_path, checkpoint_path, device='cpu').reward(image_paths, prompts)``
   and takes ``[:, 0]`` (mu) as the README does, in batches of 4 (image, prompt) pairs (right-padded).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs, write_scores  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
#: Qwen2's pre-tokenizer (tokenizer.json of the Qwen2 / Qwen2-VL checkpoints): transformers 5 rebuilds
#: Qwen2Tokenizer with this split whatever the file says, so the tiny tokenizer must use it for both sides to agree
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
              r"\s+(?!\S)|\s+")


def QWEN_PRE_TOKENIZER(pre_tokenizers):
    from tokenizers import Regex

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])


#: Qwen/Qwen2-VL-7B-Instruct's chat template (chat_template.json), with its default system prompt
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")


def write_base(base: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import (Qwen2TokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor, Qwen2VLProcessor)

    from hpsv3.dataset.data_collator_qwen import INSTRUCTION

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = QWEN_PRE_TOKENIZER(pre_tokenizers)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([INSTRUCTION, "system user assistant You are a helpful assistant.",
                             "Please provide the overall ratings of this image"] * 20, trainer=trainer)
    hf = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                                 additional_special_tokens=SPECIALS[1:], model_max_length=32768)
    hf.chat_template = CHAT_TEMPLATE
    ip = Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136,
                               max_pixels=12845056)
    Qwen2VLProcessor(image_processor=ip, tokenizer=hf, chat_template=CHAT_TEMPLATE).save_pretrained(base)
    ids = {t: hf.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg = Qwen2VLConfig(vocab_size=len(hf), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=False,
                        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
                                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                        pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(cfg).save_pretrained(base, safe_serialization=True)


def load_scorer(out_dir: str):
    """``f(image_paths, prompt) -> [score]``: ``HPSv3RewardInferencer(...).reward(paths, prompts)`` (one batch, the
    mean ``mu``) on the files ``main`` wrote in OUT (for benchmarks/peers.py)."""
    import torch
    from hpsv3 import HPSv3RewardInferencer

    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    inferencer = HPSv3RewardInferencer(config_path=str(out / "HPSv3_tiny.yaml"),
                                       checkpoint_path=str(out / "HPSv3.safetensors"), device="cpu")

    def score(paths: list, prompt: str) -> list:
        with torch.no_grad():
            return [float(x) for x in inferencer.reward(list(paths), [prompt] * len(paths))[:, 0].tolist()]
    return score


def main(inputs: str, out_dir: str) -> None:
    import safetensors.torch
    import torch
    import yaml

    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import hpsv3
    from hpsv3 import HPSv3RewardInferencer
    from hpsv3.train import create_model_and_processor
    from hpsv3.utils.parser import DataConfig, ModelConfig, PEFTLoraConfig, TrainingConfig, parse_args_with_yaml

    base = out / "base"
    write_base(base)
    cfg = yaml.safe_load((Path(hpsv3.__file__).parent / "config" / "HPSv3_7B.yaml").read_text())
    cfg.update(model_name_or_path=str(base), torch_dtype="float32", bf16=False, disable_flash_attn2=True,
               deepspeed=None, gradient_checkpointing=False, report_to="none", output_dir=str(out / "runs"))
    config_path = out / "HPSv3_tiny.yaml"
    config_path.write_text(yaml.safe_dump(cfg))

    (data_config, training_args, model_config, peft_lora_config), _ = parse_args_with_yaml(
        (DataConfig, TrainingConfig, ModelConfig, PEFTLoraConfig), str(config_path), is_train=False)
    model, _, _ = create_model_and_processor(model_config=model_config, peft_lora_config=peft_lora_config,
                                             training_args=training_args)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ckpt = out / "HPSv3.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    del model

    inferencer = HPSv3RewardInferencer(config_path=str(config_path), checkpoint_path=str(ckpt), device="cpu")
    images, prompts = read_inputs(inputs)
    scores: dict = {}
    pairs = [(im, j) for im in images for j in range(len(prompts))]
    with torch.no_grad():
        # batches of 4 pairs with different prompts (right padding, as the inferencer pads); not larger: Qwen2-VL's
        # sdpa vision attention in transformers 4.45 builds one mask over every image's patches of the batch
        for b in range(0, len(pairs), 4):
            chunk = pairs[b:b + 4]
            try:
                mu = inferencer.reward([im["path"] for im, _ in chunk], [prompts[j] for _, j in chunk])[:, 0].tolist()
            except Exception:  # noqa: BLE001 - the batch crashed: score one by one to find which
                mu = []
                for im, j in chunk:
                    try:
                        mu.append(float(inferencer.reward([im["path"]], [prompts[j]])[0, 0]))
                    except Exception as exc1:  # noqa: BLE001 - recorded: the official path crashed on it
                        mu.append(f"{type(exc1).__name__}: {exc1}"[:300])
            for (im, j), s in zip(chunk, mu):
                scores[key(im, j)] = s
    from importlib.metadata import version

    write_scores(out / "official.json", scores, package="hpsv3", version=version("hpsv3"),
                 call="HPSv3RewardInferencer(config_path, checkpoint_path, device='cpu').reward(paths, prompts)[:, 0]")
    print(f"  official: {sum(isinstance(v, float) for v in scores.values())} scores, "
          f"{sum(not isinstance(v, float) for v in scores.values())} crashes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
