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
def test_bench_revision_reaches_the_hub_loader_and_the_record(tmp_path, tiny_clip_dir, monkeypatch, capsys):
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
    # with local data only, a revision would be silently meaningless: a usage error before any model loads
    calls.clear()
    assert main(["bench", "--reward", "clipscore", "--model", str(tmp_path / "unused"), "--benchmark", "mmrb2/t2i",
                 "--data-dir", str(tmp_path / "data"), "--no-cache", "--revision", "0123abc"]) == 2
    assert "--revision" in capsys.readouterr().err and calls == []
    # the Python API refuses it too (it used to ignore the revision silently)
    from rewardkit import load_reward
    from rewardkit.bench.harness import evaluate

    with pytest.raises(ValueError, match="revision"):
        evaluate(load_reward("clipscore", model=str(tiny_clip_dir), device="cpu"), ["mmrb2/t2i"],
                 data_dir=tmp_path / "data", revision="0123abc", cache_dir=None)
    assert calls == []


# ============================================================================================== docs/integrations.md
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from rewardkit.reward import Reward, RewardBatch, RewardOutput  # noqa: E402

PROMPTS6 = ("a photo of a cat", "a red car", "two birds", "a bowl of soup", "a neon sign", "a dog")


def _red(im) -> float:
    return float(np.asarray(im)[..., 0].astype(np.float64).mean()) / 255.0


class Probe(Reward):
    """Red-channel mean of the image minus that of its first source (NaN + reason for dark images); records
    what each call received (texts, metadata, sources, batch size)."""

    name = "test-probe"
    tasks = frozenset({"t2i", "edit"})
    thread_safe = True

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []

    def _score(self, batch: RewardBatch) -> RewardOutput:
        self.calls.append({"n": len(batch), "prompts": list(batch.prompts), "metadata": [dict(m) for m in batch.metadata],
                           "sources": batch.sources})
        vals, errs = [], []
        for i, im in enumerate(batch.images):
            dark = float(np.asarray(im).mean()) < 40
            v = _red(im) - (_red(batch.sources[i][0]) if batch.sources and batch.sources[i] else 0.0)
            vals.append(float("nan") if dark else v)
            errs.append("too dark to score" if dark else None)
        return RewardOutput(scores=torch.tensor(vals, dtype=torch.float64).float(), errors=errs)


def solid(red: int, size: int = 16) -> Image.Image:
    return Image.new("RGB", (size, size), (red, 120, 90))


def float_batch(n=6, size=24, dark=(1, 4)) -> torch.Tensor:
    x = torch.stack([torch.full((3, size, size), (60 + 25 * i) / 255) for i in range(n)])  # exact in 8 bits
    for i in dark:
        x[i] = 0.01
    return x


def _trl_call(fn, prompts, completions, **columns):
    """The keywords of TRL 1.16's GRPOTrainer._calculate_rewards."""
    logged = {}
    out = fn(prompts=prompts, completions=completions, completion_ids=[[1]] * len(completions), trainer_state=None,
             log_extra=lambda c, v: None, log_metric=lambda k, v: logged.__setitem__(k, v), **columns)
    return out, logged


def test_nan_error_is_a_value_error_with_indices_and_reasons():
    """integrations.md: NonFiniteRewardError (a ValueError) lists each invalid sample's index and reason."""
    from rewardkit.integrations import NonFiniteRewardError, multi_score

    with pytest.raises(NonFiniteRewardError) as ei:
        multi_score("cpu", {"p": 1.0}, rewards={"p": Probe()})(float_batch(), PROMPTS6, None)
    assert isinstance(ei.value, ValueError)
    assert ei.value.indices == [1, 4] and ei.value.reasons == ["too dark to score"] * 2
    assert "sample 1: too dark to score" in str(ei.value) and "sample 4" in str(ei.value)


def test_fill_policy_values_and_reports_per_host():
    """integrations.md: `fill` puts fill_value at each invalid sample; the report is
    {valid_fraction, n_invalid, invalid: {index: reason}} in flow_grpo's info[name] and DDPO's metadata; flow_grpo's
    "avg" sums the filled values."""
    from rewardkit.integrations import ddpo_reward_fn, multi_score

    x = float_batch()
    red = x[:, 0, 0, 0].double()
    expected = [-2.0 if i in (1, 4) else float(red[i]) for i in range(6)]
    report = {"valid_fraction": 4 / 6, "n_invalid": 2, "invalid": {1: "too dark to score", 4: "too dark to score"}}
    details, info = multi_score("cpu", {"p": 0.5, "q": 2.0}, rewards={"p": Probe(), "q": Probe()}, nan_policy="fill",
                                fill_value=-2.0)(x, PROMPTS6, None)
    np.testing.assert_allclose(details["p"], expected, atol=1e-6)
    np.testing.assert_allclose(details["avg"], [2.5 * v for v in expected], atol=1e-5)
    assert info == {"p": report, "q": report}
    rewards, meta = ddpo_reward_fn(Probe(), nan_policy="fill", fill_value=-2.0)(x, PROMPTS6, None)
    assert rewards.dtype == torch.float32
    np.testing.assert_allclose(rewards.numpy(), expected, atol=1e-6)
    assert meta == report


