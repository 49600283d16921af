"""Bradley–Terry preference-reward training (``rewardkit train preference --config recipe.yaml``).

One readable loop on accelerate: the chosen and rejected images of every pair go through the backbone in one
forward pass (``[a_1..a_B, b_1..b_B]``), gradient accumulation reaches the global batch, DDP (torchrun or
``accelerate launch``; gloo on CPU) averages gradients, and the LR follows :func:`losses.lr_at`.

Determinism and resume: the data order is a pure function of ``(seed, epoch, step)``, so a resumed run needs
only the trainable weights, the optimizer state, the RNG states and the step, all written atomically in
safetensors + JSON (``checkpoints/step-XXXXXXXX``, pointer file ``checkpoints/latest``). Killing the process
and resuming gives bitwise the same final weights on CPU (tested).

Outputs in ``output_dir``: ``metrics.jsonl`` (one JSON object per logged step and eval), ``checkpoints/``,
``model/`` (the final :class:`PreferenceModel`, loadable with ``load_reward("preference", model=...)``),
``config.yaml`` (the resolved training config).

Size (over the ~600 lines the project aims for, on purpose): this is the method's one readable trainer file, as
TRL keeps one per method. Its configuration (:mod:`.preference_config`), checkpoint files (:mod:`.checkpoint`),
data (:mod:`.data`) and losses (:mod:`.losses`) already live beside it; what remains (set-up, the loop,
evaluation, save / resume, the command's glue) shares the trainer's state and reads top to bottom.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from .._imports import require
from . import losses as L
# the options of `rewardkit train preference`, declared once: the CLI declares them with the same function
from .arguments import preference_arguments as add_arguments
# The config (preference_config.py) and the checkpoint helpers (checkpoint.py) live beside this module; their names
# stay importable from here.
from .checkpoint import (  # noqa: F401
    _flatten_optimizer, _permutation, _replica_fingerprint, _rng_states, _unflatten_optimizer, _write_text_atomic,
    latest_checkpoint, publish_checkpoint, resume_checkpoint,
)
from .preference_config import (  # noqa: F401
    DataArgs, LoraArgs, LossArgs, ModelArgs, OptimArgs, PreferenceTrainConfig, _validate,
)

__all__ = ["PreferenceTrainConfig", "ModelArgs", "LoraArgs", "DataArgs", "OptimArgs", "LossArgs",
           "train_preference", "add_arguments", "run_cli", "latest_checkpoint"]

KILL_ENV = "REWARDKIT_TEST_KILL_AFTER_STEP"  # test hook: SIGKILL the process after this optimizer step
ROW_COLUMN = "_rk_row"  # the row's index in the loaded data (for error messages after filtering)


# ---------------------------------------------------------------------------------------------- trainer
class PreferenceTrainer:
    """Builds the model, data and optimizer from a :class:`PreferenceTrainConfig` and runs the loop."""

    def __init__(self, cfg: PreferenceTrainConfig) -> None:
        _validate(cfg)
        self.cfg = cfg
        accelerate = require("accelerate", "hf")
        from ..models.preference import PreferenceModel
        from .data import PairCollator, load_pairs, normalize_label, preflight_pairs

        cpu = cfg.cpu or not torch.cuda.is_available()
        # accelerate keeps process-wide state; a second run in one process (a notebook, a sweep, tests) with
        # another precision would be refused. Reset the per-run part, keep the process group (PartialState).
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        self.acc = accelerate.Accelerator(mixed_precision=cfg.mixed_precision, cpu=cpu,
                                          log_with=list(cfg.trackers) or None, project_dir=cfg.output_dir)
        if cfg.mixed_precision == "fp16" and self.acc.device.type == "cpu" and not self.acc.native_amp:
            # accelerate silently trains fp32 when asked for fp16 on a CPU. torch has CPU fp16 autocast and a
            # CPU GradScaler: switch them on through accelerate's own attributes (set before prepare(), so the
            # optimizer wrapper steps through the scaler and clip_grad_norm_ unscales first).
            self.acc.native_amp = True
            self.acc.scaler = torch.amp.GradScaler("cpu")
        self.out = Path(cfg.output_dir)
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        per_step = cfg.micro_batch_size * self.world
        if cfg.global_batch_size % per_step:
            raise ValueError(f"global_batch_size {cfg.global_batch_size} is not a multiple of micro_batch_size "
                             f"x processes = {cfg.micro_batch_size} x {self.world}")
        self.accum = cfg.global_batch_size // per_step

        torch.manual_seed(cfg.seed)  # identical init on every rank (DDP also broadcasts at wrap time)
        m = cfg.model
        model = PreferenceModel.from_backbone(m.backbone, head=m.head, head_hidden=m.head_hidden, dtype=m.dtype,
                                              trust_remote_code=m.trust_remote_code, min_pixels=m.min_pixels,
                                              max_pixels=m.max_pixels)
        lora = None
        if cfg.lora.enabled:
            lora = {"r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout,
                    "target_modules": cfg.lora.target_modules}
        model.configure_trainable(lora=lora, train_vision=m.train_vision)
        if m.gradient_checkpointing:
            kw = {"use_reentrant": False}
            if hasattr(model.vlm, "activation_checkpointing_enable"):  # transformers >= 5.2x name
                model.vlm.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
            else:
                model.vlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
        model.train()
        self.model_raw = model

        d = cfg.data
        # with the preflight, bad labels are row errors like the others (listed together; skip_bad_rows drops them)
        train, base = load_pairs(d.train, split=d.train_split, layout=d.layout, max_samples=d.max_train_samples,
                                 synthetic_size=d.synthetic_size, seed=cfg.seed, revision=d.revision,
                                 check_labels=not d.preflight)
        eval_ds, eval_base = None, base
        if d.eval:
            eval_ds, eval_base = load_pairs(d.eval, split=d.eval_split, layout=d.layout,
                                            max_samples=d.max_eval_samples, synthetic_size=d.synthetic_size,
                                            seed=cfg.seed, revision=d.revision, check_labels=not d.preflight)
        # Preflight (headers only, in parallel): every bad row is reported with its index and file before step 1;
        # with data.skip_bad_rows they are dropped instead (count logged, list in bad_rows.jsonl).
        self.n_bad_rows = 0
        # remember each row's index in the loaded data, so a row failing later is named as the user knows it
        train = train.add_column(ROW_COLUMN, list(range(len(train))))
        if eval_ds is not None:
            eval_ds = eval_ds.add_column(ROW_COLUMN, list(range(len(eval_ds))))
        if d.preflight:
            train = self._preflight(train, base, "train", preflight_pairs)
            if eval_ds is not None:
                eval_ds = self._preflight(eval_ds, eval_base, "eval", preflight_pairs)
        if d.eval_fraction > 0 and not d.eval:
            perm = _permutation(len(train), cfg.seed, -1).tolist()
            n_eval = max(1, int(round(len(train) * d.eval_fraction)))
            eval_ds, train = train.select(sorted(perm[:n_eval])), train.select(sorted(perm[n_eval:]))
        labels = [normalize_label(x) for x in train["label"]]
        self.n_ties_skipped = 0
        if cfg.loss.kind in ("bt", "uncertainty"):  # these losses have no tie outcome: skip ties
            keep = [i for i, lab in enumerate(labels) if lab != L.LABEL_TIE]
            self.n_ties_skipped = len(labels) - len(keep)
            if self.n_ties_skipped:
                train = train.select(keep)
        self.train_ds, self.eval_ds = train, eval_ds
        # Once training has started, data never stops the run: a row that fails to decode (its header was fine)
        # is replaced by a weight-0 copy of a good row and reported (rows_skipped in metrics.jsonl).
        fallback = train[0] if len(train) else None
        self.rows_skipped = 0
        self.train_collate = PairCollator(model, base, skip_bad=True, fallback=fallback)
        # background collation gets its own processor copy (fast tokenizers must not be shared across threads)
        self.bg_collate = PairCollator(model.input_encoder(private=True), base, skip_bad=True, fallback=fallback) \
            if cfg.data_workers > 0 else None
        self.eval_collate = PairCollator(model, eval_base, skip_bad=True, fallback=fallback)

        self.steps_per_epoch = len(train) // cfg.global_batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training set has {len(train)} usable pairs, fewer than one global batch "
                             f"({cfg.global_batch_size})")
        self.total_steps = self.steps_per_epoch * cfg.num_epochs
        if cfg.max_steps is not None:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.warmup = int(round(cfg.optim.warmup_ratio * self.total_steps))

        o = cfg.optim
        head_params = [p for p in model.head.parameters() if p.requires_grad]
        head_ids = {id(p) for p in head_params}
        body = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
        head_lr = o.lr if o.head_lr is None else o.head_lr  # head_lr=0 freezes the head (not "use lr")
        groups = [{"params": body, "lr": o.lr, "lr_scale": 1.0},
                  {"params": head_params, "lr": head_lr, "lr_scale": head_lr / o.lr}]
        groups = [g for g in groups if g["params"]]
        opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
                                foreach=False)
        # what the config says, per group: resume keeps the optimizer's state but not these (a checkpoint's lr_scale,
        # weight decay, betas, eps would override a changed config, e.g. head_lr: 0)
        self._group_hparams = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        self.model, self.opt = self.acc.prepare(model, opt)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        # gradient clipping: the parameters that are updated (a frozen head, head_lr: 0, must not scale the body's)
        self._clip_params = [p for g in opt.param_groups if g["lr_scale"] > 0 for p in g["params"]]
        self.step = 0

    def _preflight(self, ds: Any, base: Any, split: str, preflight_pairs: Any) -> Any:
        """Run the preflight check on ``ds``; raise listing every bad row, or drop them (skip_bad_rows)."""
        d = self.cfg.data
        t0 = time.perf_counter()
        bad = preflight_pairs(ds, base, workers=d.preflight_workers,
                              progress=self.cfg.progress and self.acc.is_main_process)
        dt = time.perf_counter() - t0
        if not bad:
            return ds
        rows = sorted({b.index for b in bad})
        report = self.out / f"bad_rows_{split}.jsonl"
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            _write_text_atomic(report, "".join(json.dumps(b.to_dict()) + "\n" for b in bad))
        listing = "\n  ".join(str(b) for b in bad[:50]) + (f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else "")
        if not d.skip_bad_rows:
            from .data import DataRowError

            raise DataRowError(f"{len(rows)} of {len(ds)} {split} rows are unusable (preflight, {dt:.1f} s; all "
                               f"listed in {report}):\n  {listing}\nFix or remove them, or set "
                               "data.skip_bad_rows=true to train without them.")
        if self.acc.is_main_process:
            print(f"rewardkit: skipping {len(rows)} of {len(ds)} bad {split} rows (data.skip_bad_rows; listed in "
                  f"{report}):\n  {listing}", file=sys.stderr)
        if split == "train":
            self.n_bad_rows = len(rows)
        drop = set(rows)
        return ds.select([i for i in range(len(ds)) if i not in drop])

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def save_checkpoint(self, rng: dict[str, torch.Tensor] | None = None) -> Path:
        """Atomic: everything goes to ``step-N.tmp``, then one rename publishes it, then ``latest`` moves.

        ``rng``: the RNG states to store (default: the current ones); an interrupted step passes the states
        captured at its start, so resuming replays it exactly."""
        st = require("safetensors.torch", "hf")
        root = self._ckpt_root()
        name = f"step-{self.step:08d}"
        final, tmp = root / name, root / f"{name}.tmp"
        if self.acc.is_main_process:
            for stale in root.glob("step-*.tmp"):  # left by a process killed while saving
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.acc.wait_for_everyone()
        st.save_file(rng if rng is not None else _rng_states(), str(tmp / f"rng-rank{self.rank}.safetensors"))
        if self.acc.is_main_process:
            st.save_file({k: v.contiguous().cpu() for k, v in self.model_raw.trainable_state_dict().items()},
                         str(tmp / "trainable.safetensors"))
            tensors, meta = _flatten_optimizer(self.opt.optimizer if hasattr(self.opt, "optimizer") else self.opt)
            st.save_file(tensors, str(tmp / "optimizer.safetensors"))
            scaler = self.acc.scaler.state_dict() if getattr(self.acc, "scaler", None) is not None else None
            state = {"step": self.step, "total_steps": self.total_steps, "world_size": self.world,
                     "optimizer": meta, "scaler": scaler, "config": dataclasses.asdict(self.cfg)}
            (tmp / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            publish_checkpoint(root, tmp, final, "step-*", self.cfg.save_total_limit)
        self.acc.wait_for_everyone()
        self._saved_step = self.step
        return final

    def _checkpoint_on_interrupt(self, boundary: tuple[int, dict[str, torch.Tensor]]) -> None:
        """Ctrl-C: keep the completed steps. A step cut short is dropped (its partial gradients are never
        applied) and the checkpoint stores the RNG states from its start, so a resumed run replays it exactly.
        Only single-process runs: other ranks of a distributed job may not have stopped at the same point."""
        if self.world != 1 or self.step == 0 or getattr(self, "_saved_step", None) == self.step:
            return
        rng = boundary[1] if boundary[0] == self.step else None
        path = self.save_checkpoint(rng=rng)
        print(f"\ninterrupted: checkpoint of step {self.step} written to {path}; "
              "run the same command again to resume", file=sys.stderr)

    def load_checkpoint(self, path: Path) -> None:
        st = require("safetensors.torch", "hf")
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if state["world_size"] != self.world:
            raise ValueError(f"checkpoint {path} was written by {state['world_size']} processes, this run has "
                             f"{self.world}; the data order would differ")
        saved = state.get("config", {})
        now = dataclasses.asdict(self.cfg)
        changed = [k for k in ("seed", "global_batch_size", "micro_batch_size") if saved.get(k) != now[k]]
        changed += [f"data.{k}" for k in ("train", "train_split", "max_train_samples", "synthetic_size")
                    if saved.get("data", {}).get(k) != now["data"][k]]
        if changed:
            raise ValueError(f"cannot resume from {path}: {', '.join(changed)} changed since it was written "
                             "(the data order would differ); use a new output_dir or resume=never")
        weights = st.load_file(str(path / "trainable.safetensors"))
        own = dict(self.model_raw.named_parameters())
        missing = [k for k, p in own.items() if p.requires_grad and k not in weights]
        if missing:
            raise ValueError(f"checkpoint {path} lacks trainable parameters {missing[:3]}... (config changed?)")
        with torch.no_grad():
            for k, v in weights.items():
                own[k].copy_(v)
        inner = self.opt.optimizer if hasattr(self.opt, "optimizer") else self.opt
        inner.load_state_dict(_unflatten_optimizer(st.load_file(str(path / "optimizer.safetensors")),
                                                   state["optimizer"]))
        for g, hp in zip(inner.param_groups, self._group_hparams):
            g.update(hp)
        if state.get("scaler") and getattr(self.acc, "scaler", None) is not None:
            self.acc.scaler.load_state_dict(state["scaler"])
        rng_file = path / f"rng-rank{self.rank}.safetensors"
        if rng_file.is_file():
            rng = st.load_file(str(rng_file))
            torch.set_rng_state(rng["cpu"])
            cuda = [rng[k] for k in sorted(k for k in rng if k.startswith("cuda"))]
            if cuda and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(cuda)
        self.step = int(state["step"])

    # ------------------------------------------------------------------ metrics
    def _log(self, rec: dict[str, Any]) -> None:
        if not self.acc.is_main_process:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        if self.cfg.trackers:
            self.acc.log({k: v for k, v in rec.items() if isinstance(v, (int, float))}, step=rec.get("step"))

    def _truncate_metrics(self, step: int) -> None:
        """After a resume, drop lines logged past the checkpoint (they will be logged again)."""
        path = self.out / "metrics.jsonl"
        if not self.acc.is_main_process or not path.is_file():
            return
        from .checkpoint import _log_records  # (half a record, a kill mid-write, is dropped: it failed every resume)

        keep = [json.dumps(r) for r in _log_records(path) if r.get("step", 0) <= step]
        _write_text_atomic(path, "".join(ln + "\n" for ln in keep))

    # ------------------------------------------------------------------ loss
    def _mc_seed(self, step: int, micro: int, split: int = 0) -> int:
        """Seed of the uncertainty loss's Monte-Carlo draws: a pure function of (seed, split, step, micro-batch,
        rank), so a resumed run draws exactly what the uninterrupted one did."""
        return (((self.cfg.seed * 1_000_003 + split) * 1_000_033 + step) * 1031 + micro) * 131 + self.rank

    def _loss(self, r: torch.Tensor, ls: torch.Tensor | None, batch: dict[str, Any],
              mc_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """r: ``[2B]`` rewards for ``[a..., b...]``; returns (loss, r_a [B], r_b [B])."""
        c = self.cfg.loss
        b = r.shape[0] // 2
        r_a, r_b = r[:b], r[b:]
        labels = batch["labels"].to(r.device)
        margin = None if batch["margin"] is None else batch["margin"].to(r.device)
        weight = None if batch["weight"] is None else batch["weight"].to(r.device)
        if c.kind == "bt":
            r_w, r_l = L.winner_loser(r_a, r_b, labels)
            loss = L.bradley_terry_loss(r_w, r_l, margin=margin, weight=weight, center_coef=c.center_coef)
        elif c.kind == "uncertainty":
            r_w, r_l = L.winner_loser(r_a, r_b, labels)
            s_w, s_l = L.winner_loser(ls[:b], ls[b:], labels)
            loss = L.uncertainty_loss(r_w, s_w, r_l, s_l, margin=margin, weight=weight, form=c.uncertainty_form,
                                      samples=c.uncertainty_samples, seed=mc_seed)
        elif c.kind == "rao_kupper":
            loss = L.rao_kupper_loss(r_a, r_b, labels, theta=c.theta, weight=weight)
        else:
            loss = L.davidson_loss(r_a, r_b, labels, nu=c.nu, weight=weight)
        return loss, r_a, r_b

    @staticmethod
    def _pair_metrics(r_a: torch.Tensor, r_b: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        acc, n = L.pairwise_accuracy(r_a, r_b, labels)
        keep = labels != L.LABEL_TIE
        d = (r_a - r_b)[keep]
        margin = torch.where(labels[keep] == L.LABEL_A, d, -d)
        out = {"accuracy": acc, "margin": float(margin.mean()) if n else float("nan"), "pairs": int(labels.numel())}
        out.update(L.reward_stats(torch.cat([r_a, r_b])))
        return out

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float] | None:
        """Held-out metrics. Every process scores its shard (rows ``rank::world``) with the unwrapped model (no
        collective inside the forward), then the results are gathered; the main process logs them."""
        if self.eval_ds is None:
            return None
        model = self.model_raw
        was = model.training
        model.eval()
        ra, rb, labs = [], [], []
        loss_sum = 0.0
        mine = list(range(self.rank, len(self.eval_ds), self.world))
        bs = self.cfg.eval_batch_size
        for s in range(0, len(mine), bs):
            idx = mine[s:s + bs]
            batch = self.eval_collate([self.eval_ds[i] for i in idx], idx)
            with self.acc.autocast():
                r, ls = model(**{k: v.to(self.acc.device) for k, v in batch["inputs"].items()})
            r = r.float()
            ls = None if ls is None else ls.float()
            labels = batch["labels"]
            non_tie = labels != L.LABEL_TIE
            if self.cfg.loss.kind not in ("bt", "uncertainty"):
                non_tie = torch.ones_like(non_tie)
            non_tie = non_tie & batch["keep"]  # rows that failed to decode are not evaluated
            if not bool(non_tie.all()):
                keep = torch.cat([non_tie, non_tie]).to(r.device)  # these losses have no tie outcome
                r = r[keep]
                ls = None if ls is None else ls[keep]
                batch = {**batch, "labels": labels[non_tie],
                         "margin": None if batch["margin"] is None else batch["margin"][non_tie],
                         "weight": None if batch["weight"] is None else batch["weight"][non_tie]}
            if r.numel() == 0:
                continue
            loss, a, b = self._loss(r, ls, batch, mc_seed=self._mc_seed(self.step, s, split=1))
            ra.append(a.cpu())
            rb.append(b.cpu())
            labs.append(batch["labels"])
            loss_sum += float(loss) * a.numel()
        model.train(was)

        # pad every shard to the same length (NaN rewards, label -1), gather, drop the padding
        n_per = -(-len(self.eval_ds) // self.world)

        def pad(parts: list[torch.Tensor], fill: float, dtype: torch.dtype) -> torch.Tensor:
            out = torch.full((n_per,), fill, dtype=dtype)
            if parts:
                x = torch.cat(parts)
                out[:x.numel()] = x.to(dtype)
            return out.to(self.acc.device)

        g_a = self.acc.gather(pad(ra, float("nan"), torch.float32)).cpu()
        g_b = self.acc.gather(pad(rb, float("nan"), torch.float32)).cpu()
        g_lab = self.acc.gather(pad(labs, -1, torch.long)).cpu()
        n_rows = sum(x.numel() for x in labs)
        tot = self.acc.gather(torch.tensor([loss_sum, float(n_rows)], dtype=torch.float64,
                                           device=self.acc.device).unsqueeze(0)).cpu().sum(0)
        keep = g_lab >= 0
        rec = None
        if int(keep.sum()):
            rec = {"split": "eval", "step": self.step, "loss": float(tot[0] / tot[1])}
            rec.update(self._pair_metrics(g_a[keep], g_b[keep], g_lab[keep]))
            self._log(rec)
        return rec

    # ------------------------------------------------------------------ loop
    def _chunks(self, start_step: int):
        """This process's micro-batches (lists of row indices) from ``start_step`` on, in training order.

        The order is a pure function of (seed, epoch, step): resuming at any step replays it exactly."""
        G, M = self.cfg.global_batch_size, self.cfg.micro_batch_size
        perm_epoch, perm = -1, None
        for step in range(start_step, self.total_steps):
            epoch, pos = divmod(step, self.steps_per_epoch)
            if epoch != perm_epoch:
                perm, perm_epoch = _permutation(len(self.train_ds), self.cfg.seed, epoch), epoch
            mine = perm[pos * G:(pos + 1) * G][self.rank::self.world].tolist()  # this process's share
            for k in range(self.accum):
                yield mine[k * M:(k + 1) * M]

    def _batches(self, start_step: int):
        """Yields ``(chunk, collated batch)``; with ``data_workers`` > 0 upcoming batches are prepared in
        background threads (collation is pure, so the result is the same as without)."""
        chunks = self._chunks(start_step)
        if self.bg_collate is None:
            for chunk in chunks:
                yield chunk, self.train_collate([self.train_ds[i] for i in chunk], chunk)
            return
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        # one collator (one processor copy) per worker thread; round-robin keeps each copy single-threaded
        n = self.cfg.data_workers
        collators = [self.bg_collate] + [_pair_collator_copy(self.bg_collate) for _ in range(n - 1)]
        pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rk-data{i}") for i in range(n)]
        pending: deque = deque()
        submitted = 0

        def submit() -> None:
            nonlocal submitted
            chunk = next(chunks, None)
            if chunk is None:
                return
            w = submitted % n
            pending.append((chunk, pools[w].submit(lambda c=chunk, col=collators[w]: col([self.train_ds[i] for i in c], c))))
            submitted += 1

        try:
            for _ in range(2 * n):
                submit()
            while pending:
                chunk, fut = pending.popleft()
                submit()
                yield chunk, fut.result()
        finally:
            for p in pools:
                p.shutdown(wait=True, cancel_futures=True)

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        if cfg.trackers:
            self.acc.init_trackers(cfg.project_name, config=json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
        ckpt = resume_checkpoint(cfg.resume, self.out)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
            self._truncate_metrics(self.step)
        if self.acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            from ..config import save_config

            save_config(cfg, self.out / "config.yaml")
            if ckpt is None:
                (self.out / "metrics.jsonl").unlink(missing_ok=True)
            self._log({"split": "info", "step": self.step, "resumed_from": str(ckpt) if ckpt else None,
                       "world_size": self.world, "grad_accum": self.accum, "total_steps": self.total_steps,
                       "train_pairs": len(self.train_ds), "ties_skipped": self.n_ties_skipped,
                       "bad_rows_skipped": self.n_bad_rows,
                       "eval_pairs": len(self.eval_ds) if self.eval_ds is not None else 0,
                       "trainable_params": sum(p.numel() for p in self.trainable)})
        kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
        from tqdm.auto import tqdm

        bar = tqdm(total=self.total_steps, initial=self.step, desc="train preference", unit="step",
                   disable=not (cfg.progress and self.acc.is_main_process))
        G = cfg.global_batch_size
        local_pairs = 0
        batches = self._batches(self.step)
        boundary = (self.step, _rng_states())
        try:
            while self.step < self.total_steps:
                boundary = (self.step, _rng_states())  # what a checkpoint at this step boundary would store
                t0 = time.perf_counter()
                epoch = self.step // self.steps_per_epoch
                ra, rb, labs, keeps, losses = [], [], [], [], []
                for k in range(self.accum):
                    chunk, batch = next(batches)
                    for b in batch["skipped"]:
                        self.rows_skipped += 1
                        print(f"rewardkit: step {self.step + 1}: skipped unusable {b.reason}", file=sys.stderr)
                    inputs = {key: v.to(self.acc.device) for key, v in batch["inputs"].items()}
                    last = k == self.accum - 1
                    ctx = self.acc.no_sync(self.model) if not last else nullcontext()
                    with ctx:
                        with self.acc.autocast():
                            r, ls = self.model(**inputs)
                        loss, r_a, r_b = self._loss(r.float(), None if ls is None else ls.float(), batch,
                                                    mc_seed=self._mc_seed(self.step, k))
                        self.acc.backward(loss / self.accum)
                    ra.append(r_a.detach()); rb.append(r_b.detach()); labs.append(batch["labels"].to(r_a.device))
                    keeps.append(batch["keep"].to(r_a.device))
                    losses.append(loss.detach())
                    local_pairs += len(chunk)
                grad_norm = None
                if cfg.optim.max_grad_norm:
                    grad_norm = self.acc.clip_grad_norm_(self._clip_params, cfg.optim.max_grad_norm)
                lr = L.lr_at(self.step, base_lr=cfg.optim.lr, total_steps=self.total_steps, warmup_steps=self.warmup,
                             schedule=cfg.optim.schedule, min_lr_ratio=cfg.optim.min_lr_ratio)
                for g in self.opt.param_groups:
                    g["lr"] = lr * g["lr_scale"]
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
                self.step += 1
                bar.update(1)
                dt = time.perf_counter() - t0

                is_last = self.step == self.total_steps
                if self.step % max(cfg.log_every, 1) == 0 or is_last or self.step == 1:
                    r_a = self.acc.gather(torch.cat(ra)).float().cpu()
                    r_b = self.acc.gather(torch.cat(rb)).float().cpu()
                    lab = self.acc.gather(torch.cat(labs)).cpu()
                    keep = self.acc.gather(torch.cat(keeps)).cpu()  # placeholders of skipped rows: not metrics
                    r_a, r_b, lab = r_a[keep], r_b[keep], lab[keep]
                    loss_all = self.acc.gather(torch.stack(losses).mean().reshape(1)).float().mean()
                    rec = {"split": "train", "step": self.step, "epoch": epoch, "loss": float(loss_all), "lr": lr,
                           "grad_norm": None if grad_norm is None else float(grad_norm),
                           "pairs_per_s": G / dt if dt > 0 else None, "rows_skipped": self.rows_skipped}
                    rec.update(self._pair_metrics(r_a, r_b, lab))
                    self._log(rec)
                    bar.set_postfix(loss=f"{rec['loss']:.4f}", acc=f"{rec['accuracy']:.3f}")
                if cfg.eval_every and self.step % cfg.eval_every == 0 and not is_last:
                    self.evaluate()
                if (cfg.save_every and self.step % cfg.save_every == 0) or is_last:
                    self.save_checkpoint()
                if kill_after and self.step == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: die like a preempted job, no cleanup
        except KeyboardInterrupt:
            self._checkpoint_on_interrupt(boundary)
            raise
        finally:
            bar.close()
            batches.close()

        final = self.evaluate() or {}
        summary: dict[str, Any] = {"split": "final", "step": self.step, "world_size": self.world}
        if self.world > 1:
            fp = self.acc.gather(_replica_fingerprint(self.trainable).unsqueeze(0)).cpu()
            summary["replicas_in_sync"] = bool((fp == fp[0]).all())
            summary["replica_max_abs_diff"] = float((fp - fp[0]).abs().max())
            counts = self.acc.gather(torch.tensor([local_pairs], device=self.acc.device)).cpu().tolist()
            summary["pairs_per_rank"] = counts
        if final:
            summary.update({f"eval_{k}": v for k, v in final.items() if k not in ("split", "step")})
        if self.acc.is_main_process:
            self.model_raw.eval()
            if cfg.merge_lora_on_save and self.model_raw.weights_kind == "lora":
                # training is over: merge in place rather than copying the whole model to merge a copy
                self.model_raw.vlm = self.model_raw.vlm.merge_and_unload()
            self.model_raw.save_pretrained(self.out / "model")
            summary["model_dir"] = str(self.out / "model")
        self._log(summary)
        self.acc.wait_for_everyone()
        if cfg.trackers:
            self.acc.end_training()
        return summary


def _pair_collator_copy(col):
    """Another collator over its own processor copy (one per data thread)."""
    from .data import PairCollator

    return PairCollator(col.model.__class__(copy.deepcopy(col.model.processor), col.model.template), col.base_dir,
                        skip_bad=col.skip_bad, fallback=col.fallback)


def train_preference(cfg: PreferenceTrainConfig | dict | str | None = None, **overrides: Any) -> dict[str, Any]:
    """Train a preference reward model; returns the final summary (also the last line of metrics.jsonl)."""
    from ..config import build_config

    cfg = build_config(PreferenceTrainConfig, cfg, overrides)
    return PreferenceTrainer(cfg).train()


# ---------------------------------------------------------------------------------------------- CLI glue
def run_cli(args) -> int:
    from ..config import load_config

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.resume:
        overrides.append(f"resume={args.resume}")
    if getattr(args, "no_progress", False):
        overrides.append("progress=false")
    cfg = load_config(PreferenceTrainConfig, args.config, overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False), end="")
        return 0
    summary = train_preference(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, float) or math.isfinite(v)}))
    return 0
