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
7. **Log** (``metrics.jsonl``, tqdm, ``curves.png``) and **checkpoint** (atomic; LoRA safetensors a diffusers
   pipeline loads with ``load_lora_weights``).

Every random draw is a pure function of ``(seed, epoch, rank)``, so a resumed run needs only the weights
(trained, old, EMA), the optimizer, the scaler and the epoch: killing a run and resuming it gives bitwise the
same weights on CPU (tested).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
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
from . import nft as N
from . import schedule as S
from . import solvers
from .config import NFTConfig
from .exploration import check_anchor_band, content_token_mask, noise_aware_gamma, optimize_perturbations
from .sd3 import Cond, SD3Policy

__all__ = ["NFTTrainer", "train_nft", "latest_checkpoint", "BUILTIN_PROMPTS", "load_prompts"]

KILL_ENV = "REWARDKIT_TEST_KILL_AFTER_EPOCH"  # test hook: SIGKILL the process after this epoch

BUILTIN_PROMPTS = {
    "geneval_tiny": [
        "a photo of a cat", "a photo of two dogs", "a red car and a blue bicycle", "a photo of a banana",
        "a green bowl to the left of a cup", "three birds on a branch", "a yellow umbrella", "a photo of a clock",
        "a black sink and a white toilet", "a cow below a tv", "a purple vase", "two apples on a table",
        "a photo of a giraffe and a zebra", "an orange kite in the sky", "a brown bear", "four books",
    ],
}


