"""What the first real vLLM run would have hit, tested on CPU against stand-ins that enforce vLLM's rules:
greedy n > 1, sampling fields filled from generation_config, label log-probs by stripped text, special
tokens added twice, dtype aliases, duplicate choices, and one chat template for every backend."""

from __future__ import annotations

import json
import math
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("httpx")

from tests.helpers.vllm_standin import SAMPLING_EPS, StrictLLM, StrictSamplingParams, VLLMValidationError  # noqa: E402

from rewardkit.judges import ChoiceError, load_judge  # noqa: E402
from rewardkit.testing import build_tiny_tokenizer, random_images  # noqa: E402


def conv(ims, q):
    return [{"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": q}]}]


# ---------------------------------------------------------------------------------------------- stand-in
def test_the_stand_in_refuses_what_vllm_refuses():
    with pytest.raises(VLLMValidationError, match="greedy"):
        StrictSamplingParams(n=4, temperature=0.0)
    with pytest.raises(VLLMValidationError, match="top_p"):
        StrictSamplingParams(top_p=0.0)
    with pytest.raises(VLLMValidationError, match="top_k"):
        StrictSamplingParams(top_k=-2)
    with pytest.raises(TypeError, match="unexpected"):
        StrictSamplingParams(best_of=2)
    sp = StrictSamplingParams(logprobs=3, logprob_token_ids=[1, 2])
    with pytest.raises(VLLMValidationError, match="logprobs must equal"):
        sp.validate_logprobs(300)
    assert StrictSamplingParams(n=4, temperature=SAMPLING_EPS).n == 4


def test_the_stand_in_does_not_depend_on_vllm_being_installed(monkeypatch):
    """In the documented GPU setup (``[all,vllm,dev]``) ``vllm`` is importable: the stand-in must not switch to
    the real ``SamplingParams`` (whose ``verify(model_config, ...)`` the stand-in engine cannot call)."""
    from tests.helpers import vllm_standin

    real = types.ModuleType("vllm")

    class RealLike:  # the real class's shape: verify needs a ModelConfig, not a vocabulary size
        def __init__(self, **kw):
            pass

        def verify(self, model_config, speculative_config, structured_outputs_config, tokenizer):
            raise AssertionError("the real SamplingParams reached the stand-in")

    real.SamplingParams = RealLike
    monkeypatch.setitem(sys.modules, "vllm", real)
    assert vllm_standin.sampling_params_class() is StrictSamplingParams
    llm = StrictLLM(build_tiny_tokenizer(300), {"Yes": -1.0})
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate([{"prompt": "q"}], RealLike(n=1))


def test_the_stand_in_applies_vllm_0_33_rules():
    """vllm/sampling_params.py (__post_init__, _verify_num_sequences, _validate_logprobs) and the multimodal
    input checks (validate_num_items, _validate_mm_uuids), as listed in tests/helpers/vllm_standin.py."""
    # temperatures in (0, 0.01) are raised to 0.01 (_MAX_TEMP); 0 stays greedy
    assert StrictSamplingParams(temperature=0.005).temperature == 0.01
    assert StrictSamplingParams(temperature=1e-6, n=3).temperature == 0.01  # no longer greedy: n > 1 is fine
    assert StrictSamplingParams(temperature=0.0).temperature == 0.0
    with pytest.raises(VLLMValidationError, match="temperature must be in"):
        StrictSamplingParams(temperature=2.5)
    with pytest.raises(VLLMValidationError, match="at most 16384"):  # VLLM_MAX_N_SEQUENCES default
        StrictSamplingParams(n=16385, temperature=1.0)
    with pytest.raises(VLLMValidationError, match="must be an int"):
        StrictSamplingParams(n=2.0, temperature=1.0)
    assert issubclass(VLLMValidationError, ValueError)  # vllm.exceptions: the CLI maps it to exit 2

    tok = build_tiny_tokenizer(300)
    yes, no = (tok.convert_tokens_to_ids(t) for t in ("Yes", "No"))
    llm = StrictLLM(tok, {"Yes": math.log(0.3)}, max_logprobs=1, limit_mm_per_prompt={"image": 1})
    with pytest.raises(VLLMValidationError, match="greater than max allowed: 1"):  # max_logprobs
        llm.generate([{"prompt": "q"}], StrictSamplingParams(max_tokens=1, logprobs=2, logprob_token_ids=[yes, no]))
    with pytest.raises(VLLMValidationError, match="out-of-vocab"):
        llm.generate([{"prompt": "q"}], StrictSamplingParams(max_tokens=1, logprob_token_ids=[len(tok)]))
    ims = random_images(2)
    with pytest.raises(VLLMValidationError, match="At most 1 image"):  # limit_mm_per_prompt
        llm.generate([{"prompt": "q", "multi_modal_data": {"image": ims}}], StrictSamplingParams())
    with pytest.raises(ValueError, match="same length"):  # uuids: one per item
        llm.generate([{"prompt": "q", "multi_modal_data": {"image": ims[:1]},
                       "multi_modal_uuids": {"image": ["a", "b"]}}], StrictSamplingParams())
    with pytest.raises(ValueError, match="multi_modal_uuids"):  # uuids for a modality without data
        llm.generate([{"prompt": "q", "multi_modal_uuids": {"image": ["a"]}}], StrictSamplingParams())
    # every requested id is returned, whatever its rank: "No" is not in the table, it shares the rest evenly
    out = llm.generate([{"prompt": "q"}], StrictSamplingParams(max_tokens=1, logprob_token_ids=[no]))
    table = out[0].outputs[0].logprobs[0]
    assert set(table) == {yes, no}
    assert table[no].logprob == pytest.approx(math.log(0.7 / (len(tok) - 1)))


