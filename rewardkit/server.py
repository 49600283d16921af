"""``rewardkit serve``'s public module: the reward server of :mod:`rewardkit.serve.server` (re-exported here,
so ``rewardkit.server.create_app`` and the rest keep working), plus loading the served reward by its registry
name: :func:`load_replicas` and the ``uvicorn --factory rewardkit.server:app_from_env`` factory.

The by-name loading lives here, above the registry, so that the :mod:`rewardkit.serve` folder knows the
``Reward`` contract and never the rewards (a contract of ``.importlinter``): it serves the ``Reward`` objects
it is given.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .reward import PairwiseOutput, Reward, RewardOutput  # noqa: F401 - re-exported, as before the move
from .serve.server import (  # noqa: F401 - re-exported: rewardkit.server is the public path
    LOOPBACK_HOSTS,
    RewardServer,
    ServerConfig,
    ServerHandle,
    bind_socket,
    create_app,
    decode_image,
    run_server,
    serve_in_thread,
    token_from_env,
    uvicorn_config,
)

__all__ = ["ServerConfig", "RewardServer", "create_app", "app_from_env", "load_replicas", "serve_in_thread",
           "ServerHandle", "decode_image", "uvicorn_config", "run_server", "bind_socket", "token_from_env",
           "LOOPBACK_HOSTS"]


def app_from_env():
    """App factory for running under an external ASGI server (``uvicorn --factory`` / gunicorn workers):
    ``REWARDKIT_SERVE_REWARD`` (registry name), ``REWARDKIT_SERVE_CONFIG`` (YAML, optional),
    ``REWARDKIT_SERVE_DEVICES`` (comma-separated, one replica each; default ``cpu``) and
    ``REWARDKIT_SERVE_TOKEN`` (optional bearer token; set but empty is an error). The outer server owns the
    connection bounds: give uvicorn ``--limit-concurrency``, ``--timeout-keep-alive``, ``--backlog``
    (docs/serve.md, "Exposing the server")."""
    token = token_from_env()  # before loading anything
    name = os.environ.get("REWARDKIT_SERVE_REWARD")
    if not name:
        raise RuntimeError("set REWARDKIT_SERVE_REWARD to the reward's registry name")
    conf = os.environ.get("REWARDKIT_SERVE_CONFIG") or None
    devices = [d.strip() for d in os.environ.get("REWARDKIT_SERVE_DEVICES", "cpu").split(",") if d.strip()]
    rewards = load_replicas(name, conf, {}, devices)
    return create_app(rewards, ServerConfig(token=token))


def load_replicas(name: str, config: Any, overrides: dict[str, Any], devices: list[str]) -> list[Reward]:
    """One reward instance per device (``["cuda:0", "cuda:1"]``); ``device`` is passed only to rewards whose
    config has that option (e.g. OCR runs on the CPU and has none)."""
    from .registry import get_reward_class, load_reward

    has_device = "device" in {f.name for f in dataclasses.fields(get_reward_class(name).Config)}
    if len(devices) > 1 and not has_device:
        raise ValueError(f"reward {name!r} has no device option: run one replica")
    out = []
    for d in devices or [None]:
        kw = dict(overrides)
        if d is not None and has_device:
            kw["device"] = d
        out.append(load_reward(name, config, **kw))
    return out
