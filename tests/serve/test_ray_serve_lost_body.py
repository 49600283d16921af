"""The Ray Serve replica's guard against a body Serve lost when it re-routed a request after a replica died
(CI saw it: a request retried by Serve waited out the 60 s body timeout and got a 408 that no client retries).
Pure ASGI here, no Ray: the guard must answer a retryable 503 when no body message comes, and pass every other
request through untouched."""

from __future__ import annotations

import asyncio
import json

from rewardkit.serve.client import _RETRY_STATUS
from rewardkit.integrations.ray_serve import _lost_body_guard


def _scope(method: str = "POST", headers: list | None = None) -> dict:
    return {"type": "http", "method": method, "path": "/score", "headers": headers or []}


def _run(app, scope, receive):
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


async def _never():
    await asyncio.Event().wait()


def _echo_app(seen: list):
    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            m = await receive()
            body += m.get("body", b"")
            more = m.get("more_body", False)
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
    return app


def test_a_body_that_never_comes_is_a_retryable_503_not_a_wait():
    seen: list = []
    sent = _run(_lost_body_guard(_echo_app(seen), 0.05), _scope(headers=[(b"content-length", b"10")]), _never)
    assert seen == []  # the app never ran: it would have waited for the body
    start, body = sent
    assert start["status"] == 503 and start["status"] in _RETRY_STATUS
    assert dict(start["headers"])[b"retry-after"] == b"0"
    assert "re-routes" in json.loads(body["body"])["error"]


def test_a_chunked_body_is_guarded_too():
    sent = _run(_lost_body_guard(_echo_app([]), 0.05), _scope(headers=[(b"transfer-encoding", b"chunked")]), _never)
    assert sent[0]["status"] == 503


def test_a_body_in_pieces_reaches_the_app_whole_and_in_order():
    pieces = [{"type": "http.request", "body": b"ab", "more_body": True},
              {"type": "http.request", "body": b"cd", "more_body": True},
              {"type": "http.request", "body": b"e", "more_body": False}]

    async def receive():
        return pieces.pop(0)

    seen: list = []
    sent = _run(_lost_body_guard(_echo_app(seen), 5.0), _scope(headers=[(b"content-length", b"5")]), receive)
    assert seen == [b"abcde"] and sent[0]["status"] == 200


def test_requests_without_a_body_are_not_guarded():
    seen: list = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    for scope in (_scope("GET"), _scope(headers=[(b"content-length", b"0")]), {"type": "lifespan"}):
        calls = []

        async def app(scope, receive, send, calls=calls):
            calls.append(scope["type"])

        _run(_lost_body_guard(app, 0.0), scope, _never if scope["type"] == "lifespan" else receive)
        assert calls == [scope["type"]]