# ---------------------------------------------------------------------------------------------- offline vLLM
def test_greedy_n_gt_1_is_one_request_replicated(vllm_stub, tiny_qwen2_5_vl_dir):
    judge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}")
    ims = random_images(2, seed=1)
    out = judge.generate([conv(ims, "Describe."), conv(ims[:1], "Rate.")], n=4, temperature=0.0, max_new_tokens=5)
    assert out == [["greedy"] * 4] * 2
    _, params, _ = judge.llm.calls[-1]
    assert all(p.n == 1 and p.temperature == 0.0 for p in params)
    sampled = judge.generate([conv(ims, "Describe.")], n=3, temperature=0.7, seed=2)
    assert len(sampled[0]) == 3 and judge.llm.calls[-1][1][0].n == 3


def test_every_sampling_field_is_explicit_and_no_special_tokens_are_added(vllm_stub, tiny_qwen2_5_vl_dir):
    judge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}")
    judge.generate([conv([], "Describe.")], n=2, temperature=0.7, seed=1)
    judge.choice_probs([conv([], "Yes or No?")], ["Yes", "No"])
    for _, params, tok_kwargs in judge.llm.calls:
        assert tok_kwargs == {"add_special_tokens": False}
        p = params[0] if isinstance(params, list) else params
        assert (p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == \
            (1.0, 0, 0.0, 1.0, 0.0, 0.0)


def test_a_tokenizer_with_a_bos_gets_it_once(monkeypatch):
    """A template that writes the BOS itself, rendered for an engine whose tokenizer also adds one."""
    from transformers import PreTrainedTokenizerFast

    stub = types.ModuleType("vllm")
    stub.SamplingParams = StrictSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", stub)
    from tokenizers import processors

    from rewardkit.judges.vllm_backend import VLLMJudge

    tok = build_tiny_tokenizer(300, specials=["<s>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    inner = tok.backend_tokenizer
    bos = inner.token_to_id("<s>")
    inner.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="<|im_end|>")
    tok.chat_template = "<s>{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tok("x")["input_ids"][0] == bos  # this tokenizer adds a BOS by default
    judge = VLLMJudge(StrictLLM(tok, {"Yes": -1.0, "No": -2.0}), processor=tok)
    judge.generate([[{"role": "user", "content": "Is it good?"}]], max_new_tokens=3)
    ids = judge.llm.token_ids[-1]
    assert ids.count(bos) == 1, ids


def test_prompts_use_the_processor_template_like_the_transformers_backend(vllm_stub, tiny_qwen2_5_vl_dir):
    vjudge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}")
    tjudge = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    ims = random_images(2, sizes=[(56, 56), (40, 64)], seed=3)
    convs = [conv(ims, "Is there a cat? Yes or No."),
             [{"role": "system", "content": "You are a judge."}, *conv(ims[:1], "Score 1-5.")],
             [*conv(ims[:1], "Why?"), {"role": "assistant", "content": "Because"}]]
    vjudge.generate(convs, max_new_tokens=2)
    prompts, _, _ = vjudge.llm.calls[-1]
    assert [p["prompt"] for p in prompts] == [tjudge._render(c) for c in convs]
    # and both are the processor's own chat template (transformers' apply_chat_template: a generation prompt after
    # a user turn, the final assistant message continued), not only each other
    proc = tjudge.processor
    want = [proc.apply_chat_template(c, tokenize=False, add_generation_prompt=c[-1]["role"] != "assistant",
                                     continue_final_message=c[-1]["role"] == "assistant") for c in convs]
    assert [p["prompt"] for p in prompts] == want
    assert want[2].endswith("Because") and want[0].rstrip().endswith("assistant")


@pytest.mark.parametrize("alias,name", [("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"),
                                        ("fp32", "float32"), ("bfloat16", "bfloat16"), ("auto", "auto")])
def test_dtype_aliases_are_normalised_for_vllm(vllm_stub, tiny_qwen2_5_vl_dir, alias, name):
    load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", dtype=alias)
    assert vllm_stub.created[-1].engine_kwargs["dtype"] == name
    with pytest.raises(ValueError, match="unknown dtype"):
        load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", dtype="int8")


def test_vllm_choice_probs_refuses_duplicate_and_empty_choices(vllm_stub, tiny_qwen2_5_vl_dir):
    judge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}")
    for bad in (["Yes", "Yes"], [], ["Yes", ""]):
        with pytest.raises(ChoiceError):
            judge.choice_probs([conv([], "q")], bad)
    torch.testing.assert_close(judge.choice_probs([conv([], "q")], ["Yes", "No"]),
                               torch.softmax(torch.tensor([[-1.0, -2.0]]), -1))


