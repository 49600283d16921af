"""Documented options of preference training, `bench --revision`, and the claims of docs/integrations.md,
docs/rl.md and docs/tensors-and-gradients.md that had no test that could fail (issue 16, item 3).

Expected values are computed independently: Adam's first step moves every weight by ``lr`` (|g| >> eps), a
clipped gradient is the unclipped one scaled to ``max_grad_norm``, the optimizer steps of ``num_epochs``
epochs are counted, the autocast dtype is read inside the forward, the base weights of a LoRA model are
compared with the base checkpoint's safetensors file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rewardkit.config import load_config
from rewardkit.train.trainer import PreferenceTrainConfig, PreferenceTrainer

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "arena_rm" / "tiny.yaml"
# small and fast: one micro-batch of 4 pairs per step, no eval set, no periodic checkpoints, constant lr
FAST = ["progress=false", "data.eval=null", "data.synthetic_size=16", "micro_batch_size=4", "global_batch_size=4",
        "save_every=0", "log_every=1", "optim.schedule=constant", "optim.weight_decay=0.0"]


def tiny_cfg(out: Path, *overrides: str) -> PreferenceTrainConfig:
    return load_config(PreferenceTrainConfig, TINY, [f"output_dir={out}", *FAST, *overrides])


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _inner(opt):
    return opt.optimizer if hasattr(opt, "optimizer") else opt


def run_recording(cfg: PreferenceTrainConfig, before_train=None) -> dict:
    """Train, recording at every optimizer step (after clipping / unscaling, before the update) the
    gradients, their total norm, and the param groups' lrs."""
    tr = PreferenceTrainer(cfg)
    if before_train is not None:
        before_train(tr)
    names = {id(p): n for n, p in tr.model_raw.named_parameters()}
    steps: list[dict] = []

    def hook(opt, args, kwargs):
        grads = {names[id(p)]: p.grad.detach().clone() for g in opt.param_groups for p in g["params"]
                 if p.grad is not None}
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads.values()]))
        steps.append({"grads": grads, "norm": float(norm), "lrs": [g["lr"] for g in opt.param_groups]})

    _inner(tr.opt).register_step_pre_hook(hook)
    start = {n: p.detach().clone() for n, p in tr.model_raw.named_parameters()}
    summary = tr.train()
    return {"trainer": tr, "steps": steps, "start": start, "summary": summary, "metrics": metrics(Path(cfg.output_dir))}


# ---------------------------------------------------------------------------------------------- head_lr
@pytest.mark.parametrize("head_lr", [0.05, 0.0])
def test_head_lr_sets_the_head_group_and_the_heads_step(tmp_path, head_lr):
    """docs/preference.md `head_lr`: the head's param group gets head_lr, the body lr; Adam's first update is
    lr * g / (|g| + eps), so the largest move of a weight is ~ its group's lr (head_lr=0 freezes the head)."""
    lr = 1e-3
    run = run_recording(tiny_cfg(tmp_path, "max_steps=1", f"optim.lr={lr}", f"optim.head_lr={head_lr}",
                                 "optim.max_grad_norm=null"))
    tr = run["trainer"]
    head_ids = {id(p) for p in tr.model_raw.head.parameters()}
    groups = _inner(tr.opt).param_groups
    head_groups = [g for g in groups if {id(p) for p in g["params"]} & head_ids]
    assert len(head_groups) == 1 and {id(p) for p in head_groups[0]["params"]} == head_ids
    assert run["steps"][0]["lrs"] == [lr, head_lr]  # body first, then the head, at the (constant) schedule's lr
    now = dict(tr.model_raw.named_parameters())
    head_move = (now["head.proj.weight"].detach() - run["start"]["head.proj.weight"]).abs().max().item()
    body_move = max((now[n].detach() - run["start"][n]).abs().max().item()
                    for n, p in now.items() if p.requires_grad and not n.startswith("head."))
    assert body_move == pytest.approx(lr, rel=1e-3)
    if head_lr:
        assert head_move == pytest.approx(head_lr, rel=1e-3)
    else:
        assert head_move == 0.0


def test_head_lr_and_lr_are_validated(tmp_path):
    for bad in ("optim.lr=0", "optim.head_lr=-1", "optim.lr=nan", "num_epochs=0"):
        with pytest.raises(ValueError, match="lr|num_epochs"):
            PreferenceTrainer(tiny_cfg(tmp_path, bad))


# ---------------------------------------------------------------------------------------------- max_grad_norm
@pytest.fixture(scope="module")
def unclipped(tmp_path_factory):
    """One step without clipping: the raw gradients (the reference for clipping and for fp16)."""
    out = tmp_path_factory.mktemp("unclipped")
    run = run_recording(tiny_cfg(out, "max_steps=1", "optim.max_grad_norm=null"))
    assert [r["grad_norm"] for r in run["metrics"] if r["split"] == "train"] == [None]  # null: no clipping, no norm
    return run["steps"][0]


