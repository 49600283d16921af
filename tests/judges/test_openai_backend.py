"""OpenAI-compatible backend against a small OpenAI-protocol server started on 127.0.0.1 (a test double)."""

from __future__ import annotations

import base64
import io
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from rewardkit.judges import ChoiceError, load_judge  # noqa: E402
from rewardkit.judges.openai_backend import JudgeServerError, OpenAIJudge  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402
from tests.helpers.judge_servers import Server  # noqa: E402


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def conv(ims, q):
    return [{"role": "system", "content": "judge"},
            {"role": "user", "content": [*({"type": "image", "image": i} for i in ims), {"type": "text", "text": q}]}]


def judge_for(server, **kw):
    kw.setdefault("backoff", 0.01)
    return load_judge(f"openai:{server.url}", model="tiny-judge", api_key="sk-test", **kw)


def test_request_shape_images_and_generate(server):
    ims = random_images(2, sizes=[(20, 10), (8, 8)])
    judge = judge_for(server, concurrency=3)
    out = judge.generate([conv(ims, "q1"), conv(ims[:1], "q2")], n=2, temperature=0.5, max_new_tokens=7,
                         stop=["\n\n"], seed=3)
    assert out == [["Reason: ok 0\nScore: 4", "Reason: ok 1\nScore: 3"]] * 2
    req = sorted(server.requests, key=lambda r: len(r["body"]["messages"][1]["content"]))[1]
    b = req["body"]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    assert b["model"] == "tiny-judge" and b["n"] == 2 and b["max_tokens"] == 7 and b["stop"] == ["\n\n"]
    assert b["temperature"] == 0.5 and b["seed"] == 3
    parts = b["messages"][1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert img.size == (20, 10) and img.convert("RGB").tobytes() == ims[0].tobytes()  # lossless
    assert b["messages"][0] == {"role": "system", "content": "judge"}


def test_choice_probs_from_top_logprobs(server):
    judge = judge_for(server)
    p = judge.choice_probs([conv([], "q")] * 3, ["Yes", "No"])
    torch.testing.assert_close(p, torch.tensor([[2 / 3, 1 / 3]] * 3))
    b = server.requests[-1]["body"]
    assert b["max_tokens"] == 1 and b["logprobs"] is True and b["top_logprobs"] == 20
    # a choice missing from the top list gets 0; none present -> NaN row
    server.top = [("Yes", math.log(0.9)), ("Maybe", math.log(0.1))]
    assert judge.choice_probs([conv([], "q")], ["Yes", "No"]).tolist() == [[1.0, 0.0]]
    server.top = [("Maybe", 0.0)]
    assert torch.isnan(judge.choice_probs([conv([], "q")], ["Yes", "No"])).all()
    with pytest.raises(ChoiceError, match="single tokens"):
        judge.choice_probs([conv([], "q")], ["Yes please", "No"])


def test_retries_with_backoff_then_success(server):
    server.script = ["429", "500", "ok"]
    judge = judge_for(server, max_retries=3)
    assert judge.generate([conv([], "q")])[0] == ["Reason: ok 0\nScore: 4"]
    assert len(server.requests) == 3 and judge.stats["retries"] == 2


def test_retries_exhausted_raise(server):
    server.default = "500"
    judge = judge_for(server, max_retries=2)
    with pytest.raises(JudgeServerError, match="3 attempts.*HTTP 500"):
        judge.generate([conv([], "q")])
    assert len(server.requests) == 3


def test_timeout_is_retried_then_raises(server):
    server.default = "slow"   # answers after 1 s: without the 0.2 s timeout the call succeeds (no clock needed)
    judge = judge_for(server, timeout=0.2, max_retries=1)
    with pytest.raises(JudgeServerError, match="2 attempts.*Timeout"):
        judge.generate([conv([], "q")])
    assert len(server.requests) == 2


def test_garbage_and_missing_logprobs(server):
    server.default = "garbage"
    with pytest.raises(JudgeServerError, match="unreadable response"):
        judge_for(server, max_retries=1).generate([conv([], "q")])
    server.default = "nologprobs"
    with pytest.raises(JudgeServerError, match="no log-probabilities"):
        judge_for(server).choice_probs([conv([], "q")], ["Yes", "No"])
    server.default = "400logprobs"
    with pytest.raises(JudgeServerError, match="logprobs support"):
        judge_for(server).choice_probs([conv([], "q")], ["Yes", "No"])


def test_connection_refused_and_config_errors():
    judge = OpenAIJudge("http://127.0.0.1:9/v1", model="m", max_retries=1, backoff=0.01, check_tokens=False)
    with pytest.raises(JudgeServerError, match="ConnectError"):
        judge.generate([conv([], "q")])
    with pytest.raises(ValueError, match="model"):
        OpenAIJudge("http://127.0.0.1:9/v1")


# --------------------------------------------------------------- strict OpenAI reader: duplicated token texts
def _response(top):
    return {"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
        {"token": "Yes", "logprob": top[0][1], "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}]}}]}


def test_read_raw_logprobs_tolerates_a_non_choice_text_listed_twice():
    """Bug: any token text listed twice (distinct byte pieces both shown as U+FFFD) made the row NaN, although
    the choice itself is listed once and exactly; and the over-unity check counted such a text once."""
    from rewardkit.judges.openai_backend import read_raw_logprobs

    top = [("Yes", math.log(0.5)), ("\ufffd", math.log(0.2)), ("\ufffd", math.log(0.1)), ("No", math.log(0.1))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert why is None and row == pytest.approx([math.log(0.5)])
    # 0.5 + 0.3 + 0.25 = 1.05 > 1: the two pieces are two tokens, both count towards the sum
    top = [("Yes", math.log(0.5)), ("\ufffd", math.log(0.3)), ("\ufffd", math.log(0.25))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert row is None and "sum" in why
    # a choice listed twice with different values is still ambiguous: refused
    top = [("Yes", math.log(0.5)), ("No", math.log(0.1)), ("Yes", math.log(0.2))]
    row, why = read_raw_logprobs(_response(top), ["Yes"])
    assert row is None and "twice" in why
