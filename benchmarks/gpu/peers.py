"""GPU run of the side-by-side with the official packages: ``python benchmarks/gpu/peers.py`` (no arguments needed).

``benchmarks/peers.py`` on one CUDA device (issue 41): each official package (its parity environment, built by
``scripts/parity.sh`` under ``PARITY_VENVS``, default ``~/.cache/rewardkit/parity``) and rewardkit score the same
tiny checkpoints (``~/.cache/rewardkit/peers/work``, written by the first ``benchmarks/peers.py`` run) on the same
device, in two long-lived worker processes per model sent the same rounds in alternation. Each timed span starts
and ends with ``torch.cuda.synchronize()`` (the host waits for the device, so the wall time is the device's too);
each side's peak GPU memory is ``torch.cuda.max_memory_allocated()`` in its own process, reset before each cell's
warm-up call (model weights + activations + whatever the side reloads per call). The CPU time is the side's
process time: on CUDA it includes the host's wait in ``synchronize`` (a spin by default), so it tracks the wall
time more than on the CPU.

Precisions, per model, as the official package runs on CUDA (rewardkit given the same dtype):

- ``float32``: ImageReward, HPSv3 (its config's ``torch_dtype``), VQAScore (t2v-metrics' ``QWEN2_VL_MODELS`` entry
  set to float32, as ``scripts/parity/official_vqascore.py`` does). hpsv2 always runs under
  ``torch.cuda.amp.autocast()`` and the aesthetic predictor's OpenAI CLIP is always fp16 on CUDA
  (``clip.load`` converts the weights): neither has a float32 path on CUDA, so neither has a float32 row there.
  In a float32 row the scores must agree within the parity tolerance (``scripts/parity.sh``:
  ``1e-5 * max(scale, |official|)``): ``ok`` or ``OVER`` in the ``agree`` column;
- ``half``: hpsv2 (autocast fp16, rewardkit ``float16``), aesthetic (fp16 CLIP, rewardkit ``float16``), HPSv3
  (``torch_dtype: bfloat16``, rewardkit ``bfloat16``), VQAScore (t2v-metrics' own ``torch.bfloat16``, sdpa
  attention instead of its flash-attention 2, rewardkit ``bfloat16``). ImageReward has no half-precision mode.
  The difference is printed, not bounded (two different fp16/bf16 computations).

Columns: as ``benchmarks/peers.py`` (median official / rewardkit wall and CPU ratios over the rounds, ms per
image, largest score difference relative to the score scale, peak RSS) plus the precision, the peak GPU memory of
each side and the float32 agreement; the device name heads the table. The last two columns are rewardkit's time
per call outside the model forward (forward hooks on the outermost modules, each side of the forward synchronised
with the device) and its share of the forward, measured in a third, untimed rewardkit worker: all of it, and
rewardkit's own (minus decoding and the pre-processing recipe, timed by wrapping ``rewardkit.media._to_pil`` and
the pixel functions, as ``benchmarks/peers.py`` does).

The prepared run (no arguments): the five models, mixed and equal sizes, batch 1, 8 and 32, 3 rounds of 32 images,
both precisions, within about 5 minutes on one GPU: the workers of every (model, precision) start at once, the
cells run mixed sizes first, each batch size across the models, and none starts after ``--budget`` seconds
(default 240; the ones left are printed as skipped); a watchdog ends the run at the budget + 50 s.
``--dry-run`` runs the same code on the CPU (float32, batch 1 and 2, 1 round of 2 images, hpsv2 and aesthetic,
mixed sizes), which the test suite runs (``tests/project/test_gpu_peers.py``).
``--official-python PY`` runs every official side with one interpreter instead of the parity environments (a
machine where the official packages are installed into one Python).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
PARITY = ROOT / "scripts" / "parity"


def _cpu_peers():
    """``benchmarks/peers.py`` (standard library at import time; loaded by path, since this file has its name)."""
    spec = importlib.util.spec_from_file_location("_rewardkit_cpu_peers", ROOT / "benchmarks" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = _cpu_peers()
#: model -> precision -> (official mode, rewardkit dtype) on CUDA; absent: the package has no such mode there
PRECISIONS = {
    "hpsv2": {"half": ("autocast-float16", "float16")},
    "imagereward": {"float32": ("float32", "float32")},
    "aesthetic": {"half": ("float16", "float16")},
    "hpsv3": {"float32": ("float32", "float32"), "half": ("bfloat16", "bfloat16")},
    "vqascore": {"float32": ("float32", "float32"), "half": ("bfloat16", "bfloat16")},
}
#: on the CPU every official package computes in float32
CPU_PRECISIONS = {"float32": ("float32", "float32")}
PARITY_TOL = 1e-5  # scripts/parity.sh: |official - rewardkit| <= 1e-5 * max(scale, |official|)
RK_PIXEL_FUNCS = (("rewardkit.media", ("_to_pil",)),
                  ("rewardkit.models.zoo", ("openai_clip_pixels", "hpsv2_pixels")),
                  ("rewardkit.models.pil_pixels", ("pil_pixel_values", "clip_pil_pixel_values")))


def precisions(model: str, device: str) -> dict:
    return PRECISIONS[model] if device.startswith("cuda") else CPU_PRECISIONS


# ---- workers (official environment or rewardkit's; standard library at import time) -------------------------------
def _official_scorer(model: str, d: Path, device: str, mode: str):
    """``f(paths, prompt) -> [score]``: the official call of ``scripts/parity/official_<model>.py``'s
    ``load_scorer``, on ``device`` (its loaders are CPU-only; the package's own ``device`` arguments here)."""
    import torch

    sys.path.insert(0, str(PARITY))
    mod = __import__(P.MODELS[model][0])
    if device == "cpu" or model == "hpsv2":  # hpsv2's img_score picks cuda itself when there is one (amp there)
        return mod.load_scorer(str(d))
    d = d.resolve()
    if model == "imagereward":
        RM, _ = mod._official_classes(d)
        rm = RM.load(str(d / "ImageReward.pt"), device=device, med_config=str(d / "med_config.json"))

        def score(paths, prompt):
            paths = [str(Path(p).resolve()) for p in paths]
            with torch.no_grad():
                r = rm.score(prompt, paths if len(paths) > 1 else paths[0])
            return [float(x) for x in r] if isinstance(r, list) else [float(r)]
        return score
    if model == "aesthetic":
        clip, AS = mod._official_modules()
        real_load = clip.load
        AS.clip.load = lambda name, **kw: real_load(str(d / "openai-clip-tiny.pt"), **kw)
        scorer = AS.AestheticScore(download_root=str(d), device=device)  # CLIP fp16 on CUDA (clip.load)
        scorer.mlp.load_state_dict(torch.load(d / "aesthetic.pth", weights_only=True, map_location="cpu"))
        scorer.to(device).eval()  # as ImageReward.load_score does

        def score(paths, prompt):
            with torch.no_grad():
                r = scorer.score(None, list(paths) if len(paths) > 1 else paths[0])
            return [float(x) for x in r] if isinstance(r, list) else [float(r)]
        return score
    if model == "hpsv3":
        from hpsv3 import HPSv3RewardInferencer

        cfg = d / "HPSv3_tiny.yaml"
        if mode != "float32":  # the config's torch_dtype is the package's precision switch
            text = cfg.read_text()
            if "torch_dtype: float32" not in text:
                raise ValueError(f"{cfg}: no 'torch_dtype: float32' line to switch to {mode}")
            cfg = d / f"HPSv3_tiny_{mode}.yaml"
            cfg.write_text(text.replace("torch_dtype: float32", f"torch_dtype: {mode}"))
        inf = HPSv3RewardInferencer(config_path=str(cfg), checkpoint_path=str(d / "HPSv3.safetensors"),
                                    device=device)

        def score(paths, prompt):
            with torch.no_grad():
                return [float(x) for x in inf.reward(list(paths), [prompt] * len(paths))[:, 0].float().tolist()]
        return score
    if model == "vqascore":  # t2v_metrics loads with device_map="auto": on the CUDA device there is one
        return mod.load_scorer(str(d), dtype=mode)
    raise ValueError(f"no official scorer for {model!r}")


def _profile(reward, score, chunks: list, prompt: str, sync) -> dict:
    """Wall time of the calls over ``chunks``, the time inside the model forward (hooks on the outermost modules,
    the device synchronised on entry and exit) and inside decoding + the pre-processing recipe, in seconds."""
    import importlib

    spent, depth, t0 = {"fwd": 0.0, "recipe": 0.0}, {"fwd": 0, "recipe": 0}, {"fwd": 0.0, "recipe": 0.0}

    def enter(key):
        depth[key] += 1
        if depth[key] == 1:
            sync()
            t0[key] = time.perf_counter()

    def leave(key):
        depth[key] -= 1
        if depth[key] == 0:
            sync()
            spent[key] += time.perf_counter() - t0[key]

    mods = []
    for root in P._modules(reward):
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

    # the model's own methods called instead of __call__ (a CLIPModel's get_image_features, the Qwen-VL judge's
    # vision encode through its inner model's get_image_features): timed as the forward, as benchmarks/peers.py does
    methods = [(m, n) for m in mods for n in ("get_image_features", "get_text_features") if hasattr(m, n)]
    for m, n in methods:
        setattr(m, n, timed(getattr(m, n), "fwd"))
    patched = []
    for mod_name, names in RK_PIXEL_FUNCS:
        mod = importlib.import_module(mod_name)
        patched += [(mod, n, getattr(mod, n)) for n in names if hasattr(mod, n)]
    for mod, n, fn in patched:
        setattr(mod, n, timed(fn))
    try:
        score(chunks[0], prompt)  # warm
        spent.update(fwd=0.0, recipe=0.0)
        sync()
        w0 = time.perf_counter()
        for c in chunks:
            score(c, prompt)
        sync()
        wall = time.perf_counter() - w0
    finally:
        for h in handles:
            h.remove()
        for m, n in methods:
            delattr(m, n)  # the instance attribute set above: the class's method again
        for mod, n, fn in patched:
            setattr(mod, n, fn)
    return {"calls": len(chunks), "wall": wall, "fwd": spent["fwd"], "recipe": spent["recipe"]}


def worker(side: str, model: str, work: str, device: str) -> None:
    """Requests on stdin, one JSON object a line: ``{"load": precision}`` (drops the model in hand), or a round
    (``paths``, ``prompt``, ``batch``; ``reset_peak`` before a cell's warm-up; ``profile`` for the third worker)."""
    import gc

    import torch

    torch.set_num_threads(1)
    cuda = device.startswith("cuda")
    fatal = None
    if cuda and not torch.cuda.is_available():  # e.g. a parity environment built with a CPU-only torch
        fatal = f"torch {torch.__version__} of {sys.executable} sees no CUDA device"
    elif cuda:  # "cuda" is then this device (hpsv2's img_score places its model on "cuda")
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    d = Path(work) / model
    score = reward = None
    print(json.dumps({"ready": True, "rss_mib": P._rss_mib(),
                      "device": torch.cuda.get_device_name(device) if cuda and not fatal else "cpu"}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if fatal:
                raise RuntimeError(fatal)
            if "load" in req:
                score = reward = None
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
                official, rk_dtype = precisions(model, device)[req["load"]]
                if side == "official":
                    score = _official_scorer(model, d, device, official)
                else:
                    from rewardkit import load_reward

                    reward = load_reward(model, **{**P.rk_kwargs(model, d), "device": device, "dtype": rk_dtype})

                    def score(paths, prompt, reward=reward):
                        return reward(list(paths), [prompt] * len(paths), on_error="nan").scores.tolist()
                print(json.dumps({"loaded": req["load"]}), flush=True)
                continue
            paths, b = req["paths"], req["batch"]
            chunks = [paths[i:i + b] for i in range(0, len(paths), b)]
            if req.get("profile"):
                print(json.dumps(_profile(reward, score, chunks, req["prompt"], sync)), flush=True)
                continue
            if cuda and req.get("reset_peak"):
                torch.cuda.reset_peak_memory_stats(device)
            scores = []
            sync()
            w0, c0 = time.perf_counter(), time.process_time()
            for c in chunks:
                scores += score(c, req["prompt"])
            sync()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            gpu = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
            print(json.dumps({"wall": wall, "cpu": cpu, "scores": scores, "rss_mib": P._rss_mib(),
                              "gpu_peak_mib": gpu}), flush=True)
        except Exception as exc:  # noqa: BLE001 - reported by the driver, in the row
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)


# ---- driver -------------------------------------------------------------------------------------------------------
def agreement(official: list, rk: list) -> tuple[float, float]:
    """(largest |official - rk| / max(scale, |official|), the parity bound's left side over the tolerance): the
    ``scale`` is the largest |official score|, as ``scripts/parity.sh``. NaN on either side gives NaN."""
    if len(official) != len(rk) or not official:
        raise ValueError(f"{len(official)} official scores vs {len(rk)} rewardkit scores")
    if any(math.isnan(x) for x in (*official, *rk)):  # max() would drop a NaN or keep it, by its position
        return math.nan, math.nan
    scale = max(abs(x) for x in official) or 1.0
    diff = max(abs(x - y) / max(scale, abs(x)) for x, y in zip(official, rk))
    return diff, diff / PARITY_TOL


def _mib(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _cell(off, rk, prof, m: str, prec: str, kind: str, b: int, paths: list, rounds: int, n_img: int) -> dict:
    req = {"paths": paths, "prompt": P.PROMPT, "batch": b}
    for w in (off, rk):  # warm both sides on this batch size, peak memory counted from here
        r = w.ask(**{**req, "paths": paths[:b]}, reset_peak=True)
        if "error" in r:
            return {"error": r["error"]}
    wr, cr, ow, rw, o_last, r_last = [], [], [], [], None, None
    for _ in range(rounds):
        o, r = off.ask(**req), rk.ask(**req)
        if "error" in o or "error" in r:
            return {"error": o.get("error") or r.get("error")}
        wr.append(o["wall"] / r["wall"])
        cr.append(o["cpu"] / r["cpu"])
        ow.append(o["wall"])
        rw.append(r["wall"])
        o_last, r_last = o, r
    diff, over = agreement(o_last["scores"], r_last["scores"])
    pr = prof.ask(**req, profile=True)
    if "error" in pr:
        return {"error": pr["error"]}
    outside = pr["wall"] - pr["fwd"]
    own = outside - pr["recipe"]
    return dict(model=m, precision=prec, sizes=kind, batch=b, wall=statistics.median(wr), cpu=statistics.median(cr),
                off_ms=statistics.median(ow) / n_img * 1e3, rk_ms=statistics.median(rw) / n_img * 1e3, diff=diff,
                agree=("ok" if over <= 1 else "OVER") if prec == "float32" else "-",
                rss_off=o_last["rss_mib"], rss_rk=r_last["rss_mib"], gpu_off=o_last["gpu_peak_mib"],
                gpu_rk=r_last["gpu_peak_mib"], outside_ms=outside / pr["calls"] * 1e3,
                share=outside / pr["fwd"] if pr["fwd"] else float("nan"), own_ms=own / pr["calls"] * 1e3,
                own_share=own / pr["fwd"] if pr["fwd"] else float("nan"))


HEAD = (f"{'model':12s} {'precision':9s} {'sizes':6s} {'batch':>5s} {'wall x':>7s} {'cpu x':>7s} "
        f"{'official ms/img':>15s} {'rk ms/img':>9s} {'max rel diff':>12s} {'agree':>5s} {'RSS off/rk MiB':>15s} "
        f"{'GPU peak off/rk MiB':>19s} {'rk outside fwd/call: all':>25s} {'rk own':>18s}")


def format_row(r: dict) -> str:
    gpu = f"{_mib(r['gpu_off'])}/{_mib(r['gpu_rk'])}"
    return (f"{r['model']:12s} {r['precision']:9s} {r['sizes']:6s} {r['batch']:5d} {r['wall']:6.2f}x "
            f"{r['cpu']:6.2f}x {r['off_ms']:15.2f} {r['rk_ms']:9.2f} {r['diff']:12.2g} {r['agree']:>5s} "
            f"{r['rss_off']:7.0f}/{r['rss_rk']:<7.0f} {gpu:>19s} {r['outside_ms']:9.2f} ms ({r['share']:4.0%}) "
            f"{r['own_ms']:8.2f} ms ({r['own_share']:4.0%})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the same code on the CPU, at toy sizes, 1 round")
    ap.add_argument("--device", default=None, help="default cuda:0 (--dry-run: cpu)")
    ap.add_argument("--models", default=None,
                    help="default hpsv2,imagereward,aesthetic,hpsv3,vqascore (--dry-run: hpsv2,aesthetic)")
    ap.add_argument("--precisions", default="float32,half")
    ap.add_argument("--batches", default=None, help="default 1,8,32 (--dry-run: 1,2)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (--dry-run: 1)")
    ap.add_argument("--images", type=int, default=None, help="images per round (default 32; --dry-run: 2)")
    ap.add_argument("--sizes", default=None, help="default mixed,equal (--dry-run: mixed)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "rewardkit" / "peers" / "work"))
    ap.add_argument("--budget", type=float, default=240.0,
                    help="seconds after which no new cell starts (default 240; a watchdog ends the run at +50 s)")
    ap.add_argument("--official-python", default=None, help="one interpreter for every official side")
    ap.add_argument("--worker", nargs=4, metavar=("SIDE", "MODEL", "WORK", "DEVICE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    dry = a.dry_run
    device = a.device or ("cpu" if dry else "cuda:0")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run benchmarks/peers.py for the CPU figures (or --dry-run)")
            return 2
        faulthandler.dump_traceback_later(a.budget + 50, exit=True)  # a GPU run never outlasts its slot
    models = (a.models or ("hpsv2,aesthetic" if dry else ",".join(P.MODELS))).split(",")
    unknown = [m for m in models if m not in PRECISIONS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(PRECISIONS)}")
    wanted = a.precisions.split(",")
    batches = [int(b) for b in (a.batches or ("1,2" if dry else "1,8,32")).split(",")]
    rounds = a.rounds or (1 if dry else 3)
    n_img = a.images or (2 if dry else 32)
    sizes = (a.sizes or ("mixed" if dry else "mixed,equal")).split(",")
    work = Path(a.work)
    missing = [m for m in models if not P.checkpoint_ready(m, work)]
    if missing:
        print(f"peers (gpu): no tiny checkpoints for {', '.join(missing)} under {work}: run "
              f"`python benchmarks/peers.py --models {','.join(missing)} --batches 1 --rounds 1` first (it writes them "
              "through scripts/parity.sh)")
        return 2
    venvs = Path(os.environ.get("PARITY_VENVS", Path.home() / ".cache" / "rewardkit" / "parity"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t_start = time.time()
    trios, rows = {}, []  # (model, precision) -> (official, rewardkit, profile) workers
    for m in models:
        for prec in wanted:
            if prec not in precisions(m, device):
                print(f"{m:12s} {prec:9s} skipped: the official package has no {prec} mode on {device}", flush=True)
            else:
                trios[m, prec] = None
    cmd = [HERE.as_posix(), "--worker"]

    def start(key):  # the three workers of one (model, precision), loaded
        m, prec = key
        off_py = a.official_python or P._venv_python(P.MODELS[m][1], venvs)
        ws = (P.Worker([off_py, *cmd, "official", m, str(work), device], env),
              P.Worker([sys.executable, *cmd, "rewardkit", m, str(work), device], env),
              P.Worker([sys.executable, *cmd, "profile", m, str(work), device], env))
        return ws, next((x["error"] for x in (w.ask(load=prec) for w in ws) if "error" in x), None)

    with ThreadPoolExecutor(max(1, len(trios))) as pool:  # all start at once: the start-up is most of a short run
        started = dict(zip(trios, pool.map(start, trios)))
    for (m, prec), (ws, err) in started.items():
        if err:
            print(f"{m:12s} {prec:9s} error loading: {err}", flush=True)
        else:
            trios[m, prec] = ws
    name = next(ws for ws, _ in started.values())[1].ready["device"] if started else device
    print(f"device {name}; workers up in {time.time() - t_start:.0f} s; load average {os.getloadavg()[0]:.1f} / "
          f"{os.cpu_count()} cores; one torch thread per side; {rounds} interleaved rounds of {n_img} images; ratios "
          "= official / rewardkit (> 1: rewardkit faster); float32 agreement bound 1e-5 of the score scale",
          flush=True)
    for (m, prec), ws in trios.items():
        if ws is not None:
            official, rk_dtype = precisions(m, device)[prec]
            print(f"{m} {prec}: official {official}, rewardkit {rk_dtype}", flush=True)
    print(HEAD, flush=True)
    # the most telling cells first (mixed sizes, then each batch size across the models): a budget cut drops the rest
    for kind in sizes:
        paths = P.make_images(work, P.MIXED if kind == "mixed" else P.EQUAL, n_img, kind)
        for b in batches:
            for (m, prec), ws in trios.items():
                if ws is None:
                    continue
                if time.time() - t_start > a.budget:
                    print(f"{m:12s} {prec:9s} {kind:6s} {b:5d}  skipped: past the {a.budget:.0f} s budget", flush=True)
                    continue
                row = _cell(*ws, m, prec, kind, b, paths, rounds, n_img)
                if "error" in row:
                    print(f"{m:12s} {prec:9s} {kind:6s} {b:5d}  error: {row['error']}", flush=True)
                    continue
                rows.append(row)
                print(format_row(row), flush=True)
    for ws, _ in started.values():
        for w in ws:
            w.close()
    faulthandler.cancel_dump_traceback_later()
    print(f"{len(rows)} rows in {time.time() - t_start:.0f} s; load average at the end {os.getloadavg()[0]:.1f}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
