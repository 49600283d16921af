"""OpenAI-compatible chat-completions doubles on 127.0.0.1 for the judge tests: ``FakeServer`` misbehaves on
request (no log-probs, malformed JSON, drips, huge bodies, ...); ``Server`` answers by a script of behaviours."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DRIP_SECONDS = 20.0  # a dripping response lasts at most this long (bounds the test even if the client hangs)
DRIP_INTERVAL = 0.5  # seconds between two dripped bytes, unless a test sets ``FakeServer.drip_interval``


class FakeServer:
    """OpenAI chat-completions double. ``mode`` applies to every request; ``script`` (consumed first) to the
    next ones. Modes: ok, nologprobs, labels_missing, neginf, nanlp, offscale, overunity, dupyes, malformed, 500,
    429, drip, header_drip (a byte every ``drip_interval`` s), huge, huge_nolength, retry_after_nan."""

    def __init__(self):
        self.mode = "ok"
        self.drip_interval = DRIP_INTERVAL   # drip / header_drip: seconds between two bytes
        self.poison: str | None = None  # requests holding this string (an image's data URL) get HTTP 400
        self.script: list[str] = []
        self.count = 0
        self.huge_sent = 0                   # bytes of the last huge body written before the client hung up
        self.huge_done = threading.Event()   # set when the last huge body's handler stopped writing
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj, headers=None):
                raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()  # (NaN / -Infinity literals)
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.count += 1
                    mode = server.script.pop(0) if server.script else server.mode
                try:
                    self._answer(body, mode)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout / size cap): expected

            def _answer(self, body, mode):
                if mode == "500":
                    return self._json(500, {"error": "boom"})
                if mode in ("429", "retry_after_nan"):
                    return self._json(429, {"error": "slow down"}, {"Retry-After": "1" if mode == "429" else "nan"})
                if mode == "badgzip":
                    return self._json(200, b"this is not gzip", {"Content-Encoding": "gzip"})
                if mode == "malformed":
                    return self._json(200, b'{"choices": [{"message": {"content": "Reason')
                if mode == "drip":
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    end = time.monotonic() + DRIP_SECONDS
                    while time.monotonic() < end:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(server.drip_interval)
                    return
                if mode == "header_drip":
                    end = time.monotonic() + DRIP_SECONDS
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    while time.monotonic() < end:
                        self.wfile.write(b"a")
                        self.wfile.flush()
                        time.sleep(server.drip_interval)
                    return
                if mode in ("huge", "huge_nolength"):
                    server.huge_sent = 0
                    server.huge_done.clear()
                    try:
                        self.send_response(200)
                        chunk, total = b" " * (1 << 20), 64 << 20   # 64 MiB of whitespace (valid JSON padding)
                        if mode == "huge":
                            self.send_header("Content-Length", str(total))
                        self.end_headers()
                        for _ in range(total // len(chunk)):
                            self.wfile.write(chunk)
                            server.huge_sent += len(chunk)
                    finally:
                        server.huge_done.set()
                    return
                if server.poison and server.poison in json.dumps(body):
                    return self._json(400, {"error": "this request exceeds the maximum context length"})
                text = " ".join(p.get("text", "") for m in body["messages"] if isinstance(m["content"], list)
                                for p in m["content"])
                yes = 0.1 if "NOPE" in text else 0.9
                top = [("Yes", math.log(yes)), ("No", math.log(1 - yes)), ("Maybe", math.log(1e-3))]
                if mode == "labels_missing":
                    top = [("Maybe", -0.1), ("Sure", -2.5)]
                elif mode == "neginf":
                    top = [("Yes", -math.inf), ("No", -math.inf)]
                elif mode == "nanlp":
                    top = [("Yes", math.nan), ("No", -0.2)]
                elif mode == "offscale":
                    top = [("Yes", 2.0), ("No", 1.0)]
                elif mode == "overunity":                       # P(Yes) + P(No) = 2 exp(-0.05) = 1.90
                    top = [("Yes", -0.05), ("No", -0.05)]
                elif mode == "dupyes":                          # "Yes" twice (sum 1.002): which one is it?
                    top = [("Yes", -0.1), ("No", -2.4), ("Yes", -5.0)] if yes > 0.5 else \
                        [("Yes", -5.0), ("No", -0.1), ("Yes", -2.4)]
                content = "Reason: looks right.\nScore: 7" if mode == "offscale" else "Reason: looks right.\nScore: 4"
                choices = []
                for i in range(body.get("n", 1)):
                    ch = {"index": i, "message": {"role": "assistant", "content": content}}
                    if body.get("logprobs") and mode != "nologprobs":
                        ch["logprobs"] = {"content": [{"token": top[0][0], "logprob": top[0][1],
                                                       "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]}
                    choices.append(ch)
                self._json(200, {"object": "chat.completion", "choices": choices})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


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
