"""When a dynamic batch stops waiting (docs/serve.md, "Dynamic batching"): ``max_wait_ms`` is the longest a
batch waits for late requests, and a batch closes sooner once every request in it came on a connection the server
has answered before and no such connection is left without a request in the server. Each test drives its own
keep-alive connections (``http.client``: one socket each) against a server with a long wait, so that "waited"
(about ``max_wait_ms``) and "closed early" (milliseconds) are far apart."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import Reward, RewardOutput  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402

WAIT = 1.0  # seconds: the batches' max_wait_ms
EARLY = 0.5  # a request answered faster than this did not wait for the batch to time out


class Recorder(Reward):
    """score = mean pixel value + len(prompt); records the size of every model call."""

    name = "batch-closing-recorder"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def __init__(self):
        super().__init__()
        self.calls: list[int] = []

    @staticmethod
    def expected(im, prompt: str) -> float:
        return float(np.asarray(im, dtype=np.float64).mean()) + len(prompt)

    def _score(self, batch):
        self.calls.append(len(batch))
        return RewardOutput(scores=torch.tensor([self.expected(im, p) for im, p in zip(batch.images, batch.prompts)]))


class Client:
    """One keep-alive connection; ``score`` posts one image and returns (seconds, score)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def score(self, im, prompt: str) -> tuple[float, float]:
        from rewardkit.serve.client import encode_image

        body = json.dumps({"images": [encode_image(im, "raw")], "prompt": prompt})
        t0 = time.perf_counter()
        self.conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = json.loads(resp.read())
        assert resp.status == 200, data
        return time.perf_counter() - t0, data["scores"][0]

    def get(self, path: str) -> int:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        resp.read()
        return resp.status

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def clients(url: str, n: int):
    """``n`` keep-alive connections to ``url``, closed at the end."""
    out = [Client(url) for _ in range(n)]
    try:
        yield out
    finally:
        for c in out:
            c.close()


@pytest.fixture()
def server():
    from rewardkit.serve.server import ServerConfig, serve_in_thread

    rec = Recorder()
    handle = serve_in_thread(rec, ServerConfig(max_batch=8, max_wait_ms=1e3 * WAIT))
    yield rec, handle.url
    handle.stop()


