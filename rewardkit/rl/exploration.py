"""E²PO: embedding-perturbed exploration for flow-model RL (the seed paper, "E²PO: Embedding-perturbed
Exploration Preference Optimization for Flow Models", arXiv 2605.15803).

Per prompt, ``K - 1`` learnable perturbations ``delta_k`` of the *static token embeddings* of the content tokens
(no BOS / EOS / padding) of one text encoder are optimised so that the pooled text embeddings of the variants
are mutually diverse but stay near the prompt:

    L_div = mean over ordered pairs (i != j) of the variants of cos(e_i, e_j)
    L_anc = sum_k max(|cos(e_k, e_anchor) - mu| - eps, 0)
    L_emb = lambda_div * L_div + L_anc,       delta ~ N(0, sigma_init^2) at init, AdamW, clamp to +-delta_max

Sampling then uses the noise-aware condition ``C_k(t) = gamma(sigma_t) C_k + (1 - gamma) C_orig`` with
``gamma = clip((sigma_t - (1 - rho)) / rho, 0, 1)``, and every group keeps one unperturbed member
(reference-anchored batching). Rewards and the policy update are conditioned on the original prompt.

**Batched.** The paper's pseudocode runs one encoder forward per variant per prompt per optimisation step. Here
every variant of every prompt of a batch goes through the encoder in one call per step
(:func:`optimize_perturbations`); the losses are summed over prompts, so each prompt's gradients (and AdamW's
element-wise updates) are those of its own loop. For causal encoders (CLIP) the sequence is also cut after the
last end-of-text token of the batch: the pooled output, read at the end-of-text token, never sees later
positions, so the result is unchanged. :func:`optimize_perturbations_loop` is the seed's loop, kept as the
reference the tests and ``benchmarks/e2po_batching.py`` compare against.

Decisions where the seed is ambiguous (see ``docs/rl.md``): K - 1 perturbations (Algorithm 1), L_div is the
mean over the ordered pairs of those K - 1 variants (0 when K = 2), L_anc a sum; clamp per element (the
pseudocode); AdamW with torch's default weight decay 0.01 (the pseudocode); gamma uses the scheduler's
(shifted) sigma the transformer sees; both the sequence embeddings and the pooled embeddings are
interpolated; "Pool" is the encoder's projected pooled output (CLIP's ``text_embeds``, what SD3 conditions on).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["E2POConfig", "content_token_mask", "diversity_loss", "anchor_loss", "anchor_similarity",
           "noise_aware_gamma", "noise_aware_condition", "embedding_offset", "pooled_embeddings",
           "optimize_perturbations", "optimize_perturbations_loop", "Perturbations", "anchor_band",
           "check_anchor_band"]


@dataclass
class E2POConfig:
    """E²PO knobs. Defaults are the seed paper's hyper-parameters (its Table of training settings)."""

    enabled: bool = False
    num_variants: int = 12            # K: conditions per prompt, one of them the unperturbed original
    steps: int = 300                  # T_emb: optimisation steps per prompt batch
    lr: float = 1e-3                  # alpha_emb
    weight_decay: float = 0.01        # AdamW's default, as in the paper's pseudocode (the paper does not say)
    sigma_init: float = 1e-4
    delta_max: float = 0.05           # element-wise clamp of delta
    lambda_div: float = 50.0
    mu: float = 0.80                  # anchor cosine target
    eps: float = 0.01                 # anchor margin (epsilon-insensitive)
    rho: float = 0.4                  # perturbation range of the noise-aware schedule
    # Which SD3 text encoders are perturbed: clip_l (text_encoder), clip_g (text_encoder_2). The paper's
    # ablation (its Fig. 9) finds CLIP-L alone more stable than CLIP-L + OpenCLIP-G; T5 is never perturbed.
    encoders: list[str] = field(default_factory=lambda: ["clip_l"])
    truncate_after_eos: bool = True   # exact for causal encoders (CLIP); a 3-7x cut in encoder work
    warn_band: float = 0.1            # warn when the mean anchor cosine leaves [mu-eps-band, mu+eps+band]

    def validate(self) -> None:
        if self.num_variants < 2:
            raise ValueError(f"e2po.num_variants (K) must be >= 2, got {self.num_variants}")
        if self.steps < 0 or not self.lr > 0 or not self.sigma_init >= 0 or not self.delta_max > 0:
            raise ValueError("e2po.steps >= 0, e2po.lr > 0, e2po.sigma_init >= 0 and e2po.delta_max > 0 required")
        if not 0 < self.rho <= 1:
            raise ValueError(f"e2po.rho must be in (0, 1], got {self.rho}")
        if not -1 <= self.mu <= 1 or self.eps < 0:
            raise ValueError(f"e2po.mu must be a cosine in [-1, 1] and eps >= 0, got {self.mu}, {self.eps}")
        bad = [e for e in self.encoders if e not in ("clip_l", "clip_g")]
        if bad or not self.encoders:
            raise ValueError(f"e2po.encoders must be a non-empty subset of [clip_l, clip_g], got {self.encoders}")