@pytest.mark.parametrize("factor", [0.1, 10.0])
def test_max_grad_norm_clips_to_the_norm_and_keeps_the_direction(tmp_path, unclipped, factor):
    """docs/preference.md `max_grad_norm`: a total gradient norm above it is scaled down to it (same direction);
    one below it is untouched; the logged grad_norm is the norm before clipping."""
    raw = unclipped["norm"]
    run = run_recording(tiny_cfg(tmp_path, "max_steps=1", f"optim.max_grad_norm={raw * factor!r}"))
    step = run["steps"][0]
    expected_scale = min(1.0, factor)          # torch: g * max_norm / (norm + 1e-6), only when norm > max_norm
    assert step["norm"] == pytest.approx(raw * expected_scale, rel=1e-5)
    for name, g in unclipped["grads"].items():
        torch.testing.assert_close(step["grads"][name], g * expected_scale, rtol=1e-4, atol=1e-9)
    logged = [r["grad_norm"] for r in run["metrics"] if r["split"] == "train"]
    assert logged == [pytest.approx(raw, rel=1e-5)]


# ---------------------------------------------------------------------------------------------- num_epochs
def test_num_epochs_steps_are_epochs_times_full_batches(tmp_path):
    """docs/preference.md: `num_epochs` epochs of len(train) // global_batch_size steps (the last partial batch of
    an epoch dropped); each epoch visits distinct rows in a new order; `max_steps` caps the total."""
    # 20 pairs, 8 per step: 2 full steps per epoch (4 pairs dropped), 3 epochs = 6 optimizer steps
    cfg = tiny_cfg(tmp_path, "data.synthetic_size=20", "global_batch_size=8", "num_epochs=3", "max_steps=null")
    seen: list[list[int]] = []

    def record_rows(tr):
        collate = tr.train_collate

        def wrapped(rows, chunk):
            seen.append(list(chunk))
            return collate(rows, chunk)
        tr.train_collate = wrapped

    run = run_recording(cfg, before_train=record_rows)
    assert len(run["trainer"].train_ds) == 20
    assert len(run["steps"]) == 6
    train = [r for r in run["metrics"] if r["split"] == "train"]
    assert [(r["step"], r["epoch"]) for r in train] == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2)]
    assert [r for r in run["metrics"] if r["split"] == "info"][0]["total_steps"] == 6
    # 2 micro-batches of 4 per step; per epoch 16 distinct rows, and the epochs' orders differ
    assert len(seen) == 12 and all(len(c) == 4 for c in seen)
    epochs = [sum(seen[4 * e:4 * e + 4], []) for e in range(3)]
    assert all(len(set(rows)) == 16 for rows in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    capped = PreferenceTrainer(tiny_cfg(tmp_path / "capped", "data.synthetic_size=20", "global_batch_size=8",
                                        "num_epochs=3", "max_steps=4"))
    assert capped.total_steps == 4


# ---------------------------------------------------------------------------------------------- fp16
def test_fp16_autocasts_the_backbone_and_steps_through_a_grad_scaler(tmp_path, unclipped):
    """docs/preference.md `mixed_precision: fp16`: the backbone runs in fp16 autocast (observed inside its
    forward, on CPU too), the head in fp32, the loss goes through a GradScaler (its state is checkpointed), and
    the unscaled gradients are the fp32 ones up to fp16 rounding."""
    seen: dict[str, set] = {"backbone": set(), "head": set()}
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)

    def hooks(tr):
        # the trainer's own scaler: torch's GradScaler at its default initial scale, also held by the optimizer
        assert isinstance(tr.acc.scaler, torch.amp.GradScaler) and tr.acc.scaler.is_enabled()
        assert tr.acc.scaler.get_scale() == 2.0 ** 16 and tr.opt.scaler is tr.acc.scaler
        # random tiny weights overflow fp16 gradients above a scale of ~4096 (the step would be skipped and
        # the scale halved, as GradScaler does): start lower so that this one step is taken
        tr.acc.scaler = tr.opt.scaler = scaler
        lin = next(m for n, m in tr.model_raw.vlm.named_modules()
                   if isinstance(m, torch.nn.Linear) and "language_model" in n and "q_proj" in n)
        lin.register_forward_hook(lambda m, i, o: seen["backbone"].add(o.dtype))
        tr.model_raw.head.register_forward_hook(lambda m, i, o: seen["head"].add(o.dtype))

    run = run_recording(tiny_cfg(tmp_path, "max_steps=1", "optim.max_grad_norm=null", "mixed_precision=fp16"),
                        before_train=hooks)
    tr = run["trainer"]
    assert seen == {"backbone": {torch.float16}, "head": {torch.float32}}
    assert len(run["steps"]) == 1 and scaler.get_scale() == 256.0  # the loss went through it; no overflow
    state = json.loads((tmp_path / "checkpoints" / "step-00000001" / "state.json").read_text())
    assert state["scaler"]["scale"] == 256.0                         # checkpointed for resume
    assert all(p.dtype == torch.float32 for p in tr.trainable)  # fp32 master weights
    # the gradients the optimizer sees are unscaled: the fp32 run's, up to fp16 rounding
    step = run["steps"][0]
    assert step["norm"] == pytest.approx(unclipped["norm"], rel=0.05)
    flat = torch.cat([step["grads"][n].flatten() for n in unclipped["grads"]])
    ref = torch.cat([g.flatten() for g in unclipped["grads"].values()])
    assert torch.nn.functional.cosine_similarity(flat.double(), ref.double(), dim=0) > 0.99
    assert any(not torch.equal(run["start"][n], p.detach()) for n, p in tr.model_raw.named_parameters())


