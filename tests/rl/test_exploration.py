"""E²PO on a real (tiny, random) CLIP text encoder: batched == the seed's loop, clamp, mask, the cut after EOS."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rewardkit.rl import exploration as X  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny encoders: one thread is fastest on a shared CPU
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def encoder():
    from rewardkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    cfg = transformers.CLIPTextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, max_position_embeddings=24, projection_dim=16,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc = transformers.CLIPTextModelWithProjection(cfg).eval()
    enc.requires_grad_(False)
    ids = tok(["a photo of a cat", "two birds", "a red car on a mat"], padding="max_length", max_length=24,
              truncation=True, return_tensors="pt").input_ids
    return enc, tok, ids


def test_batched_equals_seed_loop(encoder):
    enc, tok, ids = encoder
    mask = X.content_token_mask(ids, tok.eos_token_id, tok.bos_token_id)
    cfg = X.E2POConfig(enabled=True, num_variants=4, steps=6, sigma_init=1e-2, lr=1e-2)
    loop = X.optimize_perturbations_loop(enc, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
    for eos in (None, tok.eos_token_id):  # full sequence, and the exact cut after the last EOS
        bat = X.optimize_perturbations(enc, ids, mask, cfg, generator=torch.Generator().manual_seed(0), eos_token_id=eos)
        assert bat.delta.shape == loop.delta.shape == (3, 3, 24, 32)
        assert torch.allclose(bat.delta, loop.delta, atol=1e-5, rtol=0)
        assert torch.allclose(bat.anchor_sim, loop.anchor_sim, atol=1e-5)
        assert torch.allclose(bat.pairwise_sim, loop.pairwise_sim, atol=1e-5)
    assert float(loop.delta.abs().max()) > 1e-3  # it moved


def test_perturbation_respects_mask_and_clamp(encoder):
    enc, tok, ids = encoder
    mask = X.content_token_mask(ids, tok.eos_token_id, tok.bos_token_id)
    cfg = X.E2POConfig(enabled=True, num_variants=3, steps=10, lr=0.05, delta_max=0.02)
    res = X.optimize_perturbations(enc, ids, mask, cfg, generator=torch.Generator().manual_seed(1),
                                   eos_token_id=tok.eos_token_id, log_every=5)
    d = res.delta
    assert float(d.abs().max()) <= 0.02 + 1e-7
    assert float(d.abs().amax(dim=(1, 3))[~mask].max()) == 0.0  # BOS / EOS / padding never perturbed
    assert float(d.abs().amax(dim=(1, 3))[mask].min()) > 0.0
    assert res.anchor_sim.shape == (3, 2) and res.pairwise_sim.shape == (3,) and len(res.history) == 2
    assert [h["step"] for h in res.history] == [0, 5]   # catches `step % log_every == 1` (steps 1 and 6)
    # per-prompt generators: a prompt's result does not depend on its batch mates
    gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(3)]  # noqa: E731
    allp = X.optimize_perturbations(enc, ids, mask, cfg, generator=gens(), eos_token_id=tok.eos_token_id)
    one = X.optimize_perturbations(enc, ids[1:2], mask[1:2], cfg, generator=gens()[1:2], eos_token_id=tok.eos_token_id)
    diff = float((allp.delta[1] - one.delta[0]).abs().max())
    assert diff < 1e-5, diff


def test_embedding_offset_hook_is_removed(encoder):
    enc, tok, ids = encoder
    base = X.pooled_embeddings(enc, ids)
    off = torch.zeros(ids.shape[0], ids.shape[1], 32)
    off[:, 1] = 0.5
    moved = X.pooled_embeddings(enc, ids, off)
    assert not torch.allclose(base, moved)
    assert torch.equal(X.pooled_embeddings(enc, ids), base)


def test_pooled_embeddings_falls_back_to_pooler_output_then_refuses():
    from types import SimpleNamespace

    class Encoder(torch.nn.Module):
        def __init__(self, **fields):
            super().__init__()
            self.fields = fields

        def forward(self, input_ids):
            return SimpleNamespace(last_hidden_state=torch.zeros(1, 2, 3), **self.fields)

    pooled = torch.tensor([[1.0, 2.0]])
    assert torch.equal(X.pooled_embeddings(Encoder(pooler_output=pooled), torch.zeros(1, 2, dtype=torch.long)), pooled)
    # catches getattr(out, "pooler_output") without its default: an output with neither field is this TypeError,
    # not an AttributeError from inside
    with pytest.raises(TypeError, match=r"Encoder returns no pooled output \(text_embeds / pooler_output\)"):
        X.pooled_embeddings(Encoder(), torch.zeros(1, 2, dtype=torch.long))
