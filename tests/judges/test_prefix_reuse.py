"""Session prefix cache of the transformers judge: a later call reuses the KV of an earlier call's prefix
(sliced to the shared part) and its answers equal the same call without any cache."""

from __future__ import annotations

import pytest
import torch

from rewardkit.judges.transformers_backend import TransformersJudge
from rewardkit.testing import random_images


def conv(sys, imgs, text):
    return [{"role": "system", "content": sys},
            {"role": "user", "content": [{"type": "image", "image": im} for im in imgs] + [{"type": "text", "text": text}]}]


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_prefix_reused_across_calls_equals_fresh(kind):
    from rewardkit import testing

    model, proc = testing.TINY_KINDS[kind]()
    src, a, b, c = random_images(4, sizes=[(56, 56), (48, 40), (40, 56), (64, 48)], seed=3)
    sys = "You are a strict judge of images."
    first = [conv(sys, [src, a, b], "Compare image A and image B for a cat. Which is better?"),
             conv(sys, [src, c, b], "Compare image A and image B for a cat. Which is better?")]
    # PARROT-like: the projection shows the source and one candidate; EVR-like: same images, new question
    second = [conv(sys, [src, a], "Score this image alone for a cat. Is it good?"),
              conv(sys, [src, a, b], "Is the claim about image B supported? Yes or No."),
              conv(sys, [src, c, b], "Is the claim about image B supported? Yes or No."),
              conv("Another system prompt entirely.", [src, a], "Yes or No?")]
    fresh = TransformersJudge(model, proc, prefix_cache_mb=0)
    want_gen = fresh.generate(second, max_new_tokens=6)
    want_p = fresh.choice_probs(second, ["Yes", "No"])
    judge = TransformersJudge(model, proc)
    with judge.session():
        judge.generate(first, max_new_tokens=4)
        judge.stats.clear()
        got_gen = judge.generate(second, max_new_tokens=6)
        reused = judge.stats["prefix_reused_tokens"]
        got_p = judge.choice_probs(second, ["Yes", "No"])
        hits = judge.stats["prefix_hits"]
    assert got_gen == want_gen
    assert torch.allclose(got_p, want_p, atol=1e-5)
    assert reused > 0 and hits >= 3  # the second call's own prefixes are exact hits for choice_probs
    # outside a session nothing is kept
    judge.stats.clear()
    judge.generate(second[:1], max_new_tokens=2)
    assert judge.stats["prefix_reused_tokens"] == 0 and judge.stats["prefix_hits"] == 0


def test_prefix_cache_memory_budget():
    from rewardkit import testing

    model, proc = testing.tiny_qwen2_5_vl()
    judge = TransformersJudge(model, proc, prefix_cache_mb=0.02)  # ~20 KiB: about 4 tiny prefixes (~4.7 KiB each)
    ims = random_images(6, seed=5)
    with judge.session():
        for im in ims:
            judge.choice_probs([conv("sys", [im], "Yes or No?")], ["Yes", "No"])
            assert judge._cached_bytes <= judge.prefix_cache_bytes
        assert 0 < len(judge._session_prefixes) < 6
    assert judge._session_prefixes is None
