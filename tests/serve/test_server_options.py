"""Documented options of docs/serve.md that had no test of their own: ``max_batch`` / ``max_wait_ms`` batching,
metadata never merged across requests, the client's input checks, token, retries and ``Retry-After``, the serve
command's options, the app factory's devices variable, encoded files under the bomb guard, and raw pixels vs
PNG on the wire. Expected values are computed in the test, by hand or by a few lines of reference."""

from __future__ import annotations

import json
import threading
import time
import types
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rewardkit import Reward, RewardOutput, load_reward  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402
from tests.helpers.serving import stop_soon  # noqa: E402


# ============================================================================================== serve
class MetaRecorder(Reward):
    """score = mean pixel value + len(prompt) + metadata["bonus"] (0 without); records every call."""

    name = "meta-recorder"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def __init__(self, delay: float = 0.0):
        super().__init__()
        self.delay = delay
        self.calls: list[tuple[int, bool]] = []   # (images, any metadata given)

    @staticmethod
    def expected(im, prompt: str, meta: dict | None) -> float:
        return float(np.asarray(im, dtype=np.float64).mean()) + len(prompt) + float((meta or {}).get("bonus", 0))

    def _score(self, batch):
        self.calls.append((len(batch), any(batch.metadata)))
        if self.delay:
            time.sleep(self.delay)
        return RewardOutput(scores=torch.tensor([self.expected(im, p, m) for im, p, m
                                                 in zip(batch.images, batch.prompts, batch.metadata)]))


@pytest.fixture(scope="module")
def serve_mod():
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")
    import rewardkit.server as srv

    return srv


