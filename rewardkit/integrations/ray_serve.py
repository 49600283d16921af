"""A reward as a Ray Serve deployment: many replicas behind one address, the HTTP interface of ``rewardkit serve``.

``rewardkit serve --engine ray`` runs it; :func:`deployment` gives the Serve application for your own Serve
setup, :func:`app_builder` is what a Serve config YAML imports (``rewardkit serve --engine ray --print-config``
writes one, for ``serve deploy`` on a KubeRay cluster)::

    from ray import serve
    from rewardkit.integrations.ray_serve import deployment

    app = deployment("pickscore", overrides={"model": "/models/PickScore_v1"}, num_replicas=4, num_gpus=1)
    serve.run(app, route_prefix="/")            # RemoteReward(url="http://127.0.0.1:8000") works unchanged

**Same interface.** Each replica builds the very app ``rewardkit serve`` serves (:func:`rewardkit.server.create_app`,
wrapped with ``@serve.ingress``): the same routes, JSON and binary bodies, bearer auth, body / image / pixel
limits, ``/health``, ``/info`` with credentials redacted and the same error bodies. Serve's proxy is the one
address; it spreads the requests over the replicas.

**Batching** is Ray Serve's own (``@serve.batch``): a replica collects requests for at most
``batch_wait_timeout_s`` up to ``max_batch_size`` *images* (a request larger than that is scored alone, as
``rewardkit serve`` does), then scores each run of compatible requests (same route, with or without sources /
metadata, same float-image shape; never merged for ``batch_relative`` rewards; at most ``max_batch_pixels``
decoded pixels) in one reward call, split back per request. The scoring code is ``rewardkit serve``'s
(:class:`rewardkit.serve.batch._Replica`), so the scores are the same bit for bit.

**A replica that dies mid-request.** Serve's proxy answers the requests that replica held with a plain-text
HTTP 500 (Ray 2.60) and routes new requests to the live replicas while Serve starts a replacement. Scoring is
idempotent (nothing changes on the server), so sending the request again is safe: :class:`rewardkit.client.
RemoteReward` retries connection errors, 429/502/503/504 and a 500 that is not rewardkit's own JSON error
(``max_retries`` times, exponential backoff), and gets its scores from a live replica. Each answer belongs to
its own HTTP exchange, so a retried request never receives another request's scores.

**A body lost on Serve's own retry.** When a replica dies after it took a request's body from the proxy, Serve
may hand the request to another replica with the body already gone (the proxy does not keep it), and that
replica would wait for it until ``body_timeout`` (60 s) and answer 408, which no client retries. A replica
therefore answers ``503`` with ``Retry-After: 0`` when no byte of a body it expects has arrived within
``LOST_BODY_S`` seconds: the proxy holds a client's body before it routes the request, so only a lost body
takes that long. The client sends the request again, and a live replica scores it.

Ray is imported only when a function here runs (``pip install 'rewardkit-vision[ray]'``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

__all__ = ["deployment", "app_builder", "serve_config", "DEFAULT_NAME"]

DEFAULT_NAME = "rewardkit"
#: seconds a replica waits for the first message of a request body before answering 503 (see above)
LOST_BODY_S = 10.0


def _options(num_replicas: int | None, min_replicas: int | None, max_replicas: int | None,
             target_ongoing_requests: float, num_cpus: float, num_gpus: float, max_ongoing_requests: int,
             name: str) -> dict[str, Any]:
    """The Serve deployment options (the keys of a config file's ``deployments`` entry)."""
    if num_cpus < 0 or num_gpus < 0:
        raise ValueError(f"num_cpus and num_gpus must be >= 0, got {num_cpus}, {num_gpus}")
    out: dict[str, Any] = {"name": name, "max_ongoing_requests": int(max_ongoing_requests),
                           "ray_actor_options": {"num_cpus": float(num_cpus), "num_gpus": float(num_gpus)}}
    if max_replicas is not None:  # autoscaling
        lo = 1 if min_replicas is None else int(min_replicas)
        if not 0 <= lo <= max_replicas or max_replicas < 1:
            raise ValueError(f"autoscaling needs 0 <= min_replicas <= max_replicas, max_replicas >= 1; got "
                             f"{min_replicas}, {max_replicas}")
        if num_replicas is not None:
            raise ValueError("give num_replicas or max_replicas (autoscaling), not both")
        out["autoscaling_config"] = {"min_replicas": lo, "max_replicas": int(max_replicas),
                                     "target_ongoing_requests": float(target_ongoing_requests)}
    else:
        n = 1 if num_replicas is None else num_replicas
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
        out["num_replicas"] = n
    return out


def _spec(reward: str, config: Any, overrides: dict[str, Any] | None, server: Any, token_from_env: bool,
          max_batch_size: int | None, batch_wait_timeout_s: float | None, device: str | None) -> dict[str, Any]:
    """The replica's constructor arguments: plain data (a recipe, not a model), valid in a YAML file."""
    from ..server import ServerConfig

    cfg = server if isinstance(server, ServerConfig) else ServerConfig(**(server or {}))
    limits = dataclasses.asdict(cfg)
    if max_batch_size is not None:
        limits["max_batch"] = int(max_batch_size)
    if batch_wait_timeout_s is not None:
        limits["max_wait_ms"] = float(batch_wait_timeout_s) * 1000.0
    ServerConfig(**limits)  # refuses a bad value here, not on a replica
    return {"reward": reward, "config": None if config is None else str(config), "overrides": dict(overrides or {}),
            "server": limits, "token_from_env": bool(token_from_env), "device": device}


def _replica_class(max_batch: int, wait_s: float):
    """The deployment class, its ``@serve.batch`` settings fixed here (a closure: cloudpickled to the replicas)."""
    from .._imports import require

    serve = require("ray.serve", "ray", "rewardkit serve --engine ray")

    def images(jobs: list) -> int:
        # a request over max_batch counts as max_batch: it is scored alone, never refused (as rewardkit serve)
        return sum(min(j.cost, max_batch) for j in jobs)

    @serve.ingress()
    class RewardReplica:
        def __init__(self, spec: dict[str, Any]):
            from ..server import ServerConfig, create_app, load_replicas, token_from_env

            limits = dict(spec["server"])
            if spec.get("token_from_env"):
                limits["token"] = token_from_env()
                if limits["token"] is None:
                    raise RuntimeError("this deployment requires a bearer token: set REWARDKIT_SERVE_TOKEN in the "
                                       "replicas' environment (a Kubernetes secret, or runtime_env env_vars)")
            cfg = ServerConfig(**limits)
            device = spec.get("device")
            rewards = load_replicas(spec["reward"], spec.get("config"), dict(spec.get("overrides") or {}),
                                    [device] if device else [])
            self._rk_app = create_app(rewards, cfg)
            self._rk_server = self._rk_app.state.rewardkit
            # every parsed request goes through Serve's batching instead of the app's own queue (an instance
            # attribute: the app's handlers call server.handle(job, connection))
            self._rk_server.handle = self._handle

        def __serve_build_asgi_app__(self):
            return _lost_body_guard(self._rk_app, LOST_BODY_S)

        async def _handle(self, job: Any, connection: Any = None) -> dict:
            server = self._rk_server
            server.requests += 1
            job.future = asyncio.get_running_loop().create_future()  # done = gone: _run skips it
            try:
                result = await self._score_batch(job)
            finally:
                if not job.future.done():
                    job.future.cancel()
            if isinstance(result, BaseException):
                raise result
            return result

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=wait_s, batch_size_fn=images)
        async def _score_batch(self, jobs: list) -> list:
            replica = self._rk_server.replicas[0]
            loop = asyncio.get_running_loop()
            results: dict[int, Any] = {}
            for group in _groups(jobs, replica.cfg, not getattr(replica.reward, "batch_relative", False)):
                try:
                    done = await loop.run_in_executor(replica._executor, replica._run, group)
                except Exception:  # a call-level failure: each request alone, so one cannot fail its neighbours
                    done = []
                    for job in group:
                        try:
                            done += await loop.run_in_executor(replica._executor, replica._run, [job])
                        except Exception as exc:  # noqa: BLE001 - answered as the app's 500
                            results[id(job)] = exc
                if done:
                    replica.batches += 1
                    replica.merged_requests += len(done)
                for job, r in done:
                    results[id(job)] = r
            return [results.get(id(j), asyncio.CancelledError("the request was gone before it was scored"))
                    for j in jobs]

    return RewardReplica


