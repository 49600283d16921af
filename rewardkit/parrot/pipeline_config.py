"""The PARROT pipeline's configuration (``rewardkit parrot ... --config``): the dataset, the teacher, the student's
fine-tuning (stage 4) and the run. Importable from :mod:`rewardkit.parrot.pipeline` as before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParrotConfig", "DataCfg", "TeacherCfg", "SFTCfg"]


@dataclass
class DataCfg:
    train: str = "synthetic:brightness"  # hub id, .parquet/.jsonl/.json/.csv, folder, synthetic:brightness
    split: str = "train"
    layout: str = "auto"
    max_samples: int | None = None
    synthetic_size: int = 64
    revision: str | None = None


@dataclass
class TeacherCfg:
    #: judge spec: transformers:<ckpt> | vllm:<ckpt> | openai:<url> | tiny:qwen2_5_vl | tiny:qwen3_vl | scripted
    judge: str = "vllm:Qwen/Qwen3-VL-32B-Instruct"
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    temperature: float = 0.0
    max_new_tokens: int = 1024  # rationale / projection
    predict_max_new_tokens: int = 8  # the consistency check's one-letter answer


@dataclass
class SFTCfg:
    #: student checkpoint: hub id, local dir or tiny:qwen2_5_vl / tiny:qwen3_vl
    student: str = "Qwen/Qwen3-VL-8B-Instruct"
    output: str = "student"  # under output_dir
    include_pairwise: bool = True
    include_pointwise: bool = True
    max_steps: int = -1
    num_train_epochs: float = 2.0
    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 8
    gradient_checkpointing: bool = False
    dtype: str = "bfloat16"  # student weights: float32 | bfloat16 | float16
    bf16: bool = False  # mixed precision (autocast) on top of float32 weights
    use_cpu: bool = False
    lora: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | str | None = None
    logging_steps: int = 10
    save_steps: int = 500
    seed: int = 0
    report_to: str = "none"


@dataclass
class ParrotConfig:
    output_dir: str = "runs/parrot"
    data: DataCfg = field(default_factory=DataCfg)
    teacher: TeacherCfg = field(default_factory=TeacherCfg)
    sft: SFTCfg = field(default_factory=SFTCfg)
    template: str = "default"
    seed: int = 0
    batch_size: int = 16  # pairs per judge call
    retry_failed: bool = True  # rerun rows whose record says judge_failure
    #: what stage 2 is shown of a rationale (rewardkit.parrot.format.consistency_view): full (the paper's:
    #: arguments, scores, summary) | evidence_only (the per-dimension arguments alone); never the Preferred line
    consistency_view: str = "full"
