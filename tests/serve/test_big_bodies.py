"""One big request body must not stall the reward server (docs/serve.md, "Exposing the server"): the JSON a
request carries (a JSON body, a binary body's header) is bounded in bytes and in values before it is parsed,
and a long JSON body is parsed off the event loop. Structural checks only (what is refused before it is read
or parsed, which thread parses): the latency and memory figures are benchmarks/serve_big_body.py's."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import Reward, RewardOutput  # noqa: E402
from rewardkit.serve import checks  # noqa: E402
from rewardkit.serve.binary import pack_body  # noqa: E402
from rewardkit.serve.server import RewardServer, ServerConfig, serve_in_thread  # noqa: E402


class _Mean(Reward):
    name = "mean"
    tasks = frozenset({"t2i"})
    thread_safe = False

    def _score(self, batch):
        return RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))


def _png_b64(side: int, seed: int = 0) -> str:
    from PIL import Image

    px = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)  # noise: no compression
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _read_answer(s: socket.socket) -> bytes:
    """The server's whole answer on ``s`` (until it closes the connection or sends the body it announced)."""
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk
        head, sep, body = got.partition(b"\r\n\r\n")
        if sep:
            length = [int(v) for k, v in (line.split(b":", 1) for line in head.split(b"\r\n")[1:])
                      if k.strip().lower() == b"content-length"]
            if length and len(body) >= length[0]:
                return got


