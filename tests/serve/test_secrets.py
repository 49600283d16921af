"""Credentials never leave the reward server (docs/serve.md, "Replicas, security, deployment"): one secret is
planted in every place a server learns or meets one, and every byte it sends back, on every route, and every
log line it writes are searched for any part of them."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from rewardkit import Reward, RewardOutput  # noqa: E402
from rewardkit.serve.binary import pack_body  # noqa: E402
from rewardkit.serve.secrets import RedactingFilter, Redactor  # noqa: E402
from rewardkit.reward import RewardConfig  # noqa: E402
from rewardkit.serve.server import ServerConfig, serve_in_thread  # noqa: E402

# Every planted secret contains "PLANT": the answers and logs are searched for that marker, so a secret left
# over in part (``***-PLANT-...``) is caught too. Nothing else the test sends or configures contains it.
TOKEN = "tok-PLANT-6-abcdef"
ENV_KEY = "sk-PLANT-5-env98765"


@dataclass
class _PlantedConfig(RewardConfig):
    judge: str = "openai:https://bob:p@ss-PLANT-1@judge.example/v1"  # a raw "@" inside the password
    mirror: str = "https://ghp_PLANT2token@judge2.example/v1"  # a token as the whole user information
    endpoint: str = "https://judge3.example/v1/chat?model=m&api_key=qk-PLANT-3"  # a key in the query
    judge_kwargs: dict = field(default_factory=lambda: {"model": "m", "api_key": "sk-PLANT-4-live0123"})


class _Planted(Reward):
    """A reward configured and behaving like an API judge that quotes its URLs, keys and the environment's key
    in every field of its output, in its logs and in its errors."""

    name = "planted"
    tasks = frozenset({"t2i"})
    thread_safe = False
    Config = _PlantedConfig

    def _score(self, batch):
        c = self.config
        key, env = c.judge_kwargs["api_key"], os.environ["OPENAI_API_KEY"]
        said = f"POST {c.judge.split(':', 1)[1]} with {key}; mirror {c.mirror}; env {env}; {c.endpoint}"
        logging.getLogger("rewardkit.judges.planted").warning("calling %s", said)
        if any(p == "fail" for p in batch.prompts):
            raise RuntimeError(f"judge refused: {said}; token {TOKEN}")
        n = len(batch)
        # secrets no config holds, caught by the URL rules alone
        unknown = "https://eve:zz-PLANT-7@other.example/x and https://h.example/?access_token=at-PLANT-8&k=1"
        return RewardOutput(
            scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]),
            errors=[None] * n, rationales=[f"I asked {said}"] * n,
            details=[{"base_url": c.mirror, "request": said, "auth": f"Bearer {TOKEN}", "other": unknown,
                      "api_key": key, "n_tokens": 7} for _ in range(n)],
            info={"judge": {"base_url": c.judge.split(":", 1)[1], "api_key": key}, "endpoint": c.endpoint,
                  "note": f"env {env}"})


def test_no_planted_secret_reaches_a_client_or_a_log(monkeypatch, caplog):
    """Before: only results' errors and rationales were redacted, so info.judge.base_url and the details came
    back with the judge's password and key; the URL rule missed a raw '@' inside a password, TOKEN@host and
    ?api_key=...; and a judge's own log lines (another logger than the server's) went out as they were."""
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    caplog.set_level(logging.DEBUG)
    handle = serve_in_thread(_Planted(), ServerConfig(token=TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    sent: list[bytes] = []

    def record(r: httpx.Response) -> httpx.Response:
        sent.append(b"".join(k + b": " + v + b"\n" for k, v in r.headers.raw) + r.content)
        return r

    px = np.full((8, 8, 3), 9, np.uint8)
    raw_img = {"data": __import__("base64").b64encode(px.tobytes()).decode(), "shape": [8, 8, 3],
               "dtype": "uint8"}
    try:
        url = handle.url
        assert record(httpx.get(url + "/health", timeout=10)).status_code == 200
        assert record(httpx.get(url + "/info", timeout=10)).status_code == 401
        info = record(httpx.get(url + "/info", headers=auth, timeout=10))
        assert info.json()["config"]["judge"] == "openai:https://bob:***@judge.example/v1"
        assert info.json()["config"]["mirror"] == "https://***@judge2.example/v1"
        assert info.json()["config"]["endpoint"] == "https://judge3.example/v1/chat?model=m&api_key=***"
        r = record(httpx.post(url + "/score", json={"images": [raw_img] * 2, "prompt": "a"}, headers=auth,
                              timeout=30))
        assert r.status_code == 200 and r.json()["scores"] == [9.0, 9.0], r.text
        out = r.json()
        assert out["info"]["judge"] == {"base_url": "https://bob:***@judge.example/v1", "api_key": "***"}
        assert out["details"][0]["auth"] == "Bearer ***" and out["details"][0]["n_tokens"] == 7
        assert out["details"][0]["other"] == ("https://eve:***@other.example/x and "
                                              "https://h.example/?access_token=***&k=1")
        binary = pack_body({"prompt": "a"}, {"images": [({"shape": [8, 8, 3], "dtype": "uint8"}, px.tobytes())]})
        r = record(httpx.post(url + "/score", content=binary, timeout=30,
                              headers={**auth, "Content-Type": "application/octet-stream"}))
        assert r.status_code == 200 and r.json()["details"][0]["api_key"] == "***", r.text
        r = record(httpx.post(url + "/compare", json={"images_a": [raw_img], "images_b": [raw_img], "prompt": "a"},
                              headers=auth, timeout=30))
        assert r.status_code == 200, r.text
        r = record(httpx.post(url + "/score", json={"images": [raw_img], "prompt": "fail"}, headers=auth,
                              timeout=30))
        assert r.status_code == 500 and "judge refused: POST https://bob:***@judge.example/v1" in r.json()["error"]
        r = record(httpx.post(url + "/score", json={"images": [raw_img], TOKEN: ENV_KEY}, headers=auth,
                              timeout=30))  # a 400 that quotes the request's field names
        assert r.status_code == 400 and "***" in r.json()["error"], r.text
    finally:
        handle.stop()
    logged = caplog.text + "\n".join(rec.getMessage() + (rec.exc_text or "") for rec in caplog.records)
    assert "calling POST https://bob:***@judge.example/v1" in logged  # the judge's line is logged ...
    assert "RuntimeError: judge refused" in logged  # ... and the 500's traceback
    assert len(sent) == 8
    for blob in [*sent, logged.encode()]:
        assert b"PLANT" not in blob, blob[max(0, blob.find(b"PLANT") - 200):blob.find(b"PLANT") + 100]


def test_secrets_inside_other_secrets_are_redacted_whole():
    """Issue 39: a secret that contains another must go out whole, never as ``key=***-0123456789``, and two
    secrets that overlap must leave neither's tail. Expected strings written out by hand."""
    red = Redactor(["sk-live"], env={"OPENAI_API_KEY": "sk-live-0123456789"})
    assert red.text("key=sk-live-0123456789, short sk-live") == "key=***, short ***"
    red = Redactor(["0123456789", "key-01234"], env={})  # overlapping: "key-01234" + "0123456789"
    assert red.text("key=key-0123456789!") == "key=***!"
    red = Redactor(["abcd", "abcd-0123456789"], env={})
    assert red.text("x abcd-0123456789 y abcd z") == "x *** y *** z"