# ---------------------------------------------------------------------------------------------- pure math
def content_token_mask(input_ids: torch.Tensor, eos_token_id: int, bos_token_id: int | None = None) -> torch.Tensor:
    """Content-token positions: before the first end-of-text token, excluding a leading BOS.

    Found from the first EOS rather than by filtering ids, because CLIP tokenizers pad with EOS.
    input_ids: ``[B, S]``; returns bool ``[B, S]``.
    """
    ids = input_ids
    is_eos = ids == eos_token_id
    pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    first_eos = torch.where(is_eos.any(1), torch.where(is_eos, pos, ids.shape[1]).min(1).values,
                            torch.full((ids.shape[0],), ids.shape[1], device=ids.device))
    mask = pos < first_eos[:, None]
    if bos_token_id is not None:
        mask &= ~((pos == 0) & (ids == bos_token_id))
    return mask


def diversity_loss(e: torch.Tensor) -> torch.Tensor:
    """Mean cosine similarity over the ordered pairs (i != j) of the V variants: e ``[..., V, D]`` -> ``[...]``.
    Zero when V < 2 (no pair)."""
    v = e.shape[-2]
    if v < 2:
        return e.sum(dim=(-1, -2)) * 0.0
    u = F.normalize(e, dim=-1, eps=1e-8)
    sim = u @ u.transpose(-1, -2)
    off = sim.sum(dim=(-1, -2)) - sim.diagonal(dim1=-2, dim2=-1).sum(-1)
    return off / (v * (v - 1))


