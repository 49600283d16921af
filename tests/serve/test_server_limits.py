"""The reward server in a hostile world: slow and idle clients, connection floods, decompression bombs, body
drips, requests in flight. Everything runs on 127.0.0.1 with loops bounded in count and time; the tests that
need a lowered file-descriptor limit or a clean RSS figure run the server in a subprocess."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import Reward, RewardOutput  # noqa: E402
from rewardkit.serve.server import ServerConfig, serve_in_thread  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402

from tests.helpers.serving import stop_soon  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class _Const(Reward):
    """Score = the mean of the decoded pixels (so every image is really decoded); optional delay."""

    name = "const"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def __init__(self, delay: float = 0.0):
        super().__init__()
        self.delay = delay

    def _score(self, batch):
        import numpy as np

        if self.delay:
            time.sleep(self.delay)
        return RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))


def _png(im) -> str:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _bomb_png(side: int) -> bytes:
    """A valid ``side`` x ``side`` RGB PNG of zeros: 3 * side**2 bytes of pixels in a few hundred KB."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + 3 * side)  # filter byte + RGB
    idat = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# ---------------------------------------------------------------------------------------------- subprocess server
_SERVER = textwrap.dedent("""
    import json, resource, sys, time
    cfg_kw = json.loads(sys.argv[1])
    nofile = cfg_kw.pop("_nofile", None)
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import numpy as np, torch
    from rewardkit import Reward, RewardOutput
    from rewardkit.serve.server import ServerConfig, serve_in_thread

    class Mean(Reward):
        name = "mean"; tasks = frozenset({"t2i"}); thread_safe = False
        def _score(self, batch):
            return RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))

    handle = serve_in_thread(Mean(), ServerConfig(**cfg_kw))
    print(handle.url, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    handle.stop(5)
""")


class _Sub:
    def __init__(self, **cfg):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.proc.kill()
            raise RuntimeError(f"the server did not start: {self.proc.stderr.read()[-2000:]}")
        self.port = int(self.url.rsplit(":", 1)[1])

    def status(self, key: str) -> int:  # VmHWM (peak RSS), VmRSS, in kB
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def close(self) -> str:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait(5)
        return self.proc.stderr.read()


def _health(url: str, timeout: float = 2.0) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def _closed_by_server(s: socket.socket) -> bool:
    """True when the server has closed ``s`` (EOF or reset), after reading whatever it wrote first."""
    s.setblocking(False)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc")
def test_slow_header_clients_cannot_exhaust_file_descriptors():
    """80 clients each dripping a request line byte by byte, against a server whose file-descriptor limit is
    64. Before: no header timeout and no connection cap, the drips held every socket, accept() failed with
    EMFILE in a loop and /health timed out. Now: connections past the cap get a 503 and are closed, the rest
    are dropped 0.5 s after connecting, the descriptors stay under the limit, /health answers throughout."""
    srv = _Sub(_nofile=64, header_timeout=0.5, max_connections=40)
    socks: list[socket.socket] = []
    try:
        assert _health(srv.url) == 200
        for _ in range(80):  # bounded: 80 connection attempts
            try:
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=0.5)
                s.sendall(b"P")
                socks.append(s)
            except OSError:
                pass
        peak_fds = srv.fds()
        health_during = _health(srv.url, timeout=3)
        deadline = time.monotonic() + 3.0
        open_ = list(socks)
        while open_ and time.monotonic() < deadline:  # bounded: 3 s of dripping one byte per client per round
            for s in list(open_):
                if _closed_by_server(s):
                    open_.remove(s)
                    continue
                try:
                    s.sendall(b"O")
                except OSError:
                    open_.remove(s)
            time.sleep(0.1)
        assert not open_, f"{len(open_)} slow clients still connected after 3 s (header timeout 0.5 s)"
        assert peak_fds < 64 and srv.fds() < 64
        assert health_during in (200, 503), health_during  # answered (503 at the cap), never a timeout
        for s in socks:
            s.close()
        assert _health(srv.url) == 200  # recovered
    finally:
        for s in socks:
            s.close()
        err = srv.close()
    assert "Too many open files" not in err, err[-2000:]