def test_mask_policy_is_trl_only():
    from rewardkit.integrations import ddpo_reward_fn, flow_grpo_scorer, multi_score, verl_compute_score

    for make in (lambda: multi_score("cpu", {"p": 1.0}, rewards={"p": Probe()}, nan_policy="mask"),
                 lambda: flow_grpo_scorer(Probe(), nan_policy="mask"),
                 lambda: verl_compute_score(Probe(), nan_policy="mask"),
                 lambda: ddpo_reward_fn(Probe(), nan_policy="mask")):
        with pytest.raises(ValueError, match="cannot mask"):
            make()


def test_multi_score_builds_named_rewards_with_reward_kwargs(tiny_clip_dir):
    """integrations.md: multi_score(device, {name: weight}, reward_kwargs={name: {...}}) builds each reward by name
    with its options; "avg" = sum of w * s."""
    from rewardkit import load_reward
    from rewardkit.integrations import multi_score

    x = float_batch(dark=())
    fn = multi_score(torch.device("cpu"), {"pickscore": 1.0, "clipscore": 0.5},
                     reward_kwargs={"pickscore": {"model": str(tiny_clip_dir)},
                                    "clipscore": {"model": str(tiny_clip_dir), "convention": "cosine"}},
                     conventions="rewardkit")   # rewardkit's own scales (flow_grpo's: test_integrations_flow_grpo.py)
    details, _ = fn(x, PROMPTS6, tuple({} for _ in PROMPTS6), only_strict=True)
    p = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")(x, list(PROMPTS6)).scores.numpy()
    c = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")(x, list(PROMPTS6)).scores.numpy()
    np.testing.assert_array_equal(details["pickscore"], p)
    np.testing.assert_array_equal(details["clipscore"], c)
    np.testing.assert_allclose(details["avg"], p + 0.5 * c, rtol=1e-6)
    with pytest.raises(ValueError, match="score_dict does not weight"):
        multi_score("cpu", {"pickscore": 1.0}, reward_kwargs={"clipscore": {}})
    with pytest.raises(ValueError, match="avg"):
        multi_score("cpu", {"avg": 1.0})


def test_trl_text_callable_image_index_and_metadata_columns():
    """integrations.md: text=callable(prompt, completion); the `images` column with image_index picks the image;
    metadata_columns pass the named columns (only those) as per-sample metadata."""
    from rewardkit.integrations import trl_reward_func

    probe = Probe()
    fn = trl_reward_func(probe, text=lambda p, c: f"{p}|{c}", image_index=1, metadata_columns=["intent"])
    images = [[solid(60 + 10 * i), solid(200 - 10 * i)] for i in range(3)]
    out, logged = _trl_call(fn, ["p0", "p1", "p2"], ["c0", "c1", "c2"], images=images,
                            intent=["a", "b", "c"], other=[1, 2, 3])
    assert out == pytest.approx([(200 - 10 * i) / 255 for i in range(3)], abs=1e-6)   # the second image of each row
    assert probe.calls[-1]["prompts"] == ["p0|c0", "p1|c1", "p2|c2"]
    assert probe.calls[-1]["metadata"] == [{"intent": "a"}, {"intent": "b"}, {"intent": "c"}]
    assert logged == {"rewardkit/test_probe/valid_fraction": 1.0}   # __name__: the registry name, a valid identifier
    with pytest.raises(ValueError, match="intent"):
        _trl_call(fn, ["p0"], ["c0"], images=[[solid(1), solid(2)]])
    first = trl_reward_func(Probe())          # image_index defaults to 0
    assert _trl_call(first, ["p"] * 3, ["c"] * 3, images=images)[0] == pytest.approx(
        [(60 + 10 * i) / 255 for i in range(3)], abs=1e-6)


def test_verl_prompt_lookup_sources_layouts_and_no_micro_batching():
    """integrations.md (verl): prompt from extra_info["prompt"], then ["raw_prompt"], then a string ground_truth;
    prompt_key= names another key or "ground_truth"; source_key= gives editing rewards their source; uint8 CHW,
    1xCxHxW, HxWxC arrays and PIL are one sample; micro_batch 0 or 1 scores every call alone."""
    from rewardkit.integrations import verl_compute_score

    probe = Probe()
    fn = verl_compute_score(probe)

    def prompt_of(**kw):
        fn(data_source="x", solution_image=solid(150), **kw)
        return probe.calls[-1]["prompts"][0]

    assert prompt_of(ground_truth="C", extra_info={"prompt": "A", "raw_prompt": "B"}) == "A"
    assert prompt_of(ground_truth="C", extra_info={"raw_prompt": "B"}) == "B"
    assert prompt_of(ground_truth="C", extra_info={}) == "C"
    assert prompt_of(ground_truth="C", extra_info=None) == "C"
    with pytest.raises(ValueError, match="no prompt"):
        fn(data_source="x", solution_image=solid(150), ground_truth={"answer": 1}, extra_info={})
    by_key = verl_compute_score(probe, prompt_key="caption")
    by_key(solution_image=solid(150), ground_truth="C", extra_info={"caption": "D", "prompt": "A"})
    assert probe.calls[-1]["prompts"] == ["D"]
    by_gt = verl_compute_score(probe, prompt_key="ground_truth")
    by_gt(solution_image=solid(150), ground_truth="C", extra_info={"prompt": "A"})
    assert probe.calls[-1]["prompts"] == ["C"]
    # editing: the source image from extra_info[source_key]
    edit = verl_compute_score(probe, source_key="src")
    g = edit(solution_image=solid(200), ground_truth="make it red", extra_info={"src": solid(50)})
    assert g == {"score": pytest.approx((200 - 50) / 255, abs=1e-6), "valid": 1.0}
    assert len(probe.calls[-1]["sources"][0]) == 1
    with pytest.raises(ValueError, match="src"):
        edit(solution_image=solid(200), ground_truth="p", extra_info={})
    # layouts: one sample each, the same score
    pil = solid(170)
    hwc = np.array(pil)
    chw = torch.from_numpy(hwc).permute(2, 0, 1).contiguous()
    scores = [fn(solution_image=im, ground_truth="p", extra_info={})["score"] for im in (pil, hwc, chw, chw[None])]
    assert scores == [pytest.approx(170 / 255, abs=1e-6)] * 4
    # micro_batch 0 / 1: every call scored alone, even from many threads
    from concurrent.futures import ThreadPoolExecutor

    for mb in (0, 1):
        p = Probe()
        f = verl_compute_score(p, micro_batch=mb)
        with ThreadPoolExecutor(4) as ex:
            res = list(ex.map(lambda i: f(solution_image=solid(100 + i), ground_truth="p", extra_info={}), range(8)))
        assert [c["n"] for c in p.calls] == [1] * 8 and all(set(r) == {"score", "valid"} for r in res)
    for bad in ({"micro_batch": -1}, {"max_wait_s": -0.1}, {"max_wait_s": 11.0}, {"max_wait_s": float("nan")}):
        with pytest.raises(ValueError, match="micro_batch|max_wait_s"):
            verl_compute_score(Probe(), **bad)


