"""Documented options of docs/judges.md, the EVR reward and the OCR reward, each with a test that fails when the
option is ignored or mis-wired (see the map in tests/README.md).

Expected values are computed by hand in the comments. OCR options are checked against a stand-in Tesseract
executable (a small script passed as ``tesseract_cmd``) that reports the arguments and image it was given, so
the test does not depend on what the real engine happens to read; the real engine checks the failure path.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("httpx")

from PIL import Image  # noqa: E402
from test_evr import PAPER_CASE, ScriptedJudge, scripted  # noqa: E402
from test_judges_openai import Server  # noqa: E402
from test_judges_vllm_rules import vllm_stub  # noqa: E402,F401 (fixture)

from rewardkit import load_reward  # noqa: E402
from rewardkit.rewards.evr import EVR, EVRConfig  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402

INSTRUCTION = "put the cat from image 1 on the sofa of image 2"


@pytest.fixture(scope="module")
def imgs():
    return random_images(4, sizes=[(32, 32), (48, 40)], seed=11)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _texts(conv) -> str:
    return " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")


class RecordingJudge(ScriptedJudge):
    """ScriptedJudge that keeps every conversation and the generate keyword arguments it was sent."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gen_convs, self.prob_convs, self.gen_kwargs = [], [], []

    def generate(self, conversations, **kw):
        self.gen_convs += conversations
        self.gen_kwargs.append(kw)
        return super().generate(conversations, **kw)

    def choice_probs(self, conversations, choices):
        self.prob_convs += conversations
        return super().choice_probs(conversations, choices)


def recording(case=PAPER_CASE) -> RecordingJudge:
    base = scripted(case)
    return RecordingJudge(base.answers, base.verdicts)


# ============================================================================================== EVR options
def test_evr_defaults_are_the_documented_ones():
    cfg = EVRConfig()
    documented = {"k": 4, "temperature": 0.7, "max_new_tokens": 128, "seed": 0, "verifier": "binary",
                  "all_rejected": "invalid", "eps": 1e-6, "aggregate": "geometric", "use_dimensions": True,
                  "cot": True, "max_retries": 2, "unparsed": "invalid", "output": "normalized",
                  "verifier_judge": "", "on_judge_error": "auto", "compare_mode": "pairwise", "batch_size": 8,
                  "template": "default"}
    assert {k: getattr(cfg, k) for k in documented} == documented
    assert cfg.dimensions == ("reference_consistency", "scene_consistency", "harmony", "instruction_consistency",
                              "visual_quality")


def test_evr_sampling_options_reach_the_evaluator(imgs):
    judge = recording()
    EVR(judge=judge, k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert judge.gen_kwargs == [{"n": 3, "temperature": 0.7, "max_new_tokens": 128, "seed": 0}]
    judge = recording()
    EVR(judge=judge, k=3, temperature=0.2, max_new_tokens=33, seed=5)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert judge.gen_kwargs == [{"n": 3, "temperature": 0.2, "max_new_tokens": 33, "seed": 5}]


@pytest.mark.parametrize("p_yes,accepted", [(0.5, True), (0.49, False)])
def test_evr_binary_verifier_threshold_is_p_yes_at_least_half(imgs, p_yes, accepted):
    # RC: scores [4, 5, 2], verdicts: hypothesis 0 -> 1.0, hypothesis 1 -> p_yes, hypothesis 2 -> 0.0
    judge = scripted()
    judge.verdicts["evidence RC1 "] = p_yes
    out = EVR(judge=judge, k=3, eps=0.0)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    want = (4 + 5) / 2 if accepted else 4.0   # v = 1 iff P(Yes) >= 0.5
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(want, rel=1e-6)


def test_evr_eps_enters_the_formula(imgs):
    # RC: r = (4 + 5) / (2 + eps); with eps = 1 that is 9 / 3 = 3 (not 4.5)
    out = EVR(judge=scripted(), k=3, eps=1.0)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(3.0, rel=1e-6)


def test_evr_verifier_judge_object_gets_every_yes_no_question(imgs):
    evaluator, verifier = recording(), recording()
    # the separate verifier accepts every hypothesis; the evaluator's own table would reject some
    verifier.verdicts = {}
    reward = EVR(judge=evaluator, verifier_judge=verifier, k=3)
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert evaluator.prob_calls == [] and verifier.gen_calls == []
    assert verifier.prob_calls == [(15, ("Yes", "No"))]
    # all verified: r_d = mean S = 11/3, 3, 7/3, 10/3, 14/3 (with the evaluator's verdicts R would be 1260^(1/5))
    means = [11 / 3, 3, 7 / 3, 10 / 3, 14 / 3]
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)
    assert out.info["verifier_judge"] == {"kind": "scripted"}
    # the verifier is asked about the evaluator's claims
    assert "evidence RC0" in _texts(verifier.prob_convs[0])
    same = EVR(judge=evaluator, k=3)
    assert same.verifier_backend is same.judge and same._info()["verifier_judge"] is None


