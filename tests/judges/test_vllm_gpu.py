"""vLLM judge backend on a tiny checkpoint saved by rewardkit.testing (needs CUDA and vllm; skipped otherwise).

The checkpoint is ``save_tiny_vllm_checkpoint``: head size 64, float16 weights, so every vLLM attention backend
accepts it (the CPU fixtures' fp32 head-size-16 model would leave only FlexAttention). The transformers
reference runs the same float16 weights in float32 on the CPU.

Run on a GPU machine: ``python -m pytest tests/judges/test_vllm_gpu.py -q``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
from vllm_smoke import greedy_match  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def tiny_qwen2_5_vl_dir(tmp_path_factory):
    """Shadows the conftest fixture of the same name in this module: the GPU-ready tiny checkpoint."""
    from rewardkit.testing import save_tiny_vllm_checkpoint

    return save_tiny_vllm_checkpoint(tmp_path_factory.mktemp("tiny-vllm") / "qwen2_5_vl", dtype="float16")


@pytest.fixture(scope="module")
def vllm_judge(tiny_qwen2_5_vl_dir):
    pytest.importorskip("vllm")
    from rewardkit.judges import load_judge

    # tiny vocab / context: keep the engine small; eager mode avoids minutes of graph capture
    return load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", gpu_memory_utilization=0.2, max_model_len=2048,
                      enforce_eager=True, dtype="float16", seed=0)


def reference(tiny_qwen2_5_vl_dir):
    from rewardkit.judges import load_judge

    return load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu", dtype="float32")


def conv(ims, q):
    return [{"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": q}]}]


def test_vllm_choice_probs_match_transformers(vllm_judge, tiny_qwen2_5_vl_dir):
    from rewardkit.testing import random_images

    ims = random_images(3, sizes=[(56, 56), (40, 64), (64, 32)], seed=3)
    convs = [conv(ims[:2], "Is there a cat? Yes or No."), conv(ims[2:], "Yes or No?"), conv(ims[:2], "Dog?")]
    p = vllm_judge.choice_probs(convs, ["Yes", "No"])
    assert p.shape == (3, 2)
    torch.testing.assert_close(p.sum(-1), torch.ones(3))
    ref = reference(tiny_qwen2_5_vl_dir).choice_probs(convs, ["Yes", "No"])
    torch.testing.assert_close(p, ref, atol=5e-3, rtol=0)  # float16 engine vs float32 reference


def test_vllm_raw_choice_probs_match_transformers(vllm_judge, tiny_qwen2_5_vl_dir):
    """Full-vocabulary P(label) (VQAScore's default) agrees with the transformers backend's exact softmax."""
    from rewardkit.testing import random_images

    ims = random_images(2, sizes=[(56, 56), (40, 64)], seed=6)
    convs = [conv(ims[:1], 'Does this figure show "a cat"? Please answer Yes or No.'), conv(ims[1:], "Yes or No?")]
    reasons: list = []
    p = vllm_judge.raw_choice_probs(convs, ["Yes", "No"], reasons=reasons)
    assert reasons == [None, None] and p.shape == (2, 2) and (p.sum(-1) < 1).all()
    ref = reference(tiny_qwen2_5_vl_dir).raw_choice_probs(convs, ["Yes", "No"])
    torch.testing.assert_close(p, ref, rtol=1e-2, atol=1e-6)  # float16 engine vs float32 reference


def test_vllm_generate_n_samples_greedy_and_seeded(vllm_judge, tiny_qwen2_5_vl_dir):
    from rewardkit.testing import random_images

    ims = random_images(2, seed=4)
    convs = [conv(ims, "Describe."), conv(ims[:1], "Rate 1 2 3 4 5.")]
    greedy = vllm_judge.generate(convs, n=2, max_new_tokens=6)  # greedy n > 1: one request, replicated
    assert [len(g) for g in greedy] == [2, 2] and greedy[0][0] == greedy[0][1]
    # Compare token ids, not text: vLLM's incremental detokeniser may flush a tiny tokenizer differently.
    tj = reference(tiny_qwen2_5_vl_dir)
    outs = vllm_judge.llm.generate([p for p, _ in vllm_judge._prompts(convs)],
                                   vllm_judge._sampling(n=1, temperature=0.0, max_tokens=6), use_tqdm=False,
                                   tokenization_kwargs={"add_special_tokens": False})
    for cv, out in zip(convs, outs):
        # the reference input: the processor's own chat template and the conversation's images read here (not
        # the backends' shared _render / conversation_images)
        text = tj.processor.apply_chat_template(cv, tokenize=False, add_generation_prompt=True)
        cv_ims = [item["image"] for msg in cv for item in msg["content"] if item.get("type") == "image"]
        inputs = tj.processor(text=[text], images=cv_ims or None, return_tensors="pt")
        gen = tj.model.generate(**inputs, max_new_tokens=6, do_sample=False, output_scores=True,
                                return_dict_in_generate=True)
        ref = gen.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        margins = [float(s[0].float().topk(2).values[0] - s[0].float().topk(2).values[1]) for s in gen.scores]
        ok, why = greedy_match(list(out.outputs[0].token_ids), ref, margins, 0.05)  # fp16 may break near-ties
        assert ok, why
    a = vllm_judge.generate(convs, n=3, temperature=1.0, max_new_tokens=6, seed=1)
    b = vllm_judge.generate(convs[1:], n=3, temperature=1.0, max_new_tokens=6, seed=1)
    assert a[1] == b[0]  # per-request seeds: a conversation's samples do not depend on the batch


def test_evr_on_vllm(vllm_judge):
    from rewardkit.rewards.evr import EVR
    from rewardkit.testing import random_images

    ims = random_images(3, seed=5)
    reward = EVR(judge=vllm_judge, k=2, max_new_tokens=8, max_retries=0)
    out = reward(ims[:1], "edit", sources=[ims[1:]])
    assert len(out) == 1 and (out.valid.all() or out.errors[0])
