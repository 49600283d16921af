"""Device check: one DiffusionNFT training step on a full-size SD3.5-Medium-shaped transformer (random weights, no
download), fp16 and bf16, with and without E²PO; and the 2-process NCCL path when two GPUs are present.

Per precision it reports: the step time (3 forwards — old adapter, trained adapter, base model — + backward +
optimizer step, LoRA r=32 on the 8 attention projections, 512^2 images = 64x64x16 latents, batch --batch), a
10-step DPM-Solver-2 rollout time, peak memory, and for E²PO the time of one batched perturbation-search step on
a CLIP-L-shaped text encoder (K=12, --prompts prompts) extrapolated to T_emb = 300.

    python benchmarks/gpu/nft_step.py                 # one GPU, < 5 min
    torchrun --nproc_per_node 2 benchmarks/gpu/nft_step.py --ddp-only   # 2 GPUs: NCCL all-reduce of the LoRA grads
    python benchmarks/gpu/nft_step.py --tiny --device cpu               # a smoke test of this script on CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

SD35M = dict(attention_head_dim=64, num_attention_heads=24, num_layers=24, caption_projection_dim=1536,
             joint_attention_dim=4096, pooled_projection_dim=2048, in_channels=16, out_channels=16, patch_size=2,
             pos_embed_max_size=384, sample_size=128, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
TINY = dict(attention_head_dim=8, num_attention_heads=2, num_layers=2, caption_projection_dim=16,
            joint_attention_dim=32, pooled_projection_dim=32, in_channels=4, out_channels=4, patch_size=2,
            pos_embed_max_size=32, sample_size=32, dual_attention_layers=(0,), qk_norm="rms_norm")


def build(tiny: bool, device: torch.device):
    import diffusers

    from rewardkit.rl.config import LoraArgs
    from rewardkit.rl.sd3 import SD3Policy

    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: 2.5 B parameters are slow to initialise on a CPU
        tr = diffusers.SD3Transformer2DModel(**(TINY if tiny else SD35M))
    tr = tr.to(device, torch.float32).requires_grad_(False)
    pol = SD3Policy.__new__(SD3Policy)  # the adapter logic of the trainer, without loading a pipeline
    pol.transformer, pol.device = tr, device
    lora = LoraArgs(r=4 if tiny else 32, alpha=8 if tiny else 64)
    pol.add_lora(lora.r, lora.alpha, lora.target_modules, lora.init)
    return pol


def nft_step(pol, opt, scaler, amp, x0, cond, r, device):
    from rewardkit.rl import nft

    b = x0.shape[0]
    t = torch.rand(b, device=device).clamp(0.05, 0.95)
    xt = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * torch.randn_like(x0)
    with torch.no_grad():
        with pol.use_old(), torch.autocast(device.type, dtype=amp):
            v_old = pol.velocity(pol.transformer, xt, t, cond)
        with pol.use_reference(), torch.autocast(device.type, dtype=amp):
            v_ref = pol.velocity(pol.transformer, xt, t, cond)
    with torch.autocast(device.type, dtype=amp):
        v = pol.velocity(pol.transformer, xt, t, cond)
    loss, _ = nft.nft_loss(v, v_old, v_ref, x0, xt, t, r)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(pol.adapter_params("default"), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_precision(pol, name, device, args, tiny):
    from rewardkit.rl import schedule, solvers
    from rewardkit.rl.sd3 import Cond

    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    cfg = TINY if tiny else SD35M
    side = 16 if tiny else 64
    b = args.batch
    x0 = torch.randn(b, cfg["in_channels"], side, side, device=device)
    cond = Cond(torch.randn(b, 16 if tiny else 205, cfg["joint_attention_dim"], device=device),
                torch.randn(b, cfg["pooled_projection_dim"], device=device))
    r = torch.rand(b, device=device)
    opt = torch.optim.AdamW(pol.adapter_params("default"), lr=3e-4, weight_decay=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    nft_step(pol, opt, scaler, amp, x0, cond, r, device)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    losses = [nft_step(pol, opt, scaler, amp, x0, cond, r, device) for _ in range(args.iters)]
    sync(device)
    step_s = (time.perf_counter() - t0) / args.iters

    def velocity(x, sigma, i):
        s = torch.full((b,), sigma, device=device)
        with torch.autocast(device.type, dtype=amp):
            return pol.velocity(pol.transformer, x, s, cond).float()

    with torch.no_grad(), pol.use_old():
        sync(device)
        t0 = time.perf_counter()
        solvers.dpm2(velocity, torch.randn_like(x0), schedule.flow_sigmas(10))
        sync(device)
        rollout_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    return {"precision": name, "batch": b, "step_s": round(step_s, 4), "rollout_10_steps_s": round(rollout_s, 4),
            "peak_mem_gib": None if peak is None else round(peak, 2), "loss_finite": all(map(lambda v: v == v, losses))}


def bench_e2po(device, args, tiny, amp_name):
    import transformers

    from rewardkit.rl.exploration import E2POConfig, content_token_mask, optimize_perturbations

    width, layers = (32, 2) if tiny else (768, 12)
    cfg = transformers.CLIPTextConfig(vocab_size=49408, hidden_size=width, intermediate_size=4 * width,
                                      num_hidden_layers=layers, num_attention_heads=2 if tiny else 12,
                                      max_position_embeddings=77, projection_dim=width, eos_token_id=49407,
                                      bos_token_id=49406, pad_token_id=49407)
    torch.manual_seed(0)
    enc = transformers.CLIPTextModelWithProjection(cfg).to(device).eval().requires_grad_(False)
    p = args.prompts
    ids = torch.full((p, 77), 49407, dtype=torch.long)
    ids[:, 0] = 49406
    g = torch.Generator().manual_seed(0)
    for i in range(p):  # content lengths 6..20 tokens
        n = 6 + (i * 5) % 15
        ids[i, 1:n + 1] = torch.randint(1000, 40000, (n,), generator=g)
    mask = content_token_mask(ids, 49407, 49406)
    steps = 3 if tiny else 10
    e = E2POConfig(enabled=True, num_variants=12, steps=steps)
    optimize_perturbations(enc, ids.to(device), mask, E2POConfig(enabled=True, num_variants=12, steps=1),
                           eos_token_id=49407)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    res = optimize_perturbations(enc, ids.to(device), mask, e, eos_token_id=49407)
    sync(device)
    per_step = (time.perf_counter() - t0) / (steps + 1)
    return {"e2po_prompts": p, "e2po_k": 12, "e2po_step_s": round(per_step, 4),
            "e2po_T300_estimate_s": round(per_step * 301, 1), "anchor_cos_mean_after_steps": float(res.anchor_sim.mean())}


def ddp_only(args):
    torch.distributed.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    pol = build(args.tiny, device)
    ddp = torch.nn.parallel.DistributedDataParallel(pol.transformer, device_ids=[rank])
    params = pol.adapter_params("default")
    cfg = TINY if args.tiny else SD35M
    side = 16 if args.tiny else 64
    x = torch.randn(args.batch, cfg["in_channels"], side, side, device=device)
    emb = torch.randn(args.batch, 16 if args.tiny else 205, cfg["joint_attention_dim"], device=device)
    pooled = torch.randn(args.batch, cfg["pooled_projection_dim"], device=device)
    t = torch.full((args.batch,), 500.0, device=device)
    for i in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = ddp(hidden_states=x, timestep=t, encoder_hidden_states=emb, pooled_projections=pooled,
                      return_dict=False)[0]
        out.float().pow(2).mean().backward()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    fp = torch.stack([torch.cat([p.grad.flatten() for p in params]).double().sum()])
    allfp = [torch.zeros_like(fp) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(allfp, fp)
    if rank == 0:
        print(json.dumps({"ddp_world": torch.distributed.get_world_size(), "fwd_bwd_s": round(dt, 4),
                          "grads_equal_across_ranks": bool(all(torch.equal(a, allfp[0]) for a in allfp))}))
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=9)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--ddp-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="the CPU smoke mode: --tiny --device cpu")
    args = ap.parse_args()
    if args.dry_run:
        args.tiny, args.device = True, "cpu"
    if args.ddp_only:
        return ddp_only(args)
    device = torch.device(args.device)
    t_all = time.perf_counter()
    results = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "model": "tiny" if args.tiny else "SD3.5-Medium-shaped (random)", "runs": []}
    pol = build(args.tiny, device)
    results["lora_params"] = sum(p.numel() for p in pol.adapter_params("default"))
    for name in ("fp16", "bf16"):
        results["runs"].append(bench_precision(pol, name, device, args, args.tiny))
        print(json.dumps(results["runs"][-1]), flush=True)
    del pol
    if device.type == "cuda":
        torch.cuda.empty_cache()
    results["e2po"] = bench_e2po(device, args, args.tiny, "fp32")
    print(json.dumps(results["e2po"]), flush=True)
    results["total_s"] = round(time.perf_counter() - t_all, 1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