class _GradProbe(Reward):
    """Differentiable stand-in: score_tensor = mean pixel value, NaN for dark images (a model that returns a
    non-finite score on valid input)."""

    name = "test-grad-probe"
    differentiable = True

    def _score(self, batch):
        return RewardOutput(scores=torch.zeros(len(batch)))

    def score_tensor(self, images, prompt=None, *, batch_size=None):
        m = images.float().mean(dim=(1, 2, 3))
        return torch.where(m < 0.05, torch.full_like(m, float("nan")), m)


def test_alignprop_refuses_bad_pixels_and_applies_the_nan_policy_to_scores(tiny_clip_dir):
    """integrations.md (AlignProp): an input the reward cannot score raises (RewardInputError); a non-finite score
    follows the NaN policy (raise, or fill keeping the other samples' graph)."""
    from rewardkit import load_reward
    from rewardkit.errors import RewardInputError
    from rewardkit.integrations import NonFiniteRewardError, ddpo_reward_fn

    pick = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")
    bad = float_batch(n=2, dark=())
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(RewardInputError):
        ddpo_reward_fn(pick, alignprop=True)(bad, PROMPTS6[:2], None)
    x = float_batch(n=3, dark=(1,)).requires_grad_(True)
    with pytest.raises(NonFiniteRewardError):
        ddpo_reward_fn(_GradProbe(), alignprop=True)(x, PROMPTS6[:3], None)
    rewards, meta = ddpo_reward_fn(_GradProbe(), alignprop=True, nan_policy="fill", fill_value=-1.0)(x, PROMPTS6[:3], None)
    assert rewards[1].item() == -1.0 and meta["n_invalid"] == 1 and meta["invalid"] == {1: "non-finite score"}
    rewards.sum().backward()
    assert x.grad[0].abs().sum() > 0 and x.grad[1].abs().sum() == 0 and torch.isfinite(x.grad).all()


def test_composites_none_normalisation_and_gather_combine_without_a_process_group():
    """integrations.md: normalize="none" composites are accepted by every adapter; without a process group
    gather_combine(comp, axes) is comp.combine(axes), equal to one call over the batch (and group_keys groups)."""
    from rewardkit import distributed
    from rewardkit.compose import Composite
    from rewardkit.integrations import flow_grpo_scorer

    imgs = [solid(60 + 20 * i) for i in range(6)]
    raw = Composite(axes=[{"name": "a", "weight": 2.0}], rewards={"a": Probe()}, normalize="none")
    scores, _ = flow_grpo_scorer(raw)(imgs, PROMPTS6, None)
    np.testing.assert_allclose(scores, [2 * (60 + 20 * i) / 255 for i in range(6)], rtol=1e-5)

    comp = Composite(axes=[{"name": "a"}], rewards={"a": Probe()}, normalize="batch")
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    axes = comp.axis_scores(imgs, list(PROMPTS6))
    whole = comp(imgs, list(PROMPTS6)).scores
    for out in (distributed.gather_combine(comp, axes), distributed.gather_combine(comp, axes, local=True),
                comp.combine(axes)):
        torch.testing.assert_close(out.scores, whole)
    v = torch.tensor([(60 + 20 * i) / 255 for i in range(6)], dtype=torch.float64)
    torch.testing.assert_close(whole.double(), (v - v.mean()) / (v.std(unbiased=False) + 1e-4), atol=1e-5, rtol=0)
    grp = Composite(axes=[{"name": "a"}], rewards={"a": Probe()}, normalize="group")
    ids = [0, 0, 0, 1, 1, 1]
    g = distributed.gather_combine(grp, grp.axis_scores(imgs, list(PROMPTS6)), group_keys=ids).scores.double()
    for k in (0, 1):
        part = v[3 * k:3 * k + 3]
        torch.testing.assert_close(g[3 * k:3 * k + 3], (part - part.mean()) / (part.std(unbiased=False) + 1e-4),
                                   atol=1e-5, rtol=0)


