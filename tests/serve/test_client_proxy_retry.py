"""``RemoteReward`` retries a 500 that a proxy in front of the server gave (Ray Serve's plain-text answer when a
replica died), never rewardkit's own JSON 500 (a failing model: retrying would fail again)."""

from __future__ import annotations

import http.server
import json
import threading

import numpy as np
import pytest

from rewardkit.serve.client import RemoteReward, RemoteRewardError, _proxy_failure


def test_which_500_is_a_proxys():
    assert _proxy_failure(500, b"Internal Server Error")  # Ray Serve 2.60's proxy, replica died
    assert _proxy_failure(500, b"<html>500</html>")
    assert _proxy_failure(500, b'{"detail": "x"}')  # JSON, but not rewardkit's error body
    assert not _proxy_failure(500, b'{"error": "RuntimeError: the model failed"}')  # rewardkit's own
    assert not _proxy_failure(400, b"Bad Request")
    assert not _proxy_failure(200, b"{}")


INFO = {"reward": "r", "tasks": ["t2i"], "dimensions": [], "higher_is_better": True, "score_range": None,
        "uses_prompt": True, "batch_relative": False, "wire_formats": ["json"]}


def _server(answers: list[tuple[int, str, bytes]]):
    """A stdlib HTTP server: /info answers INFO, each POST the next of ``answers``; records the POSTs."""
    posts = []

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, ctype, body):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200, "application/json", json.dumps(INFO).encode())

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self._send(*answers[min(len(posts) - 1, len(answers) - 1)])

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, posts


def test_a_proxys_500_is_retried_and_a_rewardkit_500_is_not():
    ok = (200, "application/json", json.dumps({"scores": [0.5], "valid": [True], "errors": [None]}).encode())
    srv, posts = _server([(500, "text/plain", b"Internal Server Error"), ok])
    try:
        r = RemoteReward(url=f"http://127.0.0.1:{srv.server_address[1]}", wire="json", max_backoff=0.01)
        assert r([np.zeros((8, 8, 3), "uint8")], "a").scores.tolist() == [0.5]
        assert posts == ["/score", "/score"]  # retried once, then answered
    finally:
        srv.shutdown()
    srv, posts = _server([(500, "application/json", b'{"error": "RuntimeError: the model failed"}'), ok])
    try:
        r = RemoteReward(url=f"http://127.0.0.1:{srv.server_address[1]}", wire="json", max_backoff=0.01)
        with pytest.raises(RemoteRewardError, match="the model failed"):
            r([np.zeros((8, 8, 3), "uint8")], "a", on_error="raise")
        assert posts == ["/score"]  # not retried
    finally:
        srv.shutdown()
