"""Ray Serve vs ``rewardkit serve``: requests/s of the same reward, the same clients, in one run.

``--clients`` threads of this process, each a ``RemoteReward`` (binary wire), send ``--requests`` single-image
/score calls each to: ``rewardkit serve`` (a separate process, one replica), and ``rewardkit serve --engine ray``'s
deployment (:func:`rewardkit.integrations.ray_serve.deployment`) on a local Ray cluster with 1, then 2 replicas
behind Serve's proxy. Prints requests/s of each and the ratios to ``rewardkit serve``, and the load average.

On one machine the replicas, Serve's proxy, its controller and the load generator share the cores: with 2 cores
the figures show Ray Serve's overhead (one more hop per request, the proxy's own work), not what a cluster adds
(replicas on other machines behind one address, autoscaling, replacement of a failed replica).

    python benchmarks/serve_ray.py [--clients 8] [--requests 40] [--model DIR --device cuda] [--num-gpus 1]
                                   [--ray-address HOST:PORT]

``--ray-address``: a running Ray cluster to deploy on (default: a local one, started and stopped here); Serve must
not run there yet (the script starts it on a port of its own and shuts it down at the end).

``--dry-run``: a few requests each, 2 replicas only, to check the script runs (tests/project).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout:g} s")


def _load(url: str, clients: int, requests: int, size: int) -> float:
    """requests/s of ``clients`` RemoteRewards each sending ``requests`` one-image calls (after one warm-up call)."""
    import numpy as np

    from rewardkit.client import RemoteReward

    rng = np.random.default_rng(0)
    img = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8)]
    remotes = [RemoteReward(url=url, wire="binary") for _ in range(clients)]
    for r in remotes:
        r(img, "warm-up")
    barrier = threading.Barrier(clients + 1)

    def run(r) -> None:
        barrier.wait()
        for k in range(requests):
            out = r(img, f"a photo {k}")
            assert bool(out.valid.all())

    threads = [threading.Thread(target=run, args=(r,)) for r in remotes]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return clients * requests / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=40, help="one-image calls per client")
    ap.add_argument("--reward", default="pickscore")
    ap.add_argument("--model", default=None, help="checkpoint dir (default: a tiny random CLIP)")
    ap.add_argument("--device", default=None, help="rewardkit serve's device (e.g. cuda)")
    ap.add_argument("--num-cpus", type=float, default=0.5, help="CPUs per Serve replica")
    ap.add_argument("--num-gpus", type=float, default=0.0,
                    help="GPUs shared by the Serve replicas (each of n replicas gets num_gpus / n)")
    ap.add_argument("--image-size", type=int, default=32, help="input size of the random tiny CLIP")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--ray-address", default=None,
                    help="a running Ray cluster without Serve (default: start a local one)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    if args.dry_run:
        args.clients, args.requests = 2, 3

    import ray
    from ray import serve

    from rewardkit.integrations.ray_serve import deployment

    tmp = tempfile.mkdtemp()
    model = args.model
    if model is None:
        from rewardkit.testing import save_tiny_checkpoint

        model = str(save_tiny_checkpoint("clip", os.path.join(tmp, "tiny-clip"),
                                                image_size=args.image_size))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    results: dict[str, float] = {}

    port = _port()
    cmd = [sys.executable, "-m", "rewardkit.cli", "serve", "--reward", args.reward, "--model", model, "--port",
           str(port)] + (["--devices", args.device] if args.device else [])
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, proc)
        results["rewardkit serve"] = _load(url, args.clients, args.requests, args.size)
    finally:
        proc.terminate()
        proc.wait(30)

    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}})
    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    except ValueError:
        pass  # no Serve yet: the script's own, on its own port
    else:
        ray.shutdown()
        raise SystemExit(f"Ray Serve already runs on the cluster at {args.ray_address}: its proxy's port and apps "
                         "are not this benchmark's (serve shutdown first, or another cluster)")
    try:
        sport = _port()
        serve.start(http_options={"host": "127.0.0.1", "port": sport})
        for n in ((2,) if args.dry_run else (1, 2)):  # the dry run: the same code, one deployment less
            serve.run(deployment(args.reward, overrides={"model": model}, num_replicas=n, num_cpus=args.num_cpus,
                                 num_gpus=args.num_gpus / n), name="rewardkit", route_prefix="/")
            surl = f"http://127.0.0.1:{sport}"
            _wait(surl)
            results[f"ray serve, {n} replica(s)"] = _load(surl, args.clients, args.requests, args.size)
    finally:
        serve.shutdown()
        ray.shutdown()

    base = results["rewardkit serve"]
    print(f"{args.clients} clients x {args.requests} one-image calls ({args.size} px, binary wire), reward "
          f"{args.reward}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name, rps in results.items():
        print(f"{name:28s} {rps:8.1f} req/s   ratio to rewardkit serve: {rps / base:.2f}")


if __name__ == "__main__":
    main()