def _queued(url: str, n: int) -> None:
    """Wait (a 20 s hang guard) until the server at ``url`` has been handed ``n`` scoring requests."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        if json.loads(urllib.request.urlopen(f"{url}/info", timeout=5).read())["stats"]["requests"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"the server never had {n} requests")


def test_max_batch_bounds_every_merged_model_call(serve_mod):
    """Deterministic merging (no delays): in each round the first model call holds the model until every other
    request of the round has queued up behind it."""
    from rewardkit.serve.client import RemoteReward

    class Held(MetaRecorder):
        def __init__(self):
            super().__init__()
            self.hold, self.release = False, threading.Event()

        def _score(self, batch):
            if self.hold:   # the round's first call (one worker thread: no race on the flag)
                self.hold = False
                self.release.wait(20.0)
            return super()._score(batch)

    rec = Held()
    handle = serve_mod.serve_in_thread(rec, serve_mod.ServerConfig(max_batch=3, max_wait_ms=5.0))
    try:
        remote = RemoteReward(url=handle.url)
        ims = random_images(10, seed=2)
        rec.hold = True
        with ThreadPoolExecutor(10) as pool:
            futs = [pool.submit(remote, [ims[i]], f"p{i}") for i in range(10)]
            _queued(handle.url, 10)
            rec.release.set()
            outs = [f.result(timeout=30) for f in futs]
        sizes = [n for n, _ in rec.calls]
        assert sum(sizes) == 10 and max(sizes) <= 3, sizes
        assert max(sizes) >= 2, f"nothing was merged: {sizes}"
        for i, o in enumerate(outs):
            assert o.scores[0].item() == pytest.approx(MetaRecorder.expected(ims[i], f"p{i}", None), rel=1e-6)
        # two-image requests, all queued together: two of them (4 images) would exceed max_batch = 3, so none is
        # merged
        rec.calls.clear()
        rec.hold = True
        rec.release.clear()
        with ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(remote, ims[i:i + 2], "q") for i in range(6)]
            _queued(handle.url, 16)
            rec.release.set()
            outs = [f.result(timeout=30) for f in futs]
        assert [n for n, _ in rec.calls] == [2] * 6, rec.calls
        assert all(o.valid.all() for o in outs)
    finally:
        rec.release.set()
        stop_soon(handle)


def test_max_wait_ms_holds_a_batch_open_for_late_requests(serve_mod):
    from rewardkit.serve.client import RemoteReward

    rec = MetaRecorder()
    # max_batch 2: the batch closes when the late request is in (its wait, not the test, takes the 1.5 s otherwise)
    handle = serve_mod.serve_in_thread(rec, serve_mod.ServerConfig(max_batch=2, max_wait_ms=1500.0))
    try:
        remote = RemoteReward(url=handle.url)
        ims = random_images(2, seed=3)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(remote, [ims[0]], "a")
            _queued(handle.url, 1)          # the second request arrives while the first one's batch waits
            second = pool.submit(remote, [ims[1]], "b")
            first.result(30), second.result(30)
        assert [n for n, _ in rec.calls] == [2], rec.calls
    finally:
        stop_soon(handle)


def test_requests_with_and_without_metadata_are_never_merged(serve_mod):
    from rewardkit.serve.client import RemoteReward

    class Blocking(MetaRecorder):
        """The first model call holds the model until the other requests have queued up (deterministic merging,
        whatever the machine's load); later calls are immediate."""

        def __init__(self):
            super().__init__()
            self.release, self.entered = threading.Event(), threading.Event()
            self.kinds: list[set] = []

        def _score(self, batch):
            if not self.calls:
                self.entered.set()
                self.release.wait(20.0)
            self.kinds.append({bool(m) for m in batch.metadata})   # with / without metadata in this model call
            return super()._score(batch)

    rec = Blocking()
    handle = serve_mod.serve_in_thread(rec, serve_mod.ServerConfig(max_batch=64, max_wait_ms=5.0))
    try:
        remote = RemoteReward(url=handle.url)
        ims = random_images(9, seed=4)
        metas = [{"bonus": 1000.0 * (i + 1)} if i % 2 else None for i in range(9)]

        def call(i):
            return remote([ims[i]], "x", metadata=None if metas[i] is None else [metas[i]])

        with ThreadPoolExecutor(9) as pool:
            first = pool.submit(call, 0)                   # occupies the model (held until released)
            assert rec.entered.wait(20.0)
            # interleaved: with / without metadata alternate in the queue behind the held call
            rest = [pool.submit(call, i) for i in range(1, 9)]
            info = f"{handle.url}/info"
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:             # until the server has all 9 requests
                if json.loads(urllib.request.urlopen(info, timeout=5).read())["stats"]["requests"] >= 9:
                    break
                time.sleep(0.05)
            rec.release.set()
            outs = [first.result(timeout=30)] + [f.result(timeout=30) for f in rest]
        for i, o in enumerate(outs):   # each request gets its own metadata's score
            assert o.scores[0].item() == pytest.approx(MetaRecorder.expected(ims[i], "x", metas[i]), rel=1e-6)
        sizes = [n for n, _ in rec.calls]
        # the held call, then every waiting request of one kind, then the other (a request of another kind
        # keeps its place in line instead of closing the batch)
        assert sizes == [1, 4, 4], rec.calls
        assert all(len(k) == 1 for k in rec.kinds), rec.kinds     # ... never across with / without metadata
    finally:
        stop_soon(handle)


def test_client_validates_inputs_before_sending(serve_mod):
    from rewardkit.serve.client import RemoteReward

    rec = MetaRecorder()
    handle = serve_mod.serve_in_thread(rec, serve_mod.ServerConfig())
    try:
        remote = RemoteReward(url=handle.url)
        good = random_images(2, seed=5)
        out = remote([good[0], b"not an image", good[1]], "a", on_error="nan")
        assert out.valid.tolist() == [True, False, True] and out.errors[1]
        assert rec.calls == [(2, False)]          # the corrupt sample never reached the server
    finally:
        stop_soon(handle)


def test_client_token_from_the_environment(serve_mod, monkeypatch):
    from rewardkit.serve.client import RemoteReward, RemoteRewardError

    handle = serve_mod.serve_in_thread(MetaRecorder(), serve_mod.ServerConfig(token="env-secret"))
    try:
        monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
        with pytest.raises(RemoteRewardError, match="401"):
            RemoteReward(url=handle.url)
        monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "env-secret")
        assert RemoteReward(url=handle.url)(random_images(1), "a").valid.all()
        monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "wrong")
        assert RemoteReward(url=handle.url, token="env-secret")(random_images(1), "a").valid.all()  # token= wins
    finally:
        stop_soon(handle)


