"""aesthetic at batch 1, step by step against the official code (issue 41).

    python benchmarks/aesthetic_steps.py [--rounds 12] [--reps 3]

Needs what ``python benchmarks/peers.py --models aesthetic`` leaves under ``~/.cache/rewardkit/peers/work`` (the
tiny checkpoint written through the official classes, its conversion, the mixed-size images) and the image-reward
parity environment (``scripts/parity.sh aesthetic``). The official side runs in that environment as a worker
process (``AestheticScore`` from ``scripts/parity/official_aesthetic.py``); rounds alternate between the two
processes through a pipe, one torch thread each. Per image (CPU time, mean of ``reps`` per round; median and min
over rounds):

- pre: the official ``preprocess(Image.open(path))`` vs rewardkit's ``decode_image`` + ``openai_clip_pixels``
  (the two pixel tensors are checked ``torch.equal`` first);
- fwd: ``mlp(normalize(encode_image(px)))`` vs rewardkit's direct CLIP forward + head, on the SAME pixel tensor;
- full: ``AestheticScore.score(None, path)`` vs ``reward([path], prompt)``.

``full - pre - fwd`` is what each side spends outside the two steps (rewardkit: its own per-call time, plus the
cost of running them back to back rather than each on warm data).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(os.path.expanduser("~/.cache/rewardkit/peers/work"))
PARITY = Path(os.path.expanduser("~/.cache/rewardkit/parity"))
STEPS = ("pre", "fwd", "full")


def worker(parity_dir: str, out_dir: str) -> None:  # runs in the image-reward parity environment
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.nn.functional as F
    from PIL import Image

    torch.set_num_threads(1)
    sys.path.insert(0, parity_dir)
    import official_aesthetic as oa

    out = Path(out_dir)
    clip, AS = oa._official_modules()
    real_load = clip.load
    AS.clip.load = lambda name, **kw: real_load(str(out / "openai-clip-tiny.pt"), **kw)
    sc = AS.AestheticScore(download_root=str(out), device="cpu")
    sc.mlp.load_state_dict(torch.load(out / "aesthetic.pth", weights_only=True))
    sc.eval()
    pt = time.process_time
    for line in sys.stdin:
        cmd = json.loads(line)
        res = {k: [] for k in STEPS}
        with torch.no_grad():
            for p in cmd["paths"]:
                px = sc.preprocess(Image.open(p)).unsqueeze(0)
                if cmd.get("dump"):
                    torch.save(px, os.path.join(cmd["dump"], os.path.basename(p) + ".pt"))
                for _ in range(cmd["n"]):
                    t = pt(); sc.preprocess(Image.open(p)).unsqueeze(0); res["pre"].append(pt() - t)  # noqa: E702
                    t = pt(); sc.mlp(F.normalize(sc.clip_model.encode_image(px)).float()); res["fwd"].append(pt() - t)  # noqa: E702,E501
                    t = pt(); sc.score(None, p); res["full"].append(pt() - t)  # noqa: E702
        print(json.dumps(res), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import tempfile

    import torch

    from rewardkit.models.zoo import clip_image_embeddings, openai_clip_pixels
    from rewardkit.rewards.aesthetic import Aesthetic

    torch.set_num_threads(1)
    envs = [p for p in sorted(PARITY.glob("imagereward-*")) if list(p.glob("lib/python*/site-packages/clip"))]
    if not envs or not (WORK / "aesthetic" / "converted" / "rewardkit.json").is_file():
        sys.exit("needs the image-reward parity environment and benchmarks/peers.py's aesthetic work files")
    reward = Aesthetic(model=str(WORK / "aesthetic" / "converted"), device="cpu")
    paths = sorted(glob.glob(str(WORK / "peers-images" / "mixed*")))[:6]
    off = subprocess.Popen([str(envs[0] / "bin" / "python"), __file__, "--worker",
                            str(Path(__file__).resolve().parents[1] / "scripts" / "parity"), str(WORK / "aesthetic")],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"})

    def ask(cmd: dict) -> dict:
        off.stdin.write(json.dumps(cmd) + "\n")
        off.stdin.flush()
        return json.loads(off.stdout.readline())

    with tempfile.TemporaryDirectory() as tmp:
        ask({"paths": paths, "n": 1, "dump": tmp})
        px = {p: torch.load(os.path.join(tmp, os.path.basename(p) + ".pt")) for p in paths}
    for p in paths:
        assert torch.equal(openai_clip_pixels([reward.decode_image(p)], 224), px[p]), p
    pt = time.process_time

    def ours(n: int) -> dict:
        res = {k: [] for k in STEPS}
        for p in paths:
            for _ in range(n):
                t = pt()
                openai_clip_pixels([reward.decode_image(p)], 224)
                res["pre"].append(pt() - t)
                t = pt()
                with torch.inference_mode():
                    reward.head(clip_image_embeddings(reward.backbone.model, px[p]))[:, 0]
                res["fwd"].append(pt() - t)
                t = pt()
                reward([p], "x")
                res["full"].append(pt() - t)
        return res

    ours(1), ask({"paths": paths, "n": 1})  # warm-up
    got = {"official": {k: [] for k in STEPS}, "rewardkit": {k: [] for k in STEPS}}
    for i in range(args.rounds):
        for who in (("official", "rewardkit") if i % 2 else ("rewardkit", "official")):
            res = ours(args.reps) if who == "rewardkit" else ask({"paths": paths, "n": args.reps})
            for k in STEPS:
                got[who][k].append(sum(res[k]) / len(res[k]) * 1e3)
    off.stdin.close()
    off.wait()
    print(f"load {os.getloadavg()[0]:.2f}; {args.rounds} rounds x {args.reps} reps x {len(paths)} mixed images; "
          "CPU ms per image, median / min over rounds")
    med = {w: {k: statistics.median(v) for k, v in got[w].items()} for w in got}
    for k in STEPS:
        o, r = got["official"][k], got["rewardkit"][k]
        print(f"{k:5s} official {med['official'][k]:7.3f} / {min(o):7.3f}   rewardkit {med['rewardkit'][k]:7.3f} / "
              f"{min(r):7.3f}   official/rewardkit {med['official'][k] / med['rewardkit'][k]:.3f} "
              f"(min {min(o) / min(r):.3f})")
    for w in got:
        print(f"{w}: full - pre - fwd {med[w]['full'] - med[w]['pre'] - med[w]['fwd']:+.3f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
