"""rewardkit side by side with the official packages (issue 41, item 1).

    python benchmarks/peers.py --quick                 # ~2-4 min: batch 1 and 8, 3 rounds, 8 images
    python benchmarks/peers.py                         # batch 1, 8, 32; 5 rounds of 32 images
    python benchmarks/peers.py --models hpsv2,aesthetic --batches 1,32 --rounds 7

Models: hpsv2, imagereward, aesthetic, hpsv3 (their official PyPI packages) and vqascore (t2v-metrics 3.0's
Qwen2.5-VL scorer). For each model the official package runs in its own parity environment (``scripts/parity.sh``
builds them, under ``PARITY_VENVS``, default ``~/.cache/rewardkit/parity``) on a tiny checkpoint written through the
package's own classes, and rewardkit runs on that checkpoint converted with ``rewardkit convert`` (vqascore: on the
tiny judge directory itself, ``load_reward("vqascore", judge="transformers:DIR", template="t2v_metrics-3.0")``, as
``scripts/parity.sh`` compares it): the first run calls ``scripts/parity.sh MODEL...`` with ``PARITY_KEEP``
(default ``~/.cache/rewardkit/peers/work``), which also checks the scores agree, and later runs reuse its files.
Each official package is driven by ``load_scorer`` of its ``scripts/parity/official_*.py`` module (the same code
that writes the checkpoint and scores the parity inputs).

Two long-lived worker processes per model (one per side, one torch thread each) are sent the same rounds in
alternation (official, rewardkit, official, ...): a round scores the same images with one prompt in calls of the
batch size (the official API's batch form: a list of image paths and one prompt). Printed per (model, size mix,
batch): the median over rounds of the official / rewardkit wall-time and CPU-time ratios (> 1: rewardkit is
faster), the largest score difference relative to the score scale, each side's peak RSS (of the timed worker:
nothing else runs in it), and rewardkit's time per call outside the model forward and its share of the forward,
twice (issue 41, item 4): all of it (decoding and the official pre-processing recipe included, which the official
code pays as well), and rewardkit's own (the rest: input checks, prompts and tokens, batching, output). Those are
measured in a third worker, a fresh rewardkit process (so its hooks neither slow the timed rounds nor raise their
RSS): forward hooks on the outermost modules (and their ``get_image_features`` / ``get_text_features``, which
CLIP rewards and the Qwen-VL judge's vision encode call directly) time the forward; the decoding and the recipe
are timed by wrapping ``rewardkit.media._to_pil`` and the pixel functions (``rewardkit.models.zoo.
openai_clip_pixels`` / ``hpsv2_pixels``, ``rewardkit.models.pil_pixels.pil_pixel_values`` (the judges' and the
preference models' pixels) / ``clip_pil_pixel_values``). "equal": every
image 512x512; "mixed": six sizes from 97x61 to 1000x250, the official code's crash-free ones.

A worker that dies in the middle of a batch size (the official HPSv3's padded batch of 32 mixed-size images is
killed by the out-of-memory killer of a 24 GiB machine) is that row's error, with its exit status and the largest
RSS the driver saw it reach (polled from ``/proc``); a fresh worker takes over for the next rows (its RSS column
counts anew) and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARITY = ROOT / "scripts" / "parity"
#: model -> (official module, parity environment name)
MODELS = {"hpsv2": ("official_hpsv2", "hpsv2"), "imagereward": ("official_imagereward", "imagereward"),
          "aesthetic": ("official_aesthetic", "imagereward"), "hpsv3": ("official_hpsv3", "hpsv3"),
          "vqascore": ("official_vqascore", "vqascore")}
#: ``load_reward`` arguments of a model other than ``model=<work>/<model>/converted`` (as ``scripts/parity.sh``
#: compares it; "{dir}" is the model's work folder), and the file its tiny checkpoint is complete with
JUDGED = {"vqascore": ({"judge": "transformers:{dir}/judge", "template": "t2v_metrics-3.0", "dtype": "float32"},
                       "official.json")}


def rk_kwargs(model: str, d: Path) -> dict:
    """``load_reward(model, **rk_kwargs(model, d))`` scores the tiny checkpoint in work folder ``d``."""
    if model not in JUDGED:
        return {"model": str(d / "converted")}
    return {k: v.replace("{dir}", str(d)) for k, v in JUDGED[model][0].items()}


def checkpoint_ready(model: str, work: Path) -> bool:
    """Whether ``scripts/parity.sh`` (``PARITY_KEEP=work``) has left the model's tiny checkpoint there."""
    return (work / model / (JUDGED[model][1] if model in JUDGED else "converted/rewardkit.json")).exists()
