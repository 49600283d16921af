"""Prompt preparation of the transformers judge (rewardkit.judges._prep): the cached template rendering and the
per-piece tokenization equal the processor's own ``apply_chat_template`` and the tokenizer's own output, and a
judge's answers do not change with them."""

from __future__ import annotations

import pytest
import torch

from rewardkit.judges._prep import SegmentTokenizer, TemplateCache, lcp, positions
from rewardkit.testing import random_images


def test_lcp_hand_computed():
    assert lcp([[1, 2, 3, 4], [1, 2, 3, 4]]) == 4
    assert lcp([[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3]]) == 2
    assert lcp([[1, 2, 3], [1, 2, 3, 4, 5]]) == 3
    assert lcp([[5], [6]]) == 0
    assert lcp([[], [1]]) == 0
    long_a = list(range(1000))
    long_b = long_a[:637] + [-1] + long_a[638:]
    assert lcp([long_a, long_a, long_b]) == 637
    assert lcp([tuple(long_a), long_b]) == 637 and lcp([long_b, tuple(long_a)]) == 637  # tuples and lists mixed
    assert positions([3, 7, 3, 3, 1], 3) == [0, 2, 3] and positions([1, 2], 9) == []


@pytest.fixture(scope="module")
def qwen(tiny_qwen2_5_vl_dir):
    from rewardkit.models.vlm import load_processor

    return load_processor(str(tiny_qwen2_5_vl_dir))


def _convs(images):
    a, b = images[0], images[1]
    system = {"role": "system", "content": "You judge edits.\n  Be strict. "}
    return [
        [system, {"role": "user", "content": [{"type": "image", "image": a}, {"type": "image", "image": b},
                                              {"type": "text", "text": "Does it follow? {x} <b>"}]}],
        [system, {"role": "user", "content": [{"type": "image", "image": a}, {"type": "image", "image": b},
                                              {"type": "text", "text": "Another question\nwith lines"}]}],
        [{"role": "user", "content": "plain string content"}],
        [{"role": "user", "content": [{"image": a}, {"type": "text", "text": "no type key on the image"}]}],
        [{"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "Q?"}]},
         {"role": "assistant", "content": "Reason: because"}],  # continued answer
        [{"role": "user", "content": [{"type": "text", "text": "  "}]}],  # blank: rendered directly
    ]


def test_template_cache_equals_direct_rendering(qwen):
    from rewardkit.judges.base import continues_final_message

    def direct(conv):
        cont = continues_final_message(conv)
        return qwen.apply_chat_template(list(conv), tokenize=False, add_generation_prompt=not cont,
                                        continue_final_message=cont)

    cache = TemplateCache(direct)
    convs = _convs(random_images(2, size=32))
    for _ in range(2):  # learning the shapes, then spliced
        for conv in convs:
            assert cache.render(conv) == direct(conv)
    assert any(parts for parts in cache._parts.values())


def test_template_cache_gives_up_on_templates_that_transform_texts():
    calls = []

    def stripping(conv):  # a template that trims its texts: splicing would not reproduce it
        calls.append(1)
        return "|".join(m["role"] + ":" + (m["content"] if isinstance(m["content"], str) else
                                           "".join(c.get("text", "<img>") for c in m["content"])).strip()
                        for m in conv)

    cache = TemplateCache(stripping)
    conv = [{"role": "user", "content": "  padded  "}]
    assert cache.render(conv) == stripping(conv)
    assert cache._parts[(("user", "str"),)] is None  # the shape renders directly from now on
    assert cache.render([{"role": "user", "content": " x "}]) == "user:x"


def test_segment_tokenizer_equals_the_tokenizer(qwen):
    tok = qwen.tokenizer
    seg = SegmentTokenizer(tok)
    texts = ["<|im_start|>system\nYou judge.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
             "Does it follow?<|im_end|>\n<|im_start|>assistant\n",
             "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>"
             "héllo wörld  \t spaces<|im_end|>",
             "no specials at all, just text",
             "<|im_end|><|im_end|>",
             ""]
    want = [list(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]
    assert seg.encode(texts) == want and seg._ok is True
    assert seg.encode(texts[::-1]) == want[::-1]  # now from the piece cache
    assert "Does it follow?" in seg._cache


def test_segment_tokenizer_turns_itself_off_on_a_difference(qwen):
    seg = SegmentTokenizer(qwen.tokenizer)
    pattern, specials = seg._split
    seg._split = (pattern, {k: v + 1 for k, v in specials.items()})  # a wrong table: caught on the first call
    texts = ["<|im_start|>user\nhi<|im_end|>"]
    want = [list(x) for x in qwen.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert seg.encode(texts) == want and seg._ok is False
    assert seg.encode(texts) == want


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_judge_answers_unchanged_by_the_prompt_caches(kind, request):
    """Greedy hypotheses and Yes/No probabilities are identical with the caches and with direct rendering +
    whole-prompt tokenization (EVR's own conversations)."""
    from rewardkit.judges.transformers_backend import TransformersJudge
    from rewardkit.rewards.evr import DIMENSIONS, EVR

    d = request.getfixturevalue(f"tiny_{kind}_dir")
    judge = TransformersJudge(str(d), device="cpu")
    evr = EVR(judge=judge, k=2, temperature=0.0, max_new_tokens=4)
    cands = random_images(2, sizes=[(56, 56), (48, 56)], seed=1)
    refs = random_images(2, sizes=[(56, 56), (40, 40)], seed=2)
    instr = "Place the object from reference image 1 on the table in reference image 2."
    evals = [evr._eval_conv(instr, refs, c, {}, dim) for c in cands for dim in DIMENSIONS[:2]]
    verify = [evr._verify_conv(instr, refs, c, {}, dim, 3.0, "The object is on the table.")
              for c in cands for dim in DIMENSIONS[:2]]

    def run():
        with judge.session():
            h = judge.generate(evals, n=2, max_new_tokens=4)
            p = judge.choice_probs(verify, ["Yes", "No"])
        return h, p

    fast_h, fast_p = run()
    assert judge._segments._ok is True and any(judge._templates._parts.values())
    judge._templates.render = judge._render  # direct rendering, whole-prompt tokenization
    judge._segments._ok = False
    slow_h, slow_p = run()
    assert fast_h == slow_h
    assert torch.equal(fast_p, slow_p)
