"""Full-vocabulary choice probabilities (``raw_choice_probs``) on every backend, and VQAScore's use of them.

- transformers: P(Yes) equals the softmax over the whole vocabulary of a plain forward's last logits, computed
  here independently (float64), with prefix reuse and one vision encode per image kept;
- vLLM: exp of the exact log-probabilities the engine reports (stand-in engine here; the real one in
  tests/judges/test_vllm_gpu.py);
- OpenAI-compatible servers: strict reading of ``top_logprobs`` (a label outside the top-k is NaN + reason,
  never 0), hand-written malformed responses, and a fake server on 127.0.0.1.
"""

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

from rewardkit.judges import JudgeBackend  # noqa: E402
from rewardkit.judges.policy import JUDGE_FAILURE_PREFIX  # noqa: E402
from rewardkit.testing import build_tiny_tokenizer, random_images  # noqa: E402


def conv(ims, q):
    return [{"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": q}]}]


# ------------------------------------------------------------------------------------------ transformers
@pytest.fixture(scope="module")
def tjudge(tiny_qwen2_5_vl_dir):
    from rewardkit.judges import load_judge

    return load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")


def plain_p_yes(judge, c, label="Yes"):
    """softmax(last-position logits of one plain forward, over the whole vocabulary)[label], in float64.

    Nothing of the judge's own input path: the text is the processor's chat template with the generation prompt
    (as linzhiqiu/t2v_metrics @6ecb74f renders the question, ``t2v_metrics/models/vqascore_models/qwen2vl_model.py``
    lines 198-199: ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``), the images are
    read from the conversation here, and the forward is the transformers model's plain ``__call__`` on the
    processor's tensors."""
    ims = [item["image"] for msg in c for item in msg["content"] if item.get("type") == "image"]
    text = judge.processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
    inputs = judge.processor(text=[text], images=ims or None, return_tensors="pt")
    with torch.no_grad():
        logits = judge.model(**inputs).logits[0, -1].double()
    tid = judge.tokenizer.encode(label, add_special_tokens=False)
    assert len(tid) == 1
    z = logits - logits.max()
    return float(torch.exp(z[tid[0]]) / torch.exp(z).sum())


@pytest.mark.parametrize("packed", [False, True])
def test_transformers_raw_probs_are_the_full_vocab_softmax(tjudge, packed):
    ims = random_images(2, sizes=[(56, 56), (40, 64)], seed=11)
    convs = [conv(ims[:1], 'Does this figure show "a red cat"? Please answer Yes or No.'),
             conv(ims[:1], 'Does this figure show "a dog"? Please answer Yes or No.'),   # same image: prefix reuse
             conv(ims[1:], 'Does this figure show "a red cat"? Please answer Yes or No.')]
    want = torch.tensor([[plain_p_yes(tjudge, c, "Yes"), plain_p_yes(tjudge, c, "No")] for c in convs],
                        dtype=torch.float64)
    tjudge.packed_scoring = packed
    try:
        tjudge.stats.clear()
        with tjudge.session():
            reasons: list = []
            raw = tjudge.raw_choice_probs(convs, ["Yes", "No"], reasons=reasons)
            renorm = tjudge.choice_probs(convs, ["Yes", "No"])
        assert tjudge.stats["images_encoded"] == 2  # one encode per distinct image across both calls
    finally:
        tjudge.packed_scoring = False
    assert raw.dtype == torch.float32 and raw.shape == (3, 2) and reasons == [None] * 3
    torch.testing.assert_close(raw.double(), want, rtol=2e-4, atol=1e-7)
    assert (raw.sum(-1) < 1).all()  # a tiny random model spreads its mass over the vocabulary: not renormalised
    torch.testing.assert_close(renorm, raw / raw.sum(-1, keepdim=True), rtol=1e-4, atol=1e-6)
    # one label alone is the same number (nothing renormalised)
    torch.testing.assert_close(tjudge.raw_choice_probs(convs, ["Yes"])[:, 0], raw[:, 0])


def test_transformers_raw_probs_refuse_multi_token_labels(tjudge):
    from rewardkit.judges import ChoiceError

    with pytest.raises(ChoiceError):
        tjudge.raw_choice_probs([conv([], "q")], ["Yes please"])