# ============================================================================================== docs/rl.md
def test_rl_defaults_and_presets_are_the_documented_ones():
    """docs/rl.md "Defaults (DiffusionNFT's official code) and presets" and the E²PO knob table, row by row."""
    from rewardkit.config import build_config
    from rewardkit.rl.config import PRESETS, NFTConfig, preset

    c = NFTConfig()
    m, s, t, lo = c.model, c.sample, c.train, c.lora
    assert "stable-diffusion-3.5-medium" in m.pretrained and m.max_sequence_length == 128
    assert (s.num_steps, s.solver, s.resolution, s.group_size, s.num_groups) == (10, "dpm2", 512, 24, 48)
    assert (s.batch_size, t.batch_size, s.eval_num_steps, s.eval_solver) == (9, 9, 40, "euler")
    assert (lo.r, lo.alpha, lo.init) == (32, 64.0, "gaussian")
    assert len(lo.target_modules) == 8 and all(x.startswith("attn.") for x in lo.target_modules)
    assert c.mixed_precision == "fp16" and c.seed == 42 and c.invalid_rewards == "drop" and c.resume == "auto"
    assert (t.lr, t.adam_beta1, t.adam_beta2, t.weight_decay, t.adam_eps) == (3e-4, 0.9, 0.999, 1e-4, 1e-8)
    assert (t.beta, t.kl_coef, t.adv_clip_max, t.timestep_fraction) == (1.0, 1e-4, 5.0, 0.99)
    assert (t.decay_type, t.ema, t.ema_decay, t.max_grad_norm, t.steps_per_epoch) == ("linear_to_0_5", True, 0.9, 1.0, 1)
    e = c.e2po
    assert (e.enabled, e.num_variants, e.steps, e.lr, e.weight_decay, e.sigma_init, e.delta_max) == \
        (False, 12, 300, 1e-3, 0.01, 1e-4, 0.05)
    assert (e.lambda_div, e.mu, e.eps, e.rho, e.encoders, e.truncate_after_eos, e.warn_band) == \
        (50.0, 0.80, 0.01, 0.4, ["clip_l"], True, 0.1)
    assert set(PRESETS) == {"geneval", "pickscore", "hpsv2", "ocr", "multi_reward", "e2po_geneval_k12",
                            "e2po_geneval_k4", "e2po_pickscore_k3"}
    built = {name: build_config(NFTConfig, preset(name)) for name in PRESETS}
    assert {n: b.train.beta for n, b in built.items() if b.train.beta != 1.0} == {"ocr": 0.1, "multi_reward": 0.1}
    assert {n: b.train.decay_type for n, b in built.items() if b.train.decay_type != "linear_to_0_5"} == \
        {"ocr": "delayed_linear_to_0_999"}
    e2po = {n: (b.e2po.enabled, b.e2po.num_variants, b.e2po.lambda_div, b.sample.group_size % b.e2po.num_variants)
            for n, b in built.items() if b.e2po.enabled}
    assert e2po == {"e2po_geneval_k12": (True, 12, 50.0, 0), "e2po_geneval_k4": (True, 4, 100.0, 0),
                    "e2po_pickscore_k3": (True, 3, 50.0, 0)}
    assert set(built["multi_reward"].rewards) == {"pickscore", "hpsv2", "clipscore"}


def test_rl_start_checks_fail_before_any_model_loads(tmp_path):
    """docs/rl.md: a preset naming a reward rewardkit does not register fails at start with the list of known
    rewards; num_groups x group_size must be a multiple of processes x sample.batch_size. (The pipeline path does
    not exist: reaching it would be a different error.)"""
    from rewardkit.config import build_config
    from rewardkit.registry import RegistryError
    from rewardkit.rl.config import NFTConfig, preset
    from rewardkit.rl.trainer import NFTTrainer

    small = {"model": {"pretrained": str(tmp_path / "no-such-pipeline")}, "cpu": True, "output_dir": str(tmp_path / "o"),
             "sample": {"batch_size": 4, "num_groups": 2, "group_size": 4}, "train": {"batch_size": 4}}
    from rewardkit.config import _merge

    with pytest.raises(RegistryError, match=r"'geneval'.*Known rewards: .*pickscore"):
        NFTTrainer(build_config(NFTConfig, _merge(preset("geneval"), small)))
    with pytest.raises(ValueError, match="hpsv2 needs model=.*rewardkit convert hpsv2"):  # registered; no weights
        NFTTrainer(build_config(NFTConfig, _merge(preset("hpsv2"), small)))
    odd = _merge(small, {"sample": {"batch_size": 3}})
    with pytest.raises(ValueError, match="multiple of processes"):
        NFTTrainer(build_config(NFTConfig, odd))


@pytest.fixture(scope="module")
def rl_tiny_dirs(tmp_path_factory, tiny_clip_dir):
    pytest.importorskip("diffusers")
    from rewardkit.testing import save_tiny_checkpoint

    return {"sd3": str(save_tiny_checkpoint("sd3", tmp_path_factory.mktemp("rl_sd3"))), "clip": str(tiny_clip_dir)}


