"""Tensor fast path vs the processor path: input path + model time for float [B, 3, 512, 512] batches.

    python benchmarks/tensor_path.py [--device cpu] [--images 32] [--side 512] [--repeats 5] [--clip small]
    python benchmarks/gpu/tensor_path.py          # the same on a CUDA device (ViT-L/14-size CLIP, bf16)

For each reward, the same float tensor (on ``--device``) is scored twice per round, interleaved:

- **tensor path** (the default for float tensors): validation, resize / crop / normalise (CLIP) or
  ``smart_resize`` + patchify (Qwen-VL) in torch on the tensor's device, then the model;
- **processor path** (``preprocess="processor"``, what every input took before): copy to the host, round to
  8-bit PIL images, the Hugging Face PIL image processor image by image, back to the device, then the model.

Also timed alone: the input path without the model (``input_s``). One warm-up round is discarded; medians of
``--repeats`` rounds. Prints one JSON object. Models are random instances of the real classes with real input
geometry: CLIP (``--clip small``: ViT-B/32 geometry -- 224 px crop, 32 px patches -- at width 256 / 4 layers;
``base``: ViT-B/32 size; ``large``: ViT-L/14 size) and the tiny Qwen2.5-VL preference model with Qwen2.5-VL's
default pixel budget (min 56², max 28² x 1280: a 512² image becomes 504² = 1296 patches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLIP_SIZES = {  # vision (hidden, layers, heads, patch), text (hidden, layers, heads), projection
    "small": ((256, 4, 4, 32), (256, 4, 4), 256),
    "base": ((768, 12, 12, 32), (512, 12, 8), 512),
    "large": ((1024, 24, 16, 14), (768, 12, 12), 768),
}


def save_clip(path: Path, size: str) -> Path:
    """A random CLIPModel with real ViT geometry + a 224 px CLIP processor, saved for from_pretrained."""
    import transformers

    from rewardkit.testing import build_tiny_tokenizer

    (vh, vl, vheads, patch), (th, tl, theads), proj = CLIP_SIZES[size]
    tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    tok.model_max_length = 77
    cfg = transformers.CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=th, intermediate_size=4 * th, num_hidden_layers=tl,
                         num_attention_heads=theads, max_position_embeddings=77, projection_dim=proj,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=vh, intermediate_size=4 * vh, num_hidden_layers=vl, num_attention_heads=vheads,
                           image_size=224, patch_size=patch, projection_dim=proj),
        projection_dim=proj)
    torch.manual_seed(0)
    transformers.CLIPModel(cfg).save_pretrained(path, safe_serialization=True)
    transformers.CLIPProcessor(image_processor=transformers.CLIPImageProcessorPil(), tokenizer=tok).save_pretrained(path)
    return path


def save_preference(path: Path) -> Path:
    from rewardkit.models.preference import PreferenceModel

    torch.manual_seed(0)
    PreferenceModel.from_backbone("tiny:qwen2_5_vl", min_pixels=56 * 56, max_pixels=28 * 28 * 1280).save_pretrained(path)
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def bench_pair(name, fast, slow, x, prompts, input_fast, input_slow, repeats, device) -> dict:
    fast_t, slow_t, fin_t, sin_t = [], [], [], []
    for rnd in range(repeats + 1):
        a = timed(lambda: fast(x, prompts), device)
        b = timed(lambda: slow(x, prompts), device)
        c = timed(input_fast, device)
        d = timed(input_slow, device)
        if rnd:  # round 0 warms up
            fast_t.append(a), slow_t.append(b), fin_t.append(c), sin_t.append(d)
    diff = float((fast(x, prompts).scores - slow(x, prompts).scores).abs().max())
    med = statistics.median
    return {
        "reward": name,
        "tensor_path_s": round(med(fast_t), 4), "processor_path_s": round(med(slow_t), 4),
        "ratio": round(med(slow_t) / med(fast_t), 2),
        "input_tensor_s": round(med(fin_t), 4), "input_processor_s": round(med(sin_t), 4),
        "input_ratio": round(med(sin_t) / med(fin_t), 1),
        "max_abs_score_diff": diff,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--side", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--clip", choices=sorted(CLIP_SIZES), default="small")
    ap.add_argument("--dtype", default="float32", help="model dtype (bfloat16 on GPUs)")
    ap.add_argument("--skip-preference", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (0: torch's default); 1 compares with PIL's single thread fairly "
                         "and keeps timings stable on a shared machine")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from rewardkit import load_reward, media, preprocess

    device = torch.device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="rk-tensor-bench-"))
    g = torch.Generator().manual_seed(0)
    base = torch.rand(args.images, 3, args.side // 16, args.side // 16, generator=g)
    x = torch.nn.functional.interpolate(base, size=(args.side, args.side), mode="bicubic").clamp(0, 1).to(device)
    prompts = [f"a photo of object number {i} on a table" for i in range(args.images)]
    results = {"device": str(device), "images": args.images, "side": args.side, "repeats": args.repeats,
               "torch": torch.__version__, "threads": torch.get_num_threads(), "rewards": []}
    if device.type == "cuda":
        results["gpu"] = torch.cuda.get_device_name(device)

    clip_dir = save_clip(tmp / "clip", args.clip)
    kw = dict(model=str(clip_dir), device=str(device), dtype=args.dtype, batch_size=args.images)
    fast = load_reward("clipscore", **kw)
    slow = load_reward("clipscore", preprocess="processor", **kw)
    ip, params = slow.backbone.processor.image_processor, fast.backbone.tensor_params
    results["rewards"].append(bench_pair(
        f"clipscore ({args.clip})", fast, slow, x, prompts,
        lambda: preprocess.clip_pixel_values(x, params).to(fast.backbone.dtype),
        lambda: ip(images=[media._to_pil(t) for t in media.split_batch(x)],
                   return_tensors="pt")["pixel_values"].to(device, fast.backbone.dtype),
        args.repeats, device))
    del fast, slow

    if not args.skip_preference:
        pref_dir = save_preference(tmp / "preference")
        kw = dict(model=str(pref_dir), device=str(device), dtype=args.dtype, batch_size=args.images)
        fast = load_reward("preference", **kw)
        slow = load_reward("preference", preprocess="processor", **kw)
        qp = fast.model.tensor_params()
        qip = slow.model.processor.image_processor
        results["rewards"].append(bench_pair(
            "preference (tiny Qwen2.5-VL, default pixel budget)", fast, slow, x, prompts,
            lambda: preprocess.qwen_pixel_values(x, qp),
            lambda: qip(images=[media._to_pil(t) for t in media.split_batch(x)],
                        return_tensors="pt")["pixel_values"].to(device),
            args.repeats, device))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