def together(*calls):
    """Run the zero-argument ``calls`` at once (one thread each); their results in order."""
    out: list = [None] * len(calls)

    def run(i):
        out[i] = calls[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_client_calling_in_a_loop_waits_only_on_its_first_call(server):
    rec, url = server
    ims = random_images(4, seed=11)
    times = []
    with clients(url, 1) as (c,):
        for i, im in enumerate(ims):
            dt, score = c.score(im, f"p{i}")
            assert score == pytest.approx(Recorder.expected(im, f"p{i}"), rel=1e-6)
            times.append(dt)
    # the first request came on a new connection: its batch held open for late requests, the whole wait
    assert times[0] >= 0.9 * WAIT, times
    # then the connection is known, and it is the only one: nobody known is still to come, so each later batch
    # closed early (the server's own count, not a clock: a loaded machine cannot make it pass or fail)
    assert rec.calls == [1, 1, 1, 1]
    stats = httpx.get(url + "/info", timeout=10).json()["stats"]
    assert (stats["batches"], stats["batches_closed_early"]) == (4, 3), stats


@pytest.mark.slow  # waits out max_wait_ms several times
def test_a_known_connection_without_a_request_in_holds_the_batch_open(server):
    rec, url = server
    ims = random_images(2, seed=12)
    with clients(url, 2) as (a, b):
        together(lambda: a.score(ims[0], "a"), lambda: b.score(ims[1], "b"))  # both connections become known
        rec.calls.clear()

        def late_b():
            time.sleep(0.3)  # B sends its next request while A's batch waits for it
            return b.score(ims[1], "b")
        (dt_a, s_a), (dt_b, s_b) = together(lambda: a.score(ims[0], "a"), late_b)
        assert rec.calls == [2], rec.calls
        assert dt_a >= 0.25, dt_a
        assert s_a == pytest.approx(Recorder.expected(ims[0], "a"), rel=1e-6)
        assert s_b == pytest.approx(Recorder.expected(ims[1], "b"), rel=1e-6)

        # both send at once: the batch closes as soon as both are in, long before the wait is over
        rec.calls.clear()
        (dt_a, _), (dt_b, _) = together(lambda: a.score(ims[0], "a"), lambda: b.score(ims[1], "b"))
        assert max(dt_a, dt_b) < EARLY, (dt_a, dt_b)
        assert sum(rec.calls) == 2, rec.calls

        # a closed connection is no longer waited for
        b.close()
        time.sleep(0.2)  # the server sees the close
        dt, _ = a.score(ims[0], "a")
        assert dt < EARLY, dt


def test_a_connection_that_only_checked_health_is_not_waited_for(server):
    rec, url = server
    ims = random_images(1, seed=13)
    with clients(url, 2) as (a, probe):
        a.score(ims[0], "a")                # A becomes known (this one waits: its connection was new)
        assert probe.get("/health") == 200  # an open keep-alive connection that never scored
        assert probe.get("/info") == 200
        a.score(ims[0], "a")
    stats = httpx.get(url + "/info", timeout=10).json()["stats"]
    assert (stats["batches"], stats["batches_closed_early"]) == (2, 1), stats   # the second closed early


@pytest.mark.slow  # waits out max_wait_ms several times
def test_a_new_connection_holds_a_known_clients_batch_open_for_late_requests(server):
    """A request on a new connection makes its batch wait as before, even when it joins known clients' requests."""
    rec, url = server
    ims = random_images(2, seed=14)
    with clients(url, 2) as (a, fresh):
        a.score(ims[0], "a")
        rec.calls.clear()

        def late_a():
            time.sleep(0.3)
            return a.score(ims[0], "a")
        (dt_new, _), _ = together(lambda: fresh.score(ims[1], "new"), late_a)
        assert rec.calls == [2], rec.calls  # the new connection's batch waited for A
        assert dt_new >= 0.25, dt_new


@pytest.mark.slow  # waits out max_wait_ms several times
def test_without_the_servers_protocol_a_batch_always_waits():
    """Under an ASGI server other than ``rewardkit serve``'s (stock uvicorn here) the connections are unknown:
    every batch waits its ``max_wait_ms``, as before."""
    import socket

    import uvicorn

    from rewardkit.serve.server import ServerConfig, create_app

    rec = Recorder()
    app = create_app(rec, ServerConfig(max_batch=8, max_wait_ms=1e3 * WAIT / 2))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "stock uvicorn did not start"
        time.sleep(0.01)
    try:
        with clients(f"http://127.0.0.1:{sock.getsockname()[1]}", 1) as (c,):
            times = [c.score(im, "p")[0] for im in random_images(2, seed=15)]
        assert min(times) >= 0.9 * WAIT / 2, times
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.slow  # waits out max_wait_ms once
def test_a_connection_is_waited_for_as_soon_as_its_answer_is_ready(server):
    """Two known clients out of phase: A's batch scores alone (B sent nothing within the wait) while B's request
    queues. As soon as A's result is ready, A counts as about to send again, so B's batch, formed at once, waits
    for A's next request: the two merge again instead of alternating forever (A's connection used to count only
    once its handler had resumed, after B's batch had closed without it)."""
    rec, url = server
    ims = random_images(2, seed=16)
    entered, release = threading.Event(), threading.Event()
    real = rec._score

    def gated(batch):
        if not release.is_set():
            entered.set()
            release.wait(20.0)
        return real(batch)
    results: dict[str, list] = {}

    def a_twice():
        results["a"] = [a.score(ims[0], "a"), a.score(ims[0], "a")]

    def b_late():
        assert entered.wait(20.0)          # A's batch is in the model, alone
        results["b"] = [b.score(ims[1], "b")]
    with clients(url, 2) as (a, b):
        together(lambda: a.score(ims[0], "a"), lambda: b.score(ims[1], "b"))  # both known
        rec.calls.clear()
        rec._score = gated
        threads = [threading.Thread(target=b_late), threading.Thread(target=a_twice)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while httpx.get(url + "/info", timeout=10).json()["stats"]["requests"] < 4:  # 2, then A (in the model), B
            assert time.monotonic() < deadline, "B's request never reached the server"
            time.sleep(0.01)
        release.set()
        for t in threads:
            t.join(30)
    assert [s for _, s in results["a"]] == pytest.approx([Recorder.expected(ims[0], "a")] * 2, rel=1e-6)
    assert [s for _, s in results["b"]] == pytest.approx([Recorder.expected(ims[1], "b")], rel=1e-6)
    assert rec.calls == [1, 2], rec.calls
