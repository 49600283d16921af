"""The preference trainer's configuration (``rewardkit train preference --config recipe.yaml``): one dataclass per
YAML section and the checks run before any model loads. Used by :mod:`rewardkit.train.trainer`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import losses as L

__all__ = ["PreferenceTrainConfig", "ModelArgs", "LoraArgs", "DataArgs", "OptimArgs", "LossArgs"]


@dataclass
class ModelArgs:
    backbone: str = "Qwen/Qwen3-VL-8B-Instruct"  # hub id, local dir, or tiny:qwen2_5_vl / tiny:qwen3_vl
    head: str = "linear"                          # linear | mlp | uncertainty
    head_hidden: int = 1024                       # MLP head width
    dtype: str = "float32"                        # backbone weight dtype: float32 | bfloat16 | float16
    trust_remote_code: bool = False
    min_pixels: int | None = None                 # image resolution budget of the processor
    max_pixels: int | None = None
    gradient_checkpointing: bool = False
    train_vision: bool = False                    # vision tower trainable (full FT) or LoRA-wrapped (LoRA)


@dataclass
class LoraArgs:
    enabled: bool = False
    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    # a regex (used as is) or projection names (scoped to the language model; + vision tower if train_vision)
    target_modules: list[str] | str | None = None


@dataclass
class DataArgs:
    train: str = "synthetic:brightness"          # hub id, .parquet/.jsonl/.json/.csv, folder, synthetic:brightness
    train_split: str = "train"
    eval: str | None = None
    eval_split: str = "test"
    eval_fraction: float = 0.0                   # held out from train when `eval` is None
    layout: str = "auto"                         # auto | ab | chosen_rejected | pickapic
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    synthetic_size: int = 512                    # pairs per synthetic split
    revision: str | None = None
    preflight: bool = True                       # check every row (image headers, prompt, label) before step 1
    preflight_workers: int = 8                   # threads of the preflight check
    skip_bad_rows: bool = False                  # drop rows the preflight finds bad (count logged) instead of failing


@dataclass
class OptimArgs:
    lr: float = 1e-5
    head_lr: float | None = None                 # default: lr
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    schedule: str = "cosine"                     # cosine | constant
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0


@dataclass
class LossArgs:
    kind: str = "bt"                             # bt | rao_kupper | davidson | uncertainty
    center_coef: float = 0.0                     # reward-centering coefficient (bt)
    theta: float = 2.0                           # Rao-Kupper tie parameter (> 1)
    nu: float = 1.0                              # Davidson tie parameter (> 0)
    uncertainty_form: str = "hpsv3"              # hpsv3 (Monte-Carlo, HPSv3's objective) | probit (closed form)
    uncertainty_samples: int = 32                # Monte-Carlo draws per pair (hpsv3 form), seeded per micro-batch


@dataclass
class PreferenceTrainConfig:
    output_dir: str = "runs/preference"
    seed: int = 0
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    loss: LossArgs = field(default_factory=LossArgs)
    micro_batch_size: int = 4                    # pairs per process per forward (2x images)
    data_workers: int = 0                        # background threads decoding + processing upcoming micro-batches
    global_batch_size: int = 32                  # pairs per optimizer step, over all processes
    num_epochs: int = 1
    max_steps: int | None = None                 # cap on optimizer steps
    mixed_precision: str = "no"                  # no | bf16 | fp16
    cpu: bool = False                            # force CPU even when CUDA is available
    log_every: int = 10
    eval_every: int = 0                          # 0: evaluate at the end only
    eval_batch_size: int = 16
    save_every: int = 0                          # 0: checkpoint at the end only
    save_total_limit: int = 2
    resume: str = "auto"                         # auto | never | a checkpoint directory
    trackers: list[str] = field(default_factory=list)  # accelerate trackers, e.g. [wandb] or [tensorboard]
    project_name: str = "rewardkit-preference"
    merge_lora_on_save: bool = False             # save the final model with merged (full) weights
    progress: bool = True


def _validate(cfg: PreferenceTrainConfig) -> None:
    if cfg.loss.kind not in ("bt", "rao_kupper", "davidson", "uncertainty"):
        raise ValueError(f"loss.kind must be bt, rao_kupper, davidson or uncertainty, got {cfg.loss.kind!r}")
    if cfg.loss.uncertainty_form not in L.UNCERTAINTY_FORMS:
        raise ValueError(f"loss.uncertainty_form must be one of {L.UNCERTAINTY_FORMS}, got {cfg.loss.uncertainty_form!r}")
    if cfg.loss.uncertainty_samples < 1:
        raise ValueError(f"loss.uncertainty_samples must be >= 1, got {cfg.loss.uncertainty_samples}")
    if (cfg.loss.kind == "uncertainty") != (cfg.model.head == "uncertainty"):
        raise ValueError("loss.kind=uncertainty and model.head=uncertainty go together")
    o = cfg.optim
    if not 0 < o.lr < math.inf or (o.head_lr is not None and not 0 <= o.head_lr < math.inf):  # NaN-safe
        raise ValueError(f"optim.lr must be > 0 and optim.head_lr >= 0 (or null), both finite, got {o.lr!r} / "
                         f"{o.head_lr!r}")
    if o.max_grad_norm is not None and not o.max_grad_norm >= 0:  # NaN-safe
        # a negative norm would flip the clipped gradients' sign (torch scales by max_norm / norm)
        raise ValueError(f"optim.max_grad_norm must be >= 0 (0 or null: no clipping), got {o.max_grad_norm!r}")
    if not cfg.num_epochs >= 1:
        raise ValueError(f"num_epochs must be >= 1, got {cfg.num_epochs!r}")
    if cfg.mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"mixed_precision must be no, bf16 or fp16, got {cfg.mixed_precision!r}")
    if cfg.micro_batch_size < 1 or cfg.global_batch_size < 1:
        raise ValueError("micro_batch_size and global_batch_size must be >= 1")
