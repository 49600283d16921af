"""CLIPScore and PickScore on a tiny CLIP saved to disk and loaded back through from_pretrained."""

from __future__ import annotations

import pytest
import torch

from rewardkit import load_reward
from rewardkit.testing import random_images

PROMPTS = ["a red apple", "two birds on a branch", "a green bowl"]


@pytest.fixture(scope="module")
def reference(tiny_clip_dir):
    """logits_per_image from CLIPModel.forward: logit_scale * cos, an independent path."""
    import transformers

    model = transformers.CLIPModel.from_pretrained(tiny_clip_dir).eval()
    proc = transformers.AutoProcessor.from_pretrained(tiny_clip_dir)
    images = random_images(3, sizes=[(32, 32), (50, 40), (40, 64)])
    batch = proc(text=PROMPTS, images=images, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits_per_image  # [images, texts]
    return images, logits.diagonal().float(), float(model.logit_scale.detach().exp())


def test_pickscore_is_logit_scale_times_cosine(tiny_clip_dir, reference):
    images, logits, _ = reference
    reward = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")
    out = reward(images, PROMPTS)
    torch.testing.assert_close(out.scores, logits, atol=1e-5, rtol=1e-5)
    cmp = reward.compare(images[:1], images[1:2], PROMPTS[:1])  # one prompt, two images: 2-way softmax
    same_prompt = reward(images[:2], [PROMPTS[0]] * 2).scores
    torch.testing.assert_close(cmp.prob_a, torch.softmax(same_prompt, 0)[:1], atol=1e-6, rtol=1e-6)
    scaled = load_reward("pickscore", model=str(tiny_clip_dir), scale=1 / 26)
    torch.testing.assert_close(scaled(images, PROMPTS).scores, logits / 26, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("convention", ["hessel", "cosine", "logits100"])
def test_clipscore_conventions(tiny_clip_dir, reference, convention):
    images, logits, scale = reference
    cos = logits / scale
    expected = {"hessel": 2.5 * cos.clamp(min=0), "cosine": cos, "logits100": logits / 100}[convention]
    reward = load_reward("clipscore", model=str(tiny_clip_dir), convention=convention)
    out = reward(images, PROMPTS)
    torch.testing.assert_close(out.scores, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.dimensions["cosine"], cos, atol=1e-5, rtol=1e-5)
    assert out.info["convention"] == convention


def test_clipscore_rejects_unknown_convention(tiny_clip_dir):
    with pytest.raises(ValueError, match="convention"):
        load_reward("clipscore", model=str(tiny_clip_dir), convention="percent")


def test_long_prompts_are_truncated_and_reported(tiny_clip_dir):
    reward = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    out = reward(random_images(1), "a very long prompt " * 40)
    assert out.valid.all() and out.info["prompts_truncated"] == 1


def test_bf16_dtype_and_to(tiny_clip_dir, reference):
    images, logits, _ = reference
    reward = load_reward("pickscore", model=str(tiny_clip_dir), dtype="bfloat16")
    assert reward.backbone.model.dtype == torch.bfloat16
    out = reward(images, PROMPTS)
    assert out.scores.dtype == torch.float32
    torch.testing.assert_close(out.scores, logits, atol=0.5, rtol=0.05)
    assert reward.to("cpu").device == torch.device("cpu")


def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(OSError):
        load_reward("pickscore", model=str(tmp_path / "nope"))


def test_pickled_weights_are_refused(tmp_path):
    """Safetensors only: a checkpoint that only has pytorch_model.bin is not unpickled."""
    from rewardkit.testing import tiny_clip

    model, proc = tiny_clip()
    model.save_pretrained(tmp_path)
    proc.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()  # leave only a pickled state dict, as old hub repos have
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    assert (tmp_path / "pytorch_model.bin").exists() and not (tmp_path / "model.safetensors").exists()
    with pytest.raises(OSError, match="never unpickles"):
        load_reward("clipscore", model=str(tmp_path))