def test_vqascore_full_and_yes_no(tiny_qwen2_5_vl_dir, tjudge):
    from rewardkit import load_reward

    ims = random_images(2, sizes=[(48, 48), (64, 40)], seed=12)
    full = load_reward("vqascore", judge=tjudge)
    assert full.config.probability == "full"
    out = full(ims, ["a red cat", "a blue car"])
    q = 'Does this figure show "{}"? Please answer Yes or No.'
    want = [plain_p_yes(tjudge, conv([im], q.format(p))) for im, p in zip(ims, ["a red cat", "a blue car"])]
    assert out.valid.all() and out.info["probability"] == "full"
    torch.testing.assert_close(out.scores.double(), torch.tensor(want, dtype=torch.float64), rtol=2e-4, atol=1e-7)
    yn = load_reward("vqascore", judge=tjudge, probability="yes_no")(ims, ["a red cat", "a blue car"])
    want_yn = [w / (w + plain_p_yes(tjudge, conv([im], q.format(p)), "No"))
               for w, im, p in zip(want, ims, ["a red cat", "a blue car"])]
    torch.testing.assert_close(yn.scores.double(), torch.tensor(want_yn, dtype=torch.float64), rtol=2e-4, atol=1e-6)
    assert (yn.scores > out.scores).all()  # renormalising can only raise P(Yes)
    with pytest.raises(ValueError, match="probability"):
        load_reward("vqascore", judge=tjudge, probability="softmax")


def test_vqascore_full_on_a_backend_without_raw_probs():
    from rewardkit import load_reward
    from rewardkit.judges import JudgeBackend

    class Renormalised(JudgeBackend):
        kind = "custom"

        def generate(self, conversations, **kw):
            return [[""] for _ in conversations]

        def choice_probs(self, conversations, choices):
            return torch.tensor([[0.8, 0.2]] * len(conversations))

    ims = random_images(1, seed=1)
    with pytest.raises(NotImplementedError, match="probability='yes_no'"):
        load_reward("vqascore", judge=Renormalised())(ims, "a cat")
    out = load_reward("vqascore", judge=Renormalised(), probability="yes_no")(ims, "a cat")
    assert float(out.scores[0]) == pytest.approx(0.8)


class FixedRaw:
    """A backend double returning fixed raw probabilities and reasons (checks the reward's NaN-safety)."""

    kind = "double"

    def __init__(self, values, reasons=None):
        self.values, self.reasons = values, reasons

    def raw_choice_probs(self, conversations, choices, *, reasons=None):
        if reasons is not None and self.reasons is not None:
            reasons[:] = self.reasons
        return torch.tensor(self.values, dtype=torch.float32).reshape(-1, 1)

    def session(self):
        import contextlib

        return contextlib.nullcontext(self)

    def describe(self):
        return {"kind": "double"}


@pytest.mark.parametrize("value, ok", [(0.3, True), (0.0, True), (1.0, True), (float("nan"), False),
                                       (float("inf"), False), (-0.01, False), (1.5, False)])
def test_vqascore_full_is_nan_safe(value, ok):
    from rewardkit.judges import JudgeBackend
    from rewardkit.rewards.vqascore import VQAScore

    JudgeBackend.register(FixedRaw)
    r = VQAScore(judge=FixedRaw([value], [None if ok else "backend says why"]))
    out = r(random_images(1, seed=2), "a cat", on_error="nan")
    if ok:
        assert bool(out.valid[0]) and float(out.scores[0]) == pytest.approx(value)
    else:
        assert not bool(out.valid[0]) and math.isnan(float(out.scores[0]))
        assert out.errors[0] == "backend says why"


# ------------------------------------------------------------------------------------------ vLLM (stand-in)
@pytest.fixture
def vjudge(monkeypatch):
    from tests.helpers.vllm_standin import StrictLLM, sampling_params_class

    stub = types.ModuleType("vllm")
    stub.SamplingParams = sampling_params_class()
    monkeypatch.setitem(sys.modules, "vllm", stub)
    from rewardkit.judges.vllm_backend import VLLMJudge

    return VLLMJudge(StrictLLM(build_tiny_tokenizer(300), {"Yes": math.log(0.3), "No": math.log(0.1),
                                                            "a": math.log(0.6)}))