def test_evr_verifier_judge_spec_string_loads_its_own_backend(imgs, server):
    # evaluator: a scripted object; verifier: an OpenAI-compatible server given as a spec string
    # (judge_kwargs go to the spec-built backend). The server answers P(Yes) = 0.6 / (0.6 + 0.3) = 2/3.
    evaluator = recording()
    reward = load_reward("evr", judge=evaluator, verifier_judge=f"openai:{server.url}", k=3,
                         judge_kwargs={"model": "tiny-judge", "api_key": "sk-test", "backoff": 0.01})
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert evaluator.prob_calls == []
    questions = [r for r in server.requests if r["path"] == "/v1/chat/completions"]
    assert len(questions) == 15 and all(r["body"]["max_tokens"] == 1 for r in questions)
    assert out.info["verifier_judge"]["kind"] == "openai"
    means = [11 / 3, 3, 7 / 3, 10 / 3, 14 / 3]   # binary: 2/3 >= 0.5 accepts every hypothesis
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)
    soft = load_reward("evr", judge=recording(), verifier_judge=f"openai:{server.url}", k=3, verifier="soft",
                       judge_kwargs={"model": "tiny-judge", "api_key": "sk-test", "backoff": 0.01})
    # soft: every v = 2/3, so r_d = (2/3 sum S) / (3 * 2/3 + eps) = mean S again (eps 1e-6 aside)
    out = soft(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)


def _custom_template(tmp_path: Path, **changes) -> Path:
    import yaml

    from rewardkit.judges import load_template

    data = yaml.safe_load(Path(load_template("evr").path).read_text(encoding="utf-8"))
    data.update(changes)
    path = tmp_path / "my_evr.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_evr_custom_template_file(imgs, tmp_path):
    path = _custom_template(
        tmp_path, version="7",
        context="CTX-MARK {n_refs} refs{ref_roles}; instruction <<{instruction}>>",
        verify="VERIFY-MARK Is this claim about the {title} true? Claim: {claim}. Ja oder Nein.",
        verify_choices=["Ja", "Nein"])
    judge = recording()
    judge_choices = []
    orig = judge.choice_probs

    def choice_probs(convs, choices):   # answer the custom labels with the scripted verdicts
        judge_choices.append(tuple(choices))
        return orig(convs, ["Yes", "No"])

    judge.choice_probs = choice_probs
    reward = load_reward("evr", judge=judge, template=str(path), k=3, eps=1e-6)
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.info["template"] == "evr/my_evr@7"
    ctx = f"CTX-MARK 2 refs; instruction <<{INSTRUCTION}>>"
    assert all(ctx in _texts(c) for c in judge.gen_convs + judge.prob_convs)
    assert all("VERIFY-MARK" in _texts(c) for c in judge.prob_convs) and len(judge.prob_convs) == 15
    assert not any("VERIFY-MARK" in _texts(c) for c in judge.gen_convs)
    assert judge_choices == [("Ja", "Nein")]
    assert out.dimensions["raw"][0].item() == pytest.approx(1260 ** 0.2, rel=1e-5)   # same answers, same R
    # a template without a version, or missing a placeholder field the reward renders, is refused clearly
    bad = tmp_path / "bad.yaml"
    bad.write_text("context: hi\n", encoding="utf-8")
    with pytest.raises(ValueError, match="version"):
        load_reward("evr", judge=recording(), template=str(bad))
    broken = _custom_template(tmp_path, context="{n_refs} {nonexistent} {instruction}")
    with pytest.raises(KeyError, match="nonexistent"):
        load_reward("evr", judge=recording(), template=str(broken), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])


