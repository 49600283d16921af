"""Reward server throughput: dynamic batching vs one model call per request, same load, same run.

16 concurrent clients (threads of this process, posting pre-built requests over keep-alive
sockets, so that the load generator is not the bottleneck) each send single-image /score requests (raw uint8) to a
reward served by `rewardkit serve` in a separate process on 127.0.0.1; the same load runs against a server
with ``--max-batch 1`` (no merging) and one with ``--max-batch 64`` (merging), alternating, ``--rounds``
times, for each request body in ``--wire`` (``binary``: what ``RemoteReward`` sends, a JSON header + the raw
pixels; ``json``: base64 pixels in JSON, what curl users send). Prints requests/s (= images/s: one image per
request), the mean requests merged per model call, each round's ratio, the median ratio, and the machine's
load average (a loaded machine flatters the ratio), the server's CPU time per request and the load generator's.

The server process runs torch with ``--server-threads`` intra-op threads (default 1, through ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS``; 0 leaves the environment as it is: torch then takes one thread per core). On a 2-core machine
that the load generator shares, a second intra-op thread of a tiny model mostly spin-waits between its small ops
and takes the cores from the event loop and the load generator: it doubled the server's CPU per request
(benchmarks/README.md).

    python benchmarks/serve_batching.py [--clients 16] [--requests 60] [--rounds 5] [--wire binary,json]
        [--server-threads 1]

``--model`` / ``--device`` run a real CLIP checkpoint on a GPU (see benchmarks/gpu/).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=60,
                    help="requests per client per round (60: a round of the unmerged server lasts about 5 s; "
                         "the host's noise moved 1-s rounds by up to 2x)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reward", default="clipscore")
    ap.add_argument("--model", default=None, help="checkpoint dir (default: a tiny random CLIP)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--image-size", type=int, default=32, help="input size of the random tiny CLIP")
    ap.add_argument("--wire", default="binary,json", help="request bodies to measure (comma-separated)")
    ap.add_argument("--server-threads", type=int, default=1,
                    help="torch intra-op threads of the server process (0: the environment's, torch's default)")
    args = ap.parse_args()

    import os
    import socket
    import subprocess
    import sys

    import httpx

    from rewardkit.serve.client import RemoteReward
    from rewardkit.testing import random_images, save_tiny_checkpoint

    model = args.model or str(save_tiny_checkpoint("clip", tempfile.mkdtemp(), image_size=args.image_size))
    images = random_images(args.clients, size=args.size, seed=0)
    prompt = "a photo of a cat on a mat"

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def start(max_batch: int, wait: float):
        port = free_port()
        cmd = [sys.executable, "-m", "rewardkit.cli", "serve", "-r", args.reward, "-m", model, "--port", str(port),
               "--max-batch", str(max_batch), "--max-wait-ms", str(wait)]
        if args.device:
            cmd += ["--devices", args.device]
        # no auth: the token unset (set but empty is refused)
        env = {k: v for k, v in os.environ.items() if k != "REWARDKIT_SERVE_TOKEN"}
        if args.server_threads > 0:
            env.update(OMP_NUM_THREADS=str(args.server_threads), MKL_NUM_THREADS=str(args.server_threads))
        proc = subprocess.Popen(cmd + ["--max-in-flight", str(max(64, 2 * args.clients))], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                time.sleep(0.2)
        proc.kill()
        raise RuntimeError("server did not start")

    # The load generator must not be the bottleneck (2 cores here): each client thread posts a pre-encoded
    # single-image body over its own keep-alive connection, and every answer is checked.
    from rewardkit.serve.binary import CONTENT_TYPE, pack_body
    from rewardkit.serve.client import encode_image, image_bytes

    wires = [w.strip() for w in args.wire.split(",") if w.strip()]
    bodies = {"json": [json.dumps({"images": [encode_image(im, "raw")], "prompt": prompt}).encode() for im in images],
              "binary": [pack_body({"prompt": prompt}, {"images": [image_bytes(im, "raw")]}) for im in images]}
    ctypes = {"json": "application/json", "binary": CONTENT_TYPE}

    def load(url: str, wire: str) -> float:
        import re

        RemoteReward(url=url, timeout=300)(images[:2], prompt)  # warm up (and check the server answers)
        n = args.clients * args.requests
        host, port = url.rsplit("/", 1)[1].split(":")

        def one_client(c: int) -> None:
            # keep-alive over a raw socket with the request pre-built: the load generator shares the cores with
            # the server, so it does as little as it can (http.client parses every response head with the
            # email package); every answer is still read whole and checked
            body = bodies[wire][c]
            request = (f"POST /score HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctypes[wire]}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            sock = socket.create_connection((host, int(port)), timeout=300)
            buf = b""
            try:
                for _ in range(args.requests):
                    sock.sendall(request)
                    while b"\r\n\r\n" not in buf:
                        chunk = sock.recv(65536)
                        assert chunk and len(buf) < 1 << 20, buf[:200]
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
                    while len(buf) < length:
                        chunk = sock.recv(65536)
                        assert chunk, "connection closed"
                        buf += chunk
                    data, buf = buf[:length], buf[length:]
                    assert head.startswith(b"HTTP/1.1 200") and b'"valid":[true]' in data.replace(b" ", b""), \
                        head[:100] + data[:200]
            finally:
                sock.close()

        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one_client, range(args.clients)))
        dt, ru = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        client_cpu.append((ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime) / n)
        return n / dt

    configs = {"no batching (--max-batch 1)": (1, 0.0),
               f"dynamic batching (--max-batch {args.max_batch}, {args.max_wait_ms:g} ms)":
                   (args.max_batch, args.max_wait_ms)}
    names = list(configs)
    results: dict[tuple[str, str], list[float]] = {(w, k): [] for w in wires for k in configs}
    merged: dict[tuple[str, str], float] = {}
    early: dict[tuple[str, str], float] = {}  # share of model calls whose batch closed before max_wait_ms
    # the server process's CPU time per request (user + system, all its threads): what each request costs the
    # server, much less sensitive to the machine's load than requests/s
    cpu: dict[tuple[str, str], list[float]] = {(w, k): [] for w in wires for k in configs}

    def cpu_seconds(pid: int) -> float:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # not Linux: no figure
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    client_cpu: list[float] = []  # the load generator's CPU time per request (all its threads)
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for name, (mb, wait) in configs.items():
            proc, url = start(mb, wait)
            try:
                for wire in wires:  # the same server answers each body in turn
                    before = httpx.get(url + "/info", timeout=10).json()["stats"]
                    cpu0 = cpu_seconds(proc.pid)
                    results[(wire, name)].append(load(url, wire))
                    cpu[(wire, name)].append((cpu_seconds(proc.pid) - cpu0) / (args.clients * args.requests))
                    stats = httpx.get(url + "/info", timeout=10).json()["stats"]
                    calls = max(stats["batches"] - before["batches"], 1)
                    merged[(wire, name)] = (stats["merged_requests"] - before["merged_requests"]) / calls
                    early[(wire, name)] = (stats.get("batches_closed_early", 0)
                                           - before.get("batches_closed_early", 0)) / calls
            finally:
                proc.terminate()
                proc.wait(30)
    load_after = os.getloadavg()
    threads = args.server_threads or os.environ.get("OMP_NUM_THREADS", "torch's default")
    print(f"{args.reward} ({'tiny random CLIP' if not args.model else model}), device {args.device or 'default'}, "
          f"{args.clients} clients x {args.requests} single-image requests of {args.size}px, {args.rounds} rounds; "
          f"load average {load_before[0]:.1f} -> {load_after[0]:.1f} (1 min), {os.cpu_count()} CPUs; server torch "
          f"threads {threads}; load generator CPU {1e3 * statistics.median(client_cpu):.2f} ms per request")
    for wire in wires:
        for name in names:
            vals = results[(wire, name)]
            print(f"{wire:6s} {name:44s} {statistics.median(vals):8.1f} req/s = img/s  (rounds: "
                  f"{', '.join(f'{v:.1f}' for v in vals)}; requests per model call {merged[(wire, name)]:.1f}, "
                  f"{100 * early[(wire, name)]:.0f}% closed early; "
                  f"server CPU {1e3 * statistics.median(cpu[(wire, name)]):.2f} ms per request)")
        per_round = [b / a for a, b in zip(results[(wire, names[0])], results[(wire, names[1])])]
        cpu_rounds = [a / b for a, b in zip(cpu[(wire, names[0])], cpu[(wire, names[1])])]
        print(f"{wire:6s} ratio batching / no batching: rounds {', '.join(f'{r:.2f}x' for r in per_round)}; "
              f"median {statistics.median(per_round):.2f}x (of medians "
              f"{statistics.median(results[(wire, names[1])]) / statistics.median(results[(wire, names[0])]):.2f}x); "
              f"server CPU per request, no batching / batching: median {statistics.median(cpu_rounds):.2f}x")


if __name__ == "__main__":
    main()
