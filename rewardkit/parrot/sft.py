"""PARROT stage 4: distil the verified rationales into a student with TRL's ``SFTTrainer``.

Examples (the student never sees the label):

- pairwise: the student's pairwise question about ``[source] + A + B`` -> the verified anchored rationale;
- pointwise: the student's pointwise question about ``[source] + image`` -> the projected critique.

Images travel in the conversation; the collator renders the chat template, runs the processor over text and
images together, and masks everything but the assistant's answer (and its end-of-turn token) out of the loss.
LoRA (peft) or full fine-tuning, optional gradient checkpointing; DDP through ``torchrun`` / ``accelerate
launch`` (the Trainer reads the launcher's environment). Resumes from the last *complete* Trainer checkpoint
in ``<output_dir>/<sft.output>-trainer`` (one half-written by a kill is removed: :func:`last_complete_checkpoint`). The final model (LoRA merged) and its processor are written to
``<output_dir>/<sft.output>``: ``load_reward("rational", model=that_dir)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from .._imports import require

__all__ = ["build_examples", "example_images", "ParrotCollator", "train_sft", "load_student",
           "last_complete_checkpoint"]

_LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"


def build_examples(pipe: Any, *, pairwise: bool = True, pointwise: bool = True) -> list[dict[str, Any]]:
    """Training examples (without images) from a :class:`~rewardkit.parrot.pipeline.Pipeline`'s kept
    rationales and successful projections. Each: ``row``, ``kind`` (pairwise / pointwise), ``slot`` (AB / A / B),
    ``request``, ``edit``, ``completion``; :func:`example_images` gives its images."""
    out: list[dict[str, Any]] = []
    kept = sorted(r["row"] for r in pipe.filtered.records.values() if r["kept"])
    for i in kept:
        rat = pipe.rationales.get(i)
        base = {"row": i, "request": rat["prompt"], "edit": rat["task"] == "edit"}
        if pairwise:
            out.append({**base, "kind": "pairwise", "slot": "AB", "completion": rat["rationale"]})
        if pointwise:
            for slot in ("A", "B"):
                rec = pipe.projected.get((i, slot))
                if rec is not None and rec.get("status") == "ok":
                    out.append({**base, "kind": "pointwise", "slot": slot, "completion": rec["critique"]})
    return out


def example_images(ds: Any, base_dir: Any, ex: dict[str, Any]) -> list[Any]:
    """``[source] + candidates`` of an example, decoded from the preference dataset ``ds``."""
    from ..train.data import _to_image

    r = ds[ex["row"]]
    srcs = [_to_image(x, base_dir) for x in (r.get("sources") or [])]
    names = {"AB": ["image_a", "image_b"], "A": ["image_a"], "B": ["image_b"]}[ex["slot"]]
    return [*srcs, *(_to_image(r[n], base_dir) for n in names)]


def _gen_examples(shard: list[dict[str, Any]], data: dict[str, Any], identity: Any = None):
    """``datasets`` generator (module level, closure-free: its fingerprint hashes only its arguments;
    ``identity``, the dataset's content (:func:`~rewardkit.parrot.pipeline_provenance.dataset_identity`), is
    there so that the cached examples of an edited file are not reused)."""
    from ..train.data import load_pairs

    ds, base_dir = load_pairs(**data)
    for ex in shard:
        yield {**ex, "images": example_images(ds, base_dir, ex)}


def _examples_dataset(pipe: Any, examples: list[dict[str, Any]]) -> Any:
    """A ``datasets.Dataset`` with an ``images`` column, written through the Arrow cache (PNG-encoded on disk,
    memory-mapped) rather than held as decoded images in memory."""
    datasets = require("datasets", "train")
    features = datasets.Features({
        "row": datasets.Value("int64"), "request": datasets.Value("string"), "edit": datasets.Value("bool"),
        "kind": datasets.Value("string"), "slot": datasets.Value("string"), "completion": datasets.Value("string"),
        "images": datasets.Sequence(datasets.Image())})
    d = pipe.cfg.data
    data = {"source": d.train, "split": d.split, "layout": d.layout, "max_samples": d.max_samples,
            "synthetic_size": d.synthetic_size, "seed": pipe.cfg.seed, "revision": d.revision}
    return datasets.Dataset.from_generator(_gen_examples, features=features,
                                           gen_kwargs={"shard": examples, "data": data,
                                                       "identity": getattr(pipe, "_data_id", None)},
                                           cache_dir=str(pipe.out / "sft-cache"))


class ParrotCollator:
    """Examples -> ``input_ids``, ``attention_mask``, ``labels`` (-100 outside the answer), ``pixel_values``,
    ``image_grid_thw`` for a Qwen-VL student. Right padding."""

    def __init__(self, processor: Any, template: Any) -> None:
        self.processor = processor
        self.tok = processor.tokenizer
        self.template = template
        eos = self.tok.eos_token
        if not eos:
            raise ValueError("the student's tokenizer has no eos token to end the answer with")
        self.eos = eos

    def _conv(self, ex: dict[str, Any]) -> list[dict[str, Any]]:
        from .prompts import pairwise_conv, pointwise_conv

        ims = list(ex["images"])
        src = ims[:1] if ex["edit"] else []
        cands = ims[1:] if ex["edit"] else ims
        if ex["kind"] == "pairwise":
            return pairwise_conv(self.template, ex["request"], cands[0], cands[1], src)
        return pointwise_conv(self.template, ex["request"], cands[0], src)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        texts, images, answers = [], [], []
        for ex in examples:
            prompt = self.processor.apply_chat_template(self._conv(ex), tokenize=False, add_generation_prompt=True)
            answer = ex["completion"] + self.eos
            texts.append(prompt + answer)
            answers.append(answer)
            images.extend(ex["images"])
        self.tok.padding_side = "right"
        enc = self.processor(text=texts, images=images, return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        labels = torch.full_like(ids, -100)
        for r, ans in enumerate(answers):
            a = self.tok(ans, add_special_tokens=False)["input_ids"]
            n = int(mask[r].sum())
            if n < len(a) or ids[r, n - len(a):n].tolist() != a:
                raise ValueError("the answer's tokens do not end the rendered conversation (chat template adds "
                                 "text after the assistant turn?); cannot mask the prompt safely")
            labels[r, n - len(a):n] = ids[r, n - len(a):n]
        out = dict(enc)
        out["labels"] = labels
        return out


def load_student(spec: str, dtype: str = "float32") -> tuple[Any, Any]:
    """``tiny:qwen2_5_vl`` / ``tiny:qwen3_vl`` (random tiny models) or a checkpoint -> (model, processor)."""
    from ..models.vlm import load_vlm, resolve_dtype

    if spec.startswith("tiny:"):
        from .. import testing

        kind = spec.partition(":")[2]
        if kind not in ("qwen2_5_vl", "qwen3_vl"):
            raise ValueError(f"unknown tiny student {spec!r}; use tiny:qwen2_5_vl or tiny:qwen3_vl")
        model, proc = testing.TINY_KINDS[kind]()
        return model.to(resolve_dtype(dtype)), proc
    return load_vlm(spec, device="cpu", dtype=dtype)


def _save(model: Any, processor: Any, path: Path, provenance: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    # tokenizer (with its chat template) + image processor: what rewardkit's loader reads back (an
    # image-only processor; a saved processor_config.json of that class would make AutoProcessor return a
    # bare tokenizer)
    processor.tokenizer.save_pretrained(path)
    processor.image_processor.save_pretrained(path)
    for name in ("preprocessor_config.json", "tokenizer_config.json"):  # no reference to our in-process class
        f = path / name
        if f.is_file():
            data = json.loads(f.read_text(encoding="utf-8"))
            if str(data.get("processor_class", "")).endswith("ImageOnly"):
                del data["processor_class"]
                f.write_text(json.dumps(data, indent=2), encoding="utf-8")
    (path / "parrot_provenance.json").write_text(json.dumps(provenance, indent=2), encoding="utf-8")


def last_complete_checkpoint(run_dir: str | Path) -> str | None:
    """The newest Trainer checkpoint (``checkpoint-N``) in ``run_dir`` that was written to the end, or None.

    The Trainer writes a checkpoint's files in place and ``trainer_state.json`` last: a checkpoint is complete
    when that file parses and records ``global_step == N``. A newer checkpoint that is not (a kill while it was
    written) is removed, with a warning, so that the run resumes from the last complete one instead of failing
    on the half-written one at every rerun (and later writes its step afresh)."""
    import re
    import shutil
    import warnings

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    steps = sorted(((int(m.group(1)), p) for p in run_dir.iterdir()
                    if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))), reverse=True)
    for step, path in steps:
        try:
            state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
            complete = isinstance(state, dict) and int(state.get("global_step", -1)) == step
        except (OSError, ValueError, TypeError):
            complete = False
        if complete:
            return str(path)
        warnings.warn(f"{path}: incomplete checkpoint (interrupted while it was written: no readable "
                      "trainer_state.json for this step); removed, resuming from the previous one", stacklevel=2)
        shutil.rmtree(path, ignore_errors=True)
    return None


def train_sft(pipe: Any) -> dict[str, Any]:
    """Stage 4 on the outputs of ``pipe`` (a :class:`~rewardkit.parrot.pipeline.Pipeline`); returns a summary."""
    trl = require("trl", "train")
    require("peft", "train")
    import torch

    cfg = pipe.cfg.sft
    pipe.check_stage("sft")  # the stage files are of this dataset (their rows index it)
    examples = build_examples(pipe, pairwise=cfg.include_pairwise, pointwise=cfg.include_pointwise)
    if not examples:
        raise ValueError(f"no SFT examples in {pipe.out}: no rationale passed the consistency filter (see "
                         "filter_report.json); nothing to distil")
    manifest = pipe.out / "sft_examples.jsonl"
    tmp = manifest.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(e) + "\n" for e in examples),
                   encoding="utf-8")
    os.replace(tmp, manifest)
    ds = _examples_dataset(pipe, examples)

    model, processor = load_student(cfg.student, cfg.dtype)
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                 target_modules=cfg.lora_target_modules or _LORA_TARGETS, task_type="CAUSAL_LM")
    run_dir = pipe.out / f"{cfg.output}-trainer"
    # transformers >= 5.23 calls it activation checkpointing; earlier 5.x (e.g. the 5.20 that vLLM pins) gradient
    ckpt_key = ("activation_checkpointing" if "activation_checkpointing" in
                {f.name for f in dataclasses.fields(trl.SFTConfig)} else "gradient_checkpointing")
    args = trl.SFTConfig(
        output_dir=str(run_dir), max_steps=cfg.max_steps, num_train_epochs=cfg.num_train_epochs,
        learning_rate=cfg.learning_rate, per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        **{ckpt_key: cfg.gradient_checkpointing}, bf16=cfg.bf16, fp16=False, use_cpu=cfg.use_cpu,
        logging_steps=cfg.logging_steps, save_steps=cfg.save_steps, seed=cfg.seed, report_to=cfg.report_to,
        remove_unused_columns=False, dataset_kwargs={"skip_prepare_dataset": True}, max_length=None,
        disable_tqdm=not pipe.progress)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=processor,
                             data_collator=ParrotCollator(processor, pipe.template), peft_config=peft_config)
    last = last_complete_checkpoint(run_dir)
    final = pipe.out / cfg.output
    if last is not None and (final / "parrot_provenance.json").is_file():
        state = json.loads((Path(last) / "trainer_state.json").read_text(encoding="utf-8"))
        if 0 < int(state.get("max_steps", 0)) <= int(state.get("global_step", 0)):
            # finished before (resuming from the final checkpoint would run one extra step): nothing to do
            return {"examples": len(examples), "steps": int(state["global_step"]), "resumed_from": last,
                    "model": str(final), "already_trained": True}
    result = trainer.train(resume_from_checkpoint=last)
    summary = {"examples": len(examples), "pairwise": sum(e["kind"] == "pairwise" for e in examples),
               "pointwise": sum(e["kind"] == "pointwise" for e in examples), "train_loss": result.training_loss,
               "steps": result.global_step, "resumed_from": last, "model": str(final)}
    if trainer.accelerator.is_main_process:
        m = trainer.model
        if cfg.lora:
            m = m.merge_and_unload()
        m = trainer.accelerator.unwrap_model(m)
        with torch.no_grad():
            _save(m, processor, final, {"teacher": pipe.cfg.teacher.judge, "template": pipe.template.id,
                                        "student": cfg.student, "seed": cfg.seed, **pipe._data_fields(),
                                        "filter": pipe.report(), **{k: v for k, v in summary.items() if k != "model"}})
    trainer.accelerator.wait_for_everyone()
    return summary

