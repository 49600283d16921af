"""`rewardkit serve` + `RemoteReward`: same scores as in-process, dynamic batching, limits, bad requests,
disconnects and restarts. Everything runs on 127.0.0.1 with bounded loops and timeouts."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import Reward, RewardOutput, load_reward  # noqa: E402
from rewardkit.serve.client import RemoteReward, RemoteRewardError  # noqa: E402
from rewardkit.reward import RewardConfig  # noqa: E402
from rewardkit.serve.server import ServerConfig, serve_in_thread  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402

from tests.helpers.serving import stop_soon  # noqa: E402

SIZES = [(32, 32), (40, 64), (64, 40), (33, 47), (96, 24), (17, 17)]


@pytest.fixture(scope="module")
def clip(tiny_clip_dir):
    return load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine")


@pytest.fixture(scope="module")
def served(clip):
    handle = serve_in_thread(clip, ServerConfig(max_batch=64, max_wait_ms=20.0))
    yield handle
    handle.stop()


def _png(im) -> str:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


class _Recorder(Reward):
    """Score = sum of pixel means + len(prompt); records every batch size; optional delay / failure."""

    name = "recorder"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def __init__(self, delay: float = 0.0, fail_on: str | None = None, batch_relative: bool = False):
        super().__init__()
        self.delay, self.fail_on, self.batch_relative = delay, fail_on, batch_relative
        self.calls: list[int] = []

    def _score(self, batch):
        self.calls.append(len(batch))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in batch.prompts:
            raise RuntimeError("model exploded")
        import numpy as np

        vals = [float(np.asarray(im, dtype=np.float64).mean()) + len(p) for im, p in zip(batch.images, batch.prompts)]
        if self.batch_relative:
            m = sum(vals) / len(vals)
            vals = [v - m for v in vals]
        return RewardOutput(scores=torch.tensor(vals))


# ---------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_remote_scores_equal_in_process(clip, served, encoding):
    remote = RemoteReward(url=served.url, encoding=encoding)
    images = random_images(6, sizes=SIZES, seed=3)
    prompts = ["a cat", "a dog on a mat", "two birds", "a red car", "a photo", "a cat"]
    local_out, remote_out = clip(images, prompts), remote(images, prompts)
    assert torch.equal(local_out.scores, remote_out.scores)  # lossless transport: bit-identical
    assert remote_out.valid.all() and remote.name == "remote" and remote.remote_name == "clipscore"
    assert remote.tasks == clip.tasks and remote.score_range == clip.score_range

    pair_local = clip.compare(images[:3], images[3:], prompts[:3])
    pair_remote = remote.compare(images[:3], images[3:], prompts[:3])
    assert torch.equal(pair_local.prob_a, pair_remote.prob_a)


def test_bad_samples_come_back_nan_with_reasons(clip, served):
    remote = RemoteReward(url=served.url)
    good = random_images(1, seed=1)[0]
    out = remote([good, b"not an image", good], "a cat", on_error="nan")
    assert out.valid.tolist() == [True, False, True]
    assert torch.isnan(out.scores[1]) and "image" in out.errors[1]
    # batch composition changes float rounding in the model (3 vs 1 image), not the value
    torch.testing.assert_close(out.scores[0], clip([good], "a cat").scores[0], atol=1e-5, rtol=0)
    # Raw wire images that fail per sample on the server (a corrupt PNG) are NaN + reason too.
    body = {"images": [_png(good), base64.b64encode(b"\x89PNG\r\n\x1a\n garbage").decode()], "prompt": "a cat"}
    res = httpx.post(served.url + "/score", json=body, timeout=30).json()
    assert res["valid"] == [True, False] and res["scores"][1] is None and res["errors"][1]


def test_concurrent_clients_are_batched_and_each_gets_its_own_scores(clip):
    rec = _Recorder(delay=0.05)
    handle = serve_in_thread(rec, ServerConfig(max_batch=64, max_wait_ms=20.0))
    try:
        remote = RemoteReward(url=handle.url)
        images = random_images(32, sizes=SIZES, seed=5)
        prompts = [f"prompt number {i}" + "x" * i for i in range(32)]
        expected = rec(images, prompts).scores
        rec.calls.clear()
        with ThreadPoolExecutor(32) as pool:
            outs = list(pool.map(lambda i: remote([images[i]], prompts[i]), range(32)))
        got = torch.cat([o.scores for o in outs])
        assert torch.equal(got, expected)
        assert sum(rec.calls) == 32 and len(rec.calls) < 32, f"no merging happened: {rec.calls}"
        info = httpx.get(handle.url + "/info", timeout=10).json()
        assert info["stats"]["requests"] == 32 and info["stats"]["batches"] == len(rec.calls)
    finally:
        stop_soon(handle)


def test_batch_relative_rewards_are_never_merged():
    rec = _Recorder(delay=0.05, batch_relative=True)
    handle = serve_in_thread(rec, ServerConfig(max_batch=64, max_wait_ms=50.0))
    try:
        remote = RemoteReward(url=handle.url)
        images = random_images(4, seed=2)
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: remote(images[2 * i:2 * i + 2], "ab"), range(2)))
        assert sorted(rec.calls) == [2, 2]
        for o, i in zip(outs, range(2)):
            assert torch.allclose(o.scores, rec(images[2 * i:2 * i + 2], "ab").scores)
    finally:
        stop_soon(handle)


def test_a_failing_request_does_not_fail_the_requests_merged_with_it():
    """Deterministic merging (no delays): the first model call holds until the five other requests, one of them
    failing, have queued behind it; they are scored in one merged call, which fails, and then each alone."""
    release = threading.Event()

    class Held(_Recorder):
        def _score(self, batch):
            if not self.calls:
                release.wait(30)   # a hang guard only
            return super()._score(batch)

    rec = Held(fail_on="boom")
    handle = serve_in_thread(rec, ServerConfig(max_batch=64, max_wait_ms=0.0))
    try:
        remote = RemoteReward(url=handle.url, max_retries=0)
        images = random_images(6, seed=4)

        def call(i):
            try:
                return remote([images[i]], "boom" if i == 2 else f"fine {i}")
            except RemoteRewardError as exc:
                return exc

        def queued(n):
            guard = time.monotonic() + 30   # a hang guard
            while httpx.get(handle.url + "/info", timeout=10).json()["stats"]["requests"] < n \
                    and time.monotonic() < guard:
                time.sleep(0.01)

        with ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(call, 0)]
            queued(1)                      # request 0 holds the model
            futs += [pool.submit(call, i) for i in range(1, 6)]
            queued(6)                      # the other five wait behind it
            release.set()
            outs = [f.result(timeout=30) for f in futs]
        assert rec.calls[:2] == [1, 5], rec.calls   # the five were merged into one (failing) model call
        assert isinstance(outs[2], RemoteRewardError) and "500" in str(outs[2]) and "model exploded" in str(outs[2])
        for i, o in enumerate(outs):
            if i != 2:
                assert torch.equal(o.scores, rec([images[i]], f"fine {i}").scores)
    finally:
        release.set()
        stop_soon(handle)


# ---------------------------------------------------------------------------------------------- bad requests
def test_bad_requests_get_4xx_with_a_message(served):
    url = served.url
    good = _png(random_images(1)[0])

    def post(content, **kw):
        return httpx.post(url + "/score", content=content, headers={"Content-Type": "application/json"},
                          timeout=30, **kw)

    cases = {
        b"{not json": 400,
        b"[1, 2]": 400,
        json.dumps({"images": [], "prompt": "a"}).encode(): 400,
        json.dumps({"images": [good], "prompt": 3}).encode(): 400,
        json.dumps({"images": [good, good], "prompt": ["a"]}).encode(): 400,
        json.dumps({"images": ["%%%not base64"], "prompt": "a"}).encode(): 400,
        json.dumps({"images": [{"data": "AAAA", "shape": [2, 2, 3]}], "prompt": "a"}).encode(): 400,
        json.dumps({"images": [{"data": "AAAA", "shape": [-1, 2]}], "prompt": "a"}).encode(): 400,
        json.dumps({"images": [{"data": "AAAA", "shape": [100000, 100000, 3]}], "prompt": "a"}).encode(): 413,
        json.dumps({"images": [good], "prompt": "a", "evil": 1}).encode(): 400,
        json.dumps({"images": [good], "prompt": "a", "sources": [[good]]}).encode(): 400,  # t2i reward
        json.dumps({"images": [good], "prompt": "a", "metadata": "x"}).encode(): 400,
        json.dumps({"images": [good] * 300, "prompt": "a"}).encode(): 413,  # over max_images (256)
    }
    for body, status in cases.items():
        r = post(body)
        assert r.status_code == status, (body[:80], r.status_code, r.text)
        assert r.json()["error"], body[:80]
    r = httpx.post(url + "/compare", json={"images_a": [good], "images_b": [good, good], "prompt": "a"}, timeout=30)
    assert r.status_code == 400 and "images_b" in r.json()["error"]
    assert httpx.get(url + "/score", timeout=10).status_code == 405
    assert httpx.get(url + "/health", timeout=10).json() == {"status": "ok"}


def test_oversized_bodies_are_refused(clip):
    handle = serve_in_thread(clip, ServerConfig(max_body_bytes=10_000))
    try:
        big = json.dumps({"images": [_png(random_images(1, size=96)[0])] * 8, "prompt": "a"}).encode()
        r = httpx.post(handle.url + "/score", content=big, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "limit" in r.json()["error"]

        def chunks():  # chunked transfer: no Content-Length, the server counts as it reads
            for i in range(0, len(big), 4096):
                yield big[i:i + 4096]
        r = httpx.post(handle.url + "/score", content=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413
    finally:
        stop_soon(handle)


def test_bearer_token(clip):
    handle = serve_in_thread(clip, ServerConfig(token="s3cret"))
    try:
        body = {"images": [_png(random_images(1)[0])], "prompt": "a cat"}
        assert httpx.post(handle.url + "/score", json=body, timeout=30).status_code == 401
        bad = httpx.post(handle.url + "/score", json=body, headers={"Authorization": "Bearer nope"}, timeout=30)
        assert bad.status_code == 401 and "token" in bad.json()["error"]
        assert httpx.get(handle.url + "/info", timeout=10).status_code == 401
        assert httpx.get(handle.url + "/health", timeout=10).status_code == 200  # liveness stays open
        with pytest.raises(RemoteRewardError, match="401"):
            RemoteReward(url=handle.url, token="nope")
        ok = RemoteReward(url=handle.url, token="s3cret")
        assert ok(random_images(1), "a cat").valid.all()
        info = httpx.get(handle.url + "/info", headers={"Authorization": "Bearer s3cret"}, timeout=10).json()
        assert info["auth"] is True and "token" not in info["limits"] and "s3cret" not in json.dumps(info)
    finally:
        stop_soon(handle)


class _Blocked(Reward):
    """Blocks in its model call until the test releases it (a generous 60 s at most)."""

    name = "blocked"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def _score(self, batch):
        self.entered.set()
        self.release.wait(60)
        return RewardOutput(scores=torch.zeros(len(batch)))


def test_server_timeout_is_per_request():
    """The 504 comes while the model call it joined is still running: the answer does not wait for the reward.
    Deterministic (no wall-clock bound): the reward blocks until the test releases it after the answer."""
    reward = _Blocked()
    handle = serve_in_thread(reward, ServerConfig(timeout=0.3))
    try:
        r = httpx.post(handle.url + "/score", json={"images": [_png(random_images(1)[0])], "prompt": "a"}, timeout=30)
        assert r.status_code == 504 and "timeout of 0.3 s" in r.json()["error"], r.text
        assert reward.entered.is_set() and not reward.release.is_set()  # answered while the call still ran
    finally:
        reward.release.set()
        stop_soon(handle)


def test_client_disconnects_do_not_hurt_the_server(served, clip):
    host, port = served.url.rsplit("/", 1)[1].split(":")
    body = json.dumps({"images": [_png(random_images(1)[0])], "prompt": "a cat"}).encode()
    head = (f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    for payload in (head + body[:20], head + body):  # mid-body, and right after a full request
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(payload)
        s.close()
    time.sleep(0.3)
    remote = RemoteReward(url=served.url)
    torch.testing.assert_close(remote(random_images(2), "a cat").scores, clip(random_images(2), "a cat").scores,
                               atol=1e-5, rtol=0)


def test_client_retries_across_a_server_restart(clip, monkeypatch):
    import types

    import rewardkit.serve.client as client_mod

    handle = serve_in_thread(clip, ServerConfig())
    port = int(handle.url.rsplit(":", 1)[1])
    # retries 0.2 s apart for about 5 s: the restart lands inside them however loaded the machine is
    remote = RemoteReward(url=handle.url, max_retries=25, max_backoff=0.2, timeout=20)
    handle.stop()
    box: dict = {}
    retrying = threading.Event()   # set by the client's first backoff wait: an attempt failed on the closed port

    def sleep(seconds):
        retrying.set()
        time.sleep(seconds)

    monkeypatch.setattr(client_mod, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))

    def call():
        try:
            box["out"] = remote(random_images(2), "a cat")
        except Exception as exc:  # noqa: BLE001 - reported below
            box["err"] = exc

    t = threading.Thread(target=call)
    t.start()
    assert retrying.wait(30)  # the client is retrying against a closed port
    handle2 = serve_in_thread(clip, ServerConfig(), port=port)
    try:
        t.join(30)
        assert "err" not in box, box.get("err")
        torch.testing.assert_close(box["out"].scores, clip(random_images(2), "a cat").scores, atol=1e-5, rtol=0)
    finally:
        stop_soon(handle2)


def _drip_server(interval: float, body: bytes, status: str = "200 OK"):
    """A raw socket server that sends a valid header, then the body one byte every ``interval`` s."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(10)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {len(body)}\r\n\r\n".encode())
                    for i in range(len(body)):
                        if stop.wait(interval):
                            return
                        conn.sendall(body[i:i + 1])
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close():
        stop.set()
        srv.close()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", close


