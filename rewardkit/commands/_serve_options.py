"""What both serve engines (``--engine local`` and ``--engine ray``) read from the command line: the token, the
server's limits and the reward's overrides. Its own module so ``serve.py`` and ``_serve_ray.py`` both import it
and neither imports the other."""

from __future__ import annotations

import argparse


def _token(args: argparse.Namespace) -> str | None:
    from ..server import LOOPBACK_HOSTS, token_from_env

    from . import UsageError

    if args.token_file is not None:
        if args.no_auth:
            raise UsageError("--no-auth and --token-file contradict each other")
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file: {exc}") from None
        if not token:
            raise UsageError(f"--token-file {args.token_file} is empty: an empty token would turn authentication "
                             "off (pass --no-auth for that)")
        return token
    if args.no_auth:
        return None
    try:
        token = token_from_env()
    except ValueError as exc:
        raise UsageError(f"{exc} (or pass --no-auth)") from None
    if token is None and args.host not in LOOPBACK_HOSTS:
        raise UsageError(f"--host {args.host} exposes the reward to other machines: set REWARDKIT_SERVE_TOKEN or "
                         "--token-file, or pass --no-auth if something in front of it authenticates clients")
    return token


def server_config(args: argparse.Namespace, token: str | None):
    """The limits of the command line as a ``ServerConfig`` (a bad value: a usage error)."""
    from ..server import ServerConfig

    from . import UsageError

    mi = 1024 * 1024
    try:
        return ServerConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                            max_body_bytes=int(args.max_body_mb * mi), max_images=args.max_images,
                            max_json_bytes=int(args.max_json_mb * mi), max_json_items=args.max_json_items,
                            timeout=args.timeout, token=token, header_timeout=args.header_timeout,
                            body_timeout=args.body_timeout, keep_alive=args.keep_alive,
                            max_connections=args.max_connections, max_in_flight=args.max_in_flight,
                            max_request_pixels=int(args.max_request_mpixels * mi),
                            max_batch_pixels=int(args.max_batch_mpixels * mi))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def reward_overrides(args: argparse.Namespace) -> dict:
    """``--set`` options plus ``--model`` / ``--dtype``."""
    from ..config import parse_overrides

    overrides = parse_overrides(args.overrides)
    for key in ("model", "dtype"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    return overrides
