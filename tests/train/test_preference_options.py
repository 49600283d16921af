"""Documented options of preference training, each with a test that fails when the option is ignored or
mis-wired: ``head_lr``, ``max_grad_norm``, ``num_epochs``, ``mixed_precision: fp16``, ``base_model``, and the
refusal of non-finite learning rates.

Expected values are computed independently: Adam's first step moves every weight by ``lr`` (|g| >> eps), a
clipped gradient is the unclipped one scaled to ``max_grad_norm``, the optimizer steps of ``num_epochs``
epochs are counted, the autocast dtype is read inside the forward, the base weights of a LoRA model are
compared with the base checkpoint's safetensors file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rewardkit.train.trainer import PreferenceTrainer
from tests.helpers.preference_runs import _inner, run_recording, tiny_cfg


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


# ---------------------------------------------------------------------------------------------- preference trainer
def _pref():
    from tests.helpers import preference_runs as d  # tiny-run helpers (recipes/arena_rm/tiny.yaml, step recorder)

    return d


def _is_head(name: str) -> bool:
    return name.startswith("head.")


def test_resume_follows_the_configured_head_lr_not_the_checkpoints(tmp_path):
    """load_checkpoint restored each param group's `lr_scale` (and weight decay, betas, eps) from the checkpoint,
    and the trainer sets lr = schedule * lr_scale every step: a checkpoint written before `head_lr: 0` meant
    "freeze" (the old code stored scale 1 for it), or any run resumed with a new head_lr, kept training the head
    at the old rate. Resumed with head_lr=0, the head must not move; the body follows optim.lr."""
    d = _pref()
    lr = 1e-3
    out = tmp_path / "run"
    first = d.run_recording(d.tiny_cfg(out, "max_steps=1", f"optim.lr={lr}", "optim.head_lr=0.05",
                                       "optim.max_grad_norm=null"))
    assert first["steps"][0]["lrs"] == [lr, 0.05]
    after_first = {n: p.detach().clone() for n, p in first["trainer"].model_raw.named_parameters()}
    second = d.run_recording(d.tiny_cfg(out, "max_steps=2", f"optim.lr={lr}", "optim.head_lr=0",
                                        "optim.max_grad_norm=null", "optim.weight_decay=0.25"))
    tr = second["trainer"]
    assert [r for r in second["metrics"] if r["split"] == "info"][-1]["resumed_from"]
    assert len(second["steps"]) == 1 and second["steps"][0]["lrs"] == [lr, 0.0]
    assert [g["weight_decay"] for g in d._inner(tr.opt).param_groups] == [0.25, 0.25]
    now = dict(tr.model_raw.named_parameters())
    head = [n for n in now if _is_head(n)]
    assert head and all(torch.equal(now[n].detach(), after_first[n]) for n in head)
    body_move = max((now[n].detach() - after_first[n]).abs().max().item()
                    for n, p in now.items() if p.requires_grad and not _is_head(n))
    assert body_move > 0.5 * lr  # Adam's step ~ lr (plus decoupled decay lr * 0.25 * |w|)


def test_frozen_head_does_not_take_part_in_gradient_clipping(tmp_path):
    """With head_lr=0 the head is frozen, but its gradients were part of the clipped total norm, so they scaled
    the body's update (and the logged grad_norm). Expected: the body's gradients clipped by the body's own norm,
    computed here from an unclipped run on the same data."""
    d = _pref()
    ref = d.run_recording(d.tiny_cfg(tmp_path / "ref", "max_steps=1", "optim.head_lr=0", "optim.max_grad_norm=null"))
    grads = ref["steps"][0]["grads"]
    norm = lambda gs: math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))  # noqa: E731
    body = {n: g for n, g in grads.items() if not _is_head(n)}
    b_norm, all_norm = norm(body.values()), norm(grads.values())
    max_norm = 0.5 * b_norm
    right, wrong = max_norm / (b_norm + 1e-6), max_norm / (all_norm + 1e-6)
    assert abs(right - wrong) > 4e-4 * right  # the head's gradient is large enough to tell them apart (vs rtol 1e-4)
    run = d.run_recording(d.tiny_cfg(tmp_path / "clip", "max_steps=1", "optim.head_lr=0",
                                     f"optim.max_grad_norm={max_norm!r}"))
    got = run["steps"][0]["grads"]
    for n, g in body.items():
        torch.testing.assert_close(got[n], g * right, rtol=1e-4, atol=1e-9)
    logged = [r["grad_norm"] for r in run["metrics"] if r["split"] == "train"]
    assert logged == [pytest.approx(b_norm, rel=1e-5)]


@pytest.mark.parametrize("bad", ["optim.lr=inf", "optim.lr=1e400", "optim.head_lr=inf", "optim.max_grad_norm=-1",
                                 "optim.max_grad_norm=nan"])
def test_non_finite_lr_and_bad_max_grad_norm_are_refused(tmp_path, bad):
    """An infinite lr turned the first Adam step into inf / NaN weights; a negative max_grad_norm made torch scale
    every gradient by max_norm / norm < 0, i.e. gradient ascent, silently; NaN made every gradient NaN."""
    from rewardkit.train.trainer import _validate

    with pytest.raises(ValueError, match="lr|max_grad_norm"):
        _validate(_pref().tiny_cfg(tmp_path, bad))
    for ok in ("optim.max_grad_norm=0", "optim.max_grad_norm=null", "optim.max_grad_norm=inf", "optim.head_lr=0"):
        _validate(_pref().tiny_cfg(tmp_path, ok))