def test_connection_cap_answers_503_and_frees_the_slot():
    handle = serve_in_thread(_Const(), ServerConfig(max_connections=3, header_timeout=5.0))
    port = int(handle.url.rsplit(":", 1)[1])
    socks = []
    try:
        for _ in range(3):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        time.sleep(0.1)
        extra = socket.create_connection(("127.0.0.1", port), timeout=2)
        extra.settimeout(2)
        head = extra.recv(4096)
        extra.close()
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
        for s in socks:
            s.close()
        socks.clear()
        deadline = time.monotonic() + 3
        status = None
        while time.monotonic() < deadline and status != 200:  # bounded: the server sees the closes
            status = _health(handle.url)
            time.sleep(0.05)
        assert status == 200
    finally:
        for s in socks:
            s.close()
        stop_soon(handle)


def test_a_dripping_body_gets_408_and_the_connection_closes():
    """Headers complete, then one body byte every 0.05 s: the body timeout (0.25 s) ends it with a 408 (before:
    the whole-request timeout of 120 s held the slot). Deterministic: the 408 names the body timeout, comes
    before the 1000-byte body is complete (at most 400 bytes are ever sent), and the connection is closed."""
    handle = serve_in_thread(_Const(), ServerConfig(body_timeout=0.25))
    port = int(handle.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        got = b""
        s.settimeout(0.05)
        for _ in range(400):  # bounded: at most 400 body bytes, about 20 s on a loaded machine
            try:
                s.sendall(b" ")
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            except socket.timeout:
                continue
            except OSError:
                break
        assert got.startswith(b"HTTP/1.1 408"), got[:200]
        assert b"the request body took longer than 0.25 s" in got and _closed_by_server(s), got[-200:]
    finally:
        s.close()
        stop_soon(handle)



@pytest.mark.slow
def test_clients_that_never_read_their_answers_are_dropped():
    """The slow-read variant of slowloris, without a token: 3 clients pipeline requests whose answers are big
    (a 400 that lists 1000 unknown fields, 16 KB) and never read them, so each connection's write buffer fills
    and uvicorn waits for the client to drain it, forever. Before: they held all 3 connections of the cap
    indefinitely and every other client got 503. Now: a connection whose answers stay unread for body_timeout
    (0.5 s) is dropped, and /health answers 200 again while the 3 clients are still connected.
    Independent of machine load: each client pipelines until the server stops reading from it (its socket not
    writable for 2 s, or 4,000 requests), the wait for /health is a generous 60 s, and the server is checked to
    have closed every one of the three connections itself."""
    import select

    handle = serve_in_thread(_Const(), ServerConfig(max_connections=3, header_timeout=0.5, keep_alive=0.5,
                                                    body_timeout=0.5))
    port = int(handle.url.rsplit(":", 1)[1])
    body = json.dumps({f"unknown_field_{i:05d}": 0 for i in range(1000)}).encode()
    req = (b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
           % len(body) + body) * 20
    socks = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.setblocking(False)
            for _ in range(200):  # bounded: 200 x 20 requests, never reading an answer
                try:
                    s.send(req)
                except BlockingIOError:
                    if not select.select([], [s], [], 2.0)[1]:
                        break  # the server has stopped reading this client: its answers are stuck
                except OSError:
                    break  # already dropped
            socks.append(s)
        statuses: list = []
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and statuses[-1:] != [200]:  # bounded: 60 s (a few on a quiet machine)
            statuses.append(_health(handle.url, timeout=5.0))
            time.sleep(0.2)
        assert statuses[-1] == 200, statuses[-10:]
        closed = [False] * 3
        deadline = time.monotonic() + 60.0
        while not all(closed) and time.monotonic() < deadline:  # the server dropped each of them
            closed = [c or _closed_by_server(s) for c, s in zip(closed, socks)]
            time.sleep(0.1)
        assert all(closed), closed
    finally:
        for s in socks:
            s.close()
        stop_soon(handle)


def test_requests_in_flight_are_capped_with_503_and_retry_after():
    """Deterministic (no delays): the model call holds until the test releases it, and the third request is sent
    once the server has been handed the first two (one in the model call, one queued behind it: both in flight)."""
    release = threading.Event()

    class Held(_Const):
        def _score(self, batch):
            release.wait(60)   # a hang guard only: released once the third request has had its answer
            return super()._score(batch)

    handle = serve_in_thread(Held(), ServerConfig(max_in_flight=2, max_wait_ms=0))
    body = {"images": [_png(random_images(1, size=16)[0])], "prompt": "a"}
    try:
        results: list = [None] * 4

        def post(i):
            results[i] = httpx.post(handle.url + "/score", json=body, timeout=30)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        guard = time.monotonic() + 30   # a hang guard
        while httpx.get(handle.url + "/info", timeout=5).json()["stats"]["requests"] < 2 and time.monotonic() < guard:
            time.sleep(0.01)
        third = httpx.post(handle.url + "/score", json=body, timeout=10)
        assert third.status_code == 503 and third.headers["retry-after"] == "1" and "in flight" in third.json()["error"]
        assert httpx.get(handle.url + "/health", timeout=5).status_code == 200  # health is never capped
        release.set()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results[:2]] == [200, 200]
        assert httpx.post(handle.url + "/score", json=body, timeout=10).status_code == 200  # slots freed
    finally:
        release.set()
        stop_soon(handle)