def test_vllm_raw_probs_are_the_engine_logprobs(vjudge):
    reasons: list = []
    p = vjudge.raw_choice_probs([conv([], "q")] * 2, ["Yes", "No"], reasons=reasons)
    torch.testing.assert_close(p, torch.tensor([[0.3, 0.1]] * 2))
    assert reasons == [None, None]
    sp = vjudge.llm.calls[-1][1][0]
    assert sp.logprob_token_ids == [vjudge.tokenizer.convert_tokens_to_ids(t) for t in ("Yes", "No")]
    vjudge.llm.table = {"a": -0.01, "Yes": -12.0, "No": -13.0}  # far below the top token: still exact
    torch.testing.assert_close(vjudge.raw_choice_probs([conv([], "q")], ["Yes"]),
                               torch.tensor([[math.exp(-12.0)]]))
    vjudge.llm.table, vjudge.llm.omit = {"a": -0.1, "Yes": -1.0}, {"No"}  # "No" not reported
    p = vjudge.raw_choice_probs([conv([], "q")], ["Yes", "No"], reasons=reasons)
    assert torch.isnan(p).all() and "no log-probability" in reasons[0]
    vjudge.llm.omit = set()
    vjudge.llm.table = {"a": -0.1, "Yes": float("nan"), "No": -1.0}
    p = vjudge.raw_choice_probs([conv([], "q")], ["Yes", "No"], reasons=reasons)
    assert torch.isnan(p).all() and "unusable" in reasons[0]
    vjudge.llm.table = {"a": -0.1, "Yes": 0.5, "No": -1.0}  # positive: off-scale
    assert torch.isnan(vjudge.raw_choice_probs([conv([], "q")], ["Yes", "No"])).all()


def test_vllm_raw_probs_refuse_processed_logprobs(monkeypatch):
    from tests.helpers.vllm_standin import StrictLLM, sampling_params_class

    stub = types.ModuleType("vllm")
    stub.SamplingParams = sampling_params_class()
    monkeypatch.setitem(sys.modules, "vllm", stub)
    from rewardkit.judges.vllm_backend import VLLMJudge

    llm = StrictLLM(build_tiny_tokenizer(300), {"Yes": -1.0, "No": -2.0})
    llm.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(logprobs_mode="processed_logprobs"))
    with pytest.raises(ValueError, match="raw_logprobs"):
        VLLMJudge(llm).raw_choice_probs([conv([], "q")], ["Yes"])


# ------------------------------------------------------------------------------------------ OpenAI: parser
def response(top, token_key="token"):
    return {"choices": [{"message": {"content": "Yes"},
                         "logprobs": {"content": [{"token": "Yes", "logprob": -0.1,
                                                   "top_logprobs": [{token_key: t, "logprob": v} for t, v in top]}]}}]}


def test_read_raw_logprobs_well_formed():
    from rewardkit.judges.openai_backend import read_raw_logprobs

    row, why = read_raw_logprobs(response([("Yes", math.log(0.7)), ("No", math.log(0.2)), (" Yes", -5.0)]),
                                 ["Yes", "No"])
    assert why is None and row == pytest.approx([math.log(0.7), math.log(0.2)])
    # exact ids (vLLM server): keyed by id, a -inf value is an exact 0
    row, why = read_raw_logprobs(response([("token_id:7", -0.01), ("token_id:3", -math.inf)]), ["Yes"],
                                 token_ids=[3])
    assert why is None and row == [-math.inf]