def test_remote_reward_through_load_reward_and_the_score_command(serve_mod, tiny_clip_dir, tmp_path):
    """`load_reward("remote", url=...)` and `rewardkit score --reward remote --set url=...` give the
    in-process scores."""
    from rewardkit.cli import main

    clip = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")
    handle = serve_mod.serve_in_thread(clip, serve_mod.ServerConfig())
    try:
        ims = random_images(3, seed=6)
        want = clip(ims, "a cat").scores
        remote = load_reward("remote", url=handle.url)
        assert torch.equal(remote(ims, "a cat").scores, want)
        paths = []
        for i, im in enumerate(ims):
            paths.append(str(tmp_path / f"{i}.png"))
            im.save(paths[-1])
        out = tmp_path / "s.jsonl"
        assert main(["score", "--reward", "remote", "--set", f"url={handle.url}", "--prompt", "a cat", *paths,
                     "-o", str(out), "--no-progress"]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        torch.testing.assert_close(torch.tensor([r["score"] for r in rows]), want, atol=0, rtol=0)
    finally:
        stop_soon(handle)


def test_serve_command_options_reach_the_server(serve_mod, monkeypatch, capsys, tiny_clip_dir, tmp_path):
    """--max-batch / --max-wait-ms / --max-body-mb / --max-json-mb / --max-json-items / --max-images / --timeout / the per-client bounds /
    --token-file / --devices / --set reach the app (read back through GET /info)."""
    from starlette.testclient import TestClient

    from rewardkit.cli import main

    seen: dict = {}
    monkeypatch.setattr(serve_mod, "run_server",
                        lambda app, sock, cfg: seen.update(app=app, host=sock.getsockname()[0], cfg=cfg))
    monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
    tok = tmp_path / "token"
    tok.write_text("  file-secret\n")
    assert main(["serve", "-r", "clipscore", "-m", str(tiny_clip_dir), "--set", "convention=cosine",
                 "--devices", "cpu,cpu", "--max-batch", "7", "--max-wait-ms", "3", "--max-body-mb", "2",
                 "--max-images", "9", "--timeout", "11", "--token-file", str(tok), "--host", "0.0.0.0",
                 "--port", "0", "--header-timeout", "2", "--body-timeout", "3", "--keep-alive", "4",
                 "--max-connections", "50", "--max-in-flight", "6", "--max-request-mpixels", "1",
                 "--max-batch-mpixels", "2", "--max-json-mb", "1.5", "--max-json-items", "77"]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "WITHOUT authentication" not in err   # a token is set: the milder warning
    with TestClient(seen["app"]) as tc:
        assert tc.get("/info").status_code == 401
        info = tc.get("/info", headers={"Authorization": "Bearer file-secret"}).json()
    assert info["limits"] == {"max_batch": 7, "max_wait_ms": 3.0, "max_body_bytes": 2 * 1024 * 1024,
                              "max_images": 9, "timeout": 11.0, "header_timeout": 2.0, "body_timeout": 3.0,
                              "keep_alive": 4.0, "max_connections": 50, "max_in_flight": 6,
                              "max_header_bytes": 16384, "backlog": 256, "max_request_pixels": 1024 * 1024,
                              "max_batch_pixels": 2 * 1024 * 1024, "max_json_bytes": 1536 * 1024,
                              "max_json_items": 77}
    assert info["replicas"] == ["cpu", "cpu"] and info["config"]["convention"] == "cosine" and info["auth"]
    # the documented defaults
    assert main(["serve", "-r", "clipscore", "-m", str(tiny_clip_dir), "--port", "0"]) == 0
    with TestClient(seen["app"]) as tc:
        info = tc.get("/info").json()
    assert info["limits"] == {"max_batch": 32, "max_wait_ms": 5.0, "max_body_bytes": 64 * 1024 * 1024,
                              "max_images": 256, "timeout": 120.0, "header_timeout": 10.0, "body_timeout": 60.0,
                              "keep_alive": 5.0, "max_connections": 512, "max_in_flight": 64,
                              "max_header_bytes": 16384, "backlog": 256, "max_request_pixels": 64 * 1024 * 1024,
                              "max_batch_pixels": 64 * 1024 * 1024, "max_json_bytes": 16 * 1024 * 1024,
                              "max_json_items": 100_000}
    assert info["auth"] is False and seen["host"] == "127.0.0.1"
    # REWARDKIT_SERVE_TOKEN configures the server when there is no --token-file
    monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "env-secret")
    assert main(["serve", "-r", "clipscore", "-m", str(tiny_clip_dir), "--port", "0"]) == 0
    with TestClient(seen["app"]) as tc:
        assert tc.get("/info").status_code == 401
        assert tc.get("/info", headers={"Authorization": "Bearer env-secret"}).status_code == 200
    tok.write_text("\n")
    capsys.readouterr()
    assert main(["serve", "-r", "clipscore", "-m", str(tiny_clip_dir), "--token-file", str(tok)]) != 0
    assert "is empty" in capsys.readouterr().err      # an empty token file is refused, never "no auth"


def test_app_factory_devices_variable(serve_mod, monkeypatch, tiny_clip_dir):
    from starlette.testclient import TestClient

    cfg = tiny_clip_dir.parent / "serve-clip-devices.yaml"
    cfg.write_text(f"model: {tiny_clip_dir}\n")
    monkeypatch.setenv("REWARDKIT_SERVE_REWARD", "clipscore")
    monkeypatch.setenv("REWARDKIT_SERVE_CONFIG", str(cfg))
    monkeypatch.setenv("REWARDKIT_SERVE_DEVICES", "cpu,cpu")
    monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
    with TestClient(serve_mod.app_from_env()) as tc:
        info = tc.get("/info").json()
    assert info["replicas"] == ["cpu", "cpu"] and info["auth"] is False
    monkeypatch.delenv("REWARDKIT_SERVE_REWARD")
    with pytest.raises(RuntimeError, match="REWARDKIT_SERVE_REWARD"):
        serve_mod.app_from_env()


class _ScriptedRewardServer:
    """A stand-in rewardkit server: /info answers, /score answers the scripted statuses first."""

    INFO = {"reward": "stand-in", "tasks": ["t2i"], "dimensions": [], "higher_is_better": True,
            "score_range": None, "uses_prompt": True, "batch_relative": False}

    def __init__(self, script: list[tuple[int, dict]]):
        self.script, self.posts = list(script), 0
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, headers=()):
                raw = json.dumps(body).encode()
                self.send_response(code)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send(200, me.INFO)

            def do_POST(self):
                n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["images"])
                me.posts += 1
                if me.script:
                    code, headers = me.script.pop(0)
                    return self._send(code, {"error": f"scripted {code}"}, headers.items())
                self._send(200, {"scores": [0.25] * n, "valid": [True] * n, "errors": [None] * n})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_client_retries_the_documented_statuses(status):
    pytest.importorskip("httpx")
    from rewardkit.serve.client import RemoteReward

    s = _ScriptedRewardServer([(status, {"Retry-After": "0"}), (status, {"Retry-After": "0"})])
    try:
        out = RemoteReward(url=s.url, max_retries=2)(random_images(1), "a")
        assert out.scores.tolist() == [0.25] and s.posts == 3
    finally:
        s.close()