def test_client_timeout_bounds_the_whole_request():
    url, close = _drip_server(0.05, json.dumps({"reward": "x", "tasks": ["t2i"], "dimensions": [],
                                               "higher_is_better": True, "score_range": None,
                                               "uses_prompt": True, "batch_relative": False}).encode())
    try:
        # each read returns a byte within the per-read timeout (0.05 s gaps, 0.5 s): only a whole-request deadline
        # ends the call before the ~7 s drip is over, and only it says "within 0.5 s" (no wall-clock bound asserted)
        with pytest.raises(RemoteRewardError, match=r"within 0\.5 s"):
            RemoteReward(url=url, timeout=0.5, max_retries=0)
    finally:
        close()


def test_malformed_server_answers_raise_never_invent_scores(monkeypatch, served):
    remote = RemoteReward(url=served.url)
    bad_answers = [
        {"scores": ["1.0"], "valid": [True], "errors": [None]},
        {"scores": [True], "valid": [True], "errors": [None]},
        {"scores": [1.0, 2.0], "valid": [True], "errors": [None]},
        {"scores": [1.0], "valid": ["yes"], "errors": [None]},
        {"scores": [1.0], "valid": [True]},
        [1.0],
        {"scores": [1.0], "valid": [True], "errors": [None], "dimensions": {"d": ["x"]}},
    ]
    for ans in bad_answers:
        monkeypatch.setattr(remote, "_request", lambda *a, _ans=ans, **k: _ans)
        with pytest.raises(RemoteRewardError, match="malformed"):
            remote(random_images(1), "a cat")
    # A "valid" sample whose score is missing is not taken as valid.
    monkeypatch.setattr(remote, "_request", lambda *a, **k: {"scores": [None], "valid": [True], "errors": [None]})
    out = remote(random_images(1), "a cat")
    assert not out.valid[0] and torch.isnan(out.scores[0]) and out.errors[0]


