"""``rewardkit serve --engine ray``: real Ray Serve on a local 2-CPU cluster (no mocks), deployed by
the command line with 2 replicas; compared with ``rewardkit serve``'s app (``serve_in_thread``) and in-process
scoring. The session's cluster (tests/conftest.py: ``ray_cluster``) and one deployment for the module (Ray's
start-up is most of the time)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from rewardkit import load_reward  # noqa: E402
from rewardkit.client import RemoteReward  # noqa: E402
from rewardkit.server import ServerConfig, serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow

TOKEN = "s3cret-ray-serve-token"
# --max-batch 2: each test request (2 or more images) is its own model call, so that its scores can be compared
# bit for bit with the in-process call of the same images (merged requests differ from it by the model's float
# rounding across batch sizes, as with rewardkit serve: tests/serve/test_server.py)
LIMITS = dict(max_images=4, max_body_bytes=200_000, max_request_pixels=3 * 48 * 48, max_batch=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_clip_dir):
    """(Serve proxy URL, `rewardkit serve` URL, the in-process reward): the same reward and limits on both."""
    from ray import serve

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-exact scores need the replicas' summation order (1 thread: Ray's default)
    port = _free_port()
    env = {**os.environ, "REWARDKIT_SERVE_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    cli = subprocess.Popen(
        [sys.executable, "-m", "rewardkit.cli", "serve", "--engine", "ray", "--reward", "pickscore", "--model",
         str(tiny_clip_dir), "--replicas", "2", "--num-cpus", "0.5", "--port", str(port), "--ray-address",
         ray_cluster, "--max-images", "4", "--max-batch", "2",
         "--max-body-mb", str(200_000 / 2**20),
         "--max-request-mpixels", str(3 * 48 * 48 / 2**20)], env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert cli.poll() is None, f"rewardkit serve --engine ray exited: {cli.stderr.read()}"
        assert time.monotonic() < deadline, "the Serve deployment did not come up in 120 s"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    reward = load_reward("pickscore", model=str(tiny_clip_dir))
    local = serve_in_thread(reward, ServerConfig(token=TOKEN, **LIMITS))
    yield url, local.url, reward
    local.stop()
    cli.send_signal(signal.SIGINT)
    try:
        cli.wait(30)
    except subprocess.TimeoutExpired:
        cli.kill()
    serve.shutdown()  # the CLI deleted its app; Serve's controller and proxy go too: the cluster is the session's
    torch.set_num_threads(threads)


def _images(n: int, seed: int, size: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("wire", ["json", "binary"])
def test_cli_deployment_scores_equal_in_process_bit_for_bit(served, wire):
    url, _, reward = served
    imgs, prompts = _images(4, 1), ["a cat", "a dog", "a red car", "a tree"]
    remote = RemoteReward(url=url, token=TOKEN, wire=wire)
    assert remote._binary == (wire == "binary")
    out, ref = remote(imgs, prompts), reward(imgs, prompts)
    assert torch.equal(out.scores, ref.scores), (out.scores, ref.scores)
    # compare too, through the same proxy
    pair, pref = remote.compare(imgs[:2], imgs[2:], prompts[:2]), reward.compare(imgs[:2], imgs[2:], prompts[:2])
    assert torch.equal(torch.as_tensor(pair.prob_a), torch.as_tensor(pref.prob_a))


def _raw(img: np.ndarray) -> dict:
    return {"data": base64.b64encode(img.tobytes()).decode(), "shape": list(img.shape), "dtype": "uint8"}


def test_auth_and_limits_refuse_what_rewardkit_serve_refuses(served):
    url, local_url, _ = served
    ok = {"Authorization": f"Bearer {TOKEN}"}
    one = _raw(_images(1, 2)[0])
    cases = [
        ("POST", "/score", {}, json.dumps({"images": [one], "prompt": "x"})),                  # no token
        ("POST", "/score", {"Authorization": "Bearer wrong"}, json.dumps({"images": [one], "prompt": "x"})),
        ("POST", "/score", {"Authorization": TOKEN}, json.dumps({"images": [one], "prompt": "x"})),  # no scheme
        ("GET", "/info", {}, None),
        ("POST", "/score", ok, "{not json"),
        ("POST", "/score", ok, json.dumps({"images": [one], "prompt": "x", "extra": 1})),
        ("POST", "/score", ok, json.dumps({"images": [one] * 5, "prompt": "x"})),              # > max_images
        ("POST", "/score", ok, json.dumps({"images": [_raw(_images(1, 3, 96)[0])], "prompt": "x"})),  # pixels
        ("POST", "/score", ok, json.dumps({"images": [one], "prompt": "x", "pad": "a" * 250_000})),  # body
        ("POST", "/compare", ok, json.dumps({"images_a": [one], "images_b": [], "prompt": "x"})),
        ("POST", "/score", {**ok, "Content-Type": "application/octet-stream"}, b"RKB\x00garbage"),
        ("GET", "/health", {}, None),
    ]
    with httpx.Client(timeout=30) as c:
        for method, path, headers, body in cases:
            got = [c.request(method, base + path, headers=headers, content=body) for base in (url, local_url)]
            (a, b) = got
            assert a.status_code == b.status_code, (path, body and body[:60], a.text, b.text)
            assert a.json() == b.json(), (path, a.text, b.text)
            if path != "/health":
                assert a.status_code in (400, 401, 413), (path, a.status_code)
        info = c.get(url + "/info", headers=ok)
    assert info.status_code == 200 and TOKEN not in info.text
    body = info.json()
    assert body["auth"] is True and body["limits"]["max_images"] == 4 and body["reward"] == "pickscore"


def _replicas() -> list[str]:
    import ray._private.state as state

    return [a["Name"] for a in state.actors().values()
            if a["State"] == "ALIVE" and a["Name"].startswith("SERVE_REPLICA::rewardkit")]


def _counting(remote: RemoteReward, statuses: list) -> RemoteReward:
    """Records the HTTP status of every answer ``remote`` is given, to see its retries (the client is unchanged)."""
    once = remote._once

    def counted(*args, **kw):
        status, headers, data = once(*args, **kw)
        statuses.append(status)
        return status, headers, data

    remote._once = counted
    return remote


def test_a_replica_killed_under_8_clients_loses_nothing_and_mixes_nothing(served):
    url, _, reward = served
    names = _replicas()
    assert len(names) == 2, names
    victim = ray.get_actor(names[0], namespace="serve")
    calls = 10  # the kill comes after every client's first answer: 9 calls each still to go
    inputs = {(c, k): (_images(2, 100 + 16 * c + k), [f"client {c} call {k}", f"other {c} {k}"])
              for c in range(8) for k in range(calls)}
    results: dict[tuple, list] = {key: [] for key in inputs}
    failures, statuses, started = [], [], threading.Barrier(9, timeout=60)
    answered = [threading.Event() for _ in range(8)]  # the client's first call is done
    remotes = [_counting(RemoteReward(url=url, token=TOKEN, max_retries=5), statuses) for _ in range(8)]

    def client(c: int) -> None:
        started.wait()
        for k in range(calls):
            try:
                results[(c, k)].append(remotes[c](*inputs[(c, k)]).scores)
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                failures.append(f"client {c} call {k}: {exc}")
            answered[c].set()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    started.wait()
    # every client is in its loop (answered once, sending its next call): requests in flight on both replicas.
    # Waiting for that, not for the clock: on a loaded machine, a kill 0.5 s after the start hit no request.
    assert all(e.wait(120) for e in answered), failures
    # and the victim holds a request right now (Serve retries by itself what a dead replica had not accepted; only a
    # request inside it comes back as the 500 the client retries): asked of the replica actor, then killed at once
    deadline = time.monotonic() + 60
    while ray.get(victim.get_num_ongoing_requests.remote(), timeout=30) == 0 and time.monotonic() < deadline:
        pass
    ray.kill(victim, no_restart=True)
    for t in threads:
        t.join(120)
    assert not failures, failures
    for key, (imgs, prompts) in inputs.items():
        assert len(results[key]) == 1, key  # answered once
        assert torch.equal(results[key][0], reward(imgs, prompts).scores), key  # its own scores, exactly
    assert 500 in statuses, "the kill hit no request in flight: the retry path was not exercised"
    assert names[0] not in _replicas()
