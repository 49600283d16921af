"""``NFTConfig``: DiffusionNFT's official defaults (SD3.5-M, GenEval setting) and named presets.

Sizes follow the official 8-GPU setup: 48 prompts x 24 images per epoch, 9 images per GPU per batch, one
optimizer step per epoch. On fewer GPUs keep ``num_groups * group_size`` and raise ``sample.num_batches``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from .exploration import E2POConfig

__all__ = ["NFTConfig", "ModelArgs", "LoraArgs", "SampleArgs", "TrainArgs", "PRESETS", "preset",
           "FLOW_GRPO_REWARD_KWARGS"]


@dataclass
class ModelArgs:
    pretrained: str = "stabilityai/stable-diffusion-3.5-medium"  # hub id or local diffusers directory
    revision: str | None = None
    max_sequence_length: int = 128        # T5 tokens (CLIP: the tokenizers' 77)
    text_encoder_dtype: str = "auto"      # auto (the mixed-precision dtype on GPU, float32 on CPU) | float32 | ...
    trust_remote_code: bool = False
    # start from a LoRA: a directory with pytorch_lora_weights.safetensors (diffusers' save_lora_weights, what this
    # trainer writes) or adapter_config.json + adapter_model.safetensors (peft's save_pretrained). It becomes the
    # trained adapter (and the old one); the reference policy stays the base model (official train.lora_path)
    init_lora: str | None = None
    # start from a full fine-tune: a diffusers SD3Transformer2DModel directory (or a pipeline folder with a
    # transformer/ subfolder) replacing the pipeline's transformer (LoRA trains on top; it is the reference policy)
    transformer: str | None = None


@dataclass
class LoraArgs:
    r: int = 32
    alpha: float = 64.0
    init: str = "gaussian"                # PEFT init_lora_weights ("gaussian": B = 0, so the start is the base)
    target_modules: list[str] = field(default_factory=lambda: [
        "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
        "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v"])


@dataclass
class SampleArgs:
    num_steps: int = 10                   # rollout steps
    solver: str = "dpm2"                  # dpm2 | euler | ddim | flow_sde | ddim_sde
    eta: float = 0.7                      # flow_sde / ddim_sde noise level (unused by the ODE solvers)
    guidance_scale: float = 1.0           # classifier-free guidance in rollouts and eval; <= 1: off (NFT: 1.0)
    negative_prompt: str = ""             # the unconditional prompt of CFG (the official code encodes "")
    integer_timestep: bool = False        # rollouts feed the transformer long(1000 sigma), as the official sampler
    shift: float = 3.0                    # flow-matching sigma shift (SD3 / SD3.5: 3)
    resolution: int = 512
    batch_size: int = 9                   # images per process per rollout batch
    num_groups: int = 48                  # prompts per epoch (over all processes)
    group_size: int = 24                  # images per prompt (with E²PO: G x K, K = e2po.num_variants)
    eval_num_steps: int = 40              # evaluation: Euler ODE
    eval_solver: str = "euler"
    eval_guidance_scale: float | None = None  # evaluation's CFG scale; None: sample.guidance_scale (official)


@dataclass
class TrainArgs:
    batch_size: int = 9                   # samples per process per training forward
    steps_per_epoch: int = 1              # optimizer steps per epoch
    timestep_fraction: float = 0.99       # 9 of 10 rollout timesteps per sample
    beta: float = 1.0                     # NFT mixing strength (0.1 for OCR / multi-reward)
    kl_coef: float = 1e-4                 # KL to the base model (official train.beta)
    adv_clip_max: float = 5.0
    adv_mode: str = "all"                 # all | positive_only | negative_only | one_only | binary
    global_std: bool = True               # one std over the epoch (official) or one per prompt group
    lr: float = 3e-4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 1e-4
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    decay_type: str = "linear_to_0_5"     # old-policy soft update: copy | linear_to_0_5 | delayed_linear_to_0_999
    ema: bool = True
    ema_decay: float = 0.9


@dataclass
class NFTConfig:
    output_dir: str = "runs/nft"
    seed: int = 42
    model: ModelArgs = field(default_factory=ModelArgs)
    lora: LoraArgs = field(default_factory=LoraArgs)
    sample: SampleArgs = field(default_factory=SampleArgs)
    train: TrainArgs = field(default_factory=TrainArgs)
    e2po: E2POConfig = field(default_factory=E2POConfig)
    # rewards: registry name -> weight; the training reward is the weighted SUM (flow_grpo's "avg"). A set: a
    # later layer's mapping replaces it whole (rewards.NAME=W edits one entry); see rewardkit.config
    rewards: dict[str, float] = field(default_factory=lambda: {"pickscore": 1.0}, metadata={"merge": False})
    # per-reward constructor options, e.g. {"clipscore": {"model": "path/to/clip"}}; merges key by key, but a
    # layer that replaces `rewards` drops the earlier layers' options of rewards no longer in the set
    reward_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"keys_of": "rewards"})
    reward_workers: int = 4               # threads scoring finished batches while the next batch samples
    invalid_rewards: str = "drop"         # drop (left out of statistics and loss; counted and warned) | raise
    prompts: str = "builtin:geneval_tiny"  # a .txt file (one prompt a line), a .jsonl with "prompt", or builtin:...
    num_epochs: int = 1000
    mixed_precision: str = "fp16"         # no | fp16 (autocast + GradScaler) | bf16
    cpu: bool = False
    save_every: int = 30                  # epochs (and at the end)
    save_total_limit: int = 2
    resume: str = "auto"                  # auto | never | a checkpoint directory
    log_every: int = 1
    progress: bool = True
    allow_tf32: bool = True
    torch_threads: int = 0                # CPU threads for torch (0: torch's default; 1 is fastest for tiny models)

    # ---- evaluation, experiment tracking, step checkpoints (the trainer's block)
    eval_every: int = 10                  # epochs; 0: never. Also before the first epoch (the baseline) and at the end
    eval_prompts: str = ""                # held-out prompt set (as `prompts`); "": builtin:NAME_eval for builtin:NAME
    eval_num_prompts: int = 0             # the first N evaluation prompts (0: all), the same noise every time
    eval_grid: int = 16                   # images in the PNG grid written per evaluation (0: none)
    report_to: list[str] | str = field(default_factory=lambda: ["tensorboard"])  # tensorboard, wandb | none
    run_name: str = ""                    # wandb run name ("": the output_dir's name)
    log_images_every: int = 10            # epochs: the top / bottom `log_images` training images by reward (0: never)
    log_images: int = 4
    save_every_steps: int = 0             # optimizer steps between checkpoints, mid-epoch too (0: per save_every)

    def validate(self) -> None:
        s, t = self.sample, self.train
        known = ("dpm2", "euler", "ddim", "flow_sde", "ddim_sde")
        if s.solver not in known or s.eval_solver not in known:
            raise ValueError(f"sample.solver and sample.eval_solver must be one of {', '.join(known)}, got "
                             f"{s.solver!r} / {s.eval_solver!r}")
        if not (isinstance(s.guidance_scale, (int, float)) and math.isfinite(s.guidance_scale)):
            raise ValueError(f"sample.guidance_scale must be a finite number, got {s.guidance_scale!r}")
        if s.eval_guidance_scale is not None and not (isinstance(s.eval_guidance_scale, (int, float))
                                                      and math.isfinite(s.eval_guidance_scale)):
            raise ValueError(f"sample.eval_guidance_scale must be a finite number or null, got "
                             f"{s.eval_guidance_scale!r}")
        if not (0 <= s.eta < math.inf):
            raise ValueError(f"sample.eta must be finite and >= 0, got {s.eta!r}")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(f"mixed_precision must be no, fp16 or bf16, got {self.mixed_precision!r}")
        if self.invalid_rewards not in ("drop", "raise"):
            raise ValueError(f"invalid_rewards must be drop or raise, got {self.invalid_rewards!r}")
        if not self.rewards:
            raise ValueError("rewards: give at least one {name: weight}")
        for name, w in self.rewards.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise ValueError(f"rewards.{name}: weight must be a finite number, got {w!r}")
        # the optimizer always clips: a negative norm would flip the gradients (silent ascent), 0 or NaN zero them
        # (written so that NaN fails every check)
        if not (isinstance(t.lr, (int, float)) and 0 < t.lr < math.inf):
            raise ValueError(f"train.lr must be a finite number > 0, got {t.lr!r}")
        if not (isinstance(t.max_grad_norm, (int, float)) and t.max_grad_norm > 0):
            raise ValueError(f"train.max_grad_norm must be > 0 (inf: no clipping), got {t.max_grad_norm!r}")
        if not (0 <= t.weight_decay < math.inf and 0 < t.adam_eps < math.inf
                and 0 <= t.adam_beta1 < 1 and 0 <= t.adam_beta2 < 1):
            raise ValueError("train.weight_decay must be finite >= 0, adam_eps finite > 0, adam_beta1 / adam_beta2 "
                             f"in [0, 1); got {t.weight_decay!r}, {t.adam_eps!r}, {t.adam_beta1!r}, {t.adam_beta2!r}")
        # the NFT step's own settings: checked here, not after the first epoch's sampling (adv_mode, beta,
        # adv_clip_max) or training (decay_type), as the functions using them would
        from .nft import ADV_MODES
        from .schedule import DECAY_TYPES

        if t.adv_mode not in ADV_MODES:
            raise ValueError(f"train.adv_mode must be one of {', '.join(ADV_MODES)}, got {t.adv_mode!r}")
        if isinstance(t.decay_type, (int, str)) and not isinstance(t.decay_type, bool) \
                and str(t.decay_type).strip() in ("0", "1", "2"):  # the official numbers (the str field reads "2")
            t.decay_type = DECAY_TYPES[int(str(t.decay_type).strip())]
        if t.decay_type not in DECAY_TYPES:
            raise ValueError(f"train.decay_type must be one of {', '.join(DECAY_TYPES)} (or 0 / 1 / 2), got "
                             f"{t.decay_type!r}")
        for key, v, lo in (("beta", t.beta, 0.0), ("adv_clip_max", t.adv_clip_max, 0.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v < math.inf:
                raise ValueError(f"train.{key} must be a finite number > 0, got {v!r}")
        if isinstance(t.kl_coef, bool) or not isinstance(t.kl_coef, (int, float)) or not 0 <= t.kl_coef < math.inf:
            raise ValueError(f"train.kl_coef must be a finite number >= 0, got {t.kl_coef!r}")
        if not (isinstance(t.ema_decay, (int, float)) and 0 <= t.ema_decay <= 1):
            raise ValueError(f"train.ema_decay must be in [0, 1], got {t.ema_decay!r}")
        if not (isinstance(t.timestep_fraction, (int, float)) and 0 < t.timestep_fraction <= 1):
            raise ValueError(f"train.timestep_fraction must be in (0, 1], got {t.timestep_fraction!r}")
        if min(s.batch_size, s.num_groups, s.group_size, t.batch_size, t.steps_per_epoch, s.num_steps) < 1:
            raise ValueError("batch sizes, num_groups, group_size, steps and steps_per_epoch must be >= 1")
        if s.group_size < 2:
            raise ValueError("sample.group_size must be >= 2: advantages are relative to the group")
        if s.resolution % 16:
            raise ValueError(f"sample.resolution must be a multiple of 16, got {s.resolution}")
        if isinstance(self.eval_prompts, str) and self.eval_prompts.strip().isdigit():
            raise ValueError(f"eval_prompts is a held-out prompt set (a file or builtin:NAME), got {self.eval_prompts!r}"
                             f"; the number of evaluation prompts is eval_num_prompts={self.eval_prompts}")
        if isinstance(self.report_to, str):  # report_to=wandb, report_to=tensorboard,wandb
            self.report_to = [x.strip() for x in self.report_to.split(",") if x.strip()]
        if not isinstance(self.report_to, (list, tuple)):  # report_to: null (say none)
            raise ValueError(f"report_to: a list of tensorboard, wandb, or [none]; got {self.report_to!r}")
        bad = [r for r in self.report_to if r not in ("tensorboard", "wandb", "none")]
        if bad or ("none" in self.report_to and len(self.report_to) > 1):
            raise ValueError(f"report_to: a list of tensorboard, wandb, or [none]; got {self.report_to!r}")
        if min(self.eval_num_prompts, self.eval_grid, self.log_images_every, self.log_images,
               self.save_every_steps) < 0:
            raise ValueError("eval_num_prompts, eval_grid, log_images_every, log_images and save_every_steps "
                             "must be >= 0")
        if self.e2po.enabled:
            self.e2po.validate()
            if s.group_size % self.e2po.num_variants:
                raise ValueError(f"with E²PO, sample.group_size (G x K) must be a multiple of e2po.num_variants "
                                 f"(K = {self.e2po.num_variants}), got {s.group_size}")


# flow_grpo's scales (flow_grpo/rewards.py, as DiffusionNFT uses them) where rewardkit's defaults differ: PickScore
# / 26 and CLIP ViT-L/14 logits / 100, so the official weights ({"pickscore": 1, "hpsv2": 1, "clipscore": 1}) keep
# their meaning. The same values as rewardkit.integrations.flow_grpo.FLOW_GRPO_CONVENTIONS (a test checks).
FLOW_GRPO_REWARD_KWARGS: dict[str, dict[str, Any]] = {
    "pickscore": {"scale": 1.0 / 26.0},
    "clipscore": {"model": "openai/clip-vit-large-patch14", "convention": "logits100"},
}


def _official(*names: str) -> dict[str, dict[str, Any]]:
    return {n: dict(FLOW_GRPO_REWARD_KWARGS[n]) for n in names if n in FLOW_GRPO_REWARD_KWARGS}


# Official variants (config/nft.py) and the E²PO paper's three settings. Values not listed are the defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "geneval": {"rewards": {"geneval": 1.0}},
    "pickscore": {"rewards": {"pickscore": 1.0}, "reward_kwargs": _official("pickscore")},
    "hpsv2": {"rewards": {"hpsv2": 1.0}},
    "ocr": {"rewards": {"ocr": 1.0}, "train": {"beta": 0.1, "decay_type": "delayed_linear_to_0_999",
                                               "steps_per_epoch": 2}},
    "multi_reward": {"rewards": {"pickscore": 1.0, "hpsv2": 1.0, "clipscore": 1.0},
                     "reward_kwargs": _official("pickscore", "hpsv2", "clipscore"),
                     "sample": {"num_steps": 25}, "train": {"beta": 0.1}},
    # E²PO (seed paper, section 4): GenEval G=4 K=12; GenEval G=2 K=4 (lambda_div 100); PickScore G=8 K=3
    "e2po_geneval_k12": {"rewards": {"geneval": 1.0}, "sample": {"group_size": 48},
                         "e2po": {"enabled": True, "num_variants": 12}},
    "e2po_geneval_k4": {"rewards": {"geneval": 1.0}, "sample": {"group_size": 8},
                        "e2po": {"enabled": True, "num_variants": 4, "lambda_div": 100.0}},
    "e2po_pickscore_k3": {"rewards": {"pickscore": 1.0}, "reward_kwargs": _official("pickscore"),
                          "sample": {"group_size": 24},
                          "e2po": {"enabled": True, "num_variants": 3}},
}


def preset(name: str) -> dict[str, Any]:
    """A copy of ``PRESETS[name]`` (a mapping for :func:`rewardkit.config.build_config`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
