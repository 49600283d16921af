"""The vLLM backend's glue (prompt rendering, per-request seeds, log-prob tables) on a stand-in engine.

vLLM itself needs a GPU: the real engine runs in tests/judges/test_vllm_gpu.py. Here ``vllm`` is a stub
module whose ``SamplingParams`` and ``LLM`` enforce vLLM's own validation rules (tests/helpers/vllm_standin.py, used
whether or not vLLM is installed), so a call the real engine refuses fails here too.
"""

from __future__ import annotations

import math
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rewardkit.testing import build_tiny_tokenizer, random_images  # noqa: E402


@pytest.fixture
def judge(monkeypatch):
    from tests.helpers.vllm_standin import StrictLLM, sampling_params_class

    stub = types.ModuleType("vllm")
    stub.SamplingParams = sampling_params_class()
    monkeypatch.setitem(sys.modules, "vllm", stub)
    from rewardkit.judges.vllm_backend import VLLMJudge

    return VLLMJudge(StrictLLM(build_tiny_tokenizer(300), {"Yes": math.log(0.3), "No": math.log(0.1),
                                                            "a": math.log(0.6)}))


def conv(ims, q):
    return [{"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": q}]}]


def test_prompts_images_and_seeds(judge):
    ims = random_images(2, sizes=[(20, 10), (8, 8)])
    convs = [conv(ims, "q1"), conv(ims[1:], "q2")]
    out = judge.generate(convs, n=2, temperature=1.0, max_new_tokens=5, seed=3, stop=["\n"])
    prompts, params, _ = judge.llm.calls[-1]
    assert prompts[0]["prompt"] == judge.tokenizer.apply_chat_template(convs[0], tokenize=False, add_generation_prompt=True)
    assert prompts[0]["prompt"].count("<|image_pad|>") == 2
    assert [im.size for im in prompts[0]["multi_modal_data"]["image"]] == [(20, 10), (8, 8)]
    uuids = [p["multi_modal_uuids"]["image"] for p in prompts]  # stable content ids, one per image
    assert len(uuids[0]) == 2 and uuids[1] == uuids[0][1:] and uuids[0][0] != uuids[0][1]
    assert params[0].n == 2 and params[0].max_tokens == 5 and params[0].stop == ["\n"]
    assert params[0].seed != params[1].seed
    assert [len(o) for o in out] == [2, 2]
    alone = judge.generate(convs[1:], n=2, temperature=1.0, max_new_tokens=5, seed=3)
    assert alone[0] == out[1]  # per-request seed from the content, not the batch position


def test_choice_probs_from_logprob_table(judge):
    p = judge.choice_probs([conv([], "q")] * 2, ["Yes", "No"])
    torch.testing.assert_close(p, torch.tensor([[0.75, 0.25]] * 2))
    sp = judge.llm.calls[-1][1][0]
    yes, no = (judge.tokenizer.convert_tokens_to_ids(t) for t in ("Yes", "No"))
    assert sp.logprob_token_ids == [yes, no] and sp.logprobs == 2 and sp.temperature == 0.0
    # exact for any rank: a choice far below the top candidates keeps its real probability
    judge.llm.table = {"a": -0.01, "Yes": -12.0, "No": -13.0}
    torch.testing.assert_close(judge.choice_probs([conv([], "q")], ["Yes", "No"]),
                               torch.softmax(torch.tensor([[-12.0, -13.0]]), -1))
    judge.llm.omit = {"No"}  # a (broken) engine that reports no log-prob for "No": NaN, not a guess
    assert torch.isnan(judge.choice_probs([conv([], "q")], ["Yes", "No"])).all()
    with pytest.raises(ValueError, match="at most 20 log-probs"):
        judge.choice_probs([conv([], "q")], [str(i) for i in range(10)] + list("abcdefghijk"))
    from rewardkit.judges import ChoiceError

    with pytest.raises(ChoiceError):
        judge.choice_probs([conv([], "q")], ["Yes please", "No"])