def test_evr_reference_roles_reach_every_question(imgs):
    judge = recording()
    reward = EVR(judge=judge, k=3)
    reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]], metadata=[{"reference_roles": ["object", "scene"]}])
    roles = "(image 1: object; image 2: scene)"
    assert judge.gen_convs and judge.prob_convs
    assert all(roles in _texts(c) for c in judge.gen_convs + judge.prob_convs)
    # the pairwise question carries them too
    judge.prob_convs.clear()
    reward.compare(imgs[:1], imgs[3:4], INSTRUCTION, sources=[imgs[1:3]],
                   metadata=[{"reference_roles": ["object", "scene"]}])
    assert len(judge.prob_convs) == 2 and all(roles in _texts(c) for c in judge.prob_convs)
    # roles that do not match the references are that sample's input error (never silently dropped), and the
    # judge is not asked about it; the other samples are scored
    judge2 = recording()
    out = EVR(judge=judge2, k=3)(imgs[:2], INSTRUCTION, sources=[imgs[1:3], imgs[1:3]],
                                 metadata=[{"reference_roles": ["object"]}, {}], on_error="nan")
    assert out.valid.tolist() == [False, True]
    assert "1 role(s) for 2 reference image(s)" in out.errors[0]
    assert not any("image 1:" in _texts(c) for c in judge2.gen_convs) and judge2.gen_convs
    from rewardkit.errors import RewardInputError
    with pytest.raises(RewardInputError, match="reference_roles"):
        EVR(judge=recording(), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]],
                                    metadata=[{"reference_roles": ["object", 3]}])
    with pytest.raises(RewardInputError, match="1 role"):        # compare() counts the references alone
        EVR(judge=recording(), k=3).compare(imgs[:1], imgs[3:4], INSTRUCTION, sources=[imgs[1:3]],
                                            metadata=[{"reference_roles": ["object"]}])
    empty = EVR(judge=recording(), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]], metadata=[{"reference_roles": []}])
    assert empty.valid.all()                                   # [] = no roles


def test_evr_one_judge_session_per_call_across_chunks(imgs):
    """docs/judges.md: a reward call is one judge session whatever `batch_size` chunks it into (the tiny-Qwen
    test in test_evr.py counts the encoded images; this counts the sessions and the chunked calls)."""
    judge = scripted()
    out = EVR(judge=judge, k=3)(imgs[:3], INSTRUCTION, sources=[imgs[1:3]] * 3, batch_size=1)
    assert out.valid.all() and judge.sessions == 1
    assert [c[0] for c in judge.gen_calls] == [5, 5, 5]   # three chunks of one candidate x five dimensions
    assert EVR(judge=scripted(), k=3).default_batch_size == 8


def test_evr_model_shorthand_and_judge_kwargs(tiny_qwen2_5_vl_dir, server):
    # --model / model= is shorthand for a transformers judge; a spec with a backend prefix is used as is
    evr = EVR(model=str(tiny_qwen2_5_vl_dir), device="cpu", k=1, max_retries=0, max_new_tokens=2)
    assert evr.judge.describe()["kind"] == "transformers"
    evr = EVR(model=f"openai:{server.url}", judge_kwargs={"model": "served-name", "api_key": "sk"})
    assert evr.judge.describe()["kind"] == "openai" and evr.judge.model == "served-name"