def load_prompts(spec: str) -> list[str]:
    """``builtin:NAME``, a ``.txt`` file (one prompt a line) or a ``.jsonl`` file (a ``"prompt"`` per line)."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_PROMPTS:
            raise ValueError(f"unknown builtin prompt set {name!r}; choose from {sorted(BUILTIN_PROMPTS)}")
        return list(BUILTIN_PROMPTS[name])
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        prompts = []
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                rec = json.loads(line)
                if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                    raise ValueError(f"{path}:{i + 1}: expected an object with a string 'prompt'")
                prompts.append(rec["prompt"])
    else:
        prompts = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not prompts or any(not p.strip() for p in prompts):
        raise ValueError(f"{path}: no prompts (or an empty prompt)")
    return prompts


def _seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes and runs)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) & 0x7FFFFFFFFFFFFFFF
    return h


def _gen(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(*parts))


_SAMPLE, _TRAIN, _PLAN, _E2PO, _EVAL = 1, 2, 3, 4, 5


def resolve_tiny(spec: Any, root: Path, dist: "_Dist | None" = None) -> Any:
    """``"tiny:<kind>"`` (``sd3``, ``clip``, ...) -> a tiny random checkpoint written under ``root`` by
    :func:`rewardkit.testing.save_tiny_checkpoint` (once, by the main process) and loaded back from disk like
    real weights. Anything else is returned unchanged."""
    if not (isinstance(spec, str) and spec.startswith("tiny:")):
        return spec
    from ..testing import save_tiny_checkpoint

    kind = spec.split(":", 1)[1]
    path = root / kind
    if dist is None or dist.main:
        if not (path / ".complete").is_file():
            save_tiny_checkpoint(kind, path)
            (path / ".complete").write_text("ok", encoding="utf-8")
    if dist is not None:
        dist.barrier()
    return str(path)


# ---------------------------------------------------------------------------------------------- distributed
class _Dist:
    """torchrun's environment -> a process group (NCCL on GPU, gloo on CPU); or a single process."""

    def __init__(self, cpu: bool):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        use_cuda = torch.cuda.is_available() and not cpu
        self.device = torch.device(f"cuda:{local}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        self.owns_group = False
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
            self.owns_group = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def gather_cat(self, x: torch.Tensor) -> torch.Tensor:
        """All processes' ``x`` (same shape everywhere) concatenated along dim 0, in rank order."""
        if self.world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return x
        x = x.clone()
        torch.distributed.all_reduce(x)
        return x / self.world

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


# ---------------------------------------------------------------------------------------------- rewards
def _resolve_tiny_tree(obj: Any, root: Path, dist: "_Dist") -> Any:
    """:func:`resolve_tiny` on every string inside nested dicts / lists (a composite's ``axes[i].options``)."""
    if isinstance(obj, dict):
        return {k: _resolve_tiny_tree(v, root, dist) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve_tiny_tree(v, root, dist) for v in obj]
    return resolve_tiny(obj, root, dist)


def _batch_relative(reward: Any) -> bool:
    """A local composite whose score depends on the other samples of the call (its ``batch_relative``: z-scored
    per batch or group), which :meth:`_RewardScorer.finalize` can combine over the epoch."""
    from ..compose.composite import Composite

    return isinstance(reward, Composite) and reward.batch_relative


def _check_batch_relative(key: str, reward: Any) -> None:
    """Refuse the batch-relative rewards :meth:`_RewardScorer.finalize` cannot combine over the epoch (their
    statistics would silently be those of one decoded batch, or of no groups at all)."""
    from ..compose.composite import Composite

    if getattr(reward, "batch_relative", False) and not _batch_relative(reward):
        raise ValueError(f"reward {key!r} normalises over each call (e.g. a served composite), which the NFT "
                         "trainer would call once per decoded batch: use a local `composite` reward, or a "
                         "per-sample normalisation")
    if not isinstance(reward, Composite):
        return
    if _batch_relative(reward) and reward.config.normalize == "group" and reward.config.group_by != "prompt":
        raise ValueError(f"reward {key!r}: group_by={reward.config.group_by!r} reads sample metadata, which the NFT "
                         "trainer does not have (every sample would fall in one group): use group_by: prompt "
                         "(groups by prompt index)")
    for name, sub in reward.rewards.items():
        if getattr(sub, "batch_relative", False):
            raise ValueError(f"reward {key!r}: its axis {name!r} normalises over each call, which would be one "
                             "decoded batch, not the epoch: only the outer composite may use normalize: batch | group")
        _check_batch_relative(f"{key}.{name}", sub)


class _RewardScorer:
    """Weighted sum of rewardkit rewards (flow_grpo's "avg" convention: a sum) with per-component values.

    A batch-relative composite (``normalize: batch | group``) is not scored per decoded batch: each batch
    records its per-axis raw scores (:meth:`Composite.axis_scores`), and :meth:`finalize` runs the composite's
    formula once over every process's samples of the epoch (:func:`rewardkit.distributed.gather_combine`), so
    its z-scores equal one call over the whole epoch, whatever the batch size or the number of processes.
    """

    def __init__(self, cfg: NFTConfig, tiny_root: Path, dist: "_Dist"):
        from ..registry import load_reward, resolve_name

        self.names = [resolve_name(n) for n in cfg.rewards]  # unknown names fail before any model loads
        self.weights = [float(w) for w in cfg.rewards.values()]
        unknown = set(cfg.reward_kwargs) - set(cfg.rewards)
        if unknown:
            raise ValueError(f"reward_kwargs for rewards not in `rewards`: {sorted(unknown)}")
        self.rewards = []
        for name, raw in zip(self.names, cfg.rewards):
            kwargs = _resolve_tiny_tree(dict(cfg.reward_kwargs.get(raw, {})), tiny_root, dist)
            self.rewards.append(load_reward(name, **kwargs))
        self.keys = list(cfg.rewards)
        for key, r in zip(self.keys, self.rewards):
            _check_batch_relative(key, r)
        self.deferred = {k for k, r in zip(self.keys, self.rewards) if _batch_relative(r)}

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> dict[str, Any]:
        """images: float32 ``[B, 3, H, W]`` in [0, 1] -> ``{"total": [B], "components": {name: [B]},
        "dimensions": {name.dim: [B]}, "errors": [B reasons or None], "axes": {name: AxisScores}}`` (NaN where a
        reward gave no score). A batch-relative composite's component (and so the total) is NaN here; its
        ``AxisScores`` wait in ``axes`` for :meth:`finalize`."""
        comps, dims, axes = {}, {}, {}
        errors: list[str | None] = [None] * len(prompts)
        total = torch.zeros(len(prompts), dtype=torch.float64)
        for key, w, reward in zip(self.keys, self.weights, self.rewards):
            if key in self.deferred:
                axes[key] = reward.axis_scores(images, prompts, on_error="nan")
                comps[key] = torch.full((len(prompts),), float("nan"), dtype=torch.float64)
                total = total + comps[key]
                continue
            out = reward(images, prompts, on_error="nan")
            s = out.scores.double()
            comps[key] = s
            for d, v in out.dimensions.items():
                dims[f"{key}.{d}"] = v.double()
            for i, e in enumerate(out.errors):
                if e and errors[i] is None:
                    errors[i] = f"{key}: {e}"
            total = total + w * s  # NaN propagates: a sample missing any component has no total
        return {"total": total, "components": comps, "dimensions": dims, "errors": errors, "axes": axes}

    def finalize(self, results: list[dict[str, Any]], prompt_ids: torch.Tensor) -> dict[str, Any]:
        """This process's batch results of one epoch (or evaluation), concatenated, with every batch-relative
        composite combined over all processes' samples. Collective when a composite is deferred: every process
        must call it. ``prompt_ids`` ``[n]`` (this process's, in batch order) are the groups of
        ``normalize: group`` composites grouped by prompt. Returns ``{"total": [n], "components": {name: [n]},
        "dimensions": {name.dim: [n]}, "errors": [n]}`` (float64)."""
        from ..distributed import gather_combine

        n = sum(len(r["errors"]) for r in results)
        cat = (lambda xs: torch.cat(xs)) if results else (lambda xs: torch.zeros(0, dtype=torch.float64))
        comp_keys = results[0]["components"] if results else self.keys
        comps = {k: cat([r["components"][k] for r in results]) for k in comp_keys}
        dims = {k: cat([r["dimensions"][k] for r in results]) for k in (results[0]["dimensions"] if results else [])}
        errors = [e for r in results for e in r["errors"]]
        if len(prompt_ids) != n:
            raise ValueError(f"{len(prompt_ids)} prompt ids for {n} scored samples")
        for key, reward in zip(self.keys, self.rewards):
            if key not in self.deferred:
                continue
            from ..compose.composite import AxisScores

            parts = [r["axes"][key] for r in results if "axes" in r and key in r["axes"]]
            if len(parts) != len(results):
                raise ValueError(f"{key}: batch results without the composite's axis scores")
            names = list(reward.rewards)
            local = AxisScores.cat(parts) if parts else AxisScores.empty(0, names, [a.name for a in reward.axes])
            by_prompt = reward.config.normalize == "group" and reward.config.group_by == "prompt"
            out = gather_combine(reward, local, local=True,
                                 group_keys=[int(p) for p in prompt_ids] if by_prompt else None)
            comps[key] = out.scores.double()
            for d, v in out.dimensions.items():
                dims[f"{key}.{d}"] = v.double()
            for i, e in enumerate(out.errors):
                if e and errors[i] is None:
                    errors[i] = f"{key}: {e}"
        if self.deferred:
            total = torch.zeros(n, dtype=torch.float64)
            for key, w in zip(self.keys, self.weights):
                total = total + w * comps[key]  # NaN propagates as in __call__
        else:
            total = cat([r["total"] for r in results])
        return {"total": total, "components": comps, "dimensions": dims, "errors": errors}


# ---------------------------------------------------------------------------------------------- trainer
class NFTTrainer:
    def __init__(self, cfg: NFTConfig):
        cfg.validate()
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
        self.prompts = load_prompts(cfg.prompts)
        if cfg.eval_every and min(cfg.eval_prompts, len(self.prompts)) < self.dist.world:
            # every process evaluates a share of the prompts and the statistics are all-reduced by key
            raise ValueError(f"eval_prompts = {min(cfg.eval_prompts, len(self.prompts))} evaluation prompt(s) for "
                             f"{self.dist.world} processes: give at least one per process, or eval_every: 0")
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
    def _rollout(self, c_orig: Cond, c_opt: Cond, noise: torch.Tensor, gen: torch.Generator,
                 steps: int | None = None, solver: str | None = None, use_old: bool = True) -> torch.Tensor:
        """Latents at sigma = 0 from ``noise`` ``[B, C, h, w]``; E²PO members follow the noise-aware condition."""
        s, e = self.cfg.sample, self.cfg.e2po
        sigmas = self.sigmas if steps is None else S.flow_sigmas(steps, s.shift)
        perturbed = c_opt is not c_orig

        def velocity(x, sigma, i):
            cond = c_orig
            if perturbed:
                g = float(noise_aware_gamma(sigma, e.rho))
                cond = c_orig if g == 0 else Cond(g * c_opt.embeds + (1 - g) * c_orig.embeds,
                                                  g * c_opt.pooled + (1 - g) * c_orig.pooled)
            sig = torch.full((x.shape[0],), sigma, device=x.device, dtype=torch.float32)
            with self._autocast():
                return self.policy.sample_velocity(
                    self.policy.transformer, x, sig, cond, guidance_scale=s.guidance_scale,
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
                futures.append(pool.submit(self.scorer, images, texts))  # scored while the next batch samples
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
    def _train_epoch(self, buf: dict[str, Any], r: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
        t = self.cfg.train
        gen = _gen(self.cfg.seed, _TRAIN, self.epoch, self.dist.rank)
        perm = torch.randperm(self.local_n, generator=gen)
        T = self.num_train_t
        sig = self.sigmas.float()
        sums: dict[str, float] = {}
        count = 0
        grad_norms, scales = [], []
        self.policy.transformer.train()
        for m in range(self.micro_batches):
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
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
                count += 1
            if last_micro:
                self.scaler.unscale_(self.opt)
                norm = torch.nn.utils.clip_grad_norm_(self.trainable, t.max_grad_norm)
                grad_norms.append(float(norm))
                self.scaler.step(self.opt)
                self.scaler.update()
                scales.append(float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0)
                self.opt.zero_grad(set_to_none=True)
                self.global_step += 1
                if self.ema is not None:
                    N.ema_update_(self.ema, self.trainable, self.global_step, t.ema_decay)
        self.policy.transformer.eval()
        out = {k: v / max(count, 1) for k, v in sums.items()}
        vec = self.dist.mean(torch.tensor([out[k] for k in sorted(out)], dtype=torch.float64, device=self.device))
        out = {k: float(v) for k, v in zip(sorted(out), vec.cpu())}
        out["grad_norm"] = float(sum(grad_norms) / len(grad_norms)) if grad_norms else float("nan")
        out["grad_scale"] = scales[-1] if scales else float("nan")
        return out

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self) -> dict[str, Any]:
        epoch = self.epoch
        t0 = time.perf_counter()
        deltas, e_logs = (None, {})
        if self.cfg.e2po.enabled:
            deltas, e_logs = self._explore(epoch)
        t1 = time.perf_counter()
        buf = self._sample_epoch(epoch, deltas)
        t2 = time.perf_counter()
        r, valid, r_logs = self._advantages(buf)
        train_logs = self._train_epoch(buf, r, valid)
        decay = S.old_policy_decay(self.global_step, self.cfg.train.decay_type)
        N.soft_update_(self.old_params, self.trainable, decay)
        t3 = time.perf_counter()
        self.epoch += 1
        rec = {"epoch": self.epoch, "global_step": self.global_step, "old_decay": decay, **r_logs, **train_logs,
               **e_logs, "time/e2po_s": t1 - t0, "time/sample_s": t2 - t1, "time/train_s": t3 - t2}
        return rec

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Rewards of the EMA weights (the trained adapter when EMA is off) on the first ``eval_prompts`` prompts:
        ``sample.eval_solver`` with ``sample.eval_num_steps`` steps, the same noise every time."""
        cfg, s = self.cfg, self.cfg.sample
        idx = list(range(min(cfg.eval_prompts, len(self.prompts))))[self.dist.rank::self.dist.world]
        gen = _gen(cfg.seed, _EVAL, self.dist.rank)
        backup = [p.detach().clone() for p in self.trainable]
        if self.ema is not None:
            for p, e in zip(self.trainable, self.ema):
                p.copy_(e)
        results, ids = [], []
        try:
            for start in range(0, len(idx), s.batch_size):
                texts = [self.prompts[i] for i in idx[start:start + s.batch_size]]
                cond = self.policy.encode(texts)
                noise = torch.randn(self.policy.latent_shape(len(texts), s.resolution), generator=gen).to(self.device)
                x0 = self._rollout(cond, cond, noise, gen, steps=s.eval_num_steps, solver=s.eval_solver, use_old=False)
                results.append(self.scorer(self.policy.decode(x0).cpu(), texts))
                ids += idx[start:start + s.batch_size]
        finally:
            for p, b in zip(self.trainable, backup):
                p.copy_(b)
        fin = self.scorer.finalize(results, torch.tensor(ids, dtype=torch.long))
        comps = {"total": fin["total"], **fin["components"], **fin["dimensions"]}
        if self.scorer.deferred:
            # a batch-relative composite's value is relative to the other samples (its mean is 0 by
            # construction, and each evaluation prompt is a group of one): log its axes' raw scores, not the
            # z-scores, its component or the total
            deferred = self.scorer.deferred
            comps = {k: v for k, v in comps.items()
                     if k != "total" and k not in deferred
                     and not (k.split(".", 1)[0] in deferred and k.rsplit("/", 1)[-1] in ("z", "z_vetoed"))}
        keys = sorted(comps)
        cols = [comps[k] for k in keys]
        # per key: (sum of finite values, count) summed over processes
        stats = torch.tensor([[float(c[torch.isfinite(c)].sum()), float(torch.isfinite(c).sum())] for c in cols],
                             dtype=torch.float64, device=self.device)
        if self.dist.world > 1:
            torch.distributed.all_reduce(stats)
        return {f"eval/reward/{k}/mean": (float(a / n) if n else float("nan")) for k, (a, n) in zip(keys, stats.tolist())}

    # ------------------------------------------------------------------ checkpoints
    def _state_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, params in (("default", self.trainable), ("old", self.old_params), ("ema", self.ema or [])):
            for i, p in enumerate(params):
                out[f"{name}.{i}"] = p.detach().cpu().contiguous()
        return out

    def save_checkpoint(self) -> Path:
        from ..train.trainer import _flatten_optimizer, _write_text_atomic

        st = require("safetensors.torch", "rl")
        root = self.out / "checkpoints"
        name = f"epoch-{self.epoch:06d}"
        final, tmp = root / name, root / f"{name}.tmp"
        if self.dist.main:
            for stale in root.glob("*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
        st.save_file(rng, str(tmp / f"rng-rank{self.dist.rank}.safetensors"))
        if self.dist.main:
            st.save_file(self._state_tensors(), str(tmp / "adapters.safetensors"))
            tensors, meta = _flatten_optimizer(self.opt)
            st.save_file(tensors, str(tmp / "optimizer.safetensors"))
            self._save_lora(tmp / "lora")
            state = {"epoch": self.epoch, "global_step": self.global_step, "world_size": self.dist.world,
                     "optimizer": meta, "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                     "config": dataclasses.asdict(self.cfg)}
            (tmp / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            _write_text_atomic(root / "latest", name)
            kept = sorted(p for p in root.glob("epoch-*") if p.is_dir() and not p.name.endswith(".tmp"))
            for old in kept[:-max(self.cfg.save_total_limit, 1)]:
                shutil.rmtree(old, ignore_errors=True)
        self.dist.barrier()
        return final

    def _save_lora(self, directory: Path) -> None:
        """The LoRA for inference: the EMA weights when EMA is on (as the official code saves), else the
        trained adapter."""
        directory.mkdir(parents=True, exist_ok=True)
        if self.ema is None:
            self.policy.save_lora(directory, "default")
            return
        backup = [p.detach().clone() for p in self.trainable]
        with torch.no_grad():
            for p, e in zip(self.trainable, self.ema):
                p.copy_(e)
        try:
            self.policy.save_lora(directory, "default")
        finally:
            with torch.no_grad():
                for p, b in zip(self.trainable, backup):
                    p.copy_(b)

    def load_checkpoint(self, path: Path) -> None:
        from ..train.trainer import _unflatten_optimizer

        st = require("safetensors.torch", "rl")
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if state["world_size"] != self.dist.world:
            raise ValueError(f"checkpoint {path} was written by {state['world_size']} processes, this run has "
                             f"{self.dist.world}; the sample plan would differ")
        saved, now = state.get("config", {}), dataclasses.asdict(self.cfg)
        keys = ("seed", "prompts", "sample", "lora", "e2po", "rewards")
        changed = [k for k in keys if saved.get(k) != now.get(k)]
        if changed:
            raise ValueError(f"cannot resume from {path}: {', '.join(changed)} changed since it was written; use a "
                             "new output_dir or resume=never")
        tensors = st.load_file(str(path / "adapters.safetensors"))
        with torch.no_grad():
            for name, params in (("default", self.trainable), ("old", self.old_params), ("ema", self.ema or [])):
                for i, p in enumerate(params):
                    key = f"{name}.{i}"
                    if key not in tensors or tensors[key].shape != p.shape:
                        raise ValueError(f"checkpoint {path}: {key} missing or of another shape (lora changed?)")
                    p.copy_(tensors[key])
        self.opt.load_state_dict(_unflatten_optimizer(st.load_file(str(path / "optimizer.safetensors")),
                                                      state["optimizer"]))
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        rng_file = path / f"rng-rank{self.dist.rank}.safetensors"
        if rng_file.is_file():
            torch.set_rng_state(st.load_file(str(rng_file))["cpu"])
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])

    # ------------------------------------------------------------------ logging
    def _log(self, rec: dict[str, Any]) -> None:
        if not self.dist.main:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(clean) + "\n")

    def _truncate_metrics(self) -> None:
        from ..train.trainer import _write_text_atomic

        path = self.out / "metrics.jsonl"
        if not self.dist.main or not path.is_file():
            return
        keep = [ln for ln in path.read_text(encoding="utf-8").splitlines()
                if ln.strip() and json.loads(ln).get("epoch", 0) <= self.epoch and "final" not in json.loads(ln)]
        _write_text_atomic(path, "".join(ln + "\n" for ln in keep))

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
            else:
                self._truncate_metrics()
        self.dist.barrier()
        kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.num_epochs, initial=self.epoch, desc="nft", unit="epoch",
                   disable=not (cfg.progress and self.dist.main))
        last: dict[str, Any] = {}
        try:
            while self.epoch < cfg.num_epochs:
                last = self.run_epoch()
                bar.update(1)
                bar.set_postfix(reward=f"{last['reward/total/mean']:.4g}", loss=f"{last.get('loss', float('nan')):.4g}",
                                kl=f"{last.get('kl', float('nan')):.2g}")
                if cfg.eval_every and (self.epoch % cfg.eval_every == 0 or self.epoch == cfg.num_epochs):
                    last.update(self.evaluate())
                if self.epoch % max(cfg.log_every, 1) == 0 or self.epoch == cfg.num_epochs:
                    self._log(last)
                if kill_after and self.epoch == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: die like a preempted job, before saving
                if (cfg.save_every and self.epoch % cfg.save_every == 0) or self.epoch == cfg.num_epochs:
                    self.save_checkpoint()
                    if self.dist.main:
                        self.plot()
        finally:
            bar.close()
        summary: dict[str, Any] = {"final": True, "epoch": self.epoch, "global_step": self.global_step,
                                   "world_size": self.dist.world}
        if self.dist.world > 1:
            from ..train.trainer import _replica_fingerprint

            fp = self.dist.gather_cat(_replica_fingerprint(self.trainable).unsqueeze(0).to(self.device)).cpu()
            summary["replicas_in_sync"] = bool((fp == fp[0]).all())
        if self.dist.main:
            self._save_lora(self.out / "lora")
            summary["lora_dir"] = str(self.out / "lora")
            summary["reward_mean"] = last.get("reward/total/mean")
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
