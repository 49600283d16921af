"""``rewardkit serve``: serve a reward over HTTP (Starlette + uvicorn) with dynamic batching."""

from __future__ import annotations

import argparse
import os
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
                    "the client.",
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
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--token-file", type=Path,
                   help="file holding the bearer token clients must send (default: $REWARDKIT_SERVE_TOKEN)")
    p.add_argument("--max-batch", type=int, default=32, help="most images per model call (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a non-full batch waits for more requests (default 5)")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MB (default 64)")
    p.add_argument("--max-images", type=int, default=256, help="most images per request (default 256)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request, end to end (default 120)")


def run(args: argparse.Namespace) -> int:
    from .._imports import require
    from ..config import parse_overrides
    from ..server import LOOPBACK_HOSTS, ServerConfig, create_app, load_replicas

    from . import UsageError

    if not 0 <= args.port <= 65535:  # before any model loads
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    uvicorn = require("uvicorn", "serve")
    token = None
    if args.token_file is not None:
        token = args.token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise SystemExit(f"rewardkit serve: {args.token_file} is empty")
    else:
        token = os.environ.get("REWARDKIT_SERVE_TOKEN") or None
    if args.host not in LOOPBACK_HOSTS:
        print(f"rewardkit serve: WARNING: binding {args.host} exposes the reward to other machines"
              + ("" if token else " WITHOUT authentication (set REWARDKIT_SERVE_TOKEN or --token-file)"),
              file=sys.stderr)
    cfg = ServerConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                       max_body_bytes=int(args.max_body_mb * 1024 * 1024), max_images=args.max_images,
                       timeout=args.timeout, token=token)
    overrides = parse_overrides(args.overrides)
    for key in ("model", "dtype"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else []
    print(f"rewardkit serve: loading {args.reward} ({len(devices) or 1} replica(s))", file=sys.stderr)
    rewards = load_replicas(args.reward, str(args.config) if args.config else None, overrides, devices)
    app = create_app(rewards, cfg)
    print(f"rewardkit serve: {args.reward} on http://{args.host}:{args.port} "
          f"(max batch {cfg.max_batch}, max wait {cfg.max_wait_ms:g} ms, auth {'on' if token else 'off'})",
          file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