EQUAL = [(512, 512)]
MIXED = [(512, 512), (640, 360), (360, 640), (301, 300), (97, 61), (1000, 250)]
PROMPT = "a photo of a cat sitting on a mat"


# ---- workers (run in the official environment or rewardkit's; standard library at import time) -------------------
def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _modules(obj, depth=0, seen=None) -> list:
    """The torch modules reachable from ``obj`` through attributes (a few levels), outermost ones."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        return [obj]
    found = []
    values = obj.values() if isinstance(obj, dict) else getattr(obj, "__dict__", {}).values()
    for v in values:
        if isinstance(v, (torch.nn.Module, dict)) or hasattr(v, "__dict__") and not isinstance(v, type):
            found += _modules(v, depth + 1, seen)
    return found


def _profile(reward, score, chunks: list, prompt: str) -> dict:
    """Wall time of the calls over ``chunks`` (from the files), the time inside the model forward (hooks on the
    outermost modules) and inside decoding + the pre-processing recipe (wrapped functions), in seconds."""
    import importlib

    spent = {"fwd": 0.0, "recipe": 0.0}
    depth = {"fwd": 0, "recipe": 0}
    t0 = {"fwd": 0.0, "recipe": 0.0}

    def enter(key):
        depth[key] += 1
        if depth[key] == 1:
            t0[key] = time.perf_counter()

    def leave(key):
        depth[key] -= 1
        if depth[key] == 0:
            spent[key] += time.perf_counter() - t0[key]

    mods = []
    for root in _modules(reward):
        mods += [root, *root.children()]
    handles = [h for m in mods for h in (m.register_forward_pre_hook(lambda *_: enter("fwd")),
                                         m.register_forward_hook(lambda *_: leave("fwd")))]

    def timed(fn, key="recipe"):
        def wrapper(*a, **k):
            enter(key)
            try:
                return fn(*a, **k)
            finally:
                leave(key)
        return wrapper

    # a CLIPModel's forward for rewards is its get_image_features / get_text_features method (not __call__): the
    # model's own code, so timed as the forward (its children's hooks nest inside)
    methods = [(m, n) for m in mods for n in ("get_image_features", "get_text_features") if hasattr(m, n)]
    for m, n in methods:
        setattr(m, n, timed(getattr(m, n), "fwd"))
    patched = []
    # the direct vision forwards (rewardkit.models.direct_forward) are the forward too; the hooks above make
    # them take the stock call in this worker (the same values; only rewardkit's own time is read from here)
    for mod_name, names, key in (("rewardkit.media", ("_to_pil",), "recipe"),
                                 ("rewardkit.models.zoo", ("openai_clip_pixels", "hpsv2_pixels"), "recipe"),
                                 ("rewardkit.models.pil_pixels", ("pil_pixel_values", "clip_pil_pixel_values"),
                                  "recipe"),
                                 ("rewardkit.models.direct_forward", ("clip_image_features", "blip_vision_states"),
                                  "fwd")):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:  # an older rewardkit
            continue
        for n in names:
            if hasattr(mod, n):
                patched.append((mod, n, getattr(mod, n)))
                setattr(mod, n, timed(getattr(mod, n), key))
    try:
        score(chunks[0], prompt)  # warm
        spent.update(fwd=0.0, recipe=0.0)
        w0 = time.perf_counter()
        for c in chunks:
            score(c, prompt)
        wall = time.perf_counter() - w0
    finally:
        for h in handles:
            h.remove()
        for m, n in methods:
            delattr(m, n)  # the instance attribute set above: the class's method again
        for mod, n, fn in patched:
            setattr(mod, n, fn)
    return {"calls": len(chunks), "wall": wall, "fwd": spent["fwd"], "recipe": spent["recipe"]}


def worker(side: str, model: str, work: str) -> None:
    import torch

    torch.set_num_threads(1)
    d = Path(work) / model
    if side == "official":
        sys.path.insert(0, str(PARITY))
        import importlib

        score = importlib.import_module(MODELS[model][0]).load_scorer(str(d))
        reward = None
    else:  # "rewardkit" (timed) or "profile" (the time outside the forward; never timed)
        from rewardkit import load_reward

        reward = load_reward(model, **{**rk_kwargs(model, d), "device": "cpu"})

        def score(paths, prompt):
            out = reward(list(paths), [prompt] * len(paths), on_error="nan")
            return out.scores.tolist()
    print(json.dumps({"ready": True, "rss_mib": _rss_mib()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        paths, b = req["paths"], req["batch"]
        chunks = [paths[i:i + b] for i in range(0, len(paths), b)]
        if req.get("profile"):
            print(json.dumps(_profile(reward, score, chunks, req["prompt"])), flush=True)
            continue
        scores = []
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            for c in chunks:
                scores += score(c, req["prompt"])
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            print(json.dumps({"wall": wall, "cpu": cpu, "scores": scores, "rss_mib": _rss_mib()}), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported by the driver
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)


# ---- driver -------------------------------------------------------------------------------------------------------
def _venv_python(env: str, venvs: Path) -> str:
    found = sorted((p for p in venvs.glob(f"{env}-*") if (p / ".done").exists()), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"peers: no parity environment {env}-* under {venvs} (run scripts/parity.sh {env})")
    return str(found[-1] / "bin" / "python")


class WorkerDied(RuntimeError):
    """A worker process ended in the middle of a request (the official HPSv3's padded batch of 32 mixed sizes
    is killed by the kernel's out-of-memory killer on a 24 GiB machine): reported as that row, not a crash."""


class Worker:
    def __init__(self, cmd: list[str], env: dict):
        self.cmd, self.env = cmd, env
        self.peak_mib = 0.0  # the largest RSS seen while it worked (polled: a killed worker reports nothing)
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                  cwd=str(ROOT))
        self.ready = self._read()

    def _poll_rss(self, stop: threading.Event) -> None:
        status = Path(f"/proc/{self.p.pid}/status")
        while not stop.wait(0.05):
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak_mib = max(self.peak_mib, int(line.split()[1]) / 1024)
            except (OSError, ValueError):
                return

    def _read(self) -> dict:
        stop = threading.Event()
        poll = threading.Thread(target=self._poll_rss, args=(stop,), daemon=True)
        poll.start()
        try:
            while True:
                line = self.p.stdout.readline()
                if not line:
                    code = self.p.wait()
                    why = " (SIGKILL: out of memory?)" if code == -9 else ""
                    raise WorkerDied(f"worker ended (exit {code}{why}; largest RSS seen {self.peak_mib:.0f} MiB)")
                if line.startswith("{"):
                    return json.loads(line)
        finally:
            stop.set()
            poll.join()

    def ask(self, **req) -> dict:
        try:
            self.p.stdin.write(json.dumps(req) + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass  # _read reports how it ended
        return self._read()

    def restart(self) -> "Worker":
        """A fresh worker of the same command (after one died), its peak RSS counted anew."""
        self.close()
        return Worker(self.cmd, self.env)

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait()


def make_images(work: Path, sizes: list, n: int, tag: str) -> list[str]:
    sys.path.insert(0, str(PARITY))
    from common import _pattern  # seeded structured pictures, as the parity inputs
    from PIL import Image

    d = work / "peers-images"
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        p = d / f"{tag}_{i:02d}_{w}x{h}.png"
        if not p.exists():
            Image.fromarray(_pattern(w, h, 100 + i)).save(p)
        paths.append(str(p))
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 1 and 8, 3 rounds of 8 images")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default=None, help="default 1,8,32 (--quick: 1,8)")
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (--quick: 3)")
    ap.add_argument("--images", type=int, default=None, help="images per round (default 32; --quick: 8)")
    ap.add_argument("--sizes", default="mixed,equal")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "rewardkit" / "peers" / "work"))
    ap.add_argument("--worker", nargs=3, metavar=("SIDE", "MODEL", "WORK"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker)
        return 0
    batches = [int(b) for b in (a.batches or ("1,8" if a.quick else "1,8,32")).split(",")]
    rounds = a.rounds or (3 if a.quick else 5)
    n_img = a.images or (8 if a.quick else 32)
    models = [m for m in a.models.split(",") if m]
    work = Path(a.work)
    venvs = Path(os.environ.get("PARITY_VENVS", Path.home() / ".cache" / "rewardkit" / "parity"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    missing = [m for m in models if not checkpoint_ready(m, work)]
    if missing:
        print(f"peers: writing the tiny checkpoints (scripts/parity.sh {' '.join(missing)})", flush=True)
        r = subprocess.run(["bash", str(ROOT / "scripts" / "parity.sh"), *missing], cwd=str(ROOT),
                           env={**env, "PARITY_KEEP": str(work), "PARITY_VENVS": str(venvs),
                                "RK_PYTHON": os.environ.get("RK_PYTHON", sys.executable), "OMP_NUM_THREADS": "2"})
        if r.returncode:
            print("peers: scripts/parity.sh reported a failure (see above); timing anyway", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} / {os.cpu_count()} cores; one torch thread per side; "
          f"{rounds} interleaved rounds of {n_img} images; ratios = official / rewardkit (> 1: rewardkit faster)")
    head = (f"{'model':12s} {'sizes':6s} {'batch':>5s} {'wall x':>7s} {'cpu x':>7s} {'official ms/img':>15s} "
            f"{'rk ms/img':>9s} {'max rel diff':>12s} {'RSS off/rk MiB':>15s} {'rk outside fwd/call: all':>25s} "
            f"{'rk own':>18s}")
    print(head, flush=True)
    rows = []
    for m in models:
        off = Worker([_venv_python(MODELS[m][1], venvs), str(Path(__file__).resolve()), "--worker", "official", m,
                      str(work)], env)
        rk = Worker([sys.executable, str(Path(__file__).resolve()), "--worker", "rewardkit", m, str(work)], env)
        prof_w = Worker([sys.executable, str(Path(__file__).resolve()), "--worker", "profile", m, str(work)], env)
        for kind in a.sizes.split(","):
            paths = make_images(work, MIXED if kind == "mixed" else EQUAL, n_img, kind)
            for b in batches:
                req = {"paths": paths, "prompt": PROMPT, "batch": b}
                wr, cr, o_last, r_last, err, ow, rw = [], [], None, None, None, [], []
                try:
                    off.ask(**{**req, "paths": paths[:b]})  # warm both sides on this batch size
                    rk.ask(**{**req, "paths": paths[:b]})
                    for _ in range(rounds):
                        o, r = off.ask(**req), rk.ask(**req)
                        if "error" in o or "error" in r:
                            err = o.get("error") or r.get("error")
                            break
                        wr.append(o["wall"] / r["wall"])
                        cr.append(o["cpu"] / r["cpu"])
                        ow.append(o["wall"])
                        rw.append(r["wall"])
                        o_last, r_last = o, r
                except WorkerDied as exc:  # one side could not score this batch size: say so, go on
                    side = "official" if off.p.poll() is not None else "rewardkit"
                    err = f"the {side} {exc}"
                    off, rk = (off.restart(), rk) if side == "official" else (off, rk.restart())
                if err:
                    print(f"{m:12s} {kind:6s} {b:5d}  error: {err}", flush=True)
                    continue
                scale = max(abs(x) for x in o_last["scores"]) or 1.0
                diff = max(abs(x - y) / max(scale, abs(x)) for x, y in zip(o_last["scores"], r_last["scores"]))
                # the least wall of two runs (the load of a shared machine only adds time)
                prof = min((prof_w.ask(**req, profile=True) for _ in range(2)), key=lambda p: p["wall"])
                calls, fwd = prof["calls"], prof["fwd"]
                outside, share = (prof["wall"] - fwd) / calls * 1e3, (prof["wall"] - fwd) / fwd
                own_s = prof["wall"] - fwd - prof["recipe"]
                own, own_share = own_s / calls * 1e3, own_s / fwd
                row = dict(model=m, sizes=kind, batch=b, wall=statistics.median(wr), cpu=statistics.median(cr),
                           off_ms=statistics.median(ow) / n_img * 1e3, rk_ms=statistics.median(rw) / n_img * 1e3, diff=diff,
                           rss_off=o_last["rss_mib"], rss_rk=r_last["rss_mib"], outside_ms=outside, share=share,
                           own_ms=own, own_share=own_share)
                rows.append(row)
                print(f"{m:12s} {kind:6s} {b:5d} {row['wall']:6.3f}x {row['cpu']:6.3f}x {row['off_ms']:15.2f} "
                      f"{row['rk_ms']:9.2f} {diff:12.2g} {row['rss_off']:7.0f}/{row['rss_rk']:<7.0f} "
                      f"{outside:8.2f} ms ({share:4.0%}) {own:8.2f} ms ({own_share:4.0%})", flush=True)
        off.close()
        rk.close()
        prof_w.close()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
