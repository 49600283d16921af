"""E²PO perturbation search: batched (ours) vs the seed paper's per-variant loop, side by side in one run.

The encoder is a CLIP ViT-B/32-shaped text tower (``CLIPTextModelWithProjection``: width 512, 12 layers, 8 heads,
77 positions, projection 512) with random weights (no download), SD3's CLIP-L role. K = 12 (11 learnable
variants) for ``--prompts`` prompts, ``--steps`` optimisation steps, the seed's hyper-parameters otherwise.

Three timings: the seed's loop (one encoder forward per variant per prompt per step, full 77-token sequence);
batched (all variants x prompts in one call per step, full sequence); batched + the exact cut after the last
end-of-text token (ours, the default). Results must agree to 1e-5 (the delta, the final anchor cosines).

    python benchmarks/e2po_batching.py                  # CPU
    python benchmarks/e2po_batching.py --device cuda --steps 20 --prompts 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


def build_encoder(layers: int, device: str, dtype=torch.float32):
    import transformers

    from rewardkit.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer(300, clip_style=True, extra_tokens=())
    tok.model_max_length = 77
    cfg = transformers.CLIPTextConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=2048,
                                      num_hidden_layers=layers, num_attention_heads=8, max_position_embeddings=77,
                                      projection_dim=512, bos_token_id=tok.bos_token_id,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        enc = transformers.CLIPTextModelWithProjection(cfg).eval().to(device, dtype)
    enc.requires_grad_(False)
    return enc, tok


PROMPTS = ["a photo of a cat", "a red car and a blue bicycle", "a green bowl to the left of a cup",
           "three birds on a branch", "a black sink and a white toilet", "a cow below a tv",
           "two apples on a table", "an orange kite in the sky"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--eq-layers", type=int, default=2, help="layers of the float64 encoder for the equality check")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from rewardkit.rl.exploration import (E2POConfig, content_token_mask, optimize_perturbations,
                                          optimize_perturbations_loop)

    enc, tok = build_encoder(args.layers, args.device)
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" number {i}") for i in range(args.prompts)]
    ids = tok(prompts, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    mask = content_token_mask(ids, tok.eos_token_id, tok.bos_token_id)
    cfg = E2POConfig(enabled=True, num_variants=args.k, steps=args.steps)

    def run(fn, encoder, **kw):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = fn(encoder, ids.to(args.device), mask, cfg, generator=torch.Generator().manual_seed(1), **kw)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return res, time.perf_counter() - t0

    def diffs(a, b):
        return {"delta": float((a.delta.double() - b.delta.double()).abs().max()),
                "anchor_cos": float((a.anchor_sim.double() - b.anchor_sim.double()).abs().max()),
                "pairwise_cos": float((a.pairwise_sim.double() - b.pairwise_sim.double()).abs().max())}

    # timings, float32, side by side
    run(optimize_perturbations, enc, eos_token_id=tok.eos_token_id)  # warm-up
    loop, t_loop = run(optimize_perturbations_loop, enc)
    full, t_full = run(optimize_perturbations, enc, eos_token_id=None)
    ours, t_ours = run(optimize_perturbations, enc, eos_token_id=tok.eos_token_id)
    # equality: the same three computations in float64 (in float32, AdamW's sign-like first steps turn rounding
    # differences of near-zero gradients into differences of up to one lr step in single elements)
    enc64, _ = build_encoder(args.eq_layers, args.device, torch.float64)
    loop64, _ = run(optimize_perturbations_loop, enc64)
    full64, _ = run(optimize_perturbations, enc64, eos_token_id=None)
    ours64, _ = run(optimize_perturbations, enc64, eos_token_id=tok.eos_token_id)
    eq = {"batched_full_seq": diffs(full64, loop64), "batched_cut": diffs(ours64, loop64)}
    lengths = (mask.sum(1) + 2).tolist()
    out = {"k": args.k, "prompts": args.prompts, "steps": args.steps, "layers": args.layers, "device": args.device,
           "threads": torch.get_num_threads(), "tokens_incl_bos_eos": lengths,
           "seed_loop_s": round(t_loop, 3), "batched_full_seq_s": round(t_full, 3), "batched_cut_s": round(t_ours, 3),
           "speedup_batched_full_seq": round(t_loop / t_full, 2), "speedup_batched_cut": round(t_loop / t_ours, 2),
           "max_abs_diff_float64": eq, "max_abs_diff_float32": {"batched_full_seq": diffs(full, loop),
                                                                 "batched_cut": diffs(ours, loop)},
           "anchor_cos_mean": float(ours.anchor_sim.mean()), "pairwise_cos_mean": float(ours.pairwise_sim.mean()),
           "config": dataclasses.asdict(cfg)}
    print(json.dumps(out, indent=1))
    worst = max(v for d in eq.values() for v in d.values())
    assert worst < 1e-5, f"batched and looped results differ in float64 by {worst}"


if __name__ == "__main__":
    main()