def _expects_body(scope: dict) -> bool:
    """Whether an HTTP request announces a body (a positive Content-Length, or a chunked one)."""
    if scope.get("type") != "http":
        return False
    headers = dict(scope.get("headers") or [])
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"chunked" in headers.get(b"transfer-encoding", b"").lower()


def _lost_body_guard(app: Any, seconds: float):
    """``app`` with a deadline on the first body message of a request that has one: after ``seconds`` without
    it, 503 + ``Retry-After: 0`` (a retryable answer) instead of waiting out the body timeout for a body that
    Serve lost when it re-routed the request (module docstring)."""
    import json

    async def guarded(scope, receive, send):
        if not _expects_body(scope):
            return await app(scope, receive, send)
        first = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({first}, timeout=seconds)
        if not done:
            first.cancel()
            body = json.dumps({"error": f"no byte of the request body reached this replica in {seconds:g} s (Ray "
                                        "Serve loses a body when it re-routes a request after a replica dies); "
                                        "sending it again is safe"}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"0"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return None
        message, replayed = first.result(), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return message
            return await receive()

        return await app(scope, replay, send)

    return guarded


def _groups(jobs: list, cfg: Any, mergeable: bool) -> list[list]:
    """Runs of compatible jobs, in arrival order, each within the batch's image and pixel budgets."""
    if not mergeable:
        return [[j] for j in jobs]
    out: list[list] = []
    open_: dict[tuple, list] = {}
    for j in jobs:
        g = open_.get(j.key())
        if g is not None and (sum(x.cost for x in g) + j.cost > cfg.max_batch
                              or sum(x.pixels for x in g) + j.pixels > cfg.max_batch_pixels):
            g = None
        if g is None:
            g = []
            out.append(g)
            open_[j.key()] = g
        g.append(j)
    return out


def deployment(reward: str, config: Any = None, *, overrides: dict[str, Any] | None = None, server: Any = None,
               token_from_env: bool = False, num_replicas: int | None = None, min_replicas: int | None = None,
               max_replicas: int | None = None, target_ongoing_requests: float = 2.0, num_cpus: float = 1.0,
               num_gpus: float = 0.0, max_batch_size: int | None = None, batch_wait_timeout_s: float | None = None,
               max_ongoing_requests: int | None = None, name: str = DEFAULT_NAME):
    """A Ray Serve application (``serve.run(app, route_prefix="/")``) serving the registry reward ``reward``.

    Args:
        reward, config, overrides: as ``load_reward(reward, config, **overrides)``, on each replica.
        server: a :class:`rewardkit.server.ServerConfig` (or its fields as a dict): the limits of ``rewardkit
            serve``, enforced on each replica (``max_in_flight`` per replica). Its ``token`` goes to the replicas
            with the application; ``token_from_env=True`` instead makes each replica read
            ``REWARDKIT_SERVE_TOKEN`` from its own environment (and refuse to start without it).
        num_replicas: a fixed number of replicas (default 1); or ``min_replicas`` / ``max_replicas`` /
            ``target_ongoing_requests`` (per replica) for Serve's autoscaling.
        num_cpus, num_gpus: per replica. With ``num_gpus > 0`` the reward is loaded on ``cuda``.
        max_batch_size, batch_wait_timeout_s: ``@serve.batch``: most images per model call and the longest a
            batch waits (default: ``server``'s ``max_batch`` and ``max_wait_ms``).
        max_ongoing_requests: Serve's cap of requests sent to one replica (default: ``max_in_flight``).
    """
    spec = _spec(reward, config, overrides, server, token_from_env, max_batch_size, batch_wait_timeout_s,
                 "cuda" if num_gpus > 0 else None)
    opts = _options(num_replicas, min_replicas, max_replicas, target_ongoing_requests, num_cpus, num_gpus,
                    max_ongoing_requests or spec["server"]["max_in_flight"], name)
    return _bind(spec, opts)


def _bind(spec: dict[str, Any], opts: dict[str, Any]):
    from ray import serve

    cls = _replica_class(spec["server"]["max_batch"], spec["server"]["max_wait_ms"] / 1000.0)
    return serve.deployment(cls, **opts).bind(spec)


def app_builder(args: dict[str, Any]):
    """The Serve application of a config file (``import_path: rewardkit.integrations.ray_serve:app_builder``);
    ``args`` are :func:`deployment`'s keyword arguments plus ``reward`` (what :func:`serve_config` writes)."""
    args = dict(args)
    return deployment(args.pop("reward"), **args)


def serve_config(reward: str, *, host: str = "0.0.0.0", port: int = 8000, app_name: str = DEFAULT_NAME,
                 **kwargs: Any) -> dict[str, Any]:
    """A Serve config (``serve deploy`` / KubeRay ``RayService.spec.serveConfigV2``) for :func:`app_builder`.
    ``kwargs`` are :func:`deployment`'s. A token is never written: with ``token_from_env=True`` the replicas read
    ``REWARDKIT_SERVE_TOKEN`` from their environment."""
    server = kwargs.get("server")
    if server is not None:
        from ..server import ServerConfig

        limits = dataclasses.asdict(server) if isinstance(server, ServerConfig) else dict(server)
        if limits.pop("token", None) is not None:
            raise ValueError("a config file never holds the token: pass token_from_env=True and set "
                             "REWARDKIT_SERVE_TOKEN in the replicas' environment")
        kwargs["server"] = limits
    deployment(reward, **kwargs)  # validates every option (builds the application, starts nothing)
    args = {"reward": reward, **{k: v for k, v in kwargs.items() if v is not None}}
    return {"proxy_location": "EveryNode", "http_options": {"host": host, "port": int(port)},
            "applications": [{"name": app_name, "route_prefix": "/",
                              "import_path": "rewardkit.integrations.ray_serve:app_builder", "args": args}]}