@pytest.mark.parametrize("status", [400, 404, 500, 413])
def test_client_other_errors_raise_at_once_with_the_message(status):
    pytest.importorskip("httpx")
    from rewardkit.serve.client import RemoteReward, RemoteRewardError

    s = _ScriptedRewardServer([(status, {})])
    try:
        with pytest.raises(RemoteRewardError, match=f"HTTP {status}: scripted {status}"):
            RemoteReward(url=s.url, max_retries=3)(random_images(1), "a")
        assert s.posts == 1
    finally:
        s.close()


def test_client_retry_after_is_honoured_and_capped_and_retries_are_bounded(monkeypatch):
    pytest.importorskip("httpx")
    from rewardkit.serve.client import RemoteReward, RemoteRewardError

    from rewardkit.serve import client

    waits: list[float] = []   # the client's retry waits, recorded (not slept): the wait asked, not the clock
    monkeypatch.setattr(client, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=waits.append))
    s = _ScriptedRewardServer([(503, {"Retry-After": "0.6"})])
    try:
        RemoteReward(url=s.url, max_retries=1)(random_images(1), "a")
        assert waits == [0.6]                           # waited as told
    finally:
        s.close()
    s = _ScriptedRewardServer([(429, {"Retry-After": "30"})])
    try:
        RemoteReward(url=s.url, max_retries=1, max_backoff=0.2)(random_images(1), "a")
        assert waits == [0.6, 0.2]                      # capped at max_backoff
    finally:
        s.close()
    s = _ScriptedRewardServer([(503, {"Retry-After": "0"})] * 5)
    try:
        with pytest.raises(RemoteRewardError, match="failed after 2 attempts"):
            RemoteReward(url=s.url, max_retries=1)(random_images(1), "a")
        assert s.posts == 2
    finally:
        s.close()