def test_info_describes_the_reward(served):
    info = httpx.get(served.url + "/info", timeout=10).json()
    assert info["reward"] == "clipscore" and info["tasks"] == ["t2i"]
    assert info["config"]["convention"] == "cosine" and info["limits"]["max_batch"] == 64
    assert info["versions"]["rewardkit"] and info["replicas"] == ["cpu"]


def test_several_replicas_behind_one_endpoint(tiny_clip_dir, clip):
    from rewardkit.server import load_replicas

    reps = load_replicas("clipscore", None, {"model": str(tiny_clip_dir), "convention": "cosine"}, ["cpu", "cpu"])
    handle = serve_in_thread(reps, ServerConfig(max_batch=4, max_wait_ms=20.0))
    try:
        remote = RemoteReward(url=handle.url)
        images = random_images(16, sizes=SIZES, seed=9)
        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda i: remote([images[i]], "a cat"), range(16)))
        torch.testing.assert_close(torch.cat([o.scores for o in outs]), clip(images, "a cat").scores,
                                   atol=1e-5, rtol=0)
        server = handle._server.config.app.state.rewardkit
        assert all(r.batches > 0 for r in server.replicas), "one replica did no work"
    finally:
        stop_soon(handle)


def test_serve_command_help_and_host_warning(monkeypatch, capsys, tiny_clip_dir):
    import rewardkit.server as srv
    from rewardkit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0 and "127.0.0.1" in capsys.readouterr().out

    seen = {}
    monkeypatch.setattr(srv, "run_server", lambda app, sock, cfg: seen.update(sock=sock.getsockname(), cfg=cfg))
    monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
    args = ["serve", "-r", "clipscore", "-m", str(tiny_clip_dir)]
    # another host than this machine without a token is refused, unless --no-auth says so explicitly
    assert main(args + ["--host", "0.0.0.0", "--port", "0"]) == 2
    assert "REWARDKIT_SERVE_TOKEN" in capsys.readouterr().err and not seen
    assert main(args + ["--host", "0.0.0.0", "--port", "0", "--no-auth"]) == 0
    err = capsys.readouterr().err
    assert seen["sock"][0] == "0.0.0.0" and "WARNING" in err and "WITHOUT authentication" in err
    # --port 0: the port the server really listens on is printed (before: ":0")
    assert main(args + ["--port", "0"]) == 0
    err = capsys.readouterr().err
    port = seen["sock"][1]
    assert seen["sock"][0] == "127.0.0.1" and port > 0 and f"http://127.0.0.1:{port} " in err
    assert "WARNING" not in err and seen["cfg"].token is None


