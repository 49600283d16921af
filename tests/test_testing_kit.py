"""rewardkit.testing: tiny real architectures, deterministic, loadable through from_pretrained."""

from __future__ import annotations

import pytest
import torch

from rewardkit import testing


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_tiny_vlm_roundtrip_and_determinism(kind, tmp_path):
    from rewardkit.models.vlm import load_vlm

    model, proc = testing.TINY_KINDS[kind]()
    model2, _ = testing.TINY_KINDS[kind]()
    assert not model.training
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters()):
        assert torch.equal(a, b), f"{n} differs between two builds with one seed"
    rng_before = torch.get_rng_state()
    testing.TINY_KINDS[kind](seed=3)
    assert torch.equal(rng_before, torch.get_rng_state()), "builders must not disturb the caller's RNG"

    tok = proc.tokenizer
    assert len(tok.tokenize("Yes")) == 1 and len(tok.tokenize("No")) == 1
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it good?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    batch = proc(text=[text, text], images=testing.random_images(2, sizes=[(64, 64), (32, 96)]),
                 return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    path = testing.save_tiny_checkpoint(kind, tmp_path / kind)
    loaded, lproc = load_vlm(str(path), device="cpu")
    batch2 = lproc(text=[text, text], images=testing.random_images(2, sizes=[(64, 64), (32, 96)]),
                   return_tensors="pt", padding=True)
    assert torch.equal(batch["input_ids"], batch2["input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch2).logits, logits)


def test_tiny_clip_roundtrip(tiny_clip_dir):
    import transformers

    model, proc = testing.tiny_clip()
    loaded = transformers.CLIPModel.from_pretrained(tiny_clip_dir).eval()
    lproc = transformers.AutoProcessor.from_pretrained(tiny_clip_dir)
    imgs = testing.random_images(2)
    a = proc(text=["a cat", "a dog"], images=imgs, return_tensors="pt", padding=True)
    b = lproc(text=["a cat", "a dog"], images=imgs, return_tensors="pt", padding=True)
    with torch.no_grad():
        torch.testing.assert_close(model(**a).logits_per_image, loaded(**b).logits_per_image)


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown tiny kind"):
        testing.save_tiny_checkpoint("sdxl", "/tmp/x")
