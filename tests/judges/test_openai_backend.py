"""OpenAI-compatible backend against a small OpenAI-protocol server started on 127.0.0.1 (a test double)."""

from __future__ import annotations

import base64
import io
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from rewardkit.judges import ChoiceError, load_judge  # noqa: E402
from rewardkit.judges.openai_backend import JudgeServerError, OpenAIJudge  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402


class Server:
    """Scripted OpenAI chat-completions server. ``script`` is a list of behaviours consumed per request
    (then ``default``): "ok", "429", "500", "slow", "garbage", "nologprobs", "400logprobs"."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list[str] = []
        self.default = "ok"
        self.top = [("Yes", math.log(0.6)), ("No", math.log(0.3)), ("Maybe", math.log(0.1))]
        self.tokenize = {"Yes": [1], "No": [2], "A": [3], "B": [4], "Yes please": [1, 5]}
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, headers=None):
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    toks = server.tokenize.get(body["prompt"])
                    return self._send(200, {"tokens": toks}) if toks else self._send(404, {"error": "no"})
                with server.lock:
                    server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                    mode = server.script.pop(0) if server.script else server.default
                if mode == "429":
                    return self._send(429, {"error": "slow down"}, {"Retry-After": "0"})
                if mode == "500":
                    return self._send(500, {"error": "boom"})
                if mode == "slow":
                    time.sleep(1.0)
                if mode == "garbage":
                    return self._send(200, b"<html>not json")
                if mode == "400logprobs":
                    return self._send(400, {"error": "logprobs are not supported by this model"})
                n = body.get("n", 1)
                choices = []
                for i in range(n):
                    ch = {"index": i, "message": {"role": "assistant", "content": f"Reason: ok {i}\nScore: {4 - i % 2}"}}
                    if body.get("logprobs") and mode != "nologprobs":
                        ch["logprobs"] = {"content": [{"token": server.top[0][0], "logprob": server.top[0][1],
                                                       "top_logprobs": [{"token": t, "logprob": lp} for t, lp in server.top]}]}
                    choices.append(ch)
                self._send(200, {"id": "x", "object": "chat.completion", "choices": choices})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


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
    server.default = "slow"
    judge = judge_for(server, timeout=0.2, max_retries=1)
    t = time.perf_counter()
    with pytest.raises(JudgeServerError, match="Timeout"):
        judge.generate([conv([], "q")])
    assert time.perf_counter() - t < 3.0


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
