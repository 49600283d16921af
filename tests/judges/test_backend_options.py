"""Documented options of the judge backends (docs/judges.md), each with a test that fails when the option is
ignored or mis-wired: signatures and defaults, vLLM prefix caching and ``logprobs``, choice-probability rows, the
OpenAI backend's API key, server kind, retries and concurrency, the transformers backend's ``max_rows`` /
``max_prefixes``."""

from __future__ import annotations

import math
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("httpx")

from rewardkit.testing import random_images  # noqa: E402
from tests.helpers.judge_servers import Server  # noqa: E402


@pytest.fixture(scope="module")
def imgs():
    return random_images(4, sizes=[(32, 32), (48, 40)], seed=11)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


# ============================================================================================== judge backends
def test_backend_signatures_and_defaults_are_the_documented_ones():
    import inspect

    from rewardkit.judges.openai_backend import OpenAIJudge
    from rewardkit.judges.transformers_backend import TransformersJudge
    from rewardkit.judges.vllm_backend import VLLMJudge

    want = {"n": 1, "temperature": 0.0, "max_new_tokens": 256, "stop": None, "seed": None}
    for cls in (TransformersJudge, VLLMJudge, OpenAIJudge):
        sig = inspect.signature(cls.generate).parameters
        assert {k: sig[k].default for k in want} == want, cls.__name__

    def defaults(fn, *names):
        sig = inspect.signature(fn).parameters
        return {k: sig[k].default for k in names}

    assert defaults(OpenAIJudge.__init__, "timeout", "max_response_bytes", "top_logprobs", "check_tokens",
                    "server") == {"timeout": 120.0, "max_response_bytes": 8 * 1024 * 1024, "top_logprobs": 20,
                                  "check_tokens": True, "server": "auto"}
    assert defaults(TransformersJudge.__init__, "packed_scoring", "trust_remote_code") == {
        "packed_scoring": False, "trust_remote_code": False}
    assert defaults(VLLMJudge.__init__, "logprobs") == {"logprobs": 20}


def test_vllm_prefix_caching_is_forced_on(vllm_stub, tiny_qwen2_5_vl_dir):
    from rewardkit.judges import load_judge

    load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", enable_prefix_caching=False)
    kw = vllm_stub.created[-1].engine_kwargs
    assert kw["enable_prefix_caching"] is True and kw["trust_remote_code"] is False


def test_choice_probs_rows_are_float32_and_sum_to_one(server):
    from rewardkit.judges import load_judge

    conv = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    server.top = [("Yes", math.log(0.5)), ("No", math.log(0.2)), ("Maybe", math.log(0.3))]
    p = load_judge(f"openai:{server.url}", model="m", api_key="k", server="openai").choice_probs([conv] * 2,
                                                                                                ["Yes", "No"])
    assert p.dtype == torch.float32 and p.shape == (2, 2)
    torch.testing.assert_close(p, torch.tensor([[5 / 7, 2 / 7]] * 2))   # renormalised over the two choices


def test_openai_api_key_from_the_environment(server, monkeypatch, imgs):
    from rewardkit.judges import load_judge

    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    conv = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    load_judge(f"openai:{server.url}", model="m", backoff=0.01).generate([conv])
    assert server.requests[-1]["auth"] == "Bearer sk-from-env"
    load_judge(f"openai:{server.url}", model="m", api_key="sk-arg", backoff=0.01).generate([conv])
    assert server.requests[-1]["auth"] == "Bearer sk-arg"       # api_key= wins over the environment


def test_openai_server_kind_forced(server):
    """`server="vllm"` asks for the choices' exact token ids; `server="openai"` matches top-logprob texts."""
    from rewardkit.judges import load_judge

    conv = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    j = load_judge(f"openai:{server.url}", model="m", api_key="k", backoff=0.01, server="vllm")
    j.choice_probs([conv], ["Yes", "No"])
    body = server.requests[-1]["body"]
    assert body.get("logprob_token_ids") == [1, 2] and body.get("return_tokens_as_token_ids") is True
    assert body.get("top_k") == -1 and body.get("min_p") == 0 and body.get("repetition_penalty") == 1
    j = load_judge(f"openai:{server.url}", model="m", api_key="k", backoff=0.01, server="openai")
    p = j.choice_probs([conv], ["Yes", "No"])
    body = server.requests[-1]["body"]
    assert "logprob_token_ids" not in body and "top_k" not in body and body["top_logprobs"] == 20
    torch.testing.assert_close(p, torch.tensor([[2 / 3, 1 / 3]]))
    # the auto mode asks GET /version: this stand-in has none, so it is treated as a generic server
    j = load_judge(f"openai:{server.url}", model="m", api_key="k", backoff=0.01)
    j.choice_probs([conv], ["Yes", "No"])
    assert "logprob_token_ids" not in server.requests[-1]["body"]


