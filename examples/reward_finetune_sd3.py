"""Reward-guided fine-tuning of SD3 with gradients from a reward (ReFL / DRaFT-1 style), offline on CPU.

    python examples/reward_finetune_sd3.py                  # tiny random SD3 + tiny PickScore (runs anywhere)
    python examples/reward_finetune_sd3.py --pipeline /models/stable-diffusion-3.5-medium \\
        --reward-model /models/PickScore_v1 --device cuda --dtype bfloat16 --size 512 --inference-steps 28

Each training step samples images with the current model, the first ``K - 1`` denoising steps without
gradients, then runs the **last denoising step with gradients**, decodes with the VAE and back-propagates
``-reward.score_tensor(images, prompts)`` into LoRA adapters on the transformer (ReFL, Xu et al. 2023; DRaFT-1,
Clark et al. 2024). The reward's weights are frozen (rewardkit never gives them gradients); only the pixels
carry gradients back into the generator. Prints the mean reward of fixed evaluation samples before and after,
and saves the LoRA weights (safetensors) to ``--output``.

With the default tiny models the numbers are meaningless, but every piece is the real one: diffusers'
``StableDiffusion3Pipeline`` loaded with ``from_pretrained``, peft LoRA, rewardkit's PickScore.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

PROMPTS = ["a red apple on a wooden table", "two birds on a branch", "a cat sleeping on a mat",
           "a city street at night"]


def encode(pipe, prompts: list[str], max_sequence_length: int):
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None,
                                                  do_classifier_free_guidance=False,
                                                  max_sequence_length=max_sequence_length)
    return embeds, pooled


def sample(pipe, embeds, pooled, *, size: int, steps: int, generator, grad_last: bool) -> torch.Tensor:
    """Images ``[B, 3, size, size]`` in [0, 1]; with ``grad_last`` the last Euler step and the VAE decode keep
    the autograd graph (the rest of the trajectory is detached: ReFL / DRaFT-1)."""
    tr, vae = pipe.transformer, pipe.vae
    b = embeds.shape[0]
    lat = size // pipe.vae_scale_factor
    x = torch.randn(b, tr.config.in_channels, lat, lat, generator=generator).to(embeds.device, embeds.dtype)
    pipe.scheduler.set_timesteps(steps, device=embeds.device)
    sigmas = pipe.scheduler.sigmas.to(embeds.dtype)  # flow matching: x_sigma = (1 - sigma) x0 + sigma noise
    for i in range(steps):
        last = i == steps - 1
        with torch.set_grad_enabled(grad_last and last):
            t = (sigmas[i] * 1000).expand(b)
            v = tr(hidden_states=x, timestep=t, encoder_hidden_states=embeds, pooled_projections=pooled,
                   return_dict=False)[0]
            x = x + (sigmas[i + 1] - sigmas[i]) * v  # Euler step of the flow ODE
    with torch.set_grad_enabled(grad_last):
        z = x / vae.config.scaling_factor + vae.config.shift_factor
        images = vae.decode(z, return_dict=False)[0]
    return (images / 2 + 0.5).clamp(0, 1).float()


def save_lora(transformer, path: Path) -> Path:
    """LoRA weights as safetensors, written atomically."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in get_peft_model_state_dict(transformer).items()}
    tmp = path / "lora.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / "lora.safetensors")
    return path / "lora.safetensors"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", help="SD3 / SD3.5 diffusers directory (default: a tiny random one)")
    ap.add_argument("--reward", default="pickscore", help="a differentiable reward: pickscore, clipscore, preference")
    ap.add_argument("--reward-model", help="the reward's model directory (default: a tiny random CLIP)")
    ap.add_argument("--train-steps", type=int, default=10)
    ap.add_argument("--inference-steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--size", type=int, default=32, help="image side in pixels")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--rank", type=int, default=4, help="LoRA rank")
    ap.add_argument("--max-sequence-length", type=int, default=8, help="T5 tokens (SD3 uses 256 or 512)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=None, help="where to save the LoRA weights (default: a temp dir)")
    args = ap.parse_args(argv)

    import diffusers
    from peft import LoraConfig

    import rewardkit
    from rewardkit.testing import save_tiny_checkpoint

    if not (args.pipeline and args.reward_model):  # the tiny tokenizers truncate every prompt: keep logs readable
        import transformers

        transformers.logging.set_verbosity_error()
        diffusers.utils.logging.set_verbosity_error()
    work = Path(tempfile.mkdtemp(prefix="rk-refl-"))
    dtype = getattr(torch, args.dtype)
    pipe_dir = args.pipeline or str(save_tiny_checkpoint("sd3", work / "tiny-sd3"))
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(pipe_dir, dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)
    for m in pipe.components.values():
        if isinstance(m, torch.nn.Module):
            m.requires_grad_(False)
    pipe.transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian",
                                            target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    lora_params = [p for p in pipe.transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(lora_params, lr=args.lr, weight_decay=0.0)

    reward_model = args.reward_model or str(save_tiny_checkpoint("clip", work / "tiny-reward"))
    reward = rewardkit.load_reward(args.reward, model=reward_model, device=args.device)
    if not reward.differentiable:
        raise SystemExit(f"reward {args.reward!r} gives no gradients to pixels (see `rewardkit ls`, column grad)")

    eval_prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch_size)]
    eval_embeds = encode(pipe, eval_prompts, args.max_sequence_length)

    def evaluate() -> float:
        g = torch.Generator().manual_seed(1234)  # the same noise every time
        with torch.no_grad():
            images = sample(pipe, *eval_embeds, size=args.size, steps=args.inference_steps, generator=g,
                            grad_last=False)
        return float(reward(images, eval_prompts).scores.mean())  # the ordinary (inference-mode) call

    before = evaluate()
    print(f"mean reward before: {before:.4f}")
    g = torch.Generator().manual_seed(args.seed)
    for step in range(args.train_steps):
        prompts = [PROMPTS[(step * args.batch_size + i) % len(PROMPTS)] for i in range(args.batch_size)]
        embeds, pooled = encode(pipe, prompts, args.max_sequence_length)
        images = sample(pipe, embeds, pooled, size=args.size, steps=args.inference_steps, generator=g,
                        grad_last=True)
        scores = reward.score_tensor(images, prompts)  # [B], differentiable w.r.t. the pixels
        loss = -scores.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lora_params, 1.0)
        opt.step()
        print(f"step {step + 1}/{args.train_steps}: reward {float(scores.detach().mean()):.4f}")
    after = evaluate()
    print(f"mean reward after: {after:.4f} (change {after - before:+.4f})")
    reward_grads = [n for m in vars(reward).values() if isinstance(getattr(m, "model", m), torch.nn.Module)
                    for n, p in getattr(m, "model", m).named_parameters() if p.grad is not None]
    assert not reward_grads, f"reward weights received gradients: {reward_grads[:3]}"
    out = save_lora(pipe.transformer, Path(args.output) if args.output else work / "lora")
    print(f"LoRA weights: {out}")
    return {"before": before, "after": after, "lora": str(out)}


if __name__ == "__main__":
    main()
