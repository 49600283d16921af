"""How much one big request body stalls the reward server and grows its memory (docs/serve.md, "Exposing the
server"; issue 36 item 1).

For each body below, a fresh server process (a reward that costs nothing: the mean of the pixels) is started,
one client sends the body while another polls ``GET /health`` back to back on a keep-alive connection and the
server's RSS is read from /proc as often; printed: the request's status and time, the longest ``/health``
answer while it was in the server and, for scale, the longest in as long a time right after with no request
in (the machine's own floor: on a loaded machine both grow), and the server's RSS before, at its highest, and
after (the after figure is read once the idle polling is over).

    python benchmarks/serve_big_body.py                      # the code on PYTHONPATH
    python benchmarks/serve_big_body.py --server-path /tmp/old   # another checkout (e.g. `git archive` of main)

Linux only (RSS from /proc). Takes about a minute; the 48 MB bodies take longer on code that parses them.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20

_SERVER = textwrap.dedent("""
    import sys
    import numpy as np, torch
    from rewardkit import Reward, RewardOutput
    from rewardkit.serve.server import ServerConfig, serve_in_thread

    class Mean(Reward):
        name = "mean"; tasks = frozenset({"t2i"}); thread_safe = False
        def _score(self, batch):
            return RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))

    handle = serve_in_thread(Mean(), ServerConfig(timeout=600, body_timeout=600))
    print(handle.url, flush=True)
    sys.stdin.read()
    handle.stop(5)
""")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _json_dicts(size: int) -> bytes:
    """``{"images": [...], "prompt": "a", "metadata": [{}, {}, ...]}`` of ``size`` bytes: the issue's repro."""
    head = b'{"images": ["iVBORw0KGgo="], "prompt": "a", "metadata": ['
    n = (size - len(head) - 2) // 3
    return head + b"{}," * (n - 1) + b"{}" + b"]}"


def _json_raw_image(size: int) -> bytes:
    """One raw uint8 image, base64 in the JSON, filling ``size`` bytes: the largest ordinary JSON body."""
    import base64

    side = int(((size - 200) * 3 / 4 / 3) ** 0.5)
    px = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return json.dumps({"images": [{"data": base64.b64encode(px.tobytes()).decode(), "shape": [side, side, 3],
                                   "dtype": "uint8"}], "prompt": "a"}).encode()


def _json_wide_prompt(size: int) -> bytes:
    """A prompt of ``size`` bytes of ASCII after one emoji (every character of it then takes 4 bytes)."""
    head = '{"images": [{"data": "AAAA", "shape": [1, 1, 3], "dtype": "uint8"}], "prompt": "\\ud83d\\ude00'
    return (head + "a" * (size - len(head) - 2) + '"}').encode()


def _binary(header: dict, payload: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"RKB1" + struct.pack("<I", len(head)) + head + payload


def _binary_pixels(size: int) -> bytes:
    side = int((size / 3) ** 0.5)
    px = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return _binary({"images": [{"shape": [side, side, 3], "dtype": "uint8"}], "prompt": "a"}, px.tobytes())


def _binary_dict_header(size: int) -> bytes:
    n = size // 3
    return b"RKB1" + struct.pack("<I", 3 * n + 1) + b"[" + b"{}," * (n - 1) + b"{}]"


CASES = [  # (name, body, content type)
    ("JSON 48 MB of {} (the issue's repro)", lambda: _json_dicts(48 * MB), "application/json"),
    ("JSON 15.9 MB of {}", lambda: _json_dicts(int(15.9 * MB)), "application/json"),
    ("JSON 15.9 MB, one raw image", lambda: _json_raw_image(int(15.9 * MB)), "application/json"),
    ("JSON 15.9 MB prompt, one emoji", lambda: _json_wide_prompt(int(15.9 * MB)), "application/json"),
    ("binary 63 MB, one raw image", lambda: _binary_pixels(63 * MB), "application/octet-stream"),
    ("binary 48 MB header of {}", lambda: _binary_dict_header(48 * MB), "application/octet-stream"),
    ("binary 15.9 MB header of {}", lambda: _binary_dict_header(int(15.9 * MB)), "application/octet-stream"),
]


def run_case(body: bytes, ctype: str, server_path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=server_path, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env, text=True, cwd=server_path)  # cwd: python -c imports from it first
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise RuntimeError("the server did not start")
        poll = httpx.Client(timeout=120)
        for _ in range(20):  # warm: the connection is open, the route answered
            poll.get(url + "/health")
        time.sleep(0.5)
        before = _rss_kb(proc.pid)
        result: dict = {}

        def send() -> None:
            t0 = time.perf_counter()
            try:
                r = httpx.post(url + "/score", content=body, headers={"Content-Type": ctype}, timeout=600)
                result["status"] = r.status_code
            except httpx.HTTPError as exc:
                result["status"] = type(exc).__name__
            result["seconds"] = time.perf_counter() - t0

        sender = threading.Thread(target=send)
        sender.start()
        worst, peak = 0.0, before
        while sender.is_alive():
            t0 = time.perf_counter()
            poll.get(url + "/health")
            worst = max(worst, time.perf_counter() - t0)
            peak = max(peak, _rss_kb(proc.pid))
            time.sleep(0.002)
        sender.join()
        # the same polling with no request in the server, as long (at least 1 s): the machine's own floor
        idle, t_end = 0.0, time.perf_counter() + max(1.0, result["seconds"])
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            poll.get(url + "/health")
            idle = max(idle, time.perf_counter() - t0)
            _rss_kb(proc.pid)
            time.sleep(0.002)
        result.update(health_ms=worst * 1e3, idle_ms=idle * 1e3, rss_before=before / 1024, rss_peak=peak / 1024,
                      rss_after=_rss_kb(proc.pid) / 1024, body_mb=len(body) / MB)
        poll.close()
        return result
    finally:
        proc.stdin.close()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-path", default=str(ROOT), help="PYTHONPATH of the server (default: this checkout)")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    args = ap.parse_args()
    print(f"server code: {args.server_path}; {os.cpu_count()} CPUs")
    print(f"{'body':40s} {'MB':>6s} {'status':>6s} {'req s':>7s} {'/health max ms':>15s} {'idle max':>8s} "
          f"{'RSS MB before':>13s} {'peak':>7s} {'after':>7s} {'peak growth / body':>18s}")
    for name, make, ctype in CASES:
        if args.only and args.only not in name:
            continue
        r = run_case(make(), ctype, args.server_path)
        print(f"{name:40s} {r['body_mb']:6.1f} {r['status']!s:>6s} {r['seconds']:7.2f} {r['health_ms']:15.0f} "
              f"{r['idle_ms']:8.0f} "
              f"{r['rss_before']:13.0f} {r['rss_peak']:7.0f} {r['rss_after']:7.0f} "
              f"{(r['rss_peak'] - r['rss_before']) / r['body_mb']:18.1f}", flush=True)


if __name__ == "__main__":
    main()
