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


def test_tiny_sd3_pipeline_samples_saves_and_reloads(tmp_path):
    diffusers = pytest.importorskip("diffusers")

    rng_before = torch.get_rng_state()
    pipe = testing.tiny_sd3_pipeline()
    assert torch.equal(rng_before, torch.get_rng_state()), "builders must not disturb the caller's RNG"
    assert all(not m.training for m in pipe.components.values() if isinstance(m, torch.nn.Module))
    # SD3 / SD3.5's shifted flow-matching schedule (shift 3): the published 10-step sigma list.
    pipe.scheduler.set_timesteps(10)
    expected = [1.0, 0.9601, 0.9133, 0.8577, 0.7904, 0.7073, 0.6022, 0.4649, 0.278, 0.0089, 0.0]
    assert pipe.scheduler.sigmas.tolist() == pytest.approx(expected, abs=1e-4)

    kw = dict(num_inference_steps=2, height=32, width=32, guidance_scale=1.0, max_sequence_length=8,
              output_type="pt")
    images = pipe(["a cat", "a dog"], generator=torch.Generator().manual_seed(0), **kw).images
    assert images.shape == (2, 3, 32, 32) and 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    embeds, _, pooled, _ = pipe.encode_prompt(prompt="a cat", prompt_2=None, prompt_3=None,
                                              do_classifier_free_guidance=False, max_sequence_length=8)
    assert embeds.shape == (1, 16 + 8, 32) and pooled.shape == (1, 32)  # 16 CLIP + 8 T5 tokens

    path = testing.save_tiny_checkpoint("sd3", tmp_path / "sd3")
    assert not list(path.rglob("*.bin")), "tiny checkpoints are safetensors only"
    loaded = diffusers.StableDiffusion3Pipeline.from_pretrained(path)
    loaded.set_progress_bar_config(disable=True)
    again = loaded(["a cat", "a dog"], generator=torch.Generator().manual_seed(0), **kw).images
    assert torch.equal(images, again)