# ---------------------------------------------------------------------------------------------- vllm serve
class FakeServe:
    """An OpenAI-compatible server with ``vllm serve``'s behaviours: ``/version``, ``/tokenize`` (token ids),
    request validation as ``SamplingParams`` does it (HTTP 400), omitted sampling fields filled from a
    generation_config, ``logprob_token_ids`` + ``return_tokens_as_token_ids``. ``vllm=False`` plays a plain
    OpenAI-style API that rejects unknown fields and has neither endpoint."""

    GENERATION_CONFIG = {"top_k": 1, "top_p": 0.001, "repetition_penalty": 1.05, "temperature": 0.01}
    #: what the server uses for a field the request leaves out (a server-side default, as the generation config)
    SERVER_DEFAULTS = {"skip_special_tokens": False}
    STANDARD = {"model", "messages", "n", "temperature", "top_p", "max_tokens", "stop", "seed", "logprobs",
                "top_logprobs", "presence_penalty", "frequency_penalty"}
    VOCAB = {"Yes": 11, " Yes": 12, "No": 13, " No": 14}

    def __init__(self, vllm: bool = True):
        self.vllm, self.requests, self.effective = vllm, [], []
        # the spaced variants rank higher, as they do for some tokenizers
        self.logprobs = {"Yes": math.log(0.1), " Yes": math.log(0.5), "No": math.log(0.3), " No": math.log(0.05)}
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def send(self, code, obj):
                raw = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path == "/version" and srv.vllm:
                    return self.send(200, {"version": "0.33.0"})
                self.send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    if not srv.vllm:
                        return self.send(404, {"error": "not found"})
                    return self.send(200, {"tokens": [srv.VOCAB[body["prompt"]]] if body["prompt"] in srv.VOCAB
                                           else [1, 2]})
                srv.requests.append(body)
                if not srv.vllm and set(body) - srv.STANDARD:
                    return self.send(400, {"error": f"Unrecognized request arguments: {sorted(set(body) - srv.STANDARD)}"})
                eff = {**srv.SERVER_DEFAULTS, **srv.GENERATION_CONFIG,
                       **{k: v for k, v in body.items() if v is not None}}
                if eff.get("continue_final_message") and eff.get("add_generation_prompt", True):
                    # vLLM's ChatCompletionRequest validator
                    return self.send(400, {"error": "Cannot set both `continue_final_message` and "
                                                    "`add_generation_prompt` to True."})
                srv.effective.append(eff)
                try:
                    StrictSamplingParams(n=eff.get("n", 1), temperature=eff["temperature"], top_p=eff["top_p"],
                                         top_k=eff.get("top_k", 0) if srv.vllm else 0, max_tokens=eff["max_tokens"])
                except VLLMValidationError as exc:
                    return self.send(400, {"error": str(exc)})
                ch = {"index": 0, "message": {"role": "assistant", "content": "Score: 3"}}
                if body.get("logprobs"):
                    if body.get("logprob_token_ids"):
                        inv = {v: k for k, v in srv.VOCAB.items()}
                        alts = [{"token": f"token_id:{t}", "logprob": srv.logprobs[inv[t]]}
                                for t in body["logprob_token_ids"] if inv[t] in srv.logprobs]
                    else:
                        alts = sorted(({"token": t, "logprob": lp} for t, lp in srv.logprobs.items()),
                                      key=lambda a: -a["logprob"])[:body["top_logprobs"]]
                    ch["logprobs"] = {"content": [{"token": alts[0]["token"], "logprob": alts[0]["logprob"],
                                                   "top_logprobs": alts}]}
                self.send(200, {"choices": [dict(ch, index=i) for i in range(eff.get("n", 1))]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(params=[True, False], ids=["vllm-serve", "plain-openai"])
def serve(request):
    s = FakeServe(vllm=request.param)
    yield s
    s.close()


def test_openai_backend_greedy_n_and_explicit_sampling_fields(serve):
    judge = load_judge(f"openai:{serve.url}", model="m", max_retries=0)
    assert judge.generate([conv([], "q")], n=4, temperature=0.0) == [["Score: 3"] * 4]
    assert serve.requests[-1]["n"] == 1 and serve.requests[-1]["temperature"] == 0.0
    judge.generate([conv([], "q")], n=3, temperature=0.8, seed=5)
    eff = serve.effective[-1]
    assert eff["n"] == 3 and eff["temperature"] == 0.8 and eff["top_p"] == 1.0 and eff["seed"] == 5
    if serve.vllm:  # nothing left for the server's generation_config to fill
        assert eff["top_k"] == -1 and eff["repetition_penalty"] == 1.0 and eff["min_p"] == 0.0
        assert judge.describe()["server"] == "vllm"
    else:
        assert set(serve.requests[-1]) <= FakeServe.STANDARD and judge.describe()["server"] == "openai"


def test_label_logprobs_are_exact_tokens(serve):
    judge = load_judge(f"openai:{serve.url}", model="m", max_retries=0)
    p = judge.choice_probs([conv([], "Yes or No?")], ["Yes", "No"])
    # the true P("Yes") : P("No") = 0.1 : 0.3, although " Yes" ranks first
    torch.testing.assert_close(p, torch.tensor([[0.25, 0.75]]))
    body = serve.requests[-1]
    if serve.vllm:
        assert body["logprob_token_ids"] == [11, 13] and body["return_tokens_as_token_ids"] is True
        assert body["top_logprobs"] == 2
        del serve.logprobs["No"]  # the server reports no log-prob for a choice: NaN, never a guess
        assert torch.isnan(judge.choice_probs([conv([], "Yes or No?")], ["Yes", "No"])).all()
    else:
        assert "logprob_token_ids" not in body


def test_an_engine_refusal_is_a_usage_error_for_the_cli(monkeypatch, capsys):
    """vLLM's VLLMValidationError is a ValueError: the CLI reports it and exits 2 (not 3, not a traceback)."""
    from rewardkit import cli
    from rewardkit.commands import ls

    def refuse(args):
        raise VLLMValidationError("At most 1 image(s) may be provided in one prompt.", parameter="image")

    monkeypatch.delenv("REWARDKIT_DEBUG", raising=False)
    monkeypatch.setattr(ls, "run", refuse)
    assert cli.main(["ls"]) == 2
    assert "At most 1 image(s)" in capsys.readouterr().err


def test_the_judge_meets_the_engine_limits(vllm_stub, tiny_qwen2_5_vl_dir):
    judge = load_judge(f"vllm:{tiny_qwen2_5_vl_dir}", max_images=1)
    assert judge.llm.engine_kwargs["limit_mm_per_prompt"] == {"image": 1, "video": 0}
    ims = random_images(2, seed=1)
    with pytest.raises(VLLMValidationError, match="At most 1 image"):
        judge.generate([conv(ims, "Describe.")], max_new_tokens=2)
    out = judge.generate([conv(ims[:1], "Describe.")], n=3, temperature=0.005, seed=1)
    assert len(out[0]) == 3 and judge.llm.calls[-1][1][0].temperature == 0.01  # raised, as vLLM does


# ---------------------------------------------------------------------------------------------- request rules
def test_continued_conversation_on_the_server(serve):
    """A conversation ending in an assistant message is continued on the server path too (vLLM's
    ``continue_final_message``), as the transformers and offline vLLM backends do; a server that cannot is
    refused rather than silently starting a new turn."""
    judge = load_judge(f"openai:{serve.url}", model="m", max_retries=0)
    convs = [[*conv([], "Why?"), {"role": "assistant", "content": "Because"}]]
    if serve.vllm:
        judge.generate(convs, max_new_tokens=3)
        body = serve.requests[-1]
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        judge.choice_probs(convs, ["Yes", "No"])
        assert serve.requests[-1]["continue_final_message"] is True
        judge.generate([conv([], "q")], max_new_tokens=3)  # an ordinary conversation: no template fields
        assert "continue_final_message" not in serve.requests[-1]
    else:
        with pytest.raises(ValueError, match="continue_final_message"):
            judge.generate(convs, max_new_tokens=3)


def test_server_decodes_without_special_tokens(serve):
    judge = load_judge(f"openai:{serve.url}", model="m", max_retries=0)
    judge.generate([conv([], "q")], max_new_tokens=3)
    if serve.vllm:  # explicit, not the server's default
        assert serve.requests[-1]["skip_special_tokens"] is True and serve.effective[-1]["skip_special_tokens"]
    else:
        assert "skip_special_tokens" not in serve.requests[-1]


def test_an_empty_choice_is_refused_on_every_backend(serve, vllm_stub, tiny_qwen2_5_vl_dir):
    """Without ``/tokenize`` (a plain OpenAI server) an empty choice used to read as probability 0: [[1, 0]]."""
    judges = [load_judge(f"openai:{serve.url}", model="m", max_retries=0), load_judge(f"vllm:{tiny_qwen2_5_vl_dir}"),
              load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")]
    for judge in judges:
        for bad in (["Yes", ""], [], ["Yes", "Yes"]):
            with pytest.raises(ChoiceError):
                judge.choice_probs([conv([], "q")], bad)


def test_temperature_outside_vllms_range_is_refused_everywhere(serve, vllm_stub, tiny_qwen2_5_vl_dir, tmp_path):
    """vLLM refuses temperatures above 2 (``SamplingParams._verify_args``): every backend and every judge
    reward refuses them up front, with one shared check."""
    from rewardkit.judges import check_temperature
    from rewardkit.parrot.pipeline import ParrotConfig, Pipeline, TeacherCfg
    from rewardkit.rewards.evr import EVR
    from rewardkit.rewards.rational import RationalReward

    judges = [load_judge(f"openai:{serve.url}", model="m", max_retries=0), load_judge(f"vllm:{tiny_qwen2_5_vl_dir}"),
              load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")]
    n_requests = len(serve.requests)
    for t in (2.5, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"\[0, 2\]"):
            check_temperature(t)
        for judge in judges:
            with pytest.raises(ValueError, match=r"\[0, 2\]"):
                judge.generate([conv([], "q")], n=2, temperature=t, max_new_tokens=2)
        with pytest.raises(ValueError, match="EVR temperature"):
            EVR(judge=judges[2], temperature=t)
        with pytest.raises(ValueError, match="rational temperature"):
            RationalReward(judge=judges[2], temperature=t)
        with pytest.raises(ValueError, match="teacher.temperature"):
            Pipeline(ParrotConfig(output_dir=str(tmp_path), teacher=TeacherCfg(temperature=t)))
    assert len(serve.requests) == n_requests  # refused before anything was sent
    assert check_temperature(2.0) == 2.0 and check_temperature(0) == 0.0