# ---------------------------------------------------------------------------------------------- decoded pixels
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_decompression_bombs_are_refused_from_their_headers_before_decoding():
    """Three 8000 x 8000 PNGs of zeros (576 MB of RGB pixels in a ~1 MB body). Before: all three were decoded
    (the server's memory went from 0.5 to 2.2 GB). Now: their headers add up to 192,000,000 pixels, over the
    per-request budget of 67,108,864 (64 Mi), and the request is refused before one pixel is decoded."""
    bomb = base64.b64encode(_bomb_png(8000)).decode()
    body = json.dumps({"images": [bomb] * 3, "prompt": "a"}).encode()
    assert len(body) < 2_000_000
    srv = _Sub()
    try:
        assert _health(srv.url) == 200
        small = {"images": [_png(random_images(1, size=32)[0])], "prompt": "a"}
        assert httpx.post(srv.url + "/score", json=small, timeout=30).status_code == 200  # warm: the decode path ran
        before = srv.status("VmHWM")
        r = httpx.post(srv.url + "/score", content=body, headers={"Content-Type": "application/json"}, timeout=60)
        grown_mb = (srv.status("VmHWM") - before) / 1024
        assert r.status_code == 413 and "192,000,000 pixels" in r.json()["error"], r.text[:300]
        # the body, its base64 decode and three header probes; a single decoded bomb alone would be 192 MB
        assert grown_mb < 64, f"peak RSS grew by {grown_mb:.0f} MB"
        assert httpx.post(srv.url + "/score", json=small, timeout=30).status_code == 200
    finally:
        srv.close()


def test_a_timed_out_request_stops_being_decoded(monkeypatch):
    """A request of 6 images, each taking 0.15 s to decode, with a server timeout of 0.3 s: the client gets its
    504 and the replica stops decoding at the next image (before: every image was decoded and scored after
    the client was gone)."""
    import rewardkit.serve.batch as batcher

    decoded = []
    real = batcher._decode

    def slow_decode(x, *rest):  # (rest: the reward whose input policy decodes it)
        time.sleep(0.15)
        decoded.append(1)
        return real(x, *rest)

    monkeypatch.setattr(batcher, "_decode", slow_decode)
    rec = _Const()
    calls = []
    monkeypatch.setattr(rec, "_score",
                        lambda batch: calls.append(len(batch)) or RewardOutput(scores=torch.zeros(len(batch))))
    handle = serve_in_thread(rec, ServerConfig(timeout=0.3, max_wait_ms=0))
    try:
        body = {"images": [_png(im) for im in random_images(6, size=16)], "prompt": "a"}
        r = httpx.post(handle.url + "/score", json=body, timeout=10)
        assert r.status_code == 504
        time.sleep(0.6)  # the replica notices within one image's decode
        assert len(decoded) <= 3 and calls == [], (len(decoded), calls)
    finally:
        stop_soon(handle)


