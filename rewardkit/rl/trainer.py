"""DiffusionNFT on SD3 / SD3.5 with optional E²PO exploration: ``rewardkit rl nft --config recipe.yaml``.

One epoch, top to bottom (:meth:`NFTTrainer.run_epoch`):

1. **Plan.** ``num_groups`` prompts drawn with a generator seeded by ``(seed, epoch)`` (the same on every
   process), each repeated ``group_size`` times (with E²PO: G noises x K conditions), shuffled and cut into
   per-process batches: a group is spread over the processes.
2. **E²PO** (optional). The epoch's prompts are shared out over the processes, each optimises the
   perturbations of its share in one batched run (:func:`exploration.optimize_perturbations`), and the
   results are all-gathered.
3. **Rollouts** with the ``"old"`` adapter, no grad, under autocast: DPM-Solver-2 over the SD3 sigma schedule,
   noise seeded by ``(seed, epoch, rank)``. Each decoded batch is handed to a thread pool that scores it with
   every configured :class:`~rewardkit.Reward` while the next batch samples.
4. **Advantages.** Rewards of all processes are gathered; per prompt group mean, one global std,
   ``r = 1/2 + 1/2 clip(A / 5, -1, 1)`` (:mod:`.nft`).
5. **Training.** Per micro-batch and per selected rollout timestep: fresh noise, three forwards (old adapter,
   trained adapter through DDP, base model), :func:`nft.nft_loss`; ``steps_per_epoch`` optimizer steps
   (fp16: GradScaler), an EMA step after each.
6. **Old policy** ``old <- d old + (1 - d) default`` with ``d = old_policy_decay(global_step)``.
7. **Log** (``metrics.jsonl`` per epoch, ``steps.jsonl`` per optimizer step under the official names, the
   ``report_to`` trackers, tqdm, ``curves.png``), **evaluate** (:mod:`.evaluation`: held-out prompts, EMA
   weights, a baseline before the first epoch) and **checkpoint** (:mod:`.checkpoints`; atomic; LoRA
   safetensors a diffusers pipeline loads with ``load_lora_weights``).

Every random draw is a pure function of ``(seed, epoch, rank)``, so a resumed run needs only the weights
(trained, old, EMA), the optimizer, the scaler and the epoch; inside an epoch (``save_every_steps``) also the
epoch's rollouts, r and the training generator's state. Killing a run and resuming it gives bitwise the same
weights on CPU, at an epoch boundary or mid-epoch (tested).

Helpers live beside it: :mod:`.prompts` (prompt sets with metadata), :mod:`.runtime` (seeds, processes),
:mod:`.scoring` (rewards), :mod:`.tracking` (loss terms, trackers).

Size (over the ~600 lines the project aims for, on purpose): the seven steps above are methods of one class that
share its state (adapters, optimizer, scaler, generators, buffers), in the order they run, so the file reads as
the algorithm; everything that does not need that state already lives in the helper modules.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from .._imports import require
from ..train.trainer import latest_checkpoint, resume_checkpoint  # same checkpoint layout as the RM trainer
from . import checkpoints as _ckpt
from . import nft as N
from . import schedule as S
from . import solvers
from .config import NFTConfig
from .exploration import check_anchor_band, content_token_mask, noise_aware_gamma, optimize_perturbations
from .prompts import BUILTIN_PROMPTS, load_prompt_set, load_prompts
from .runtime import _E2PO, _EVAL, _PLAN, _SAMPLE, _TRAIN, _Dist, _gen, _seed, resolve_tiny  # noqa: F401
from .scoring import _batch_relative, _check_batch_relative, _resolve_tiny_tree, _RewardScorer, check_group_keys  # noqa: F401
from .evaluation import evaluate, write_grid
from .sd3 import Cond, SD3Policy
from .tracking import Trackers, check_report_to, loss_terms

__all__ = ["NFTTrainer", "train_nft", "latest_checkpoint", "BUILTIN_PROMPTS", "load_prompts", "load_prompt_set"]

KILL_ENV = "REWARDKIT_TEST_KILL_AFTER_EPOCH"  # test hook: SIGKILL the process after this epoch
KILL_STEP_ENV = "REWARDKIT_TEST_KILL_AFTER_STEP"  # test hook: SIGKILL after this optimizer step (and its checkpoint)


def _default_eval_prompts(prompts: str) -> str:
    """``builtin:NAME_eval`` for ``builtin:NAME`` when that held-out set exists; otherwise an error: evaluating on
    the training prompts would measure memorisation, so a held-out file must be named."""
    if prompts.startswith("builtin:") and f"{prompts.split(':', 1)[1]}_eval" in BUILTIN_PROMPTS:
        return prompts + "_eval"
    raise ValueError("eval_every needs held-out prompts: set eval_prompts to a prompt file (as `prompts`, e.g. "
                     "test_metadata.jsonl), or eval_every: 0")


# ---------------------------------------------------------------------------------------------- trainer
class NFTTrainer:
    def __init__(self, cfg: NFTConfig):
        cfg.validate()
        # the rl extra and the trackers' libraries before any reward or model loads
        require("diffusers", "rl", purpose="the DiffusionNFT trainer")
        require("peft", "rl", purpose="LoRA adapters of the DiffusionNFT trainer")
        check_report_to(cfg.report_to)
        self.cfg = cfg
        self.dist = _Dist(cfg.cpu)
        self.device = self.dist.device
        self.out = Path(cfg.output_dir)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.mixed_precision)
        if cfg.allow_tf32 and self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        s, t = cfg.sample, cfg.train
        world = self.dist.world
        total = s.num_groups * s.group_size
        if total % (world * s.batch_size):
            raise ValueError(f"num_groups x group_size = {total} images per epoch is not a multiple of processes "
                             f"x sample.batch_size = {world} x {s.batch_size}")
        self.num_batches = total // (world * s.batch_size)
        self.local_n = self.num_batches * s.batch_size
        if self.local_n % t.batch_size:
            raise ValueError(f"{self.local_n} samples per process per epoch is not a multiple of train.batch_size "
                             f"{t.batch_size}")
        self.micro_batches = self.local_n // t.batch_size
        if self.micro_batches % t.steps_per_epoch:
            raise ValueError(f"{self.micro_batches} micro-batches per epoch do not split into "
                             f"train.steps_per_epoch = {t.steps_per_epoch} optimizer steps")
        self.accum = self.micro_batches // t.steps_per_epoch
        self.sigmas = S.flow_sigmas(s.num_steps, s.shift)
        self.num_train_t = S.num_train_timesteps(s.num_steps, t.timestep_fraction)
        self.prompts, self.metadata = load_prompt_set(cfg.prompts)
        self.eval_prompts: list[str] = []
        self.eval_metadata: list[dict[str, Any]] = []
        if cfg.eval_every:
            spec = cfg.eval_prompts or _default_eval_prompts(cfg.prompts)
            self.eval_prompts, self.eval_metadata = load_prompt_set(spec)
            if cfg.eval_num_prompts:
                self.eval_prompts = self.eval_prompts[:cfg.eval_num_prompts]
                self.eval_metadata = self.eval_metadata[:cfg.eval_num_prompts]
        overlap = set(self.eval_prompts) & set(self.prompts)
        if overlap and self.dist.main:
            warnings.warn(f"{len(overlap)} of {len(self.eval_prompts)} evaluation prompts are training prompts too "
                          f"(e.g. {sorted(overlap)[0]!r}): the evaluation is not held out", stacklevel=2)
        if cfg.eval_every and len(self.eval_prompts) < self.dist.world:
            # every process evaluates a share of the prompts and the statistics are all-reduced by key
            raise ValueError(f"{len(self.eval_prompts)} evaluation prompt(s) for {self.dist.world} processes: give at "
                             "least one per process (eval_prompts, eval_num_prompts), or eval_every: 0")
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)

        text_dtype = torch.float32
        if cfg.model.text_encoder_dtype == "auto":
            if self.device.type == "cuda" and self.amp_dtype is not None:
                text_dtype = self.amp_dtype
        else:
            text_dtype = getattr(torch, cfg.model.text_encoder_dtype)
        tiny_root = self.out / "tiny_models"
        self.scorer = _RewardScorer(cfg, tiny_root, self.dist)
        check_group_keys(self.scorer, self.metadata, cfg.prompts)
        check_group_keys(self.scorer, self.eval_metadata, cfg.eval_prompts or 'the evaluation prompts')
        self.policy = SD3Policy(resolve_tiny(cfg.model.pretrained, tiny_root, self.dist), device=self.device, text_dtype=text_dtype,
                                max_sequence_length=cfg.model.max_sequence_length, revision=cfg.model.revision,
                                trust_remote_code=cfg.model.trust_remote_code, transformer=cfg.model.transformer)
        long = self.policy.truncated(self.prompts)
        if long and self.dist.main:
            warnings.warn(f"{len(long)} of {len(self.prompts)} prompts exceed the CLIP window "
                          f"({self.policy.pipe.tokenizer.model_max_length} tokens) and are truncated for CLIP, "
                          f"e.g. {long[0]!r}", stacklevel=2)
        # identical LoRA init on every process (DDP also broadcasts at wrap time)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.policy.add_lora(cfg.lora.r, cfg.lora.alpha, cfg.lora.target_modules, cfg.lora.init,
                                 init_lora=cfg.model.init_lora)
        self.trainable = self.policy.adapter_params("default")
        self.old_params = self.policy.adapter_params("old")
        self.ema = [p.detach().clone() for p in self.trainable] if t.ema else None
        self.model = self.policy.transformer
        if world > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.policy.transformer, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=False)
        self.opt = torch.optim.AdamW(self.trainable, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2),
                                     weight_decay=t.weight_decay, eps=t.adam_eps, foreach=False)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.mixed_precision == "fp16")
        self.epoch = 0
        self.global_step = 0
        self._resume_state: dict[str, Any] | None = None  # an epoch a mid-epoch checkpoint stopped in
        self._kill_after_step = int(os.environ.get(KILL_STEP_ENV, "0") or 0)
        self.trackers = Trackers([], self.out, main=False)  # the real ones open in train()
        self.wandb_run_id: str | None = None  # the wandb run a resumed run continues (saved in each checkpoint)

    # ------------------------------------------------------------------ helpers
    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def _plan(self, epoch: int) -> tuple[list[int], list[list[tuple[int, int]]]]:
        """The epoch's prompts (indices) and this process's batches of (prompt, variant) (variant 0 = the
        unperturbed condition). Identical on every process: a generator seeded by (seed, epoch)."""
        s, cfg = self.cfg.sample, self.cfg
        g = _gen(cfg.seed, _PLAN, epoch)
        n = len(self.prompts)
        chosen = torch.randperm(n, generator=g)[: s.num_groups].tolist() if s.num_groups <= n \
            else torch.randint(n, (s.num_groups,), generator=g).tolist()
        k = cfg.e2po.num_variants if cfg.e2po.enabled else 1
        members = [(p, j % k) for p in chosen for j in range(s.group_size)]
        order = torch.randperm(len(members), generator=g).tolist()
        members = [members[i] for i in order]
        per_batch = self.dist.world * s.batch_size
        r, b = self.dist.rank, s.batch_size
        return chosen, [members[i * per_batch + r * b: i * per_batch + (r + 1) * b] for i in range(self.num_batches)]

    # ------------------------------------------------------------------ E²PO
    def _explore(self, epoch: int) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, float]]:
        """Perturbations for the epoch's prompts: ``{prompt: {encoder: [V, 77, d]}}`` and log values."""
        e = self.cfg.e2po
        prompts = sorted(set(self._plan(epoch)[0]))
        world, rank = self.dist.world, self.dist.rank
        share = math.ceil(len(prompts) / world)
        mine = prompts[rank * share:(rank + 1) * share]
        result: dict[int, dict[str, torch.Tensor]] = {p: {} for p in prompts}
        logs: dict[str, float] = {}
        for enc_idx, which in enumerate(e.encoders):
            enc = self.policy.encoder(which)
            eos, bos = self.policy.clip_ids(which)
            dim = enc.get_input_embeddings().embedding_dim
            seq = self.policy.tokenize_clip(["x"], which).shape[1]
            local = torch.zeros(share, e.num_variants - 1, seq, dim, device=self.device)
            anc = torch.full((share, e.num_variants - 1), float("nan"), device=self.device)
            pair = torch.full((share,), float("nan"), device=self.device)
            if mine:
                ids = self.policy.tokenize_clip([self.prompts[p] for p in mine], which)
                mask = content_token_mask(ids, eos, bos)
                gens = [_gen(self.cfg.seed, _E2PO, epoch, p, enc_idx) for p in mine]
                enc.requires_grad_(False)
                with torch.autocast(self.device.type, enabled=False):
                    res = optimize_perturbations(enc, ids, mask, e, generator=gens, eos_token_id=eos)
                local[: len(mine)] = res.delta.float()
                anc[: len(mine)] = res.anchor_sim.float()
                pair[: len(mine)] = res.pairwise_sim.float()
            all_delta = self.dist.gather_cat(local)
            all_anc = self.dist.gather_cat(anc)
            all_pair = self.dist.gather_cat(pair)
            for i, p in enumerate(prompts):
                result[p][which] = all_delta[i]
            ok = torch.isfinite(all_anc)
            logs[f"e2po/{which}/anchor_sim_mean"] = float(all_anc[ok].mean())
            logs[f"e2po/{which}/anchor_sim_min"] = float(all_anc[ok].min())
            logs[f"e2po/{which}/anchor_sim_max"] = float(all_anc[ok].max())
            logs[f"e2po/{which}/pairwise_sim_mean"] = float(all_pair[torch.isfinite(all_pair)].mean())
            if self.dist.main:
                logs[f"e2po/{which}/in_band"] = float(check_anchor_band(
                    logs[f"e2po/{which}/anchor_sim_mean"], e, where=f" ({which}, epoch {epoch})"))
        return result, logs

    def _conditions(self, batch: list[tuple[int, int]], deltas) -> tuple[Cond, Cond]:
        """(C_orig, C_opt) for a batch; C_opt == C_orig for unperturbed members."""
        texts = [self.prompts[p] for p, _ in batch]
        c_orig = self.policy.encode(texts)
        if deltas is None or all(v == 0 for _, v in batch):
            return c_orig, c_orig
        offsets = {}
        for which in self.cfg.e2po.encoders:
            rows = []
            for p, v in batch:
                d = deltas[p][which]
                rows.append(torch.zeros_like(d[0]) if v == 0 else d[v - 1])
            offsets[which] = torch.stack(rows)
        return c_orig, self.policy.encode(texts, offsets)

    # ------------------------------------------------------------------ rollouts
    @torch.no_grad()
    def _rollout(self, c_orig: Cond, c_opt: Cond, noise: torch.Tensor, gen: solvers.Generators,
                 steps: int | None = None, solver: str | None = None, use_old: bool = True,
                 guidance_scale: float | None = None) -> torch.Tensor:
        """Latents at sigma = 0 from ``noise`` ``[B, C, h, w]``; E²PO members follow the noise-aware condition.
        ``gen``: a stochastic solver's step noise, one generator for the batch or one per row (``solvers``)."""
        s, e = self.cfg.sample, self.cfg.e2po
        sigmas = self.sigmas if steps is None else S.flow_sigmas(steps, s.shift)
        perturbed = c_opt is not c_orig
        cfg_scale = s.guidance_scale if guidance_scale is None else guidance_scale

        def velocity(x, sigma, i):
            cond = c_orig
            if perturbed:
                g = float(noise_aware_gamma(sigma, e.rho))
                cond = c_orig if g == 0 else Cond(g * c_opt.embeds + (1 - g) * c_orig.embeds,
                                                  g * c_opt.pooled + (1 - g) * c_orig.pooled)
            sig = torch.full((x.shape[0],), sigma, device=x.device, dtype=torch.float32)
            with self._autocast():
                return self.policy.sample_velocity(
                    self.policy.transformer, x, sig, cond, guidance_scale=cfg_scale,
                    negative_prompt=s.negative_prompt, integer_timestep=s.integer_timestep).float()

        ctx = self.policy.use_old() if use_old else nullcontext()
        with ctx:
            return solvers.sample(solver or s.solver, velocity, noise, sigmas, eta=s.eta, generator=gen)

    def _sample_epoch(self, epoch: int, deltas, bar=None) -> dict[str, Any]:
        s = self.cfg.sample
        gen = _gen(self.cfg.seed, _SAMPLE, epoch, self.dist.rank)
        plan = self._plan(epoch)[1]
        x0s, conds, prompt_ids, variants, futures = [], [], [], [], []
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.reward_workers)) as pool:
            for batch in plan:
                c_orig, c_opt = self._conditions(batch, deltas)
                noise = torch.randn(self.policy.latent_shape(len(batch), s.resolution), generator=gen).to(self.device)
                x0 = self._rollout(c_orig, c_opt, noise, gen)
                images = self.policy.decode(x0).cpu()
                texts = [self.prompts[p] for p, _ in batch]
                metas = [self.metadata[p] for p, _ in batch]  # the prompt row (prompt included), per sample
                futures.append(pool.submit(self.scorer, images, texts, metas))  # scored while the next batch samples
                x0s.append(x0)
                conds.append(c_orig)
                prompt_ids += [p for p, _ in batch]
                variants += [v for _, v in batch]
            results = [f.result() for f in futures]
        return {"x0": torch.cat(x0s), "cond": Cond.cat(conds), "prompt": torch.tensor(prompt_ids),
                "variant": torch.tensor(variants), "rewards": results}

    # ------------------------------------------------------------------ advantages
    def _advantages(self, buf: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """r ``[local_n]`` (float64) and the valid mask, from rewards gathered over all processes."""
        t = self.cfg.train
        fin = self.scorer.finalize(buf["rewards"], buf["prompt"])  # collective for batch-relative composites
        total, errors = fin["total"], fin["errors"]
        buf["total"] = total  # this process's rewards, for the top / bottom images
        keys, dims = list(fin["components"]), list(fin["dimensions"])
        comp = torch.stack([fin["components"][k] for k in keys] + [fin["dimensions"][k] for k in dims], dim=1) \
            if keys or dims else torch.zeros(len(total), 0, dtype=torch.float64)
        bad = [(i, errors[i]) for i in range(len(total)) if not math.isfinite(float(total[i]))]
        if bad and self.cfg.invalid_rewards == "raise":
            i, why = bad[0]
            raise RuntimeError(f"reward missing for {len(bad)} sample(s) of epoch {self.epoch} (first: prompt "
                               f"{self.prompts[int(buf['prompt'][i])]!r}: {why}); set invalid_rewards=drop to train on")
        dev = self.device
        g_total = self.dist.gather_cat(total.to(dev)).cpu()
        g_prompt = self.dist.gather_cat(buf["prompt"].to(dev)).cpu()
        g_comp = self.dist.gather_cat(comp.to(dev)).cpu()
        g_var = self.dist.gather_cat(buf["variant"].to(dev)).cpu()
        adv = N.group_advantages(g_total, g_prompt, global_std=t.global_std)
        r_all = N.optimality_probability(adv, t.adv_clip_max, t.adv_mode)
        valid_all = torch.isfinite(r_all)
        lo = self.dist.rank * self.local_n
        r = r_all[lo: lo + self.local_n]
        valid = valid_all[lo: lo + self.local_n]
        logs: dict[str, Any] = {}
        for name, col in [("total", g_total)] + [(k, g_comp[:, j]) for j, k in enumerate(keys + dims)]:
            ok = torch.isfinite(col)
            logs[f"reward/{name}/mean"] = float(col[ok].mean()) if ok.any() else float("nan")
            logs[f"reward/{name}/std"] = float(col[ok].std(unbiased=False)) if ok.any() else float("nan")
            logs[f"reward/{name}/max"] = float(col[ok].max()) if ok.any() else float("nan")
            logs[f"reward/{name}/min"] = float(col[ok].min()) if ok.any() else float("nan")
        if self.cfg.e2po.enabled:
            for v in (0, 1):
                sel = (g_var == 0) if v == 0 else (g_var > 0)
                ok = sel & torch.isfinite(g_total)
                logs[f"reward/total/mean_{'anchor' if v == 0 else 'perturbed'}"] = \
                    float(g_total[ok].mean()) if ok.any() else float("nan")
        logs["zero_std_group_ratio"] = N.zero_std_group_ratio(g_total, g_prompt)
        logs["invalid_rewards"] = int((~torch.isfinite(g_total)).sum())
        rv = r_all[valid_all]
        logs["r/mean"] = float(rv.mean()) if rv.numel() else float("nan")
        logs["r/hist"] = torch.histc(rv.float(), bins=10, min=0, max=1).int().tolist() if rv.numel() else [0] * 10
        if logs["invalid_rewards"] and self.dist.main:
            warnings.warn(f"epoch {self.epoch}: {logs['invalid_rewards']} sample(s) without a valid reward were "
                          "left out of the statistics and the loss", stacklevel=2)
        return r, valid, logs

    # ------------------------------------------------------------------ training
    def _train_epoch(self, st: dict[str, Any]) -> dict[str, float]:
        """The epoch's optimizer steps from micro-batch ``st["micro"]`` on. ``st`` is the epoch in progress (its
        rollouts, r, the training generator's state after the last step, running sums): what a mid-epoch
        checkpoint saves, so that a resumed epoch draws the same permutation, timesteps and noise."""
        t = self.cfg.train
        buf, r, valid = st["buf"], st["r"], st["valid"]
        gen = _gen(self.cfg.seed, _TRAIN, st["epoch"], self.dist.rank)
        perm = torch.randperm(self.local_n, generator=gen)
        if st["gen_state"] is not None:
            gen.set_state(st["gen_state"])
        T = self.num_train_t
        sig = self.sigmas.float()
        sums: dict[str, float] = st["sums"]
        step_sums: dict[str, float] = {}
        step_count = 0
        self.policy.transformer.train()
        for m in range(st["micro"], self.micro_batches):
            idx = perm[m * t.batch_size:(m + 1) * t.batch_size]
            x0 = buf["x0"][idx.to(self.device)].float()
            cond = buf["cond"][idx.to(self.device)]
            rr = r[idx].to(self.device)
            mask = valid[idx].to(self.device).double()
            t_idx = S.train_timestep_indices(len(idx), self.cfg.sample.num_steps, T, gen)
            last_micro = (m + 1) % self.accum == 0
            for j in range(T):
                tt = sig[t_idx[:, j]].to(self.device)
                eps = torch.randn(x0.shape, generator=gen).to(self.device)
                xt = (1 - tt.view(-1, 1, 1, 1)) * x0 + tt.view(-1, 1, 1, 1) * eps
                with torch.no_grad():
                    with self.policy.use_old(), self._autocast():
                        v_old = self.policy.velocity(self.policy.transformer, xt, tt, cond)
                    v_ref = None
                    if t.kl_coef > 0:
                        with self.policy.use_reference(), self._autocast():
                            v_ref = self.policy.velocity(self.policy.transformer, xt, tt, cond)
                sync = last_micro and j == T - 1
                ctx = self.model.no_sync() if (self.dist.world > 1 and not sync) else nullcontext()
                with ctx:
                    with self._autocast():
                        v_theta = self.policy.velocity(self.model, xt, tt, cond)
                    loss, metrics = N.nft_loss(v_theta, v_old, v_ref, x0, xt, tt, rr, beta=t.beta,
                                               adv_clip_max=t.adv_clip_max, kl_coef=t.kl_coef, mask=mask)
                    self.scaler.scale(loss / (self.accum * T)).backward()
                for k, v in loss_terms(v_theta, v_old, v_ref, x0, loss, metrics, t.adv_clip_max).items():
                    sums[k] = sums.get(k, 0.0) + v
                    step_sums[k] = step_sums.get(k, 0.0) + v
                st["count"] += 1
                step_count += 1
            if last_micro:
                self.scaler.unscale_(self.opt)
                norm = torch.nn.utils.clip_grad_norm_(self.trainable, t.max_grad_norm)
                st["grad_norms"].append(float(norm))
                self.scaler.step(self.opt)
                self.scaler.update()
                st["scales"].append(float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0)
                self.opt.zero_grad(set_to_none=True)
                self.global_step += 1
                if self.ema is not None:
                    N.ema_update_(self.ema, self.trainable, self.global_step, t.ema_decay)
                st["micro"], st["gen_state"] = m + 1, gen.get_state()
                self._log_step(st, step_sums, step_count)
                step_sums, step_count = {}, 0
                if self.cfg.save_every_steps and self.global_step % self.cfg.save_every_steps == 0:
                    self.save_checkpoint(st)
                if self._kill_after_step and self.global_step == self._kill_after_step:
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: die like a preempted job, mid-epoch
        self.policy.transformer.eval()
        out = self._reduce_mean({k: v / max(st["count"], 1) for k, v in sums.items()})
        out["grad_norm"] = float(sum(st["grad_norms"]) / len(st["grad_norms"])) if st["grad_norms"] else float("nan")
        out["grad_scale"] = st["scales"][-1] if st["scales"] else float("nan")
        return out

    def _reduce_mean(self, values: dict[str, float]) -> dict[str, float]:
        """Per key, the mean over processes (collective)."""
        keys = sorted(values)
        vec = self.dist.mean(torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device))
        return {k: float(v) for k, v in zip(keys, vec.cpu())}

    def _log_step(self, st: dict[str, Any], step_sums: dict[str, float], count: int) -> None:
        """One optimizer step's record (the official per-step log): the loss terms averaged over its backward
        passes and over processes, the gradient norm and scale; ``steps.jsonl`` and the trackers."""
        rec = self._reduce_mean({k: v / max(count, 1) for k, v in step_sums.items()})
        rec = {"step": self.global_step, "epoch": st["epoch"], **rec, "grad_norm": st["grad_norms"][-1],
               "grad_scale": st["scales"][-1], "lr": float(self.opt.param_groups[0]["lr"])}
        self._log(rec, "steps.jsonl")
        self.trackers.log({f"train/{k}": v for k, v in rec.items() if k != "step"}, self.global_step)

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self) -> dict[str, Any]:
        """One epoch, or the rest of one a mid-epoch checkpoint stopped in."""
        epoch = self.epoch
        st, self._resume_state = self._resume_state, None
        t0 = time.perf_counter()
        if st is None:
            deltas, e_logs = (None, {})
            if self.cfg.e2po.enabled:
                deltas, e_logs = self._explore(epoch)
            t1 = time.perf_counter()
            buf = self._sample_epoch(epoch, deltas)
            t2 = time.perf_counter()
            r, valid, r_logs = self._advantages(buf)
            self._log_images(buf)
            buf = {k: buf[k] for k in ("x0", "cond", "prompt", "variant")}
            st = {"epoch": epoch, "buf": buf, "r": r, "valid": valid, "micro": 0, "gen_state": None, "sums": {},
                  "count": 0, "grad_norms": [], "scales": [],
                  "logs": {**r_logs, **e_logs, "time/e2po_s": t1 - t0, "time/sample_s": t2 - t1}}
        else:  # resumed mid-epoch: the rollouts' conditions, encoded again batch by batch as when sampled
            st["buf"]["cond"] = Cond.cat([self._conditions(batch, None)[0] for batch in self._plan(epoch)[1]])
        t2 = time.perf_counter()
        train_logs = self._train_epoch(st)
        decay = S.old_policy_decay(self.global_step, self.cfg.train.decay_type)
        N.soft_update_(self.old_params, self.trainable, decay)
        self.epoch += 1
        return {"epoch": self.epoch, "global_step": self.global_step, "old_decay": decay, **st["logs"],
                **train_logs, "time/train_s": time.perf_counter() - t2}

    def _log_images(self, buf: dict[str, Any]) -> None:
        """Every ``log_images_every`` epochs (from the first), the main process's ``log_images`` highest- and
        lowest-reward training images of the epoch (decoded again from their latents) to the trackers."""
        cfg = self.cfg
        k, every = cfg.log_images, cfg.log_images_every
        if not (self.dist.main and k and every and self.epoch % every == 0 and "total" in buf):
            return
        if self.trackers.tb is None and self.trackers.wandb is None:
            return
        total = buf["total"]
        ok = torch.nonzero(torch.isfinite(total)).flatten()
        if not len(ok):
            return
        order = ok[torch.argsort(total[ok], descending=True, stable=True)]
        for tag, sel in (("train/top_reward_images", order[:k]), ("train/bottom_reward_images", order.flip(0)[:k])):
            with torch.no_grad():
                images = self.policy.decode(buf["x0"][sel.to(self.device)]).float().cpu()
            caps = [f"{self.prompts[int(buf['prompt'][i])]:.100} | total: {float(total[i]):.4g}" for i in sel]
            self.trackers.log_images(tag, images, self.global_step, caps)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Rewards of the EMA weights on the held-out prompts (:func:`.evaluation.evaluate`); writes the PNG grid
        ``eval-epoch-NNNNNN.png`` and sends the metrics and images to the trackers."""
        metrics, grid, grid_prompts = evaluate(self)
        if self.dist.main:
            if len(grid):
                write_grid(grid, self.out / f"eval-epoch-{self.epoch:06d}.png")
                self.trackers.log_images("eval/images", grid, self.global_step, grid_prompts)
            self.trackers.log(metrics, self.global_step)
        return metrics

    # ------------------------------------------------------------------ checkpoints (.checkpoints)
    def save_checkpoint(self, st: dict[str, Any] | None = None) -> Path:
        return _ckpt.save_checkpoint(self, st)

    def load_checkpoint(self, path: Path) -> None:
        _ckpt.load_checkpoint(self, path)

    def _save_lora(self, directory: Path) -> None:
        _ckpt.save_lora(self, directory)

    # ------------------------------------------------------------------ logging
    def _log(self, rec: dict[str, Any], name: str = "metrics.jsonl") -> None:
        if not self.dist.main:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / name).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean) + "\n")

    def _truncate_metrics(self) -> None:
        """On resume: drop the records the killed run wrote after its checkpoint (epochs after ``self.epoch``,
        steps after ``self.global_step``) and the old final summary."""
        from ..train.checkpoint import _log_records as _records
        from ..train.trainer import _write_text_atomic

        if not self.dist.main:
            return
        for name, key, last in (("metrics.jsonl", "epoch", self.epoch), ("steps.jsonl", "step", self.global_step)):
            path = self.out / name
            if path.is_file():
                keep = [json.dumps(r) for r in _records(path) if r.get(key, 0) <= last and "final" not in r]
                _write_text_atomic(path, "".join(ln + "\n" for ln in keep))

    def _last_epoch_record(self) -> dict[str, Any]:
        from ..train.checkpoint import _log_records as _records

        path = self.out / "metrics.jsonl"
        recs = _records(path) if path.is_file() else []
        recs = [r for r in recs if "final" not in r and "reward/total/mean" in r]
        return recs[-1] if recs else {}

    # ------------------------------------------------------------------ main loop
    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        ckpt = resume_checkpoint(cfg.resume, self.out)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            from ..config import save_config

            save_config(cfg, self.out / "config.yaml")
            if ckpt is None:
                (self.out / "metrics.jsonl").unlink(missing_ok=True)
                (self.out / "steps.jsonl").unlink(missing_ok=True)
            else:
                self._truncate_metrics()
        self.trackers = Trackers(cfg.report_to, self.out, main=self.dist.main, run_name=cfg.run_name,
                                 config=dataclasses.asdict(cfg), resume_step=None if ckpt is None else self.global_step,
                                 wandb_id=None if ckpt is None else self.wandb_run_id)
        if self.trackers.wandb is not None:
            self.wandb_run_id = self.trackers.wandb.id
        self.dist.barrier()
        kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.num_epochs, initial=self.epoch, desc="nft", unit="epoch",
                   disable=not (cfg.progress and self.dist.main))
        last: dict[str, Any] = {}
        try:
            if cfg.eval_every and ckpt is None:  # the baseline: the starting model
                base = {"epoch": 0, "global_step": 0, **self.evaluate()}
                self._log(base)
            while self.epoch < cfg.num_epochs:
                last = self.run_epoch()
                bar.update(1)
                bar.set_postfix(reward=f"{last['reward/total/mean']:.4g}",
                                loss=f"{last.get('total_loss', float('nan')):.4g}",
                                kl=f"{last.get('kl_div', float('nan')):.2g}")
                if cfg.eval_every and (self.epoch % cfg.eval_every == 0 or self.epoch == cfg.num_epochs):
                    last.update(self.evaluate())
                if self.epoch % max(cfg.log_every, 1) == 0 or self.epoch == cfg.num_epochs:
                    self._log(last)
                    self.trackers.log({k: v for k, v in last.items() if not k.startswith("eval/")
                                       and k not in ("epoch", "global_step")}, self.global_step)
                if kill_after and self.epoch == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: die like a preempted job, before saving
                if (cfg.save_every and self.epoch % cfg.save_every == 0) or self.epoch == cfg.num_epochs:
                    self.save_checkpoint()
                    if self.dist.main:
                        self.plot()
                self.trackers.flush()
        finally:
            bar.close()
            self.trackers.close()
        summary: dict[str, Any] = {"final": True, "epoch": self.epoch, "global_step": self.global_step,
                                   "world_size": self.dist.world}
        if self.dist.world > 1:
            from ..train.trainer import _replica_fingerprint

            fp = self.dist.gather_cat(_replica_fingerprint(self.trainable).unsqueeze(0).to(self.device)).cpu()
            summary["replicas_in_sync"] = bool((fp == fp[0]).all())
        if self.dist.main:
            self._save_lora(self.out / "lora")
            summary["lora_dir"] = str(self.out / "lora")
            # a rerun of a finished run trains no epoch: its summary reads the last epoch's record again
            summary["reward_mean"] = (last or self._last_epoch_record()).get("reward/total/mean")
            self._log(summary)
            self.plot()
        self.dist.barrier()
        return summary

    def plot(self) -> Path | None:
        from .curves import plot_curves

        return plot_curves(self.out / "metrics.jsonl", self.out / "curves.png", e2po=self.cfg.e2po)

    def close(self) -> None:
        if self.dist.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def train_nft(cfg: NFTConfig | dict | str | None = None, **overrides: Any) -> dict[str, Any]:
    """Run DiffusionNFT (with E²PO when ``e2po.enabled``); returns the final summary."""
    from ..config import build_config

    cfg = build_config(NFTConfig, cfg, overrides)
    trainer = NFTTrainer(cfg)
    try:
        return trainer.train()
    finally:
        trainer.close()