def _rl_cfg(out, dirs, **over):
    from rewardkit.config import _merge, build_config
    from rewardkit.rl.config import NFTConfig

    base = {"output_dir": str(out), "seed": 3, "cpu": True, "mixed_precision": "no", "progress": False,
            "resume": "never", "num_epochs": 1, "reward_workers": 1, "save_every": 1, "eval_every": 0,
            "model": {"pretrained": dirs["sd3"], "max_sequence_length": 8}, "lora": {"r": 4, "alpha": 8},
            "sample": {"num_steps": 2, "resolution": 32, "batch_size": 4, "num_groups": 2, "group_size": 2},
            "train": {"batch_size": 4, "lr": 1e-3, "ema": False},
            "rewards": {"pickscore": 1.0}, "reward_kwargs": {"pickscore": {"model": dirs["clip"], "device": "cpu"}}}
    return build_config(NFTConfig, _merge(base, over))


@pytest.mark.slow
def test_rl_resume_auto_continues_and_never_starts_over(tmp_path, rl_tiny_dirs):
    """docs/rl.md: running the same command again resumes from checkpoints/latest (metrics before it kept);
    `resume=never` starts over; `resume=<dir>` names a checkpoint, which must exist."""
    from rewardkit.rl.trainer import NFTTrainer

    def epochs():
        return [json.loads(x).get("epoch") if "final" not in x else "final"
                for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def run(**over):
            """Train; return (summary, the epochs this run computed itself)."""
            tr = NFTTrainer(_rl_cfg(tmp_path, rl_tiny_dirs, **over))
            ran, real = [], tr.run_epoch
            tr.run_epoch = lambda: (ran.append(tr.epoch + 1), real())[1]
            out = tr.train()
            return (out["epoch"], out["global_step"], ran)

        assert run(num_epochs=1) == (1, 1, [1]) and epochs() == [1, "final"]
        assert run(num_epochs=2, resume="auto") == (2, 2, [2]) and epochs() == [1, 2, "final"]  # epoch 1 not redone
        ckpt = tmp_path / "checkpoints" / "epoch-000001"
        assert ckpt.is_dir()
        assert run(num_epochs=1, resume="never") == (1, 1, [1]) and epochs() == [1, "final"]
        assert run(num_epochs=2, resume=str(ckpt)) == (2, 2, [2])
        with pytest.raises(FileNotFoundError, match="resume checkpoint not found"):
            NFTTrainer(_rl_cfg(tmp_path, rl_tiny_dirs, resume=str(tmp_path / "nope"))).train()
    finally:
        torch.set_num_threads(n_threads)


def test_rl_fp16_epoch_autocast_fp32_vae_adamw_clipping_and_logged_keys(tmp_path, rl_tiny_dirs):
    """docs/rl.md: fp16 = autocast (the transformer's matmuls run in fp16) + GradScaler with fp32 master weights and
    an fp32 VAE; AdamW with the configured betas / weight decay / eps; gradients clipped to train.max_grad_norm
    before the step (grad_norm logs the norm before clipping); the epoch record has the documented keys."""
    from rewardkit.rl.trainer import NFTTrainer

    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest
    try:
        cfg = _rl_cfg(tmp_path, rl_tiny_dirs, mixed_precision="fp16", save_every=0, train={"max_grad_norm": 1e-4})
        tr = NFTTrainer(cfg)
        seen = {"transformer": set(), "vae": set()}
        lin = next(mod for n, mod in tr.policy.transformer.named_modules()
                   if isinstance(mod, torch.nn.Linear) and n.endswith("to_q.base_layer"))
        lin.register_forward_hook(lambda mod, i, o: seen["transformer"].add(o.dtype))
        tr.policy.vae.decoder.register_forward_hook(lambda mod, i, o: seen["vae"].add(o.dtype))
        norms = []

        def at_step(opt, args, kwargs):
            g = [p.grad.double().norm() for grp in opt.param_groups for p in grp["params"] if p.grad is not None]
            norms.append(float(torch.stack(g).norm()))

        tr.opt.register_step_pre_hook(at_step)
        group = tr.opt.param_groups[0]
        assert type(tr.opt) is torch.optim.AdamW
        assert (group["lr"], group["betas"], group["weight_decay"], group["eps"]) == (1e-3, (0.9, 0.999), 1e-4, 1e-8)
        rec = tr.run_epoch()
    finally:
        torch.set_num_threads(n_threads)
    assert seen == {"transformer": {torch.float16}, "vae": {torch.float32}}
    assert all(p.dtype == torch.float32 for p in tr.trainable)
    assert tr.scaler.is_enabled() and rec["grad_scale"] == tr.scaler.get_scale()
    assert len(norms) == 1 and norms[0] == pytest.approx(1e-4, rel=1e-3)   # clipped to max_grad_norm
    assert rec["grad_norm"] > 1e-3                                        # the norm before clipping
    documented = {"reward/pickscore/mean", "reward/pickscore/std", "zero_std_group_ratio", "invalid_rewards", "r/mean",
                  "r/hist", "total_loss", "policy_loss", "unweighted_policy_loss", "kl_div", "old_kl_div",
                  "old_deviate", "old_deviate_max", "x0_norm", "x0_norm_max", "policy_loss_plain_mse",
                  "reward/total/max", "reward/total/min", "grad_norm", "grad_scale", "old_decay", "time/e2po_s", "time/sample_s", "time/train_s"}
    assert documented <= set(rec), sorted(documented - set(rec))
    assert rec["old_decay"] == pytest.approx(min(0.001 * 1, 0.5))         # d = min(0.001 step, 0.5) after step 1


# ============================================================================================== docs/tensors-and-gradients.md
@pytest.fixture(scope="module")
def cos_clip(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")


def _pixels(b=4, h=40, w=48, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.25 + 0.5 * torch.rand(b, 3, h, w, generator=g)


def test_processor_settings_the_torch_path_cannot_follow_keep_the_processor_path(tiny_clip_dir, tmp_path, monkeypatch):
    """tensors-and-gradients.md: resampling other than bicubic / bilinear, padding or no rescaling keep a reward on
    the processor path (supports_tensor_input False, float tensors go through PIL); so do numpy arrays and paths."""
    import shutil

    from rewardkit import load_reward, media

    calls = {"pil": 0}
    real = media._to_pil
    monkeypatch.setattr(media, "_to_pil", lambda v: (calls.__setitem__("pil", calls["pil"] + 1), real(v))[1])
    x = _pixels(b=2)
    auto = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")
    assert auto.supports_tensor_input
    auto(x, "a cat")
    assert calls["pil"] == 0
    auto(x.permute(0, 2, 3, 1).numpy(), "a cat")  # a float numpy batch: the processor path
    assert calls["pil"] == 2
    for i, im in enumerate(x):
        media.to_pil(im).save(tmp_path / f"{i}.png")
    auto([str(tmp_path / "0.png"), str(tmp_path / "1.png")], "a cat")
    assert calls["pil"] >= 4
    for change in ({"resample": 0}, {"do_rescale": False}, {"do_pad": True}):
        d = tmp_path / ("clip-" + "-".join(change))
        shutil.copytree(tiny_clip_dir, d)
        cfg_file = d / "processor_config.json"  # transformers 5: the image processor's settings live here
        cfg = json.loads(cfg_file.read_text())
        cfg["image_processor"].update(change)
        cfg_file.write_text(json.dumps(cfg))
        r = load_reward("clipscore", model=str(d), convention="cosine", device="cpu")
        assert not r.supports_tensor_input, change
        before = calls["pil"]
        r(x, "a cat")
        assert calls["pil"] == before + 2, change


def test_score_tensor_under_no_grad_and_its_refusals(cos_clip):
    """tensors-and-gradients.md: score_tensor turns autograd on inside (works under an outer no_grad), returns
    float32 [B] on the input's device for any float dtype, takes one prompt or B, and refuses NaN / Inf, values
    outside [0, 1], and a wrong shape, naming the sample."""
    from rewardkit.errors import RewardInputError

    x = _pixels(b=2).requires_grad_(True)
    with torch.no_grad():
        s = cos_clip.score_tensor(x, "a cat")
    assert s.requires_grad and s.dtype == torch.float32 and s.shape == (2,) and s.device == x.device
    s.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    torch.testing.assert_close(cos_clip.score_tensor(x.detach().double(), ["a cat", "a cat"]).detach(), s.detach(),
                               atol=1e-5, rtol=0)
    edge = _pixels(b=2)
    edge[0, 0, 0, 0], edge[1, 2, 5, 5] = 1.0 + 5e-4, -5e-4           # within the 1e-3 tolerance: clamped
    torch.testing.assert_close(cos_clip.score_tensor(edge, "a cat").detach(),
                               cos_clip.score_tensor(edge.clamp(0, 1), "a cat").detach(), atol=0, rtol=0)
    for value, index in ((float("inf"), 1), (1.5, 0), (-0.2, 1), (1.002, 0), (-0.002, 1)):
        bad = _pixels(b=2)
        bad[index, 1, 2, 3] = value
        with pytest.raises(RewardInputError) as ei:
            cos_clip.score_tensor(bad, "a cat")
        assert ei.value.index == index
    for shape in ((2, 4, 32, 32), (3, 32, 32), (2, 1, 32, 32)):
        with pytest.raises(RewardInputError):
            cos_clip.score_tensor(torch.rand(shape), "a cat")
    with pytest.raises((RewardInputError, ValueError)):
        cos_clip.score_tensor(_pixels(b=2), ["one prompt for two images"])


def test_hessel_clipscore_has_zero_gradient_where_the_cosine_is_negative(tiny_clip_dir, cos_clip):
    """tensors-and-gradients.md: the default Hessel convention 2.5 max(cos, 0) gives no gradient where cos < 0;
    the cosine convention does."""
    from rewardkit import load_reward

    hessel = load_reward("clipscore", model=str(tiny_clip_dir), device="cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(8, 3, 32, 32, generator=g), torch.rand(8, 3, 1, 1, generator=g).expand(8, 3, 32, 32)])
    pairs = [(i, p) for p in ("a red car on a road", "zzz qqq", "blue") for i in range(16)]
    cos = cos_clip.score_tensor(x[[i for i, _ in pairs]], [p for _, p in pairs]).detach()
    assert (cos < 0).any() and (cos > 0).any()
    neg, pos = pairs[int(torch.nonzero(cos < 0)[0])], pairs[int(torch.nonzero(cos > 0)[0])]
    xi = x[[neg[0], pos[0]]].clone().requires_grad_(True)
    pr = [neg[1], pos[1]]
    h = hessel.score_tensor(xi, pr)
    c2 = cos_clip.score_tensor(xi.detach(), pr)
    assert c2[0] < 0 < c2[1]
    torch.testing.assert_close(h.detach(), 2.5 * c2.clamp_min(0), atol=1e-5, rtol=0)
    h.sum().backward()
    assert xi.grad[0].abs().sum() == 0 and xi.grad[1].abs().sum() > 0
    xc = x[[neg[0]]].clone().requires_grad_(True)
    cos_clip.score_tensor(xc, pr[:1]).sum().backward()
    assert xc.grad.abs().sum() > 0


def test_preference_calibration_normalises_differentiably(tmp_path):
    """tensors-and-gradients.md: a preference model with a calibration normalises inside score_tensor:
    "calibration" is (raw - mean) / std (gradient = raw gradient / std), "quantile" the piecewise-linear CDF."""
    from rewardkit import load_reward
    from rewardkit.calibration import calibration_stats
    from rewardkit.models.preference import PreferenceModel
    from rewardkit.rewards.preference import PreferenceReward

    raw_reward = PreferenceReward.tiny(str(tmp_path))
    d = tmp_path / "tiny-preference"
    x = _pixels(b=3, h=32, w=32, seed=2)
    raw = raw_reward(x, "a cat").scores
    stats = calibration_stats(torch.cat([raw, raw + 0.3, raw - 0.2, raw * 1.5]))
    PreferenceModel.save_calibration(raw_reward.model, d, stats)
    xg = x.clone().requires_grad_(True)
    raw_reward.score_tensor(xg, "a cat").sum().backward()
    raw_grad = xg.grad.clone()

    cal = load_reward("preference", model=str(d), normalize="calibration", device="cpu")
    xc = x.clone().requires_grad_(True)
    z = cal.score_tensor(xc, "a cat")
    torch.testing.assert_close(z.detach(), ((raw.double() - stats["mean"]) / stats["std"]).float(), atol=1e-4, rtol=0)
    z.sum().backward()
    torch.testing.assert_close(xc.grad, raw_grad / stats["std"], atol=1e-6, rtol=1e-3)

    qr = load_reward("preference", model=str(d), normalize="quantile", device="cpu")
    qs = sorted((float(k), v) for k, v in stats["quantiles"].items())
    ref = torch.tensor([float(np.interp(float(r), [v for _, v in qs], [q for q, _ in qs])) for r in raw])
    xq = x.clone().requires_grad_(True)
    q = qr.score_tensor(xq, "a cat")
    torch.testing.assert_close(q.detach(), ref.float(), atol=1e-4, rtol=0)
    q.sum().backward()
    assert torch.isfinite(xq.grad).all() and xq.grad.abs().sum() > 0


def test_qwen_tensor_path_retires_itself_when_the_first_check_differs(tmp_path, monkeypatch):
    """tensors-and-gradients.md: on its first call the Qwen-VL tensor path checks its token ids, masks and grid
    against the processor; any difference retires it for that model and the processor path is used instead."""
    from rewardkit import load_reward, media, preprocess
    from rewardkit.rewards.preference import PreferenceReward

    PreferenceReward.tiny(str(tmp_path))
    d = str(tmp_path / "tiny-preference")
    proc = load_reward("preference", model=d, preprocess="processor", device="cpu")
    auto = load_reward("preference", model=d, device="cpu")
    assert auto.supports_tensor_input
    real = preprocess.qwen_pixel_values

    def off_by_one_grid(images, params):
        pv, grid = real(images, params)
        return pv, grid + torch.tensor([0, 0, 2])     # a torch path that disagrees with the processor

    monkeypatch.setattr(preprocess, "qwen_pixel_values", off_by_one_grid)
    x = _pixels(b=2, h=32, w=32, seed=4)
    ref = proc(x, "a cat").scores
    n_pil = {"n": 0}
    to_pil = media.to_pil
    monkeypatch.setattr(media, "to_pil", lambda v: (n_pil.__setitem__("n", n_pil["n"] + 1), to_pil(v))[1])
    torch.testing.assert_close(auto(x, "a cat").scores, ref, atol=1e-5, rtol=0)   # answered by the processor path
    assert auto.model._encoder._tensor_ok is False and not auto.supports_tensor_input
    assert n_pil["n"] >= 2


def test_rl_reward_scorer_weighted_sum_components_dimensions_and_nan(tmp_path, monkeypatch):
    """docs/rl.md "Rewards": each reward gets the decoded float NCHW images in [0, 1] and the prompts with
    on_error="nan"; the training reward is sum(weight * score); each component and each reward dimension is
    kept for the logs; a sample missing any component has no total (NaN) and its reason."""
    from rewardkit import registry
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.trainer import _RewardScorer

    class Fake(Reward):
        name = "fake"

        def __init__(self, offset):
            super().__init__()
            self.offset, self.seen = offset, []

        def __call__(self, images, prompts, **kw):
            self.seen.append((images, list(prompts), kw))
            v = images.mean(dim=(1, 2, 3)).double() + self.offset
            bad = images.mean(dim=(1, 2, 3)) < 0.05
            return RewardOutput(scores=torch.where(bad, float("nan"), v).float(),
                                errors=["too dark" if b else None for b in bad.tolist()],
                                dimensions={"half": (v / 2).float()})

        def _score(self, batch):  # unused: __call__ is overridden to see the call's arguments
            raise AssertionError

    fakes = {"ra": Fake(1.0), "rb": Fake(-3.0)}
    monkeypatch.setattr(registry, "resolve_name", lambda n: n)
    monkeypatch.setattr(registry, "load_reward", lambda name, **kw: fakes[name])
    cfg = NFTConfig(rewards={"ra": 2.0, "rb": -0.5})
    scorer = _RewardScorer(cfg, tmp_path, None)
    x = torch.stack([torch.full((3, 8, 8), v) for v in (0.2, 0.01, 0.7)])
    out = scorer(x, ["p0", "p1", "p2"])
    for f in fakes.values():
        images, prompts, kw = f.seen[-1]
        assert images is x and prompts == ["p0", "p1", "p2"] and kw.get("on_error") == "nan"
    m = torch.tensor([0.2, 0.01, 0.7], dtype=torch.float64)
    expected = 2.0 * (m + 1.0) - 0.5 * (m - 3.0)
    assert torch.allclose(out["total"][[0, 2]], expected[[0, 2]], atol=1e-6) and torch.isnan(out["total"][1])
    assert set(out["components"]) == {"ra", "rb"} and set(out["dimensions"]) == {"ra.half", "rb.half"}
    assert torch.allclose(out["components"]["ra"][[0, 2]], (m + 1.0)[[0, 2]], atol=1e-6)
    assert out["errors"] == [None, "ra: too dark", None]


# dropin's options (CFG, DDIM, integer timestep, init_lora): in the table by their real names; on a branch
# without them yet they are the only names allowed to be missing (empty this set once both branches are merged)
_OPTIONS_FROM_OTHER_BRANCHES: set[str] = set()


def test_rl_side_by_side_table_names_real_options():
    """docs/rl.md "Side by side with the official script": every option the "ours" column names is a field of
    NFTConfig (dotted paths into its sections), and every NFTConfig field appears somewhere in docs/rl.md."""
    import dataclasses
    import re

    from rewardkit.rl.config import NFTConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "rl.md").read_text(encoding="utf-8")
    section = text.split("### Side by side with the official script", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| official")]
    assert len(rows) > 40

    def fields(cls, prefix=""):
        out = set()
        for f in dataclasses.fields(cls):
            out.add(prefix + f.name)
            sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(sub):
                out |= fields(type(sub), prefix + f.name + ".")
        return out

    known = fields(NFTConfig)
    sections = {k for k in known if "." not in k}
    named = set()
    for row in rows:
        ours = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))][2]
        for tok in re.findall(r"`([a-z0-9_.]+)`", ours):
            if "." in tok and tok.split(".")[0] not in sections:
                continue
            if tok.split(".")[0] in sections or tok in known:
                # "train.lr, adam_beta1, ..." names the section's fields after the first
                named.add(tok)
        lead = re.match(r"`(\w+)\.\w+`", ours)
        if lead:
            for tok in re.findall(r", `?(\w+)`?", ours.split(":")[0]):
                if tok and not tok[0].isdigit() and f"{lead.group(1)}.{tok}" in known:
                    named.add(f"{lead.group(1)}.{tok}")
    missing = {n for n in named if n not in known and not n.endswith(".*")} - _OPTIONS_FROM_OTHER_BRANCHES
    assert not missing, sorted(missing)
    assert {"rewards", "eval_prompts", "report_to", "save_every_steps", "train.kl_coef", "sample.group_size"} <= named
    leaves = known - {k for k in known if any(o.startswith(k + ".") for o in known)}
    undocumented = {k for k in leaves if not re.search(rf"`({re.escape(k)}|{re.escape(k.split('.')[-1])})[`:]", text)}
    assert not undocumented, sorted(undocumented)


def test_rl_report_to_checks_its_libraries_before_any_model(tmp_path, monkeypatch, capsys):
    """docs/rl.md "Experiment tracking": report_to=wandb without wandb installed fails at start with the pip
    command; report_to accepts a comma-separated word; [none] alone; unknown trackers are refused."""
    import sys

    from rewardkit.config import build_config, parse_overrides
    from rewardkit.rl.config import NFTConfig
    from rewardkit.rl.tracking import _wandb_mode, check_report_to

    cfg = build_config(NFTConfig, None, parse_overrides(["report_to=tensorboard,wandb"]))
    cfg.validate()
    assert cfg.report_to == ["tensorboard", "wandb"]
    for bad in (["mlflow"], ["none", "wandb"], None):  # (report_to: null was a TypeError, "internal error")
        with pytest.raises(ValueError, match="report_to"):
            NFTConfig(report_to=bad).validate()
    monkeypatch.setitem(sys.modules, "wandb", None)  # not importable
    from rewardkit.errors import MissingDependencyError

    # a MissingDependencyError (the CLI's exit 2) with wandb's own pip command; it was a plain ImportError, which
    # the CLI reports as "internal error ... please report it" (exit 1)
    with pytest.raises(MissingDependencyError, match="pip install wandb\n"):
        check_report_to(["wandb"])
    from rewardkit.cli import main

    assert main(["rl", "nft", f"output_dir={tmp_path / 'w'}", "report_to=null"]) == 2
    assert "report_to" in capsys.readouterr().err
    check_report_to(["none"])
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert _wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert _wandb_mode() == "disabled"
    with pytest.raises(ValueError, match="eval_num_prompts=4"):
        build_config(NFTConfig, {"eval_prompts": 4}).validate()  # the old meaning of eval_prompts