def anchor_similarity(e: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """cos(e_k, e_anchor): e ``[..., V, D]``, anchor ``[..., D]`` -> ``[..., V]``."""
    return F.cosine_similarity(e, anchor.unsqueeze(-2).expand_as(e), dim=-1, eps=1e-8)


def anchor_loss(e: torch.Tensor, anchor: torch.Tensor, mu: float = 0.8, eps: float = 0.01) -> torch.Tensor:
    """``sum_k max(|cos(e_k, anchor) - mu| - eps, 0)``: e ``[..., V, D]``, anchor ``[..., D]`` -> ``[...]``."""
    return (anchor_similarity(e, anchor) - mu).abs().sub(eps).clamp(min=0).sum(-1)


def noise_aware_gamma(sigma: torch.Tensor | float, rho: float = 0.4) -> torch.Tensor:
    """``gamma(sigma) = clip((sigma - (1 - rho)) / rho, 0, 1)``: 1 at sigma = 1, 0 for sigma <= 1 - rho."""
    s = torch.as_tensor(sigma, dtype=torch.float64)
    return ((s - (1 - rho)) / rho).clamp(0, 1)


def noise_aware_condition(c_orig: torch.Tensor, c_opt: torch.Tensor, sigma: torch.Tensor | float,
                          rho: float = 0.4) -> torch.Tensor:
    """``gamma(sigma) * c_opt + (1 - gamma) * c_orig``; sigma a scalar or ``[B]`` (broadcast over the rest)."""
    g = noise_aware_gamma(sigma, rho).to(c_orig.dtype).to(c_orig.device)
    while g.ndim < c_orig.ndim:
        g = g.unsqueeze(-1)
    return g * c_opt + (1 - g) * c_orig


def anchor_band(cfg: E2POConfig) -> tuple[float, float]:
    return cfg.mu - cfg.eps - cfg.warn_band, cfg.mu + cfg.eps + cfg.warn_band


def check_anchor_band(mean_sim: float, cfg: E2POConfig, where: str = "") -> bool:
    """Warn (and return False) when the achieved mean anchor cosine is outside the band (or NaN)."""
    lo, hi = anchor_band(cfg)
    if not (lo <= mean_sim <= hi):
        warnings.warn(
            f"E²PO{where}: achieved anchor cosine {mean_sim:.3f} is outside [{lo:.3f}, {hi:.3f}] (mu={cfg.mu}, "
            f"eps={cfg.eps}); with this encoder the diversity term (lambda_div={cfg.lambda_div}) "
            "or the clamp (delta_max) dominates. See docs/rl.md, 'Holding the anchor band'.", stacklevel=2)
        return False
    return True


# ---------------------------------------------------------------------------------------------- encoder glue
@contextlib.contextmanager
def embedding_offset(encoder: torch.nn.Module, offset: torch.Tensor | None) -> Iterator[None]:
    """Add ``offset`` ``[B, S, d]`` (or ``[S, d]``) to the output of ``encoder``'s token-embedding module
    while the context is open (transformers' CLIP text models take no ``inputs_embeds``)."""
    if offset is None:
        yield
        return
    emb = encoder.get_input_embeddings()

    def hook(_mod, _inp, out):
        return out + offset[..., : out.shape[-2], :].to(out.dtype)

    handle = emb.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def pooled_embeddings(encoder: torch.nn.Module, input_ids: torch.Tensor, offset: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """The encoder's pooled (projected) text embedding with token-embedding ``offset``: ``[B, D]``."""
    with embedding_offset(encoder, offset):
        out = encoder(input_ids=input_ids)
    pooled = getattr(out, "text_embeds", None)
    if pooled is None:
        pooled = getattr(out, "pooler_output", None)
    if pooled is None:
        raise TypeError(f"{type(encoder).__name__} returns no pooled output (text_embeds / pooler_output)")
    return pooled


def _work_dtype(encoder: torch.nn.Module) -> torch.dtype:
    """float64 for a float64 encoder (exactness checks), float32 otherwise (the loss in fp32 under any AMP)."""
    return torch.float64 if next(encoder.parameters()).dtype == torch.float64 else torch.float32


@dataclass
class Perturbations:
    """Result of an optimisation for P prompts.

    delta: ``[P, V, S, d]`` offsets of the token embeddings (zero outside the content tokens), V = K - 1.
    anchor_sim: ``[P, V]`` final cos(e_k, e_anchor); pairwise_sim: ``[P]`` final mean pairwise cosine.
    history: per logged step, ``{"step", "loss", "anchor_sim", "pairwise_sim"}`` (means over prompts).
    """

    delta: torch.Tensor
    anchor_sim: torch.Tensor
    pairwise_sim: torch.Tensor
    history: list[dict[str, float]] = field(default_factory=list)


def _init_delta(mask: torch.Tensor, num_var: int, dim: int, sigma_init: float,
                generator: torch.Generator | list[torch.Generator] | None) -> list[torch.Tensor]:
    """Per prompt, ``[V, L_p, d]`` draws in prompt order (the loop and the batched version share them).
    ``generator`` may be one per prompt: a prompt's perturbation then does not depend on its batch mates
    (processes of a distributed run optimise disjoint shares of the prompts and get the same result)."""
    gens = generator if isinstance(generator, (list, tuple)) else [generator] * len(mask)
    if len(gens) != len(mask):
        raise ValueError(f"{len(gens)} generators for {len(mask)} prompts")
    return [torch.randn(num_var, int(m.sum()), dim, generator=g) * sigma_init for m, g in zip(mask, gens)]


def _scatter(parts: list[torch.Tensor], mask: torch.Tensor, num_var: int, dim: int) -> torch.Tensor:
    p, s = mask.shape
    dense = torch.zeros(p, num_var, s, dim)
    for i, part in enumerate(parts):
        dense[i][:, mask[i]] = part
    return dense


def optimize_perturbations(encoder: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor,
                           cfg: E2POConfig, *, generator: torch.Generator | list[torch.Generator] | None = None,
                           log_every: int = 0, eos_token_id: int | None = None) -> Perturbations:
    """Batched E²PO optimisation for P prompts: one encoder call on ``P * (K - 1)`` rows per step.

    Args:
        encoder: a frozen text encoder with a pooled output (``CLIPTextModelWithProjection``).
        input_ids: ``[P, S]`` token ids as the pipeline tokenises them (padded to the encoder's length).
        mask: ``[P, S]`` content tokens (:func:`content_token_mask`).
        generator: CPU generator for the N(0, sigma_init^2) init (same draws as the loop version).
        eos_token_id: enables the exact cut after the last end-of-text token (``cfg.truncate_after_eos``).
    """
    cfg.validate()
    device = next(encoder.parameters()).device
    num_var = cfg.num_variants - 1
    dim = encoder.get_input_embeddings().embedding_dim
    p, s = input_ids.shape
    mask = mask.bool().cpu()
    wd = _work_dtype(encoder)
    delta = _scatter(_init_delta(mask, num_var, dim, cfg.sigma_init, generator), mask, num_var, dim).to(device, wd)
    if cfg.truncate_after_eos and eos_token_id is not None:
        is_eos = input_ids == eos_token_id
        if bool(is_eos.any(1).all()):  # every row has an EOS: cut after the last first-EOS of the batch
            first = torch.where(is_eos, torch.arange(s).expand_as(input_ids), s).min(1).values
            s = int(first.max()) + 1
    ids = input_ids[:, :s].to(device)
    m = mask[:, :s].to(device)[:, None, :, None].to(delta.dtype)
    delta_param = torch.nn.Parameter(delta[:, :, :s].contiguous())
    opt = torch.optim.AdamW([delta_param], lr=cfg.lr, weight_decay=cfg.weight_decay)
    rows = ids.repeat_interleave(num_var, dim=0)                        # [P*V, s]
    with torch.no_grad():
        anchor = pooled_embeddings(encoder, ids).to(wd)                  # [P, D]
    history: list[dict[str, float]] = []
    for step in range(cfg.steps + 1):
        e = pooled_embeddings(encoder, rows, (delta_param * m).reshape(p * num_var, s, dim)).to(wd)
        e = e.reshape(p, num_var, -1)
        div = diversity_loss(e)
        anc_sim = anchor_similarity(e, anchor)
        if step == cfg.steps:  # the final evaluation, no update
            break
        loss = (cfg.lambda_div * div + anchor_loss(e, anchor, cfg.mu, cfg.eps)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            delta_param.clamp_(-cfg.delta_max, cfg.delta_max)
        if log_every and step % log_every == 0:
            history.append({"step": step, "loss": float(loss.detach()) / p, "anchor_sim": float(anc_sim.detach().mean()),
                            "pairwise_sim": float(div.detach().mean())})
    out = torch.zeros(p, num_var, input_ids.shape[1], dim, device=device, dtype=wd)
    out[:, :, :s] = (delta_param.detach() * m)
    return Perturbations(delta=out, anchor_sim=anc_sim.detach(), pairwise_sim=div.detach(), history=history)


def optimize_perturbations_loop(encoder: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor,
                                cfg: E2POConfig, *, generator: torch.Generator | None = None) -> Perturbations:
    """The seed's pseudocode: per prompt its own delta and AdamW, one encoder forward per variant per step
    over the full padded sequence. The reference :func:`optimize_perturbations` is tested against."""
    cfg.validate()
    device = next(encoder.parameters()).device
    num_var = cfg.num_variants - 1
    dim = encoder.get_input_embeddings().embedding_dim
    mask = mask.bool().cpu()
    inits = _init_delta(mask, num_var, dim, cfg.sigma_init, generator)
    wd = _work_dtype(encoder)
    deltas, anc_all, div_all = [], [], []
    for i in range(input_ids.shape[0]):
        ids = input_ids[i: i + 1].to(device)
        idx = mask[i].nonzero().flatten().to(device)
        delta = torch.nn.Parameter(inits[i].to(device, wd))
        opt = torch.optim.AdamW([delta], lr=cfg.lr, weight_decay=cfg.weight_decay)
        with torch.no_grad():
            anchor = pooled_embeddings(encoder, ids).to(wd)[0]
        for step in range(cfg.steps + 1):
            variants = []
            for k in range(num_var):
                off = torch.zeros(1, ids.shape[1], dim, device=device, dtype=wd).index_add(1, idx, delta[k][None])
                variants.append(pooled_embeddings(encoder, ids, off).to(wd))
            e = torch.cat(variants)
            div = diversity_loss(e)
            anc_sim = anchor_similarity(e, anchor)
            if step == cfg.steps:
                break
            loss = cfg.lambda_div * div + anchor_loss(e, anchor, cfg.mu, cfg.eps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                delta.clamp_(-cfg.delta_max, cfg.delta_max)
        dense = torch.zeros(num_var, ids.shape[1], dim, device=device, dtype=wd)
        dense[:, idx] = delta.detach()
        deltas.append(dense)
        anc_all.append(anc_sim.detach())
        div_all.append(div.detach())
    return Perturbations(delta=torch.stack(deltas), anchor_sim=torch.stack(anc_all), pairwise_sim=torch.stack(div_all))
