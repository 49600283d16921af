"""The direct forward (rewardkit.models.direct_forward, issue 41) against transformers' stock call.

    python benchmarks/direct_forward.py                       # both parts, aesthetic / hpsv2 / imagereward
    python benchmarks/direct_forward.py --models aesthetic --blocks 30
    python benchmarks/direct_forward.py --models imagereward --only text --batches 1,8,32

One torch thread, CPU time (thread clock). Part 1, the wrappers alone: a CLIP and a BLIP vision tower of two
layers and ImageReward's BLIP text tower (one layer with cross-attention), 8 wide, so that the maths costs next
to nothing and what is left is each path's per-call Python and operator dispatch. Part 2, whole calls from files
(PNGs of six sizes: 8 one by one, 16 in batches of 8, 32 in one batch of 32) of the tiny rewards
(``Reward.tiny``; the peers checkpoints under ``--work`` when they exist), with the direct path on and off (off:
the stock ``get_image_features`` / ``BlipVisionModel`` / ``BlipTextModel`` call, the previous code's forward;
``--only vision`` / ``--only text`` toggles those towers alone, the others direct both sides) alternated in
blocks in one process, so that load drifts hit both; printed: the paired median of stock / direct CPU per image
(> 1: direct faster) and its inter-quartile range. Both paths give the same scores (checked: within 2e-6 of the
largest; the direct path runs the last layer for the pooled row alone, through other kernel blockings).

Part 3 (``--depth``, alone): the stock call, the direct path with its last layer run whole, and the direct path,
on ViT-L/14's and ViT-H/14's shapes (random weights) at batch 1, where the saving that matters is the last layer
run for the pooled row alone (about one layer's share).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES = [(512, 512), (640, 360), (360, 640), (301, 300), (97, 61), (1000, 250)]
PROMPT = "a photo of a cat sitting on a mat"


def _clock(fn, n: int) -> float:
    t = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t) / n


def wrappers(reps: int = 9) -> None:
    import torch
    import transformers

    from rewardkit.models.direct_forward import blip_text_states, blip_vision_states, clip_image_features

    vision = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=14, hidden_act="quick_gelu")
    text = dict(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    clip = transformers.CLIPModel._from_config(
        transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8),
        attn_implementation="sdpa").eval()
    blip = transformers.BlipVisionModel(transformers.BlipVisionConfig(
        hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        patch_size=16)).eval()
    btext = transformers.BlipTextModel(transformers.BlipTextConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        encoder_hidden_size=8, max_position_embeddings=40, is_decoder=True, bos_token_id=0, sep_token_id=1,
        eos_token_id=1), add_pooling_layer=False).eval()
    pc, pb = torch.randn(1, 3, 28, 28), torch.randn(1, 3, 32, 32)
    ids, img = torch.randint(2, 64, (1, 35)), torch.randn(1, 5, 8)
    mask = (torch.arange(35) < 9).long()[None]  # 9 tokens padded to ImageReward's 35

    def stock_text():
        return btext(input_ids=ids, attention_mask=mask, encoder_hidden_states=img,
                     encoder_attention_mask=torch.ones(1, 5, dtype=torch.long), is_decoder=False)

    with torch.inference_mode():
        for name, stock, direct in (
                ("CLIP", lambda: clip.get_image_features(pixel_values=pc), lambda: clip_image_features(clip, pc)),
                ("BLIP", lambda: blip(pixel_values=pb), lambda: blip_vision_states(blip, pb)),
                ("BLIP text", stock_text, lambda: blip_text_states(btext, ids, mask, img))):
            s = [_clock(stock, 1000) * 1e6 for _ in range(reps)]
            d = [_clock(direct, 1000) * 1e6 for _ in range(reps)]
            print(f"wrappers {name}: us per call, stock min {min(s):.0f} median {statistics.median(s):.0f} | "
                  f"direct min {min(d):.0f} median {statistics.median(d):.0f}", flush=True)


def _images(folder: Path) -> list[str]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(32):
        w, h = SIZES[i % len(SIZES)]
        p = folder / f"img_{i:02d}_{w}x{h}.png"
        if not p.exists():
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
        paths.append(str(p))
    return paths


def _reward(name: str, work: Path, tmp: str):
    from rewardkit import load_reward
    from rewardkit.registry import get_reward_class

    converted = work / name / "converted"
    if (converted / "rewardkit.json").is_file():
        return load_reward(name, model=str(converted), device="cpu")
    return get_reward_class(name).tiny(tmp)


def calls(models: list[str], blocks: int, work: Path, only: str = "all", batches=(1, 8)) -> None:
    import torch

    from rewardkit.models import direct_forward as dfw

    def stock_clip(model, px):
        out = model.get_image_features(pixel_values=px)
        return getattr(out, "pooler_output", out)

    def stock_blip(vision, px):
        return vision(pixel_values=px).last_hidden_state

    def stock_text(text, ids, mask, img, first_only=False):
        ones = torch.ones(img.shape[:2], dtype=torch.long, device=img.device)
        out = text(input_ids=ids, attention_mask=mask, encoder_hidden_states=img, encoder_attention_mask=ones,
                   is_decoder=False).last_hidden_state
        return out[:, :1] if first_only else out

    direct = (dfw.clip_image_features, dfw.blip_vision_states, dfw.blip_text_states)
    stock = (stock_clip, stock_blip, stock_text)
    toggled = {"all": (0, 1, 2), "vision": (0, 1), "text": (2,)}[only]

    def use(on: bool) -> None:
        dfw.clip_image_features, dfw.blip_vision_states, dfw.blip_text_states = (
            stock[i] if not on and i in toggled else direct[i] for i in range(3))

    with tempfile.TemporaryDirectory() as tmp:
        paths = _images(Path(tmp))
        try:
            for name in models:
                reward = _reward(name, work, tmp)
                for b in batches:
                    chunks = [paths[i:i + b] for i in range(0, len(paths), b)][: 8 if b == 1 else max(1, 16 // b)]
                    scores = {}
                    for on in (True, False):
                        use(on)
                        scores[on] = torch.cat([reward(c, PROMPT).scores for c in chunks])  # also warms
                    # equal within rounding: the direct path runs the last layer for the pooled row only
                    rel = float((scores[True] - scores[False]).abs().max() / scores[False].abs().max().clamp_min(1e-30))
                    assert rel <= 2e-6, (name, rel)

                    n_img = sum(map(len, chunks))

                    def run():
                        return _clock(lambda: [reward(c, PROMPT) for c in chunks], 1) / n_img * 1e3

                    got = {True: [], False: []}
                    for k in range(blocks):
                        for on in ((True, False) if k % 2 else (False, True)):
                            use(on)
                            got[on].append(run())
                    r = sorted(s / d for s, d in zip(got[False], got[True]))
                    print(f"calls {name:12s} batch {b}: CPU ms per image stock {statistics.median(got[False]):.2f} "
                          f"direct {statistics.median(got[True]):.2f}; stock / direct paired median "
                          f"{statistics.median(r):.3f} (IQR {r[len(r) // 4]:.3f}-{r[3 * len(r) // 4]:.3f}); "
                          f"scores equal within {rel:.1e} of the largest", flush=True)
        finally:
            use(True)


#: published towers' vision configurations (random weights; only the shapes matter for the time)
DEPTHS = {
    "vit-l-14": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                     image_size=224, patch_size=14, hidden_act="quick_gelu"),  # aesthetic's OpenAI ViT-L/14
    "vit-h-14": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                     image_size=224, patch_size=14, hidden_act="gelu"),  # HPSv2's OpenCLIP ViT-H/14
}


def depth(names: list[str], reps: int) -> None:
    """Stock ``get_image_features`` against the direct path on a published tower's shape at batch 1, and the direct
    path with its last layer run whole (every row, as before issue 41's last change): what running that layer
    for the pooled row alone saves at real depth, and what the rest of the direct path does there."""
    import torch
    import transformers

    from rewardkit.models import direct_forward as dfw

    text = dict(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    real_layer = dfw._clip_layer
    for name in names:
        vision = DEPTHS[name]
        torch.manual_seed(0)
        model = transformers.CLIPModel._from_config(
            transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=768),
            attn_implementation="sdpa").eval()
        px = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))

        def stock():
            out = model.get_image_features(pixel_values=px)
            return getattr(out, "pooler_output", out)

        def direct(whole: bool = False):
            if whole:  # every layer on every row
                dfw._clip_layer = lambda layer, h, impl, first_only=False: real_layer(layer, h, impl)
            try:
                return dfw.clip_image_features(model, px)
            finally:
                dfw._clip_layer = real_layer

        fns = {"stock": stock, "whole": lambda: direct(True), "direct": direct}
        with torch.inference_mode():
            ref = stock()
            assert torch.equal(direct(True), ref), name  # the whole layers: the stock values bit for bit
            rel = float((direct() - ref).abs().max() / ref.abs().max())
            got = {k: [] for k in fns}
            order = list(fns)
            for k in range(reps):
                for who in (order if k % 2 else order[::-1]):
                    got[who].append(_clock(fns[who], 1) * 1e3)

        def ratio(a: str, b: str) -> str:
            r = sorted(x / y for x, y in zip(got[a], got[b]))
            return f"{statistics.median(r):.3f} (IQR {r[len(r) // 4]:.3f}-{r[3 * len(r) // 4]:.3f})"

        layers = vision["num_hidden_layers"]
        med = {k: statistics.median(v) for k, v in got.items()}
        print(f"depth {name} ({layers} layers, {vision['hidden_size']} wide) batch 1: CPU ms stock {med['stock']:.0f}"
              f", direct with the last layer whole {med['whole']:.0f}, direct {med['direct']:.0f}; paired medians: "
              f"stock / direct {ratio('stock', 'direct')}, last layer whole / one row {ratio('whole', 'direct')} "
              f"(one layer of {layers} is {1 / layers:.1%}); features within {rel:.1e} of the largest", flush=True)
        del model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="aesthetic,hpsv2,imagereward")
    ap.add_argument("--blocks", type=int, default=20, help="alternated blocks per row (default 20)")
    ap.add_argument("--work", default=str(Path.home() / ".cache" / "rewardkit" / "peers" / "work"))
    ap.add_argument("--skip-wrappers", action="store_true")
    ap.add_argument("--only", choices=("all", "vision", "text"), default="all",
                    help="which towers' direct path is toggled (default all)")
    ap.add_argument("--batches", default="1,8", help="batch sizes of part 2 (default 1,8; 32 repeats the images)")
    ap.add_argument("--depth", nargs="?", const="vit-l-14,vit-h-14", default="",
                    help="only part 3: stock vs direct on published towers' shapes (default vit-l-14,vit-h-14)")
    ap.add_argument("--reps", type=int, default=8, help="alternated repetitions of part 3 (default 8)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; one torch thread; CPU time (thread clock)", flush=True)
    if args.depth:
        depth([n for n in args.depth.split(",") if n], args.reps)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        return 0
    if not args.skip_wrappers:
        wrappers()
    calls([m for m in args.models.split(",") if m], args.blocks, Path(args.work), args.only,
          [int(b) for b in args.batches.split(",")])
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