def test_openai_other_4xx_fail_at_once_but_429_and_5xx_are_retried(server):
    from rewardkit.judges import load_judge
    from rewardkit.judges.openai_backend import JudgeServerError

    conv = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    j = load_judge(f"openai:{server.url}", model="m", api_key="k", backoff=0.01, max_retries=3, server="openai")
    server.script = ["400logprobs"]
    with pytest.raises(JudgeServerError, match="logprobs"):
        j.choice_probs([conv], ["Yes", "No"])
    assert len(server.requests) == 1                      # a 400 is not retried, the server's message is kept
    server.script = ["429", "500", "500"]
    torch.testing.assert_close(j.choice_probs([conv], ["Yes", "No"]), torch.tensor([[2 / 3, 1 / 3]]))
    assert len(server.requests) == 1 + 4                  # three retried failures, then the answer


@pytest.mark.slow
def test_openai_concurrency_requests_in_flight(server):
    """`concurrency` requests in flight: 4 questions to a server that takes 1 s each."""
    from rewardkit.judges import load_judge

    server.default = "slow"
    convs = [[{"role": "user", "content": [{"type": "text", "text": f"q{i}"}]}] for i in range(4)]
    for concurrency, check in ((1, lambda t: t >= 3.9), (4, lambda t: t < 3.0)):
        j = load_judge(f"openai:{server.url}", model="m", api_key="k", concurrency=concurrency, server="openai")
        t0 = time.monotonic()
        j.choice_probs(convs, ["Yes", "No"])
        assert check(time.monotonic() - t0), (concurrency, time.monotonic() - t0)


def test_vllm_logprobs_option_must_cover_the_choices(vllm_stub, tiny_qwen2_5_vl_dir):
    from rewardkit.judges import load_judge

    conv = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    judge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", logprobs=2)
    assert vllm_stub.created[-1].engine_kwargs["max_logprobs"] >= 2
    judge.choice_probs([conv], ["Yes", "No"])
    with pytest.raises(ValueError, match="logprobs >= the number of choices"):
        judge.choice_probs([conv], ["Yes", "No", "A"])
    assert load_judge(f"vllm:{tiny_qwen2_5_vl_dir}").describe()["logprobs"] == 20   # the documented default


def test_transformers_max_rows_and_max_prefixes_do_not_change_answers(tiny_qwen2_5_vl_dir, imgs):
    """`max_rows` / `max_prefixes` bound how much is computed at once; results are the same."""
    from rewardkit.judges import load_judge

    def conv(i, q):
        return [{"role": "user", "content": [{"type": "image", "image": imgs[i]}, {"type": "text", "text": q}]}]

    convs = [conv(i % 3, f"question {j}? Yes or No.") for j, i in enumerate(range(6))]
    ref = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    small = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu", max_rows=1, max_prefixes=1)
    def batches(judge):   # the batch size of every language-model forward during one choice_probs call
        seen = []
        h = judge.model.model.language_model.register_forward_pre_hook(
            lambda m, a, k: seen.append(int((k["inputs_embeds"] if k.get("inputs_embeds") is not None
                                             else k["input_ids"]).shape[0])), with_kwargs=True)
        try:
            probs = judge.choice_probs(convs, ["Yes", "No"])
        finally:
            h.remove()
        return probs, seen

    (p_ref, b_ref), (p_small, b_small) = batches(ref), batches(small)
    torch.testing.assert_close(p_small, p_ref, rtol=1e-5, atol=1e-6)
    assert max(b_ref) > 1 and set(b_small) == {1}   # 3 prefixes / 6 rows at once by default; one at a time here
    assert small.generate(convs[:3], max_new_tokens=4) == ref.generate(convs[:3], max_new_tokens=4)
    assert small.stats["prefixes"] >= 3   # one prefix per distinct image, prefilled one at a time
    # load_judge((model, processor)): already loaded transformers objects, same answers
    from rewardkit.judges.transformers_backend import TransformersJudge

    objs = load_judge((ref.model, ref.processor))
    assert isinstance(objs, TransformersJudge) and objs.model is ref.model
    torch.testing.assert_close(objs.choice_probs(convs[:2], ["Yes", "No"]), ref.choice_probs(convs[:2], ["Yes", "No"]))
    with pytest.raises(ValueError, match="max_rows and max_prefixes"):
        load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu", max_prefixes=0)