def test_merged_model_calls_stay_within_the_batch_pixel_budget():
    """4 concurrent requests of one 32 x 32 image each (1,024 pixels) with max_batch_pixels = 2,048: no model
    call holds more than 2 of them (before: all 4 merged into one call of 4,096 pixels). Deterministic (no delays):
    the first model call holds until the other three requests have queued behind it."""
    rec = _Const()
    sizes = []
    release = threading.Event()
    orig = rec._score

    def score(batch):
        sizes.append(len(batch))
        if len(sizes) == 1:
            release.wait(30)   # a hang guard only
        return orig(batch)

    rec._score = score
    handle = serve_in_thread(rec, ServerConfig(max_batch=64, max_wait_ms=0.0, max_batch_pixels=2048))
    try:
        body = {"images": [_png(random_images(1, size=32)[0])], "prompt": "a"}
        with __import__("concurrent.futures").futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(httpx.post, handle.url + "/score", json=body, timeout=30) for _ in range(4)]
            guard = time.monotonic() + 30   # a hang guard
            while httpx.get(handle.url + "/info", timeout=5).json()["stats"]["requests"] < 4 \
                    and time.monotonic() < guard:
                time.sleep(0.01)
            release.set()
            outs = [f.result(timeout=30) for f in futs]
        assert [o.status_code for o in outs] == [200] * 4
        # the three waiting requests (3,072 pixels) fill one call up to the budget, the last one has its own
        assert sum(sizes) == 4 and max(sizes) == 2, sizes
        # one request over the batch budget (2 x 4,096 pixels) is not refused (that is max_request_pixels'
        # job, default 64 Mi): it runs in a model call of its own
        big = {"images": [_png(random_images(1, size=64)[0])] * 2, "prompt": "a"}
        assert httpx.post(handle.url + "/score", json=big, timeout=10).status_code == 200
    finally:
        release.set()
        stop_soon(handle)


def test_oversized_headers_are_a_400():
    """An unfinished request head buffered past 16 KiB (uvicorn's h11_max_incomplete_event_size, set by the
    server) is a 400 and the connection closes: a client cannot make the server buffer an endless header."""
    handle = serve_in_thread(_Const(), ServerConfig())
    port = int(handle.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000)  # no end of head
            got = b""
            for _ in range(20):  # bounded
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        assert got.startswith(b"HTTP/1.1 400"), got[:100]
        assert httpx.get(handle.url + "/health", timeout=5).status_code == 200
    finally:
        stop_soon(handle)