MALFORMED = {  # name -> (response, what the reason must mention)
    "no choices": ({"choices": []}, "no choices"),
    "not a dict": (["Yes"], "no choices"),
    "no logprobs": ({"choices": [{"message": {"content": "Yes"}}]}, "no log-probabilities"),
    "empty content": ({"choices": [{"logprobs": {"content": []}}]}, "no log-probabilities"),
    "content not a list": ({"choices": [{"logprobs": {"content": {"token": "Yes"}}}]}, "not a list"),
    "no top list": ({"choices": [{"logprobs": {"content": [{"token": "Yes", "logprob": -0.1}]}}]}, "top_logprobs"),
    "top not a list": ({"choices": [{"logprobs": {"content": [{"token": "Yes", "top_logprobs": "Yes"}]}}]},
                       "top_logprobs"),
    "token not a string": (response([(1, -0.1)]), "string token"),
    "no token key": (response([("Yes", -0.1)], token_key="text"), "string token"),
    "logprob a string": (response([("Yes", "-0.1")]), "not a number"),
    "logprob a bool": (response([("Yes", True)]), "not a number"),
    "logprob null": (response([("Yes", None)]), "not a number"),
    "logprob NaN": (response([("Yes", math.nan), ("No", -1.0)]), "off-scale"),
    "logprob positive": (response([("Yes", 0.5), ("No", -1.0)]), "off-scale"),
    "logprob +inf": (response([("Yes", math.inf)]), "off-scale"),
    "listed twice": (response([("Yes", -0.2), ("No", -3.0), ("Yes", -0.9)]), "twice"),
    "sums above 1": (response([("Yes", math.log(0.8)), ("No", math.log(0.5))]), "sum"),
    "listed -inf": (response([("No", -0.1), ("Yes", -math.inf)]), "-inf"),
    "label outside top-k": (response([("No", -0.1), ("Maybe", -2.5)]), "not among the server's top 2"),
    "exact id missing": (response([("token_id:7", -0.1)]), "no log-probability"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_read_raw_logprobs_refuses(case):
    from rewardkit.judges.openai_backend import read_raw_logprobs

    data, must = MALFORMED[case]
    row, why = read_raw_logprobs(data, ["Yes"], token_ids=[3] if case == "exact id missing" else None)
    assert row is None and must in why, (case, why)


# ------------------------------------------------------------------------------------------ OpenAI: server
class RawServer:
    """Answers every chat completion with ``self.top`` as the first token's ``top_logprobs``."""

    def __init__(self):
        self.top: list = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.last = body
                data = response(server.top) if body.get("logprobs") else {"choices": [{"message": {"content": "x"}}]}
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture(scope="module")
def raw_server():
    pytest.importorskip("httpx")
    s = RawServer()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def openai_judge(server):
    from rewardkit.judges.openai_backend import OpenAIJudge

    return OpenAIJudge(server.url, model="fake", api_key="", timeout=2.0, max_retries=0, check_tokens=False,
                       server="openai", top_logprobs=3)


def test_openai_raw_probs_through_a_server(raw_server):
    from rewardkit import load_reward

    j = openai_judge(raw_server)
    ims = random_images(2, seed=3)
    raw_server.top = [("Yes", math.log(0.6)), ("No", math.log(0.3)), ("yes", math.log(0.05))]
    reasons: list = []
    p = j.raw_choice_probs([conv(ims[:1], "q"), conv(ims[1:], "q")], ["Yes", "No"], reasons=reasons)
    torch.testing.assert_close(p, torch.tensor([[0.6, 0.3]] * 2))
    assert reasons == [None, None] and raw_server.last["top_logprobs"] == 3 and raw_server.last["max_tokens"] == 1
    out = load_reward("vqascore", judge=j)(ims, "a cat")
    torch.testing.assert_close(out.scores, torch.tensor([0.6, 0.6]))
    yn = load_reward("vqascore", judge=j, probability="yes_no")(ims, "a cat")
    torch.testing.assert_close(yn.scores, torch.tensor([2 / 3, 2 / 3]))


def test_openai_label_outside_top_k_is_nan_with_reason(raw_server):
    from rewardkit import load_reward

    j = openai_judge(raw_server)
    raw_server.top = [("No", math.log(0.9)), ("The", math.log(0.05)), ("no", math.log(0.01))]
    out = load_reward("vqascore", judge=j)(random_images(2, seed=4), "a cat", on_error="nan")
    assert not out.valid.any() and torch.isnan(out.scores).all()
    assert "['Yes'] not among the server's top 3" in out.errors[0] and "below 0.01" in out.errors[0]
    # the renormalised form keeps its documented bound: "Yes" absent means P(Yes | Yes or No) = 0
    yn = load_reward("vqascore", judge=j, probability="yes_no")(random_images(1, seed=4), "a cat")
    assert float(yn.scores[0]) == 0.0


@pytest.mark.parametrize("top", [[("Yes", "high"), ("No", -1.0)], [("Yes", -0.2), ("Yes", -0.4)],
                                 [("Yes", 0.3)], [("Yes", math.log(0.9)), ("No", math.log(0.9))]])
def test_openai_malformed_logprobs_are_nan_with_reason(raw_server, top):
    from rewardkit import load_reward

    raw_server.top = top
    out = load_reward("vqascore", judge=openai_judge(raw_server))(random_images(1, seed=5), "a cat", on_error="nan")
    assert not bool(out.valid[0]) and math.isnan(float(out.scores[0]))
    assert out.errors[0].startswith(raw_server.url), out.errors[0]


# ------------------------------------------------------------------------------------------ the misbehaving server
VQA_CASES = {  # case -> (server mode or script, reason must mention (full), reason must mention (yes_no))
    "ok": ("ok", None, None),
    "no_logprobs": ("nologprobs", "no log-probabilities", "log-prob"),
    "labels_missing": ("labels_missing", "not among the server's top 2", "no usable"),
    "neg_inf_logprobs": ("neginf", "-inf", "no usable"),
    "nan_logprobs": ("nanlp", "off-scale", "no usable"),
    "off_scale": ("offscale", "off-scale", "no usable"),
    "malformed_json": ("malformed", "judge call failed", "judge call failed"),
    "500_then_ok": (["500"], None, None),
    "slow_drip": ("drip", "Timeout", "Timeout"),
    "huge_body": ("huge_nolength", "max_response_bytes", "max_response_bytes"),
}


@pytest.fixture(scope="module")
def misbehaving():
    pytest.importorskip("httpx")
    from tests.helpers.judge_servers import FakeServer

    s = FakeServer()
    yield s
    s.close()


@pytest.mark.parametrize("probability", ["full", "yes_no"])
@pytest.mark.parametrize("case", sorted(VQA_CASES))
def test_vqascore_through_the_misbehaving_server(misbehaving, case, probability, monkeypatch):
    """Every case ends in the judge's own P(Yes) (0.1: the question holds "NOPE") or NaN + a reason, never a
    finite score the judge did not give; a failing request is NaN with on_error="nan" (judge policy "auto")."""
    import time

    from rewardkit import load_reward
    from rewardkit.judges.openai_backend import OpenAIJudge

    mode, must_full, must_yn = VQA_CASES[case]
    misbehaving.mode, misbehaving.script, misbehaving.poison = "ok", [], None
    # slow_drip: a 0.1 s deadline, a fifth of the drip's 0.5 s between bytes (each attempt waits it out)
    j = OpenAIJudge(misbehaving.url, model="fake", api_key="", timeout=0.1 if case == "slow_drip" else 1.0,
                    max_retries=1, backoff=0.01, concurrency=4, check_tokens=False, max_response_bytes=256 * 1024,
                    server="openai")
    r = load_reward("vqascore", judge=j, probability=probability)
    if isinstance(mode, list):
        misbehaving.script = list(mode)
    else:
        misbehaving.mode = mode
    from rewardkit.judges import openai_backend

    waits: list[float] = []   # the backoff waits, recorded (not slept): each bounded by the 0.01 s backoff
    monkeypatch.setattr(openai_backend, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=waits.append))
    out = r(random_images(2, seed=6), "a NOPE cat", on_error="nan")
    assert all(0 <= w <= 0.01 for w in waits), waits
    must = must_full if probability == "full" else must_yn
    for i in range(2):
        if must is None:
            assert bool(out.valid[i]) and float(out.scores[i]) == pytest.approx(0.1, rel=1e-5), out.errors[i]
        else:
            assert not bool(out.valid[i]) and math.isnan(float(out.scores[i])), (case, out.scores)
            assert must in out.errors[i], (case, out.errors[i])
    if must in ("judge call failed", "Timeout", "max_response_bytes"):  # a failed call, not an answer:
        from rewardkit.judges.openai_backend import JudgeServerError

        with pytest.raises(JudgeServerError):  # on_error="raise" (the default) raises it
            r(random_images(1, seed=6), "a NOPE cat")
    misbehaving.mode = "ok"


#: the questions of the two t2v_metrics lines, transcribed: PyPI t2v-metrics 3.0 wheel,
#: t2v_metrics/models/vqascore_models/qwen2vl_model.py line 163 (Qwen2VLModel.forward question_template default);
#: GitHub linzhiqiu/t2v_metrics@6ecb74f, the same file's default (v3.1)
T2V_QUESTIONS = {"t2v_metrics-3.0": 'Does this image show "{}"?',
                 "t2v_metrics-3.1": 'Does this figure show "{}"? Please answer Yes or No.',
                 "default": 'Does this figure show "{}"? Please answer Yes or No.'}


@pytest.mark.parametrize("template", sorted(T2V_QUESTIONS))
def test_vqascore_template_versions_ask_the_official_question(tjudge, template):
    from rewardkit import load_reward

    ims = random_images(2, sizes=[(48, 48), (64, 40)], seed=13)
    prompts = ["a red cat", "a blue car"]
    reward = load_reward("vqascore", judge=tjudge, template=template)
    q = T2V_QUESTIONS[template]
    assert reward.conversation(ims[0], prompts[0])[0]["content"][1]["text"] == q.format(prompts[0])
    out = reward(ims, prompts)
    want = [plain_p_yes(tjudge, conv([im], q.format(p))) for im, p in zip(ims, prompts)]
    torch.testing.assert_close(out.scores.double(), torch.tensor(want, dtype=torch.float64), rtol=2e-4, atol=1e-7)
    version = "3.0" if template == "t2v_metrics-3.0" else "3.1"
    assert out.info["template"] == f"vqascore/{template}@vqascore-t2v_metrics-{version}"


# --------------------------------------------------------------- vqascore yes_no: a row must be a distribution
class Unnormed(JudgeBackend):
    kind = "unnormed"

    def __init__(self, row):
        self.row = row

    def generate(self, conversations, **kw):
        return [[""] for _ in conversations]

    def choice_probs(self, conversations, choices):
        return torch.tensor([self.row] * len(conversations), dtype=torch.float32)


@pytest.mark.parametrize("row, want", [([0.2, 0.2], None), ([0.7, 0.7], None), ([0.75, 0.25], 0.75),
                                       ([1.0, 0.0], 1.0), ([float("nan"), 0.5], None)])
def test_vqascore_yes_no_refuses_a_row_that_is_not_a_distribution(row, want):
    """Bug: probability='yes_no' took P(Yes) from any finite row in [0, 1] ([0.2, 0.2] scored 0.2, valid),
    against the judge policy (a row not summing to 1 is an unanswered question)."""
    from rewardkit.rewards.vqascore import VQAScore

    out = VQAScore(judge=Unnormed(row), probability="yes_no")(random_images(1, seed=2), "a cat", on_error="nan")
    if want is None:
        assert not bool(out.valid[0]) and math.isnan(float(out.scores[0])) and out.errors[0]
    else:
        assert bool(out.valid[0]) and float(out.scores[0]) == pytest.approx(want)


# --------------------------------------------------------------- raw probabilities from a server without logprobs
def test_vqascore_full_on_a_server_without_logprobs_is_a_judge_failure():
    """Bug: with probability='full' a server that returns no log-probabilities at all gave NaN + a reason without
    the failure prefix (the bench cache kept it: fixing the server did not help) and never raised with
    on_error='raise'; probability='yes_no' (choice_probs) raises JudgeServerError for the same server."""
    pytest.importorskip("httpx")
    from tests.helpers.judge_servers import FakeServer

    from rewardkit.judges.openai_backend import JudgeServerError, OpenAIJudge
    from rewardkit.rewards.vqascore import VQAScore

    server = FakeServer()
    try:
        server.mode = "nologprobs"
        judge = OpenAIJudge(server.url, model="fake", api_key="", timeout=2.0, max_retries=0, check_tokens=False,
                            server="openai")
        ims = random_images(2, seed=6)
        for probability in ("full", "yes_no"):
            r = VQAScore(judge=judge, probability=probability)
            out = r(ims, "a cat", on_error="nan")
            assert not out.valid.any()
            assert all(e.startswith(JUDGE_FAILURE_PREFIX) and "log-prob" in e for e in out.errors), out.errors
            with pytest.raises(JudgeServerError, match="log-prob"):
                r(ims, "a cat", on_error="raise")
    finally:
        server.close()