def test_server_decodes_encoded_files_with_the_bomb_guard(serve_mod):
    """An encoded file over the pixel limit is that sample's error (NaN + reason); raw pixels over it are 413."""
    import base64
    import io

    import httpx

    from rewardkit import media

    rec = MetaRecorder()
    handle = serve_mod.serve_in_thread(rec, serve_mod.ServerConfig())
    old = media.get_max_pixels()
    try:
        small, big = random_images(2, sizes=[(8, 8), (64, 64)], seed=12)

        def png(im):
            buf = io.BytesIO()
            im.save(buf, format="PNG")
            return base64.b64encode(buf.getvalue()).decode()

        media.set_max_pixels(1000)                       # 64 x 64 = 4096 pixels is over it, 8 x 8 is not
        res = httpx.post(handle.url + "/score", json={"images": [png(small), png(big)], "prompt": "a"}, timeout=30)
        body = res.json()
        assert res.status_code == 200 and body["valid"] == [True, False] and body["scores"][1] is None
        assert "pixel" in body["errors"][1].lower() or "bomb" in body["errors"][1].lower(), body["errors"][1]
        assert body["scores"][0] == pytest.approx(MetaRecorder.expected(small, "a", None), rel=1e-6)
        raw = np.asarray(big, dtype=np.uint8)
        wire = {"data": base64.b64encode(raw.tobytes()).decode(), "shape": list(raw.shape), "dtype": "uint8"}
        assert httpx.post(handle.url + "/score", json={"images": [wire], "prompt": "a"}, timeout=30).status_code == 413
    finally:
        media.set_max_pixels(old)
        stop_soon(handle)


def test_client_sends_raw_pixels_by_default_and_png_on_request(serve_mod, monkeypatch):
    """serve.md: RemoteReward sends the binary body by default (raw uint8 pixels after a JSON header), PNG with
    `encoding="png"`; `wire="json"` sends `{"data", "shape": [H, W, 3], "dtype": "uint8"}` / base64 PNG; all
    decode to the same pixels."""
    import base64
    import io

    from PIL import Image

    from rewardkit.serve.binary import parse_body
    from rewardkit.serve.client import RemoteReward

    handle = serve_mod.serve_in_thread(MetaRecorder(), serve_mod.ServerConfig())
    try:
        im = random_images(1, sizes=[(20, 12)], seed=14)[0]
        bodies = []
        for kw in ({}, {"encoding": "png"}, {"wire": "json"}, {"wire": "json", "encoding": "png"}):
            remote = RemoteReward(url=handle.url, **kw)
            orig = remote._request
            monkeypatch.setattr(remote, "_request", lambda m, p, b=None, _o=orig: (bodies.append(b), _o(m, p, b))[1])
            remote([im], "a")
        pixels = np.asarray(im, dtype=np.uint8).tobytes()
        raw, png = parse_body(bodies[0], "score")["images"][0], parse_body(bodies[1], "score")["images"][0]
        assert raw.desc == {"shape": [12, 20, 3], "dtype": "uint8"} and bytes(raw.data) == pixels
        decoded = Image.open(io.BytesIO(bytes(png.data)))
        assert decoded.format == "PNG" and decoded.convert("RGB").tobytes() == im.tobytes()
        raw, png = bodies[2]["images"][0], bodies[3]["images"][0]
        assert raw["shape"] == [12, 20, 3] and raw["dtype"] == "uint8"
        assert base64.b64decode(raw["data"]) == pixels
        decoded = Image.open(io.BytesIO(base64.b64decode(png)))
        assert decoded.format == "PNG" and decoded.convert("RGB").tobytes() == im.tobytes()
    finally:
        stop_soon(handle)