def test_serve_refuses_before_loading_the_model(monkeypatch, capsys, tmp_path):
    """A busy port, an empty REWARDKIT_SERVE_TOKEN (which silently turned authentication off) and an empty
    token file exit 2 before the reward loads (before: the model loaded first, then uvicorn exited 3)."""
    import rewardkit.server as srv
    from rewardkit.cli import main

    def boom(*a, **k):
        raise AssertionError("the reward was loaded before the command line was checked")

    monkeypatch.setattr(srv, "load_replicas", boom)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
        assert main(["serve", "-r", "clipscore", "--port", str(busy.getsockname()[1])]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        busy.close()
    monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "  ")
    assert main(["serve", "-r", "clipscore", "--port", "0"]) == 2
    assert "REWARDKIT_SERVE_TOKEN is set but empty" in capsys.readouterr().err
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["serve", "-r", "clipscore", "--port", "0", "--token-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["serve", "-r", "clipscore", "--port", "0", "--no-auth", "--header-timeout", "0"]) == 2
    assert "header_timeout" in capsys.readouterr().err
    with pytest.raises(ValueError, match="set but empty"):
        srv.app_from_env()
    with pytest.raises(ValueError, match="non-empty"):
        ServerConfig(token="")


def test_app_factory_for_external_asgi_servers(monkeypatch, tiny_clip_dir, clip):
    from starlette.testclient import TestClient

    from rewardkit.server import app_from_env

    cfg = tiny_clip_dir.parent / "serve-clip.yaml"
    cfg.write_text(f"model: {tiny_clip_dir}\nconvention: cosine\n")
    monkeypatch.setenv("REWARDKIT_SERVE_REWARD", "clipscore")
    monkeypatch.setenv("REWARDKIT_SERVE_CONFIG", str(cfg))
    monkeypatch.setenv("REWARDKIT_SERVE_TOKEN", "tok")
    images = random_images(2, seed=11)
    with TestClient(app_from_env()) as tc:
        body = {"images": [_png(im) for im in images], "prompt": "a cat"}
        assert tc.post("/score", json=body).status_code == 401
        res = tc.post("/score", json=body, headers={"Authorization": "Bearer tok"}).json()
    torch.testing.assert_close(torch.tensor(res["scores"]), clip(images, "a cat").scores, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------- secrets
@dataclass
class _JudgeLikeConfig(RewardConfig):
    judge: str = "openai:http://127.0.0.1:1"
    judge_kwargs: dict = field(default_factory=lambda: {"model": "m", "api_key": "sk-live-0123456789"})
    headers: dict = field(default_factory=lambda: {"Authorization": "Bearer hdr-secret-abc"})
    password: str | None = None


class _JudgeLike(Reward):
    """A reward configured like an API judge; its call fails with a message quoting its key and the env key."""

    name = "judgelike"
    tasks = frozenset({"t2i"})
    thread_safe = False
    Config = _JudgeLikeConfig

    def _score(self, batch):
        import os

        raise RuntimeError(f"401 from the judge: key sk-live-0123456789 / {os.environ.get('OPENAI_API_KEY')} refused")


def test_credentials_never_leave_the_server(monkeypatch, caplog):
    """/info, error answers and the server's logs carry no credential: the judge's api_key and auth header
    (config values under credential-like keys), an OPENAI_API_KEY from the environment, the bearer token.
    Before: /info returned judge_kwargs.api_key as is, and a 500 quoted whatever the reward's error said."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-9876543210")
    secrets = ["sk-live-0123456789", "hdr-secret-abc", "sk-env-9876543210", "tok-abcdef"]
    handle = serve_in_thread(_JudgeLike(), ServerConfig(token="tok-abcdef"))
    auth = {"Authorization": "Bearer tok-abcdef"}
    try:
        info = httpx.get(handle.url + "/info", headers=auth, timeout=10).json()
        assert info["config"]["judge_kwargs"] == {"model": "m", "api_key": "***"}  # the key redacted, not dropped
        assert info["config"]["headers"] == {"Authorization": "***"} and info["config"]["password"] is None
        assert info["config"]["judge"] == "openai:http://127.0.0.1:1"
        with caplog.at_level("ERROR", logger="rewardkit.server"):
            r = httpx.post(handle.url + "/score", json={"images": [_png(random_images(1)[0])], "prompt": "a"},
                           headers=auth, timeout=30)
        assert r.status_code == 500 and "401 from the judge: key *** / *** refused" in r.json()["error"]
        logged = "\n".join(rec.getMessage() + (rec.exc_text or "") for rec in caplog.records)
        assert "RuntimeError" in logged  # the traceback is logged ...
        for s in secrets:  # ... without a secret anywhere
            assert s not in json.dumps(info) and s not in r.text and s not in logged, s
    finally:
        stop_soon(handle)


def test_redactor_keys_and_values():
    from rewardkit.serve.secrets import Redactor

    red = Redactor(["tok-123456"], env={"HF_TOKEN": "hf_abcdefgh", "HOME": "/root", "MY_SECRET_X": "zzzz9999",
                                        "USE_AUTH_TOKEN": "true"})  # a flag, not a secret: too short to redact
    red.collect({"judge_kwargs": {"api_key": "sk-1234567"}})
    got = red({"api_key": "sk-1234567", "API-Key": "x", "access_token": "y", "client_secret": "z", "model": "m",
               "nested": [{"Authorization": "Bearer q"}], "note": "uses sk-1234567 and hf_abcdefgh, tok-123456",
               "tokenizer_path": "/models/t", "max_new_tokens": 5, "apiKey": "k", "home": "/root",
               "flag": "true", "env": "zzzz9999"})
    assert got == {"api_key": "***", "API-Key": "***", "access_token": "***", "client_secret": "***", "model": "m",
                   "nested": [{"Authorization": "***"}], "note": "uses *** and ***, ***",
                   "tokenizer_path": "/models/t", "max_new_tokens": 5, "apiKey": "***", "home": "/root",
                   "flag": "true", "env": "***"}



def test_redactor_learns_every_secret_under_a_credential_key_and_url_passwords():
    """Before: a list of keys under a credential-like key (``api_keys: [...]``) was redacted in /info but its
    values were not learned, so an error quoting one of them went out as it was; so did the token of an
    ``Authorization: Bearer <token>`` header quoted without its scheme, and the password of a judge URL with
    credentials (``https://user:password@host/v1``)."""
    from rewardkit.serve.secrets import Redactor

    red = Redactor([], env={})
    red.collect({"judge_kwargs": {"api_keys": ["sk-first-1234", "sk-second-5678"],
                                  "extra_headers": {"Authorization": "Bearer tok-in-header-99"}},
                 "judge": "openai:https://bob:pa55-word-x@judge.example/v1"})
    said = ("judge 401: key sk-second-5678 refused; header tok-in-header-99; "
            "POST https://bob:pa55-word-x@judge.example/v1/chat/completions failed")
    assert red.text(said) == ("judge 401: key *** refused; header ***; "
                              "POST https://bob:***@judge.example/v1/chat/completions failed")
    assert red({"judge": "openai:https://bob:pa55-word-x@judge.example/v1", "api_keys": ["a", "b"]}) == \
        {"judge": "openai:https://bob:***@judge.example/v1", "api_keys": "***"}
    assert red.text("see http://127.0.0.1:8000/v1 and user@example.com") == \
        "see http://127.0.0.1:8000/v1 and user@example.com"

def test_bearer_token_is_compared_whole(clip):
    """Catches the mutation that compares the token by prefix (``token.startswith(given)``), which accepts an
    empty token and any prefix of the real one. Expected answers are written out by hand, not derived from
    the server's own comparison."""
    handle = serve_in_thread(clip, ServerConfig(token="s3cret-token"))
    try:
        expected = {
            "Bearer s3cret-token": 200,
            "bearer s3cret-token": 200,   # the scheme is case-insensitive (RFC 7235)
            "Bearer   s3cret-token  ": 200,
            "Bearer s3cret": 401,         # a prefix
            "Bearer ": 401,               # empty
            "Bearer": 401,
            "Bearer s": 401,
            "Bearer s3cret-token-and-more": 401,
            "Basic s3cret-token": 401,
            "s3cret-token": 401,
        }
        host, port = handle.url.rsplit("/", 1)[1].split(":")

        def status(auth: str) -> int:  # a raw request: httpx refuses header values with trailing blanks
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
                          .encode())
                return int(s.recv(64).split(b" ")[1])

        got = {h: status(h) for h in expected}
        assert got == expected
    finally:
        stop_soon(handle)


def test_deeply_nested_json_is_a_400(served):
    """json.loads raises RecursionError on deep nesting: it was answered 500 (a server error) instead of 400."""
    body = b'{"images": ' + b"[" * 50_000 + b"]" * 50_000 + b', "prompt": "a"}'  # under max_json_items
    r = httpx.post(served.url + "/score", content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]




class _Details(Reward):
    """Per-sample details and call info holding what judge rewards put there: NaN for a failed sample, numpy
    scalars, a tensor."""

    name = "details"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def _score(self, batch):
        import numpy as np

        n = len(batch)
        return RewardOutput(scores=torch.ones(n), details=[{"p": float("nan"), "q": np.float32(0.5),
                                                            "k": np.int64(3)} for _ in range(n)],
                            info={"t": float("inf"), "v": torch.tensor([0.25, float("nan")])})


def test_non_json_values_in_details_and_info_are_answered():
    """NaN / inf / numpy scalars / tensors in ``details`` or ``info`` (EVR's compare details are NaN for a failed
    sample): before, rendering the answer raised ValueError after the handler, so the client got uvicorn's
    plain-text 500 (and uvicorn logged the traceback past the redaction filter). Now they travel as JSON:
    non-finite -> null, numpy scalars and tensors -> numbers and lists."""
    handle = serve_in_thread(_Details(), ServerConfig())
    try:
        out = RemoteReward(url=handle.url)(random_images(2, size=8), "a")
        assert out.valid.all() and out.details == [{"p": None, "q": 0.5, "k": 3}] * 2
        assert out.info == {"t": None, "v": [0.25, None]}
    finally:
        stop_soon(handle)

def test_an_integer_too_long_to_convert_is_a_400(served):
    """json.loads raises a plain ValueError (not JSONDecodeError) for an integer of more than 4300 digits
    (Python's int_max_str_digits): it was answered 500 with Python's message."""
    body = b'{"images": [], "prompt": "a", "metadata": [{"x": 1' + b"0" * 5000 + b'}]}'
    r = httpx.post(served.url + "/score", content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]

def _busy_pool_threads():
    """RemoteReward pool threads inside a request (an idle worker, waiting for the next call, does not count)."""
    import sys

    frames = sys._current_frames()
    busy = []
    for t in threading.enumerate():
        f = frames.get(t.ident) if t.name.startswith("rewardkit-remote") else None
        while f is not None and f.f_code.co_name != "_once":
            f = f.f_back
        if f is not None:
            busy.append(t)
    return busy


def test_client_threads_end_with_the_call():
    """The drip server sends one byte every 0.05 s; the call gives up after 0.5 s. Before: the pool thread kept
    reading the drip (about 20 s for this body) after the call had raised; now it stops with the call."""
    body = json.dumps({"reward": "x", "tasks": ["t2i"], "dimensions": [], "higher_is_better": True,
                       "score_range": None, "uses_prompt": True, "batch_relative": False, "pad": "x" * 300}).encode()
    url, close = _drip_server(0.05, body)

    pool_threads = _busy_pool_threads

    try:
        before = set(pool_threads())  # a thread of an earlier test may still be finishing: only new ones count
        with pytest.raises(RemoteRewardError, match=r"within 0\.5 s"):
            RemoteReward(url=url, timeout=0.5, max_retries=0)
        deadline = time.monotonic() + 5.0   # a hang guard, far inside the ~20 s drip a thread left reading takes
        while set(pool_threads()) - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(pool_threads()) - before, "a pool thread is still reading the dripping server"
    finally:
        close()


def test_client_threads_end_with_the_call_when_the_server_drips_its_headers():
    """The same, with the status line and headers dripped (one byte every 0.05 s, about 20 s of them). Before:
    the deadline was checked only between body chunks, and each header byte reset httpx's read timeout, so the
    pool thread stayed blocked in the header read long after the call had raised."""
    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 400 + b"\r\n\r\n"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)
    srv.settimeout(10)
    stop = threading.Event()

    def serve():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            try:
                conn.recv(65536)
                for i in range(len(head)):  # bounded: len(head) bytes, ends when stop is set
                    if stop.wait(0.05):
                        return
                    conn.sendall(head[i:i + 1])
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()

    pool_threads = _busy_pool_threads

    try:
        before = set(pool_threads())  # a thread of an earlier test may still be finishing: only new ones count
        with pytest.raises(RemoteRewardError, match=r"within 0\.5 s"):
            RemoteReward(url=f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=0.5, max_retries=0)
        deadline = time.monotonic() + 5.0   # a hang guard, far inside the ~20 s drip a thread left reading takes
        while set(pool_threads()) - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(pool_threads()) - before, "a pool thread is still reading the dripped headers"
    finally:
        stop.set()
        srv.close()


# ---------------------------------------------------------------------------------------------- float tensors
def test_served_reward_keeps_its_empty_prompt_rule(clip, served):
    """CLIP rewards score an empty prompt as their packages do; served, the client used to refuse it locally
    (NaN + "prompt is empty") while the same reward in-process scored it."""
    remote = RemoteReward(url=served.url)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    local, got = clip(x, ["", "a cat"]), remote(x, ["", "a cat"])
    assert got.valid.all() and torch.equal(got.scores, local.scores)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_tensors_are_served_bit_identical(clip, served, dtype):
    """A float [B, 3, H, W] tensor (what an RL host holds) scores the same served as in-process, bit for bit.
    Before: the client rounded it to uint8 first, which changes the scores (checked below, so the equality is
    not vacuous)."""
    remote = RemoteReward(url=served.url)
    assert remote.supports_tensor_input
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 40, 56, generator=g).to(dtype)
    prompts = ["a cat", "a dog on a mat", "two birds", "a red car"]
    local, got = clip(x, prompts), remote(x, prompts)
    assert got.valid.all() and torch.equal(got.scores, local.scores)
    rounded = clip([(im.float() * 255).round().to(torch.uint8).permute(1, 2, 0).numpy() for im in x], prompts)
    assert not torch.equal(rounded.scores, local.scores)  # the uint8 detour is visible at this precision
    pair_local = clip.compare(x[:2], x[2:], prompts[:2])
    pair_remote = remote.compare(x[:2], x[2:], prompts[:2])
    assert torch.equal(pair_local.prob_a, pair_remote.prob_a)
    # out-of-range floats are refused per sample on the client, before anything is sent, as in-process
    bad = x.clone()
    bad[1] = 2.0
    out = remote(bad, prompts, on_error="nan")
    assert out.valid.tolist() == [True, False, True, True] and "[0, 1]" in out.errors[1]