def test_evr_command_line_against_an_openai_server(server, tmp_path, imgs):
    """The documented `rewardkit score -r evr --set judge=openai:... judge_kwargs.model=... k=4 verifier=binary`."""
    from rewardkit.cli import main

    paths = []
    for i, im in enumerate(imgs[:3]):
        p = tmp_path / f"{i}.png"
        im.save(p)
        paths.append(str(p))
    out = tmp_path / "evr.jsonl"
    rc = main(["score", "-r", "evr", "--set", f"judge=openai:{server.url}", "judge_kwargs.model=tiny-judge",
               "judge_kwargs.api_key=sk", "k=4", "verifier=binary", "--prompt", "Put the mug from image 1 on the table",
               paths[0], "--sources", paths[1], paths[2], "-o", str(out), "--no-progress"])
    assert rc == 0
    row = json.loads(out.read_text().splitlines()[0])
    # the server's k = 4 answers score 4, 3, 4, 3; P(Yes) = 2/3 accepts all: r_d = 3.5 for all five, R = 3.5
    assert row["score"] == pytest.approx((3.5 - 1) / 4, rel=1e-6)
    gens = [r for r in server.requests if r["body"].get("n") == 4]
    assert len(gens) == 5 and all(r["body"]["model"] == "tiny-judge" for r in gens)


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


# ============================================================================================== OCR options
FAKE_TESSERACT = textwrap.dedent("""\
    #!{python}
    # stand-in for the tesseract CLI: `tesseract IN OUTBASE [-l LANG] [--psm N] txt`
    import json, os, sys, time
    from PIL import Image
    args = sys.argv[1:]
    start = time.time()
    time.sleep(float(os.environ.get("FAKE_TESSERACT_SLEEP", "0")))
    with Image.open(args[0]) as im:
        size = im.size
    info = {{"args": args[2:], "size": list(size), "start": start, "end": time.time()}}
    with open(args[1] + ".txt", "w") as f:
        f.write(os.environ.get("FAKE_TESSERACT_TEXT", "OPEN") + "\\n")
    log = os.environ.get("FAKE_TESSERACT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(info) + "\\n")
    """)


@pytest.fixture
def fake_tesseract(tmp_path, monkeypatch):
    pytest.importorskip("pytesseract")
    exe = tmp_path / "fake-tesseract"
    exe.write_text(FAKE_TESSERACT.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TESSERACT_LOG", str(log))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return str(exe), calls


def test_ocr_lang_and_psm_reach_tesseract(fake_tesseract):
    exe, calls = fake_tesseract
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1)
    out = ocr([Image.new("RGB", (40, 30), "white")], ['a sign "OPEN"'])
    assert out.valid.all() and out.scores[0].item() == 1.0 and out.details[0]["read"] == "OPEN"
    assert calls()[-1]["args"] == ["-l", "eng", "--psm", "3", "txt"]        # the defaults
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1, lang="eng+deu", psm=11)
    ocr([Image.new("RGB", (40, 30), "white")], ['a sign "OPEN"'])
    assert calls()[-1]["args"] == ["-l", "eng+deu", "--psm", "11", "txt"]


@pytest.mark.parametrize("read,prompt,options,want", [
    # default: case folded, whitespace removed, full match, divided by |t| and clipped: "open" vs "shopopennow"
    ("Shop OPEN now", '"open"', {}, 0.0),                                   # d = 7 -> 1 - min(7, 4) / 4
    ("Shop OPEN now", '"open"', {"match": "substring"}, 1.0),               # closest substring: d = 0
    ("OPEN", '"open"', {}, 1.0),
    ("OPEN", '"open"', {"case_sensitive": True}, 0.0),                      # d = 4
    ("a b", '"ab"', {}, 1.0),                                               # "ab" vs "ab"
    ("a b", '"ab"', {"whitespace": "collapse"}, 0.5),                       # "ab" vs "a b": d = 1
    ("abcd", '"ab"', {}, 0.0),                                              # d = 2 -> 1 - 2 / 2
    ("abcd", '"ab"', {"normalize_by": "max"}, 0.5),                         # 1 - 2 / max(2, 4)
    ("HELLO WORLD", 'a sign "hello" and a banner "world"', {}, 1.0),         # spans joined by a space
])
def test_ocr_text_options_reach_the_reward(fake_tesseract, monkeypatch, read, prompt, options, want):
    exe, _ = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_TEXT", read)
    out = load_reward("ocr", tesseract_cmd=exe, num_workers=1, **options)([Image.new("RGB", (40, 30), "white")],
                                                                          [prompt])
    assert out.valid.all() and out.scores[0].item() == pytest.approx(want)
    assert out.details[0]["read"] == read


