"""``rewardkit serve --engine ray``: the reward as a Ray Serve deployment (:mod:`rewardkit.integrations.ray_serve`),
or ``--print-config``: the Serve config YAML of that deployment, for ``serve deploy`` / KubeRay."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (--engine ray; docs/serve.md, 'Ray Serve')")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: one process (default); ray: a Ray Serve deployment, many replicas behind Serve's "
                        "proxy on --host:--port")
    g.add_argument("--replicas", type=int, default=None, help="replicas (default 1; or --min/--max-replicas)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas (default 1)")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas (turns it on)")
    g.add_argument("--target-ongoing-requests", type=float, default=2.0,
                   help="autoscaling: requests per replica it aims at (default 2)")
    g.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica (default 1)")
    g.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (default 0; > 0 loads on cuda)")
    g.add_argument("--ray-address", default=None,
                   help="the Ray cluster to deploy on (default: start a local one; 'auto': the running one)")
    g.add_argument("--print-config", action="store_true",
                   help="write the Serve config YAML (for `serve deploy` / a KubeRay RayService) and exit; the "
                        "token is never written: the replicas read REWARDKIT_SERVE_TOKEN from their environment")


def run(args: argparse.Namespace) -> int:
    from .._imports import require
    from ..integrations import ray_serve

    from . import UsageError
    from ._serve_options import _token, reward_overrides, server_config

    if args.devices:
        raise UsageError("--devices is for --engine local; with --engine ray give --replicas and --num-gpus")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--engine ray needs a fixed --port in 1..65535, got {args.port}")
    token = _token(args)
    cfg = server_config(args, token)
    kw = dict(config=str(args.config) if args.config else None, overrides=reward_overrides(args),
              num_replicas=args.replicas, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
              target_ongoing_requests=args.target_ongoing_requests, num_cpus=args.num_cpus, num_gpus=args.num_gpus)
    if args.print_config:
        import dataclasses

        yaml = require("yaml", None, "--print-config")
        limits = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "token"}
        try:
            conf = ray_serve.serve_config(args.reward, host=args.host, port=args.port, server=limits,
                                          token_from_env=token is not None, **kw)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        sys.stdout.write("# rewardkit serve --engine ray --print-config: `serve deploy` this file (docs/serve.md, "
                         "'Ray Serve')\n")
        sys.stdout.write(yaml.safe_dump(conf, sort_keys=False))
        return 0
    require("ray.serve", "ray", "rewardkit serve --engine ray")
    import ray
    from ray import serve

    try:
        app = ray_serve.deployment(args.reward, server=cfg, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    n = args.replicas or (f"{args.min_replicas or 1}..{args.max_replicas}" if args.max_replicas else 1)
    print(f"rewardkit serve: deploying {args.reward} on Ray Serve ({n} replica(s))", file=sys.stderr, flush=True)
    serve.run(app, name=ray_serve.DEFAULT_NAME, route_prefix="/")
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"rewardkit serve: {args.reward} on http://{shown}:{args.port} (Ray Serve, {n} replica(s), max batch "
          f"{cfg.max_batch}, max wait {cfg.max_wait_ms:g} ms, auth {'on' if token else 'off'})",
          file=sys.stderr, flush=True)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a stop from a process manager: delete the app too
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(ray_serve.DEFAULT_NAME)
    return 0