def test_an_unread_body_cannot_hold_the_connection():
    """A request answered without reading its body (401: no token) whose client keeps dripping the body: the
    connection closes (before: the 401 kept the connection open for as long as the drip went on). Deterministic:
    the drip (one byte per round, of a 100,000-byte body) goes on until the server closes, for up to 300 rounds
    (about 30 s on a loaded machine; the header timeout is 0.5 s); before, it never closed."""
    handle = serve_in_thread(_Const(), ServerConfig(token="tok-123456", header_timeout=0.5))
    port = int(handle.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n")
        got, closed = b"", False
        s.settimeout(0.1)
        for _ in range(300):  # bounded: 300 rounds
            try:
                s.sendall(b" ")
                chunk = s.recv(4096)
                if not chunk:
                    closed = True
                    break
                got += chunk
            except socket.timeout:
                continue
            except OSError:
                closed = True
                break
        assert got.startswith(b"HTTP/1.1 401") and closed, got[:200]
    finally:
        s.close()
        stop_soon(handle)


class _Edit(_Const):
    name = "edit-const"
    tasks = frozenset({"edit", "multi_ref"})
    accepts_sources = True


def test_source_images_count_against_max_images():
    """--max-images bounded ``images`` but every sample could bring another max_images sources: 256 images with
    256 one-pixel PNG sources each (65,536 images in a 6 MB body) took 21 s of server time and blocked the event
    loop (/health) for 3 s while their headers were read. Now the sources of a request count against
    max_images too (in all), refused with 413 before any is opened."""
    handle = serve_in_thread(_Edit(), ServerConfig(max_images=8))
    one = _png(random_images(1, size=4)[0])
    try:
        ok = httpx.post(handle.url + "/score", json={"images": [one] * 4, "prompt": "a",
                                                     "sources": [[one, one]] * 4}, timeout=30)
        assert ok.status_code == 200 and ok.json()["valid"] == [True] * 4  # 8 sources in all: at the limit
        r = httpx.post(handle.url + "/score", json={"images": [one] * 4, "prompt": "a",
                                                    "sources": [[one, one, one]] * 4}, timeout=30)
        assert r.status_code == 413 and "12 source images" in r.json()["error"], r.text
    finally:
        stop_soon(handle)


def test_source_images_count_against_the_request_pixel_limit():
    """docs/serve.md: the decoded pixels of a request are its images' and its sources', read from the headers.
    Expected by hand: 2 images of 20 x 10 (200 pixels each) and one 30 x 30 source each (900 pixels each) are
    2 * 200 + 2 * 900 = 2,200 pixels: scored at a limit of 2,200, refused (413) at 2,199. A server counting the
    images alone (400 pixels) would score both."""
    from PIL import Image

    img = _png(Image.new("RGB", (20, 10), (1, 2, 3)))
    src = _png(Image.new("RGB", (30, 30), (4, 5, 6)))
    body = {"images": [img, img], "prompt": "a", "sources": [[src], [src]]}
    for limit, status in ((2200, 200), (2199, 413)):
        handle = serve_in_thread(_Edit(), ServerConfig(max_request_pixels=limit))
        try:
            r = httpx.post(handle.url + "/score", json=body, timeout=30)
            assert r.status_code == status, (limit, r.text)
            if status == 413:
                assert "decode to 2,200 pixels" in r.json()["error"], r.text
        finally:
            stop_soon(handle)


def _server_side_nodelay(server) -> list[int]:
    """TCP_NODELAY of every connection a running uvicorn ``server`` holds (read on the server's own sockets)."""
    return [p.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for p in list(server.server_state.connections)]


@pytest.mark.parametrize("proto", ["bind_socket", "proto 0"])
def test_connections_have_nagle_off_whatever_socket_the_server_was_given(proto):
    """asyncio turns Nagle's algorithm off only on sockets created with proto IPPROTO_TCP. A listening socket
    made as ``socket.socket(AF_INET, SOCK_STREAM)`` (proto 0; what ``rewardkit serve`` used to pass uvicorn)
    left it on, and every answer's body, written after its head, waited for the client's delayed ACK: ~40 ms
    per keep-alive request (48 ms per call for one client, 300 req/s ceiling for 16). Checked on the server's
    accepted sockets, for its own ``bind_socket`` and for a proto-0 socket handed to the protocol."""
    import uvicorn

    from rewardkit.serve.server import bind_socket, create_app, uvicorn_config

    if proto == "bind_socket":
        sock = bind_socket("127.0.0.1", 0)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    assert (sock.proto == socket.IPPROTO_TCP) == (proto == "bind_socket")
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(create_app(_Const())))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b'"ok"' not in got:
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
            flags = _server_side_nodelay(server)
            assert len(flags) == 1 and flags[0] != 0, flags
    finally:
        server.should_exit = True
        thread.join(10)