def test_a_json_body_over_its_limit_is_refused_before_it_is_read():
    """Before: a JSON body was read whole up to max_body_bytes (64 MB) and parsed on the event loop (a 48 MB
    body held /health for 16 s). Now a JSON body announcing more than max_json_bytes is answered 413 from its
    Content-Length, with not one byte of it sent; a binary body of the same size is read (its limit is
    max_body_bytes) and scored."""
    handle = serve_in_thread(_Mean(), ServerConfig(max_json_bytes=4096, max_body_bytes=1 << 20))
    port = int(handle.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 4097\r\n\r\n")  # and no body at all
            got = _read_answer(s)
        assert got.startswith(b"HTTP/1.1 413"), got[:300]
        assert b"a JSON body of 4,097 bytes is over the limit of 4,096" in got, got[-300:]
        px = np.full((40, 40, 3), 7, np.uint8)  # 4,800 bytes of pixels: more than the JSON limit, in binary
        body = pack_body({"prompt": "a"}, {"images": [({"shape": [40, 40, 3], "dtype": "uint8"}, px.tobytes())]})
        assert len(body) > 4096
        r = httpx.post(handle.url + "/score", content=body, timeout=30,
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200 and r.json()["scores"] == [7.0], r.text
        # a chunked JSON body (no Content-Length) is cut at the limit while it is read
        r = httpx.post(handle.url + "/score", content=iter([b'{"images": ["', b"A" * 5000, b'"]}']),
                       headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "a JSON body is over the limit of 4,096" in r.json()["error"], r.text
    finally:
        handle.stop()


def test_json_values_are_counted_before_the_body_is_parsed(monkeypatch):
    """A 48 MB body of ``[{}, {}, ...]`` grew the server by 1.3 GB while ``json.loads`` built 16 M dicts. Now
    the ``,`` ``[`` ``{`` of a JSON body, and of a binary body's header, are counted on the bytes first: past
    max_json_items the answer is 413 and the parser never sees the bytes. Expected counts written out by hand:
    ``{"images": [...], "prompt": "a", "metadata": [{}, {}, ...]}`` with 1 image and 30 metadata dicts has
    1 + 1 + 2 (commas between the 3 top-level fields) + 1 + 30 + 29 = 64 of them."""
    seen: list[bytes] = []
    real = json.loads

    def spy(raw, *a, **kw):  # records what the parser is given (the server's, and the client's answers)
        seen.append(bytes(raw) if isinstance(raw, (bytes, bytearray)) else raw.encode())
        return real(raw, *a, **kw)

    monkeypatch.setattr(checks.json, "loads", spy)
    handle = serve_in_thread(_Mean(), ServerConfig(max_json_items=63))
    img = _png_b64(4)
    try:
        body = json.dumps({"images": [img], "prompt": "a", "metadata": [{}] * 30}).encode()
        assert body.count(b",") + body.count(b"[") + body.count(b"{") == 64
        r = httpx.post(handle.url + "/score", content=body, headers={"Content-Type": "application/json"},
                       timeout=30)
        assert r.status_code == 413 and "64 ',' '[' '{' characters" in r.json()["error"], r.text
        assert body not in seen
        ok = json.dumps({"images": [img], "prompt": "a", "metadata": [{}]}).encode()  # 6: well within
        r = httpx.post(handle.url + "/score", content=ok, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 200 and ok in seen, r.text  # (the spy sees what the server parses)
        # the same count for a binary body's header {"prompt":"a","metadata":[{},...],"images":[{"shape":[2,2,3],
        # "dtype":"uint8"}]}: 1 + 2 top-level commas + 1 + 40 + 39 (metadata) + 1 + 1 + 1 + 1 + 2 (images) = 89
        px = np.zeros((2, 2, 3), np.uint8).tobytes()
        binary = pack_body({"prompt": "a", "metadata": [{}] * 40},
                           {"images": [({"shape": [2, 2, 3], "dtype": "uint8"}, px)]})
        r = httpx.post(handle.url + "/score", content=binary, timeout=30,
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 413 and "the binary body's header has 89 ','" in r.json()["error"], r.text
        assert not any(b'"metadata":[{},{}' in x for x in seen)
    finally:
        handle.stop()


def test_a_binary_header_over_the_json_limit_is_refused_before_it_is_parsed(monkeypatch):
    """A binary body's header is JSON too: one over max_json_bytes is refused from its announced length (the
    body's bytes 4 to 8), before the rest of the body is read, and never parsed (before: any header up to the
    body limit was parsed, in a thread that still holds the interpreter for the whole parse)."""
    seen: list[bytes] = []
    real = json.loads
    monkeypatch.setattr(checks.json, "loads", lambda raw, *a, **kw: (seen.append(raw), real(raw, *a, **kw))[1])
    handle = serve_in_thread(_Mean(), ServerConfig(max_json_bytes=2000))
    try:
        head = json.dumps({"images": [{"shape": [2, 2, 3], "dtype": "uint8"}], "prompt": "x" * 3000}).encode()
        body = b"RKB1" + struct.pack("<I", len(head)) + head + bytes(12)
        r = httpx.post(handle.url + "/score", content=body, timeout=30,
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 413, r.text
        assert f"header has {len(head):,} bytes of JSON, over this server's limit of 2,000" in r.json()["error"]
        assert head not in seen
        # from its first 8 bytes: the rest of the body is never sent, yet the answer comes
        port = int(handle.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                      b"Content-Length: 1000000\r\n\r\nRKB1" + struct.pack("<I", 900_000))
            got = _read_answer(s)
        assert got.startswith(b"HTTP/1.1 413") and b"header has 900,000 bytes of JSON" in got, got[-300:]
    finally:
        handle.stop()


def test_long_json_bodies_are_parsed_off_the_event_loop(monkeypatch):
    """Before: every JSON body was parsed, base64-decoded and its image headers opened on the event loop, so
    /health and every other client waited for it. Now a body over 64 KiB is parsed and checked in a worker
    thread (a short one stays on the loop: less work than the hop)."""
    threads: list[str] = []
    real = RewardServer.parse

    def spy(self, kind, body):
        threads.append(threading.current_thread().name)
        return real(self, kind, body)

    monkeypatch.setattr(RewardServer, "parse", spy)
    handle = serve_in_thread(_Mean(), ServerConfig())
    loop_thread = f"rewardkit-serve-{handle.url.rsplit(':', 1)[1]}"  # serve_in_thread's uvicorn thread
    try:
        small = {"images": [_png_b64(8)], "prompt": "a"}
        big = {"images": [_png_b64(160)], "prompt": "a"}  # 160 x 160 noise: ~100 KB of base64
        assert len(json.dumps(small)) < 64 * 1024 < len(json.dumps(big))
        for body in (small, big):
            r = httpx.post(handle.url + "/score", json=body, timeout=30)
            assert r.status_code == 200 and r.json()["valid"] == [True], r.text
        assert threads[0] == loop_thread and threads[1] != loop_thread, threads
    finally:
        handle.stop()
