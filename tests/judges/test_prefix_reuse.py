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


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_candidates_share_their_stem_and_answers_equal_the_full_forward(kind):
    """Edits of one source with shared references: the system message and reference images are prefilled once
    for every candidate, each candidate's own image and text run as a continuation with image tokens, and the
    answers are transformers' own forward / generate on the processor's inputs (Qwen3-VL: deepstack too)."""
    from rewardkit import testing

    model, proc = testing.TINY_KINDS[kind]()
    ref1, ref2, a, b, c = random_images(5, sizes=[(56, 56), (40, 56), (48, 40), (64, 48), (56, 56)], seed=7)
    sys = "You are a meticulous evaluator of image edits. " * 4  # a long shared system message
    qs = ["Is the object placed well? Yes or No.", "Does the lighting match? Answer Yes or No."]
    convs = [conv(sys, [ref1, ref2, cand], q) for cand in (a, b, c) for q in qs]
    judge = TransformersJudge(model, proc)
    with torch.inference_mode(), judge.session():
        cs, feats = judge._prepare(convs)
        prefixes, _, _ = judge._plan(cs)
        stem = judge._shared_stem(prefixes, feats)
    assert stem is not None and len(prefixes) == 3 and stem[1] == [cs[0].images[0], cs[0].images[1]]
    n = len(stem[0])
    assert all(p[:n] == stem[0] for p, _ in prefixes) and all(len(p) > n for p, _ in prefixes)

    no_cache = TransformersJudge(model, proc, prefix_cache_mb=0)  # no session cache: every prefix prefilled
    with judge.session():
        judge.stats.clear()
        got_p = judge.choice_probs(convs, ["Yes", "No"])
        assert judge.stats["prefix_reused_tokens"] == 2 * n  # the stem prefilled once instead of three times
        got_gen = judge.generate(convs, max_new_tokens=6)
        # a later call of the session with other candidates finds the stem kept: not prefilled again
        d, e = random_images(2, sizes=[(40, 40), (56, 48)], seed=8)
        later = [conv(sys, [ref1, ref2, cand], qs[0]) for cand in (d, e)]
        judge.stats.clear()
        got_later = judge.choice_probs(later, ["Yes", "No"])
        assert judge.stats["prefix_hits"] == 1 and judge.stats["prefix_reused_tokens"] == 2 * n
    torch.testing.assert_close(got_later, no_cache.choice_probs(later, ["Yes", "No"]), rtol=1e-5, atol=1e-6)
    no_cache.stats.clear()
    want_p = no_cache.choice_probs(convs, ["Yes", "No"])
    assert judge.stats["prefill_tokens"] > 0 and no_cache.stats["prefill_tokens"] - 2 * n > 0
    torch.testing.assert_close(got_p, want_p, rtol=1e-5, atol=1e-6)
    ids = judge.choice_token_ids(["Yes", "No"])
    for cv, p, texts in zip(convs, got_p, got_gen):
        text = proc.apply_chat_template(cv, tokenize=False, add_generation_prompt=True)
        ims = [item["image"] for item in cv[1]["content"] if item.get("type") == "image"]
        inp = proc(text=[text], images=ims, return_tensors="pt")
        with torch.inference_mode():
            logits = model(**inp).logits[0, -1].float()
            g = model.generate(**inp, max_new_tokens=6, do_sample=False)
        assert torch.allclose(p, torch.softmax(logits[ids], -1), atol=1e-5)
        assert texts == [proc.tokenizer.decode(g[0, inp["input_ids"].shape[1]:], skip_special_tokens=True)]


def test_no_stem_across_different_images_with_the_same_token_count():
    """Two prefixes whose first images differ in pixels but not in size have equal token ids through that image:
    the stem stops before it (same ids, other pixels), here leaving the system message alone."""
    from rewardkit import testing

    model, proc = testing.tiny_qwen2_5_vl()
    a, b, ref = random_images(3, sizes=[(56, 56), (56, 56), (40, 40)], seed=9)
    sys = "A long shared system message for a judge of images. " * 3
    convs = [conv(sys, [a, ref], "Yes or No?"), conv(sys, [b, ref], "Yes or No?")]
    judge = TransformersJudge(model, proc)
    with torch.inference_mode(), judge.session():
        cs, feats = judge._prepare(convs)
        prefixes, _, _ = judge._plan(cs)
        assert cs[0].images[0] != cs[1].images[0]
        first_image = cs[0].ids.index(judge.image_token_id)
        assert cs[0].ids[:cs[0].image_end] == cs[1].ids[:cs[1].image_end]  # the ids cannot tell them apart
        stem = judge._shared_stem(prefixes, feats)
        assert stem is not None and stem[1] == [] and len(stem[0]) == first_image
        got = judge.choice_probs(convs, ["Yes", "No"])
    want = TransformersJudge(model, proc, prefix_cache_mb=0).choice_probs(convs, ["Yes", "No"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got[0], got[1])