def test_url_credentials_are_redacted_by_rule():
    """The URL rules without any known secret: a raw '@' in a password, a token as the user information, a
    credential-like query parameter; user names, hosts and ordinary parameters stay."""
    red = Redactor([], env={})
    cases = {
        "https://bob:p@ss@judge.example/v1": "https://bob:***@judge.example/v1",
        "http://TOKEN123@host:8000/x?y=1": "http://***@host:8000/x?y=1",
        "GET https://h.example/v1?api_key=sk-1&model=m#f": "GET https://h.example/v1?api_key=***&model=m#f",
        "https://maps.example/api?key=AIza999&sig=abc&size=3": "https://maps.example/api?key=***&sig=***&size=3",
        "see http://127.0.0.1:8000/v1?max_new_tokens=5 and user@example.com":
            "see http://127.0.0.1:8000/v1?max_new_tokens=5 and user@example.com",
    }
    assert {k: red.text(k) for k in cases} == cases
    red.collect({"judge": "openai:https://bob:pa55@word@judge.example/v1"})  # learned: quoted alone, redacted
    assert red.text("password pa55@word refused") == "password *** refused"


def test_the_log_filter_keeps_a_formatter_s_arguments():
    """uvicorn's access-log formatter unpacks a record's arguments: redaction keeps them a tuple (before, a
    record with a secret lost its arguments and the formatter failed)."""
    red = Redactor(["sk-secret-99"], env={})
    rec = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s"', ("1.2.3.4", "GET",
                            "/score?api_key=sk-secret-99"), None)
    assert RedactingFilter(red).filter(rec)
    assert rec.args == ("1.2.3.4", "GET", "/score?api_key=***") and rec.getMessage() == '1.2.3.4 - "GET /score?api_key=***"'
    assert json.dumps(rec.args)  # still plain values


def test_colon_passwords_env_lengths_and_adjacent_secrets():
    """Bugs mutation testing found room for (each expected string written by hand): the user information split
    at its last ':' left the start of a password holding ':' (``bob:pa:***``) and learned only its tail;
    environment values shorter than 8 characters ("true" under ``USE_AUTH_TOKEN``) redacted as secrets; two
    secrets side by side counted as two runs (``******``: the count of stars tells how many secrets met)."""
    red = Redactor([], env={})
    assert red.text("https://bob:pa:ss@judge.example/v1") == "https://bob:***@judge.example/v1"
    red.collect({"judge": "openai:https://bob:pa55:word@judge.example/v1"})
    assert red.text("password pa55:word refused") == "password *** refused"
    env = {"USE_AUTH_TOKEN": "true", "HF_TOKEN": "hf_abcde", "MY_TOKEN": "abcdefg", "HOME": "/home/someone-else"}
    assert Redactor([], env=env).text("true hf_abcde abcdefg /home/someone-else") == \
        "true *** abcdefg /home/someone-else"   # 8 characters (hf_abcde) is a secret, 7 (abcdefg) is not
    red = Redactor(["abcd", "wxyz"], env={})
    assert red.text("<abcdwxyz> <abcd wxyz>") == "<***> <*** ***>"


def test_the_log_filter_flattens_what_it_cannot_redact_argument_by_argument():
    """A secret split across a record's arguments (no argument holds it whole) and records without a format
    tuple (an exception as the message, a mapping of arguments) still log only redacted text; before (as
    mutants), the split secret went out through the kept arguments, and a record without a tuple raised."""
    red = Redactor(["sk-secret-99"], env={})
    split = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s%s", ("sk-sec", "ret-99"), None)
    assert RedactingFilter(red).filter(split)
    assert split.getMessage() == "key ***" and split.args is None
    exc = logging.LogRecord("x", logging.ERROR, __file__, 1, RuntimeError("refused sk-secret-99"), None, None)
    assert RedactingFilter(red).filter(exc)
    assert exc.getMessage() == "refused ***"
    mapping = logging.LogRecord("x", logging.INFO, __file__, 1, "key %(k)s", ({"k": "sk-secret-99"},), None)
    assert RedactingFilter(red).filter(mapping)
    assert mapping.getMessage() == "key ***"