# ---------------------------------------------------------------------------------------------- binary body
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_binary_and_json_bodies_give_bit_identical_scores(clip, served, encoding):
    """RemoteReward sends the binary body by default; JSON stays available; both score the very same."""
    from rewardkit.serve.binary import CONTENT_TYPE

    assert "binary" in httpx.get(served.url + "/info", timeout=10).json()["wire_formats"]
    binary = RemoteReward(url=served.url, encoding=encoding)
    as_json = RemoteReward(url=served.url, encoding=encoding, wire="json")
    assert binary._binary and not as_json._binary
    sent = []
    orig = httpx.Client.stream

    def spy(self, method, path, **kw):
        sent.append((kw.get("headers") or {}).get("Content-Type"))
        return orig(self, method, path, **kw)

    images = random_images(6, sizes=SIZES, seed=3)
    prompts = ["a cat", "a dog on a mat", "two birds", "a red car", "a photo", "a cat"]
    httpx.Client.stream = spy
    try:
        b, j = binary(images, prompts), as_json(images, prompts)
        pb = binary.compare(images[:3], images[3:], prompts[:3])
        pj = as_json.compare(images[:3], images[3:], prompts[:3])
    finally:
        httpx.Client.stream = orig
    assert sent == [CONTENT_TYPE, "application/json", CONTENT_TYPE, "application/json"]
    assert torch.equal(b.scores, j.scores) and torch.equal(b.scores, clip(images, prompts).scores)
    assert torch.equal(pb.prob_a, pj.prob_a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_binary_float_tensors_are_bit_identical(clip, served, dtype):
    from rewardkit.serve.binary import pack_body

    x = torch.rand(3, 3, 32, 32).to(dtype)
    prompts = ["a", "b", "c"]
    want = clip(x, prompts).scores
    assert torch.equal(RemoteReward(url=served.url)(x, prompts).scores, want)
    # by hand: little-endian bytes of the tensor's own dtype after a JSON header
    raw = x.view(torch.int16).numpy().astype("<i2").tobytes() if dtype == torch.bfloat16 else \
        x.numpy().astype("<f4" if dtype == torch.float32 else "<f2").tobytes()
    per = len(raw) // 3
    dt = str(dtype).removeprefix("torch.")
    body = pack_body({"prompt": prompts}, {"images": [({"shape": [3, 32, 32], "dtype": dt}, raw[i * per:(i + 1) * per])
                                                       for i in range(3)]})
    r = httpx.post(served.url + "/score", content=body, headers={"Content-Type": "application/octet-stream"},
                   timeout=30)
    assert r.status_code == 200 and torch.equal(torch.tensor(r.json()["scores"]), want)


def test_malformed_binary_bodies_are_400s(served):
    import struct

    from rewardkit.serve.binary import MAGIC, pack_body

    im = random_images(1, size=8)[0]
    import numpy as np

    px = np.asarray(im).tobytes()
    good = pack_body({"prompt": "a"}, {"images": [({"shape": [8, 8, 3], "dtype": "uint8"}, px)]})
    head = json.dumps({"images": [{"shape": [8, 8, 3], "dtype": "uint8"}], "prompt": "a"}).encode()

    def framed(h: bytes, payload: bytes, n: int | None = None) -> bytes:
        return MAGIC + struct.pack("<I", len(h) if n is None else n) + h + payload

    cases = {
        b"": 400,
        b"RKB2" + good[4:]: 400,                                        # wrong magic / version
        good[:6]: 400,                                                   # shorter than the fixed part
        framed(head, px, n=10 ** 6): 400,                                # header length past the end
        framed(b"{not json", px): 400,
        framed(b"[1, 2]", b""): 400,                                     # header not an object
        framed(head, px[:-1]): 400,                                      # payload one byte short
        framed(head, px + b"x"): 400,                                    # trailing bytes
        framed(json.dumps({"images": ["AAAA"], "prompt": "a"}).encode(), px): 400,  # base64 in a binary body
        framed(json.dumps({"images": [{"shape": [8, 8, 5], "dtype": "uint8"}], "prompt": "a"}).encode(), px): 400,
        framed(json.dumps({"images": [{"shape": [8, 8, 3], "dtype": "int64"}], "prompt": "a"}).encode(), px): 400,
        framed(json.dumps({"images": [{"encoded": 0}], "prompt": "a"}).encode(), b""): 400,
        framed(json.dumps({"images": [{"encoded": 3, "shape": [1, 1]}], "prompt": "a"}).encode(), b"abc"): 400,
        framed(json.dumps({"images": [{"shape": [8, 8, 3]}], "prompt": "a", "evil": 1}).encode(), px): 400,
        framed(json.dumps({"images": [], "prompt": "a"}).encode(), b""): 400,
        # over the per-image pixel limit: refused from the header, with nothing behind it to read
        framed(json.dumps({"images": [{"shape": [100000, 100000, 3], "dtype": "uint8"}], "prompt": "a"}).encode(),
               b""): 413,
    }
    for body, status in cases.items():
        r = httpx.post(served.url + "/score", content=body, headers={"Content-Type": "application/octet-stream"},
                       timeout=30)
        assert r.status_code == status, (body[:60], r.status_code, r.text)
        assert r.json()["error"], body[:60]
    r = httpx.post(served.url + "/score", content=good, headers={"Content-Type": "application/octet-stream"},
                   timeout=30)
    assert r.status_code == 200 and r.json()["valid"] == [True]
    # a corrupt encoded file is a per-sample NaN with its reason, as in the JSON body
    bad = pack_body({"prompt": "a"}, {"images": [({"encoded": 9}, b"\x89PNG junk")]})
    res = httpx.post(served.url + "/score", content=bad, headers={"Content-Type": "application/octet-stream"},
                     timeout=30).json()
    assert res["valid"] == [False] and res["scores"] == [None] and res["errors"][0]


class _RecordingCLIP:
    """Makes a CLIPScore subclass that records every model call the server makes (images as passed, prompts)."""

    @staticmethod
    def load(tiny_clip_dir):
        from rewardkit.rewards.clipscore import CLIPScore

        class RecordingCLIPScore(CLIPScore):
            def __call__(self, images, prompt=None, **kw):
                self.calls.append(list(prompt))
                return super().__call__(images, prompt, **kw)

        rec = RecordingCLIPScore(model=str(tiny_clip_dir), convention="cosine")
        rec.calls = []
        return rec


def _mixed_requests():
    """Five /score requests, each with its own prompt: binary raw pixels, binary PNG with a corrupt file, JSON raw,
    JSON PNG with a corrupt file, binary raw. Returns [(prompt, images as the client holds them, body, type)]."""
    from rewardkit.serve.binary import CONTENT_TYPE, pack_body
    from rewardkit.serve.client import encode_image, image_bytes

    ims = random_images(6, sizes=SIZES, seed=11)
    corrupt = b"\x89PNG\r\n\x1a\n not a png"
    spec = [("req a", [ims[0], ims[1]], "binary", "raw"), ("req b", [ims[2], corrupt], "binary", "png"),
            ("req c", [ims[3]], "json", "raw"), ("req d", [corrupt, ims[4]], "json", "png"),
            ("req e", [ims[5]], "binary", "raw")]
    out = []
    for prompt, images, wire, enc in spec:
        if wire == "binary":
            parts = [({"encoded": len(x)}, x) if isinstance(x, bytes) else image_bytes(x, enc) for x in images]
            out.append((prompt, images, pack_body({"prompt": prompt}, {"images": parts}), CONTENT_TYPE))
        else:
            wired = [base64.b64encode(x).decode() if isinstance(x, bytes) else encode_image(x, enc) for x in images]
            out.append((prompt, images, json.dumps({"images": wired, "prompt": prompt}).encode(), "application/json"))
    return out


def _post_all(url: str, requests: list) -> dict[str, dict]:
    def post(req):
        prompt, _, body, ctype = req
        r = httpx.post(url + "/score", content=body, headers={"Content-Type": ctype}, timeout=60)
        assert r.status_code == 200, r.text
        return prompt, r.json()

    with ThreadPoolExecutor(len(requests)) as pool:
        return dict(pool.map(post, requests))


def _assert_same(got: dict, want) -> None:
    """A request's answer equals an in-process RewardOutput: scores bit for bit (NaN where invalid), validity, and
    each invalid sample's reason."""
    scores = torch.tensor([float("nan") if v is None else v for v in got["scores"]], dtype=want.scores.dtype)
    torch.testing.assert_close(scores, want.scores, rtol=0, atol=0, equal_nan=True)
    assert got["valid"] == want.valid.tolist()
    assert [e or None for e in got["errors"]] == [e or None for e in want.errors]


def test_merged_requests_score_as_the_in_process_call(tiny_clip_dir):
    """Requests merged into one model call -- binary raw pixels (checked on the event loop), binary and JSON with
    encoded files (checked in a thread), with corrupt files among them -- get exactly what the in-process reward
    gives for that same call, split per request: scores bit for bit, and each invalid sample NaN with its own
    reason in its own request. Unmerged (max_batch=1), each request gets exactly the in-process score of its
    images alone; merged and alone differ only by the model's float rounding across batch sizes."""
    from rewardkit.rewards.clipscore import CLIPScore

    rec = _RecordingCLIP.load(tiny_clip_dir)
    reqs = _mixed_requests()
    n_images = sum(len(images) for _, images, _, _ in reqs)
    holds = {prompt: images for prompt, images, _, _ in reqs}
    # the batch closes when all 8 images are in (max_batch); the long wait only bounds a slow machine
    handle = serve_in_thread(rec, ServerConfig(max_batch=n_images, max_wait_ms=5000.0))
    try:
        merged = _post_all(handle.url, reqs)
    finally:
        stop_soon(handle)
    assert len(rec.calls) == 1 and len(rec.calls[0]) == n_images, rec.calls  # one model call for all five
    order = list(dict.fromkeys(rec.calls[0]))  # the requests in the order the batch took them
    call_images = [im for p in order for im in holds[p]]
    want = CLIPScore.__call__(rec, call_images, rec.calls[0], on_error="nan")  # in-process, same call
    start = 0
    for p in order:
        k = len(holds[p])
        part = type(want)(scores=want.scores[start:start + k], valid=want.valid[start:start + k],
                          errors=want.errors[start:start + k])
        _assert_same(merged[p], part)
        start += k
    assert merged["req b"]["valid"] == [True, False] and merged["req d"]["valid"] == [False, True]

    rec.calls.clear()
    handle = serve_in_thread(rec, ServerConfig(max_batch=1, max_wait_ms=0.0))
    try:
        alone = _post_all(handle.url, reqs)
    finally:
        stop_soon(handle)
    assert sorted(len(c) for c in rec.calls) == sorted(len(i) for i in holds.values())  # one call per request
    for p, images in holds.items():
        want_alone = CLIPScore.__call__(rec, images, p, on_error="nan")
        _assert_same(alone[p], want_alone)
        a = torch.tensor([float("nan") if v is None else v for v in merged[p]["scores"]])
        torch.testing.assert_close(a, want_alone.scores, rtol=0, atol=1e-5, equal_nan=True)


def test_binary_bodies_checked_on_the_event_loop_are_those_with_raw_pixels_only():
    """Which binary bodies are parsed on the event loop: a short header and raw uint8 images only (the pixels
    stay views of the body). Encoded files, float images (also as sources) and long headers go to a thread."""
    import numpy as np

    from rewardkit.serve.binary import LIGHT_HEADER_BYTES, light_header, only_raw_pixels, pack_body, parse_body

    px = ({"shape": [4, 4, 3], "dtype": "uint8"}, np.zeros((4, 4, 3), np.uint8).tobytes())
    gray = ({"shape": [4, 4]}, bytes(16))  # uint8 by default
    png = ({"encoded": 3}, b"abc")
    flt = ({"shape": [3, 2, 2], "dtype": "float32"}, bytes(48))

    def light(images, sources=None, kind="score", **fields):
        body = pack_body({"prompt": "a", **fields}, images, sources)
        return light_header(body) and only_raw_pixels(parse_body(body, kind))

    assert light({"images": [px, gray]})
    assert light({"images": [px]}, sources=[[px, gray]])
    assert light({"images_a": [px], "images_b": [gray]}, kind="compare")
    assert not light({"images": [px, png]})
    assert not light({"images": [flt]})
    assert not light({"images_a": [px], "images_b": [png]}, kind="compare")
    assert not light({"images": [px]}, sources=[[px, png]])
    assert not light({"images": [px]}, metadata=[{"note": "x" * LIGHT_HEADER_BYTES}])  # a header over 64 KiB
    assert light_header(b"RKB")  # too short to hold a header: refused (400) from its first bytes


def test_binary_bodies_keep_the_request_limits(clip):
    """Body bytes, images per request and decoded pixels per request bound the binary body as the JSON one."""
    import numpy as np

    from rewardkit.serve.binary import pack_body

    handle = serve_in_thread(clip, ServerConfig(max_body_bytes=20_000, max_images=4, max_request_pixels=150))
    try:
        def post(body):
            return httpx.post(handle.url + "/score", content=body,
                              headers={"Content-Type": "application/octet-stream"}, timeout=30)

        small = ({"shape": [8, 8, 3], "dtype": "uint8"}, np.zeros((8, 8, 3), np.uint8).tobytes())  # 64 pixels
        big = ({"shape": [64, 64, 3], "dtype": "uint8"}, np.zeros((64, 64, 3), np.uint8).tobytes())  # 12 KB
        assert post(pack_body({"prompt": "a"}, {"images": [small]})).status_code == 200
        r = post(pack_body({"prompt": "a"}, {"images": [big] * 2}))  # 24 KB: over the body limit
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = post(pack_body({"prompt": "a"}, {"images": [small] * 5}))  # over max_images
        assert r.status_code == 413 and "at most 4" in r.json()["error"]
        r = post(pack_body({"prompt": "a"}, {"images": [small] * 3}))  # 192 decoded pixels > 150
        assert r.status_code == 413 and "pixels" in r.json()["error"]
        wide = ({"shape": [8, 8 * 64 * 4, 3], "dtype": "uint8"}, b"")  # 4 x 64 x 64 pixels claimed, 0 bytes sent
        r = post(pack_body({"prompt": "a"}, {"images": [wide]}))
        assert r.status_code == 400  # the payload does not hold the claimed pixels: nothing is read
    finally:
        stop_soon(handle)


# ---------------------------------------------------------------------------------------------- several replicas
def _requests_served(url: str) -> int:
    return RemoteReward(url=url).server_info()["stats"]["requests"]


def test_remote_reward_spreads_over_replicas_and_fails_over(clip, tiny_clip_dir):
    """RemoteReward(url=[a, b]): requests go round-robin over replicas of one served reward (scores equal the
    in-process ones whichever replica answers), a replica that goes away is skipped (the retry goes to the next
    one at once), and replicas serving different rewards or options are refused at start."""
    a = serve_in_thread(clip, ServerConfig(max_wait_ms=1.0))
    b = serve_in_thread(load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine"),
                        ServerConfig(max_wait_ms=1.0))
    other = serve_in_thread(load_reward("clipscore", model=str(tiny_clip_dir), convention="hessel"),
                            ServerConfig(max_wait_ms=1.0))
    try:
        x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
        prompts = ["a cat", "a dog"]
        local = clip(x, prompts)
        remote = RemoteReward(url=f"{a.url}, {b.url}", timeout=10.0, max_retries=2)
        assert remote.urls == [a.url.rstrip("/"), b.url.rstrip("/")]
        before = (_requests_served(a.url), _requests_served(b.url))
        for _ in range(4):
            assert torch.equal(remote(x, prompts).scores, local.scores)
        after = (_requests_served(a.url), _requests_served(b.url))
        assert (after[0] - before[0], after[1] - before[1]) == (2, 2)  # round-robin: 2 scoring requests each
        b.stop()
        for _ in range(3):  # every other request first meets the stopped replica, then the live one
            assert torch.equal(remote(x, prompts).scores, local.scores)
        with pytest.raises(RemoteRewardError, match="does not serve the same reward.*config"):
            RemoteReward(url=[a.url, other.url])
        with pytest.raises(ValueError, match="names no server"):
            RemoteReward(url=" , ")
        with pytest.raises(ValueError, match="twice"):
            RemoteReward(url=[a.url, a.url])
    finally:
        for h in (a, b, other):
            stop_soon(h)


def test_env_factory_errors_name_the_variable(monkeypatch):
    from rewardkit.server import app_from_env, token_from_env

    # catches the empty-token error's text changed: it names the variable and both ways out
    with pytest.raises(ValueError, match=r"^REWARDKIT_SERVE_TOKEN is set but empty: set a token, or unset it to "
                                         r"serve without authentication$"):
        token_from_env({"REWARDKIT_SERVE_TOKEN": "  "})
    assert token_from_env({}) is None and token_from_env({"REWARDKIT_SERVE_TOKEN": " t "}) == "t"
    # catches the missing-reward error's text changed (checked before any model is loaded)
    monkeypatch.delenv("REWARDKIT_SERVE_TOKEN", raising=False)
    monkeypatch.delenv("REWARDKIT_SERVE_REWARD", raising=False)
    with pytest.raises(RuntimeError, match=r"^set REWARDKIT_SERVE_REWARD to the reward's registry name$"):
        app_from_env()


def test_a_batch_fills_to_exactly_max_batch():
    import asyncio

    from rewardkit.serve.server import RewardServer

    # catches `>=` at the batch limit: five one-image requests already waiting with max_batch 4 are scored as
    # 4 + 1 model calls (a request that brings the batch to exactly max_batch joins it), not 3 + 2
    rec = _Recorder()
    server = RewardServer([rec], ServerConfig(max_batch=4, max_wait_ms=50.0))
    images = random_images(5, seed=7)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [server.parse("score", {"images": [_png(im)], "prompt": f"p{i}"}) for i, im in enumerate(images)]
        for job in jobs:   # all queued before the worker starts: the batches do not depend on timing
            job.future = loop.create_future()
            server.replicas[0].submit(job)
        await server.startup()
        try:
            return await asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 60)
        finally:
            await server.shutdown()

    results = asyncio.run(main())
    assert rec.calls == [4, 1]
    expected = rec(images, [f"p{i}" for i in range(5)]).scores.tolist()
    assert [r["scores"][0] for r in results] == expected


