"""Every judge-backed reward through a fake OpenAI-compatible server on 127.0.0.1 that misbehaves.

The server answers chat completions by a rule (P(yes) = 0.9, or 0.1 when the question contains "NOPE"; EVR
hypotheses "Reason: looks right. / Score: 4") and, per case, returns: no log-probs, labels missing from the
top log-probs, -inf / NaN log-probs, malformed JSON, 500 then OK, 429 with Retry-After, a slow drip, a huge
body, an off-scale answer. Every case must end in the correct score or NaN + a reason, never a finite score
the judge did not give. Everything is bounded: short timeouts, one retry, daemon server threads.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from rewardkit import load_reward  # noqa: E402
from rewardkit.compose.composite import Composite  # noqa: E402
from rewardkit.judges.openai_backend import JudgeServerError, OpenAIJudge  # noqa: E402

from tests.helpers.judge_servers import DRIP_INTERVAL, FakeServer  # noqa: E402


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture
def fresh(server):
    server.mode, server.script, server.count, server.poison = "ok", [], 0, None
    server.drip_interval = DRIP_INTERVAL
    return server


@pytest.fixture
def sleeps(monkeypatch):
    """The backend's retry waits, recorded instead of slept: what a test checks is the wait the backend asks for
    (Retry-After honoured, capped, or ignored), not how long a loaded machine took."""
    import types

    from rewardkit.judges import openai_backend

    asked: list[float] = []
    monkeypatch.setattr(openai_backend, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=asked.append))
    return asked


def judge(server, **kw):
    opts = dict(model="fake", api_key="", timeout=1.0, max_retries=1, backoff=0.01, concurrency=4,
                check_tokens=False, max_response_bytes=256 * 1024)
    opts.update(kw)
    return OpenAIJudge(server.url, **opts)


# ------------------------------------------------------------------------------- item 4: the backend
# These drips send a byte every 0.1 s for DRIP_SECONDS (20 s); each socket read alone waits at most `timeout`
# (0.4 s, 4 gaps). Only the request's deadline (each read gets min(timeout, time left)) ends the call in a Timeout;
# without it (before) every read stayed alive, the call lasted the whole drip and ended in the server's hang-up
# (RemoteProtocolError), not a Timeout. A loaded machine can only make a read time out sooner, never later.
def test_total_timeout_bounds_a_body_drip(fresh):
    fresh.mode, fresh.drip_interval = "drip", 0.1
    with pytest.raises(JudgeServerError, match=r"last error: Timeout \("):
        judge(fresh, timeout=0.4, max_retries=0).generate([[{"role": "user", "content": "q"}]])


def test_total_timeout_bounds_a_header_drip(fresh):
    fresh.mode, fresh.drip_interval = "header_drip", 0.1
    with pytest.raises(JudgeServerError, match=r"last error: Timeout \("):
        judge(fresh, timeout=0.4, max_retries=0).generate([[{"role": "user", "content": "q"}]])


@pytest.mark.parametrize("mode", ["huge", "huge_nolength"])
def test_response_size_cap(fresh, mode):
    fresh.mode = mode
    j = judge(fresh, timeout=30.0, max_retries=3)
    with pytest.raises(JudgeServerError, match="max_response_bytes=262144"):
        j.generate([[{"role": "user", "content": "q"}]])
    assert fresh.count == 1   # refused at once, not retried
    # and the client hung up: the server's write of its 64 MiB failed part-way (the wait is a hang guard only)
    assert fresh.huge_done.wait(60) and fresh.huge_sent < 64 << 20
    with pytest.raises(ValueError, match="max_response_bytes"):
        judge(fresh, max_response_bytes=0)


def test_undecodable_body_is_a_judge_failure(fresh):
    fresh.mode = "badgzip"   # before: a raw httpx.DecodingError escaped (not a judge failure, so never NaN)
    with pytest.raises(JudgeServerError, match="DecodingError"):
        judge(fresh).generate([[{"role": "user", "content": "q"}]])
    assert fresh.count == 2   # retried once


def test_unusable_retry_after_is_ignored(fresh, sleeps):
    fresh.script = ["retry_after_nan"]
    assert judge(fresh).generate([[{"role": "user", "content": "q"}]]) == [["Reason: looks right.\nScore: 4"]]
    # one wait, the backoff's (0.01 s x a jitter in [0.5, 1)); before: Retry-After "nan" / "inf" asked for 60 s
    assert len(sleeps) == 1 and 0.005 <= sleeps[0] <= 0.01


# ------------------------------------------------------------------------------- the rewards
RED = Image.new("RGB", (16, 16), (200, 20, 20))
TREE = [{"id": 1, "question": "Is there a cat?", "parents": []},
        {"id": 2, "question": "Is the cat NOPE black?", "parents": [1]},
        {"id": 3, "question": "Is it sunny?", "parents": []}]
CONS = [{"id": 1, "question": "Is the background free of NOPE text?", "parents": []},
        {"id": 2, "question": "Is the background plain?", "parents": []}]
META = [{"questions": TREE, "constraint_questions": CONS, "intent": "strict"}] * 2
PROMPT = "a NOPE cat"   # the detector applicability question ("does the prompt ask for text?") answers No


def build(kind, j, tmp_path):
    if kind == "evr":
        return load_reward("evr", judge=j, k=2, dimensions=("IC", "Q"), max_retries=0, temperature=0.0)
    if kind == "detectors":
        return load_reward("detectors", judge=j, applicability_cache=str(tmp_path / "det.jsonl"))
    if kind == "composite":
        return Composite({"axes": [{"name": "faith", "reward": "faithfulness"},
                                   {"name": "cons", "reward": "constraints", "weight": 0.5, "gate": "intent"}],
                          "detectors": {"reward": "detectors", "mode": "veto", "target": "faith",
                                        "options": {"applicability_cache": str(tmp_path / "cdet.jsonl")}},
                          "normalize": "none"}, judge=j)
    return load_reward(kind, judge=j)


def run(kind, r):
    if kind == "evr":
        return r([RED, RED], "make it red", sources=[[RED]] * 2, on_error="nan")
    return r([RED, RED], PROMPT, metadata=META, on_error="nan")


# what the judge's answers give when they are well-formed
EXPECTED = {
    "faithfulness": 2 / 3,                 # yes, no (NOPE), yes
    "constraints": 1 / 2,                  # no (NOPE), yes
    "detectors": 1.0,                      # garbled_text and unrequested_text (enabled: no text asked) fire
    "evr": (8 / (2 + 1e-6) - 1) / 4,        # every hypothesis 4, verified: r_d = 4k / (k + eps)
    "composite": 0.0 + 0.5 * 0.5,          # faith 2/3 vetoed to 0 (a detector fired) + 0.5 * constraints
}
KINDS = sorted(EXPECTED)

CASES = {  # case -> (server mode or script, what a NaN's reason must mention)
    "ok": ("ok", None),
    "no_logprobs": ("nologprobs", "log-prob"),
    "labels_missing": ("labels_missing", "no usable"),
    "neg_inf_logprobs": ("neginf", "no usable"),
    "nan_logprobs": ("nanlp", "no usable"),
    "malformed_json": ("malformed", "unreadable response"),
    "500_then_ok": (["500"], None),
    "429_retry_after": (["429"], None),
    "slow_drip": ("drip", "Timeout"),
    "huge_body": ("huge_nolength", "max_response_bytes"),
    "off_scale": ("offscale", None),
    "over_unity_logprobs": ("overunity", "no usable"),    # before: renormalised to 0.5 / 0.5 and scored
    "duplicate_label_logprobs": ("dupyes", "no usable"),  # before: the first "Yes" won
}


# cases that wait out a drip's deadlines run for one kind in the inner loop (-m "not slow") and for every kind in
# the whole suite (Retry-After: 1 is recorded by the `sleeps` fixture, not slept)
WAITING_CASES = {"slow_drip"}


@pytest.mark.parametrize("kind, case", [
    pytest.param(kind, case, marks=[pytest.mark.slow] if case in WAITING_CASES and kind != KINDS[0] else [])
    for kind in KINDS for case in sorted(CASES)])
def test_reward_through_misbehaving_server(fresh, sleeps, tmp_path, kind, case):
    mode, must_mention = CASES[case]
    # slow_drip: a 0.1 s deadline, a fifth of the drip's 0.5 s between bytes (the total deadline against a drip
    # that keeps every read alive is test_total_timeout_bounds_a_body_drip's); each stage waits 2 x the deadline
    r = build(kind, judge(fresh, timeout=0.1 if case == "slow_drip" else 1.0), tmp_path)
    if isinstance(mode, list):
        fresh.script = list(mode)
    else:
        fresh.mode = mode
    out = run(kind, r)
    # every wait bounded: the backoff (<= 0.01 s here) or the server's Retry-After (1 s), never more
    assert all(0 <= w <= 1.0 for w in sleeps), sleeps
    for i in range(2):
        s, ok, err = float(out.scores[i]), bool(out.valid[i]), out.errors[i]
        if ok:   # a finite score must be exactly what the judge's answers give
            assert case in ("ok", "500_then_ok", "429_retry_after"), (kind, case, s)
            assert s == pytest.approx(EXPECTED[kind], rel=1e-5), (kind, case)
            assert err is None
        else:
            assert math.isnan(s) and err, (kind, case, s, err)
            if must_mention:
                assert must_mention in err, (kind, case, err)
    if case in ("ok", "500_then_ok", "429_retry_after"):
        assert out.valid.all(), (kind, case, out.errors)
    else:
        assert not out.valid.any(), (kind, case, out.scores)
    if case == "429_retry_after":
        assert 1.0 in sleeps          # Retry-After: 1 honoured (recorded, not slept)
    if case == "off_scale" and kind == "evr":
        assert "Score: 7" in out.errors[0]    # the raw answer in the reason
    if case == "off_scale" and kind != "evr":
        assert "no usable" in out.errors[0]
    for cache in tmp_path.glob("*det.jsonl"):   # nothing unanswered is ever cached
        for line in cache.read_text().splitlines():
            applies = json.loads(line)["applies"]
            assert applies == {"unrequested_text": False, "photoreal_drift": False}, (kind, case, applies)


@pytest.mark.parametrize("kind", KINDS)
def test_one_failing_request_fails_only_its_sample(fresh, tmp_path, kind):
    """A request the server refuses (HTTP 400, not retried) fails only the sample it belongs to, inside one
    chunk: the rest of the batch keeps its correct score (on_error="nan"); on_error="raise" raises."""
    from rewardkit.judges.openai_backend import _image_url

    poisoned = Image.new("RGB", (16, 16), (201, 20, 20))
    fresh.poison = _image_url(poisoned)
    r = build(kind, judge(fresh), tmp_path)
    if kind == "evr":
        out = r([poisoned, RED], "make it red", sources=[[RED]] * 2, on_error="nan")
    else:
        out = r([poisoned, RED], PROMPT, metadata=META, on_error="nan")
    assert math.isnan(out.scores[0]) and "judge call failed" in out.errors[0] and "HTTP 400" in out.errors[0]
    assert out.valid[1] and float(out.scores[1]) == pytest.approx(EXPECTED[kind], rel=1e-5), out.errors[1]
    with pytest.raises(JudgeServerError, match="HTTP 400"):
        if kind == "evr":
            r([poisoned, RED], "make it red", sources=[[RED]] * 2)
        else:
            r([poisoned, RED], PROMPT, metadata=META)


# ------------------------------------------------------------------------------- the /version probe
class VersionServer:
    """``GET /version`` only: ``drip`` sends a version object one byte per 0.1 s (~2 s), ``huge`` a valid
    version object padded to 32 MiB without Content-Length, ``huge_length`` the same with it, ``ok`` a plain
    one. ``sent`` counts the body bytes written."""

    def __init__(self, mode):
        self.mode, self.sent = mode, 0
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = b'{"version": "0.9.0"}'
                try:
                    if srv.mode == "ok":
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    elif srv.mode == "drip":
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        for b in body:  # 21 bytes, 0.1 s apart: ~2 s in all, each read well inside `timeout`
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            srv.sent += 1
                            time.sleep(0.1)
                    else:
                        n = 32 * 1024 * 1024
                        self.send_response(200)
                        if srv.mode == "huge_length":
                            self.send_header("Content-Length", str(n))
                        self.end_headers()
                        pad = n - len(b'{"version": "0.9.0", "pad": ""}')
                        self.wfile.write(b'{"version": "0.9.0", "pad": "')
                        chunk = b"x" * (1024 * 1024)
                        while pad > 0:
                            self.wfile.write(chunk[:min(pad, len(chunk))])
                            srv.sent += min(pad, len(chunk))
                            pad -= len(chunk)
                        self.wfile.write(b'"}')
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["drip", "huge", "huge_length"])
def test_version_probe_is_bounded_like_every_request(mode):
    """Bug: ``GET /version`` (server="auto") went through the bare client: a dripping answer held the call for
    as long as the server pleased, and a 32 MiB (or 300 MB) answer was read whole into memory. It now has the
    request deadline (``timeout``) and ``max_response_bytes``; an answer past either is "not vLLM"."""
    srv = VersionServer(mode)
    try:
        # drip: a 0.4 s deadline, 4 of its gaps and a fifth of its ~2 s (huge: the size cap, not the deadline, stops it)
        j = OpenAIJudge(srv.url, model="fake", api_key="", timeout=0.4 if mode == "drip" else 1.0, max_retries=0,
                        check_tokens=False, max_response_bytes=256 * 1024)
        assert j.is_vllm is False   # (drip: without the deadline the 21 bytes, each read in time, gave a version)
        if mode != "drip":
            assert srv.sent < 16 * 1024 * 1024      # the client stopped reading (before: the whole 32 MiB)
        j.close()
        ok = VersionServer("ok")
        try:
            assert OpenAIJudge(ok.url, model="fake", api_key="", timeout=1.0, check_tokens=False).is_vllm is True
        finally:
            ok.close()
    finally:
        srv.close()
