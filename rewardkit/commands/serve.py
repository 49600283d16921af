"""``rewardkit serve``: serve a reward over HTTP (Starlette + uvicorn) with dynamic batching."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve a reward over HTTP with dynamic batching",
        description="Serve a reward over HTTP: POST /score, POST /compare, GET /health, GET /info.\n"
                    "Concurrent requests are merged into one model call (up to --max-batch images, waiting at\n"
                    "most --max-wait-ms). Binds 127.0.0.1 unless --host says otherwise.\n\n"
                    "Examples:\n"
                    "  rewardkit serve --reward pickscore --model /models/PickScore_v1 --port 8000\n"
                    "  rewardkit serve --reward pickscore --devices cuda:0,cuda:1 --max-batch 64\n\n"
                    "Clients: rewardkit.client.RemoteReward(url='http://127.0.0.1:8000') is a Reward like any\n"
                    "other. Authentication: set REWARDKIT_SERVE_TOKEN (or --token-file) on the server and\n"
                    "the client. Another --host than this machine needs a token, or an explicit --no-auth.\n"
                    "Every resource a client can claim is bounded (connections, read times, requests in\n"
                    "flight, body bytes, decoded pixels): see docs/serve.md, 'Exposing the server'.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reward", "-r", required=True, help="registry name (see `rewardkit ls`)")
    p.add_argument("--model", "-m", help="hub id or local checkpoint directory for model-backed rewards")
    p.add_argument("--config", type=Path, help="YAML file with the reward's options")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override reward options")
    p.add_argument("--dtype", help="float32, float16 or bfloat16")
    p.add_argument("--devices", default=None,
                   help="comma-separated devices, one model replica each (e.g. cuda:0,cuda:1); default: the "
                        "reward's own default")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000,
                   help="port (default 8000; 0 picks a free one, printed once the server listens)")
    p.add_argument("--token-file", type=Path,
                   help="file holding the bearer token clients must send (default: $REWARDKIT_SERVE_TOKEN)")
    p.add_argument("--no-auth", action="store_true",
                   help="serve without a token even on another --host than 127.0.0.1 (behind your own auth)")
    p.add_argument("--max-batch", type=int, default=32, help="most images per model call (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="the longest a non-full batch waits for more requests (default 5); it closes sooner "
                        "once every client the server knows of has a request in")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MB (default 64)")
    p.add_argument("--max-json-mb", type=float, default=16.0,
                   help="largest JSON body, and largest header of a binary body, in MB (default 16)")
    p.add_argument("--max-json-items", type=int, default=100_000,
                   help="most ',' '[' '{' characters in that JSON, counted before it is parsed (default 100000)")
    p.add_argument("--max-images", type=int, default=256,
                   help="most images per request, and most source images per request (default 256)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request, end to end (default 120)")
    g = p.add_argument_group("bounds per client (docs/serve.md, 'Exposing the server')")
    g.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds to send a request's headers, then 408 and close (default 10)")
    g.add_argument("--body-timeout", type=float, default=60.0,
                   help="seconds to send a request's body once its headers are in, and to read "
                        "an answer (default 60)")
    g.add_argument("--keep-alive", type=float, default=5.0, help="idle keep-alive seconds (default 5)")
    g.add_argument("--max-connections", type=int, default=512,
                   help="open connections; more get 503 (default 512; lowered to fit the fd limit)")
    g.add_argument("--max-in-flight", type=int, default=64,
                   help="/score and /compare requests being read, queued or scored; more get 503 (default 64)")
    g.add_argument("--max-request-mpixels", type=float, default=64.0,
                   help="decoded pixels per request, in Mi (2**20) pixels, from the image headers (default 64)")
    g.add_argument("--max-batch-mpixels", type=float, default=64.0,
                   help="decoded pixels per model call, in Mi pixels (default 64)")
    from ._serve_ray import add_arguments

    add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from .._imports import require
    from ..server import LOOPBACK_HOSTS, bind_socket, create_app, load_replicas, run_server

    from . import UsageError

    from ._serve_options import _token, reward_overrides, server_config

    if args.engine == "ray":
        from ._serve_ray import run as run_ray

        return run_ray(args)
    # everything that can be refused is refused before any model loads (it takes minutes on a cold cache)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    require("uvicorn", "serve")
    token = _token(args)
    cfg = server_config(args, token)
    overrides = reward_overrides(args)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else []
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
                         "(is another server using the port? --port 0 picks a free one)") from None
    try:
        if args.host not in LOOPBACK_HOSTS:
            print(f"rewardkit serve: WARNING: binding {args.host} exposes the reward to other machines"
                  + ("" if token else " WITHOUT authentication (--no-auth)"), file=sys.stderr)
        print(f"rewardkit serve: loading {args.reward} ({len(devices) or 1} replica(s))", file=sys.stderr)
        rewards = load_replicas(args.reward, str(args.config) if args.config else None, overrides, devices)
        app = create_app(rewards, cfg)
        port = sock.getsockname()[1]
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"rewardkit serve: {args.reward} on http://{shown}:{port} "
              f"(max batch {cfg.max_batch}, max wait {cfg.max_wait_ms:g} ms, auth {'on' if token else 'off'})",
              file=sys.stderr, flush=True)
        run_server(app, sock, cfg)
    finally:
        sock.close()
    return 0