def test_an_ipv6_loopback_server_url_has_brackets():
    # catches the bracketing of an IPv6 host dropped: "http://::1:port" is not a URL a client can use
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this machine")
    rec = _Recorder()
    try:
        handle = serve_in_thread(rec, ServerConfig(), host="::1")
    except OSError:
        pytest.skip("cannot bind ::1 here")
    try:
        port = int(handle.url.rsplit(":", 1)[1])
        assert handle.url == f"http://[::1]:{port}"
        assert httpx.get(handle.url + "/health", timeout=10).status_code == 200
    finally:
        stop_soon(handle)


def test_the_sources_of_a_request_reach_the_reward():
    import asyncio

    import numpy as np
    from PIL import Image

    from rewardkit.serve.server import RewardServer

    class EditGap(Reward):
        """Score = (mean of the image - mean of its first source) / 255."""

        name = "edit-gap"
        tasks = frozenset({"edit"})
        thread_safe = True

        def _score(self, batch):
            return RewardOutput(scores=torch.tensor(
                [(float(np.asarray(im).mean()) - float(np.asarray(src[0]).mean())) / 255.0
                 for im, src in zip(batch.images, batch.sources)]))

    def grey(v):
        return Image.fromarray(np.full((8, 8, 3), v, dtype=np.uint8))

    # catches the parsed sources left out of the queued job: (200 - 50) / 255 needs the source
    server = RewardServer([EditGap()], ServerConfig())

    async def main():
        job = server.parse("score", {"images": [_png(grey(200))], "prompt": "make it lighter",
                                     "sources": [[_png(grey(50))]]})
        await server.startup()
        try:
            return await asyncio.wait_for(server.handle(job), 60)
        finally:
            await server.shutdown()

    assert asyncio.run(main())["scores"] == [pytest.approx(150 / 255)]


def test_the_old_public_import_paths_keep_working():
    """The server and client moved into rewardkit/serve/; ``rewardkit.server`` and ``rewardkit.client`` (and the
    registry's ``remote``) still give the very same objects, and ``rewardkit.server`` keeps loading by name
    (the serve folder itself knows no reward: ``.importlinter``'s serve-knows-the-contract)."""
    import rewardkit.client as old_client
    import rewardkit.server as old_server
    from rewardkit.registry import get_reward_class
    from rewardkit.serve import client, server

    for name in server.__all__:
        assert getattr(old_server, name) is getattr(server, name), name
    assert set(server.__all__) | {"app_from_env", "load_replicas"} == set(old_server.__all__)
    assert callable(old_server.app_from_env) and callable(old_server.load_replicas)
    for name in ("RemoteReward", "RemoteRewardConfig", "RemoteRewardError", "encode_image", "image_bytes"):
        assert getattr(old_client, name) is getattr(client, name), name
    assert get_reward_class("remote") is client.RemoteReward