def test_ocr_defaults_are_the_documented_ones(fake_tesseract):
    from rewardkit.rewards.ocr import OCRConfig

    cfg = OCRConfig()
    assert (cfg.lang, cfg.psm, cfg.min_side, cfg.num_workers, cfg.case_sensitive, cfg.whitespace, cfg.match,
            cfg.normalize_by) == ("eng", 3, 0, 0, False, "remove", "full", "target")
    exe, _ = fake_tesseract
    assert load_reward("ocr", tesseract_cmd=exe)._workers == min(4, os.cpu_count() or 1)   # 0 = min(4, CPUs)


def test_ocr_min_side_upscales_small_images(fake_tesseract):
    exe, calls = fake_tesseract
    im = Image.new("RGB", (100, 50), "white")   # W x H
    load_reward("ocr", tesseract_cmd=exe, num_workers=1)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [100 + 20, 50 + 20]           # never upscaled by default; a 10 px margin
    load_reward("ocr", tesseract_cmd=exe, num_workers=1, min_side=200)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [400 + 20, 200 + 20]          # shorter side 50 -> 200: x4
    load_reward("ocr", tesseract_cmd=exe, num_workers=1, min_side=40)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [100 + 20, 50 + 20]           # already large enough


@pytest.mark.slow
def test_ocr_timeout_marks_the_sample_invalid(fake_tesseract, monkeypatch):
    exe, _ = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_SLEEP", "20")
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1, timeout_s=0.5)
    t0 = time.monotonic()
    out = ocr([Image.new("RGB", (40, 30), "white")], ['"OPEN"'], on_error="nan")
    assert time.monotonic() - t0 < 10
    assert not out.valid[0] and math.isnan(out.scores[0].item())
    assert "tesseract failed" in out.errors[0] and "timeout" in out.errors[0]


@pytest.mark.slow
def test_ocr_num_workers_bounds_concurrent_processes(fake_tesseract, monkeypatch):
    exe, calls = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_SLEEP", "0.4")
    ims = [Image.new("RGB", (40, 30), "white")] * 4

    def max_overlap(rows):
        events = sorted([(r["start"], 1) for r in rows] + [(r["end"], -1) for r in rows], key=lambda e: (e[0], e[1]))
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best

    load_reward("ocr", tesseract_cmd=exe, num_workers=1)(ims, ['"OPEN"'] * 4)
    assert len(calls()) == 4 and max_overlap(calls()) == 1
    n = len(calls())
    load_reward("ocr", tesseract_cmd=exe, num_workers=4)(ims, ['"OPEN"'] * 4)
    assert max_overlap(calls()[n:]) >= 2
    with pytest.raises(ValueError, match="num_workers"):
        load_reward("ocr", tesseract_cmd=exe, num_workers=-1)


def test_ocr_missing_executable_is_a_clear_error(tmp_path):
    pytest.importorskip("pytesseract")
    with pytest.raises(RuntimeError, match="apt-get install tesseract-ocr"):
        load_reward("ocr", tesseract_cmd=str(tmp_path / "no-such-tesseract"))


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract-ocr is not installed")
def test_ocr_real_tesseract_failure_is_an_invalid_sample():
    """A language pack that is not installed makes Tesseract fail: the sample is invalid with its message."""
    pytest.importorskip("pytesseract")
    ocr = load_reward("ocr", lang="xx-not-a-language", num_workers=1)
    out = ocr([Image.new("RGB", (60, 30), "white")], ['"OPEN"'], on_error="nan")
    assert not out.valid[0] and out.errors[0].startswith("tesseract failed")
    assert os.path.exists(shutil.which("tesseract"))