# ---------------------------------------------------------------------------------------------- base_model
@pytest.fixture(scope="module")
def lora_model_on_base_a(tiny_qwen2_5_vl_dir, tmp_path_factory):
    """A LoRA preference model whose saved base is the session's tiny Qwen2.5-VL directory."""
    from rewardkit.models.preference import PreferenceModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        m = PreferenceModel.from_backbone(str(tiny_qwen2_5_vl_dir))
        m.configure_trainable(lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]})
        for p in m.parameters():
            if p.requires_grad:
                with torch.no_grad():
                    p.add_(torch.randn_like(p) * 0.1)
    return m.save_pretrained(tmp_path_factory.mktemp("lora-pref") / "model")


def _base_tensor(directory: Path, suffix: str) -> torch.Tensor:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        state.update(load_file(str(f)))
    keys = [k for k in state if k.endswith(suffix)]
    assert len(keys) == 1, keys
    return state[keys[0]]


def test_base_model_option_loads_the_named_base(lora_model_on_base_a, tiny_qwen2_5_vl_dir, tmp_path):
    """docs/preference.md `base_model`: a LoRA model loads its base from the saved base_model by default, and from
    `base_model=` when given (load_reward option and PreferenceModel.from_pretrained)."""
    from rewardkit import load_reward
    from rewardkit.models.preference import CONFIG_NAME, PreferenceModel
    from rewardkit.testing import random_images, save_tiny_checkpoint

    d = lora_model_on_base_a
    saved = json.loads((d / CONFIG_NAME).read_text())
    assert saved["weights"] == "lora" and saved["base_model"] == str(tiny_qwen2_5_vl_dir)
    other = save_tiny_checkpoint("qwen2_5_vl", tmp_path / "base_b", seed=7)  # same architecture, other weights
    suffix = "visual.patch_embed.proj.weight"  # outside the LoRA targets: exactly the base's tensor
    a, b = _base_tensor(tiny_qwen2_5_vl_dir, suffix), _base_tensor(other, suffix)
    assert not torch.equal(a, b)

    def loaded(model) -> torch.Tensor:
        return next(p for n, p in model.named_parameters() if n.endswith(suffix)).detach()

    assert torch.equal(loaded(PreferenceModel.from_pretrained(d)), a)
    assert torch.equal(loaded(PreferenceModel.from_pretrained(d, base_model=str(other))), b)
    images, prompts = random_images(2, seed=1), ["a cat", "a dog"]
    r_a = load_reward("preference", model=str(d), device="cpu")
    r_b = load_reward("preference", model=str(d), base_model=str(other), device="cpu")
    assert torch.equal(loaded(r_b.model), b) and torch.equal(loaded(r_a.model), a)
    assert not torch.allclose(r_a(images, prompts).scores, r_b(images, prompts).scores)


# ---------------------------------------------------------------------------------------------- bench --revision
def test_bench_revision_reaches_the_hub_loader_and_the_record(tmp_path, tiny_clip_dir, monkeypatch):
    """docs/bench.md `--revision` (pin the dataset commit): passed to datasets.load_dataset as revision=, with the
    spec's dataset / config / split, and recorded in the result's data block. (The score cache is keyed by image
    bytes, not by revision: the same images under another revision reuse their scores, by design.)"""
    import datasets
    import pyarrow.parquet as pq

    from rewardkit.bench.synthetic import write_synthetic_benchmarks
    from rewardkit.cli import main

    files = write_synthetic_benchmarks(tmp_path / "data")
    calls: list[tuple] = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset(pq.read_table(files["mmrb2/t2i"]))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    out = tmp_path / "out"
    rc = main(["bench", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--benchmark", "mmrb2/t2i",
               "--no-cache", "--output-dir", str(out), "--bootstrap", "0", "--no-progress", "--device", "cpu",
               "--limit", "3", "--revision", "0123abc"])
    assert rc == 0
    assert len(calls) == 1
    args, kwargs = calls[0]
    assert args == ("rl-research/multimodal-rewardbench-2", "t2i")
    assert kwargs["revision"] == "0123abc" and kwargs["split"] == "test"
    rec = json.loads(next(out.glob("*.json")).read_text())
    data = rec["benchmarks"]["mmrb2/t2i"]["data"]
    assert data["source"] == "hub" and data["revision"] == "0123abc"
    assert rec["settings"]["revision"] == "0123abc"
