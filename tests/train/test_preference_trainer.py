"""Bradley–Terry training on tiny Qwen-VL models: learning, parameter updates, data, kill-and-resume, 2-process DDP."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from rewardkit.config import load_config
from rewardkit.errors import ConfigError
from rewardkit.train.trainer import KILL_ENV, PreferenceTrainConfig, PreferenceTrainer, latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "arena_rm" / "tiny.yaml"


def tiny_cfg(out: Path, *overrides: str) -> PreferenceTrainConfig:
    return load_config(PreferenceTrainConfig, TINY, [f"output_dir={out}", "progress=false", *overrides])


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def pair_folder(tmp_path_factory) -> Path:
    """An "image folder" of pairs: PNG files + metadata.jsonl with relative paths, A / B / tie labels."""
    import numpy as np
    from PIL import Image

    d = tmp_path_factory.mktemp("pairs")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(16):
        tex = rng.uniform(0.3, 1.0, (32, 32, 3))
        Image.fromarray((tex * 250).astype("uint8")).save(d / f"{i}_bright.png")
        Image.fromarray((tex * 90).astype("uint8")).save(d / f"{i}_dark.png")
        a, b = (f"{i}_bright.png", f"{i}_dark.png") if i % 2 else (f"{i}_dark.png", f"{i}_bright.png")
        label = "tie" if i % 4 == 0 else ("A" if i % 2 else "B")
        rows.append({"prompt": "a texture", "image_a": a, "image_b": b, "label": label, "weight": 1.0 + (i % 3)})
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_learns_brightness_preference(tmp_path):
    """A tiny model learns "the brighter image wins" to >= 90% held-out accuracy; the eval loss falls."""
    cfg = tiny_cfg(tmp_path / "run", "max_steps=12", "data.synthetic_size=96")
    t0 = time.perf_counter()
    trainer = PreferenceTrainer(cfg)
    before = trainer.evaluate()
    summary = trainer.train()
    elapsed = time.perf_counter() - t0
    assert summary["eval_accuracy"] >= 0.9, summary
    assert summary["eval_loss"] < before["loss"] - 0.1, (before, summary)
    m = metrics(tmp_path / "run")
    train = [r for r in m if r["split"] == "train"]
    assert {"loss", "accuracy", "margin", "reward_mean", "reward_std", "reward_min", "reward_max", "lr"} <= set(train[0])
    assert train[-1]["step"] == 12 and m[-1]["split"] == "final"
    print(f"brightness task: eval acc {before['accuracy']:.3f} -> {summary['eval_accuracy']:.3f} in {elapsed:.1f}s")
    # the final model loads as a reward and ranks held-out pairs the same way
    from rewardkit import load_reward
    from rewardkit.train.data import load_pairs

    r = load_reward("preference", model=summary["model_dir"])
    ds, _ = load_pairs("synthetic:brightness", split="test", synthetic_size=32)
    pw = r.compare([x["image_a"] for x in ds], [x["image_b"] for x in ds], [x["prompt"] for x in ds])
    right = [(p > 0.5) == (lab == "A") for p, lab in zip(pw.prob_a.tolist(), ds["label"])]
    assert sum(right) / len(right) >= 0.9


@pytest.mark.parametrize("lora", [False, True])
def test_parameters_change_after_one_step(tmp_path, lora):
    cfg = tiny_cfg(tmp_path, "max_steps=1", "data.eval=null", f"lora.enabled={str(lora).lower()}", "lora.r=4")
    trainer = PreferenceTrainer(cfg)
    named = dict(trainer.model_raw.named_parameters())
    before = {n: p.detach().clone() for n, p in named.items()}
    trainable = {n for n, p in named.items() if p.requires_grad}
    trainer.train()
    changed = {n for n in trainable if not torch.equal(before[n], named[n].detach())}
    assert "head.proj.weight" in changed
    # every trainable tensor moved, except two with an exactly zero first gradient: the head bias (it
    # cancels in r_w - r_l) and LoRA A (B starts at zero)
    unchanged = trainable - changed
    assert all("lora_A" in n or n == "head.proj.bias" for n in unchanged), sorted(unchanged)[:5]
    frozen = [n for n in named if n not in trainable]
    assert frozen and all(torch.equal(before[n], named[n].detach()) for n in frozen)
    if lora:
        assert any("trainable_tokens_delta" in n for n in changed), "the reward token's embedding must train"
    else:
        assert not any(".visual." in n for n in trainable)


def test_ctrl_c_mid_step_checkpoints_and_resumes_bitwise(tmp_path):
    """KeyboardInterrupt inside step 3 (no periodic checkpoints): the two completed steps are saved with the
    RNG states of step 3's start, and the resumed run ends bitwise equal to an uninterrupted one."""
    common = ["max_steps=4", "save_every=0", "log_every=1", "data.eval=null", "lora.enabled=true", "lora.r=4",
              "lora.dropout=0.1", "optim.schedule=cosine", "optim.warmup_ratio=0.25"]
    out = tmp_path / "interrupted"
    trainer = PreferenceTrainer(tiny_cfg(out, *common))
    head, calls = trainer.model_raw.head, []
    accum = trainer.accum
    original = head.forward

    def forward(h):
        calls.append(1)
        if len(calls) == 2 * accum + accum:  # the last micro-batch of step 3
            raise KeyboardInterrupt
        return original(h)

    head.forward = forward
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    ck = latest_checkpoint(out)
    assert ck is not None and ck.name == "step-00000002" and not (out / "model").exists()

    resumed = PreferenceTrainer(tiny_cfg(out, *common)).train()
    clean = PreferenceTrainer(tiny_cfg(tmp_path / "clean", *common)).train()
    assert resumed["step"] == clean["step"] == 4

    from safetensors.torch import load_file

    a = load_file(str(latest_checkpoint(out) / "trainable.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "clean") / "trainable.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical(tmp_path):
    """SIGKILL after step 3 (last checkpoint: step 2), resume -> the same final weights as a clean run."""
    common = ["max_steps=4", "save_every=2", "log_every=1", "data.eval=null", "data_workers=2", "lora.enabled=true", "lora.r=4",
              "lora.dropout=0.1", "optim.schedule=cosine", "optim.warmup_ratio=0.25"]
    from tests.helpers.forked import run_forked

    killed = tmp_path / "killed"
    # a process of its own, forked from this one (the same entry point, a real SIGKILL, no fresh interpreter)
    proc = run_forked(["train", "preference", "--config", TINY, f"output_dir={killed}", "progress=false", *common],
                      env={KILL_ENV: "3"}, cwd=ROOT, timeout=240)
    assert proc.returncode == -9, proc.stderr[-2000:]
    ck = latest_checkpoint(killed)
    assert ck is not None and ck.name == "step-00000002"
    assert not list((killed / "checkpoints").glob("*.tmp")) and not (killed / "model").exists()
    assert max(r["step"] for r in metrics(killed)) == 3

    resumed = PreferenceTrainer(tiny_cfg(killed, *common)).train()
    clean = PreferenceTrainer(tiny_cfg(tmp_path / "clean", *common)).train()
    assert resumed["step"] == clean["step"] == 4

    from safetensors.torch import load_file

    a = load_file(str(latest_checkpoint(killed) / "trainable.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "clean") / "trainable.safetensors"))
    assert a.keys() == b.keys() and len(a) > 3
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, diff
    oa = load_file(str(latest_checkpoint(killed) / "optimizer.safetensors"))
    ob = load_file(str(latest_checkpoint(tmp_path / "clean") / "optimizer.safetensors"))
    assert all(torch.equal(oa[k], ob[k]) for k in oa)
    # metrics after the resume point were dropped and re-logged once; old checkpoints pruned to the limit
    steps = [r["step"] for r in metrics(killed) if r["split"] == "train"]
    assert steps == sorted(set(steps))
    assert len([p for p in (killed / "checkpoints").iterdir() if p.is_dir()]) <= 2


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_gloo_keeps_replicas_in_sync(tmp_path):
    from tests.helpers.forked import run_forked_ranks

    out = tmp_path / "ddp"
    # 2 ranks forked from this process with torchrun's worker environment (tests/helpers/forked.py; torchrun's own
    # launch: docs/test_commands.py, docs/rl.md's 2-process line)
    ranks = run_forked_ranks(["train", "preference", "--config", TINY, f"output_dir={out}", "progress=false",
                              "max_steps=2", "data.synthetic_size=33", "micro_batch_size=2"], cwd=ROOT, timeout=150)
    assert [r.returncode for r in ranks] == [0, 0], "\n".join(r.stderr[-3000:] for r in ranks)
    final = metrics(out)[-1]
    info = [r for r in metrics(out) if r["split"] == "info"][0]
    assert final["world_size"] == 2 and info["grad_accum"] == 2   # 8 pairs = 2 ranks x 2 pairs x 2 accumulation
    assert final["replicas_in_sync"] is True and final["replica_max_abs_diff"] == 0.0
    assert final["pairs_per_rank"] == [8, 8]                       # each rank saw its own half of 2 x 8 pairs
    assert final["eval_pairs"] == 33                                # sharded eval (17 + 16 rows), gathered
    assert (out / "model" / "preference_config.json").is_file()


def test_image_folder_with_ties_weights_and_tie_losses(tmp_path, pair_folder):
    for kind in ("bt", "rao_kupper", "davidson"):
        out = tmp_path / kind
        cfg = tiny_cfg(out, f"data.train={pair_folder}", "data.eval=null", "data.eval_fraction=0.25",
                       f"loss.kind={kind}", "max_steps=1", "global_batch_size=4", "micro_batch_size=4")
        summary = PreferenceTrainer(cfg).train()
        info = [r for r in metrics(out) if r["split"] == "info"][0]
        assert info["eval_pairs"] == 4 and info["train_pairs"] + info["ties_skipped"] == 12
        # Bradley-Terry has no tie outcome: ties are skipped; the tie models train on them
        assert (info["ties_skipped"] > 0) if kind == "bt" else (info["ties_skipped"] == 0)
        assert torch.isfinite(torch.tensor(summary["eval_loss"]))


def test_uncertainty_head_trains(tmp_path):
    cfg = tiny_cfg(tmp_path, "model.head=uncertainty", "loss.kind=uncertainty", "max_steps=2", "data.eval=null",
                   "lora.enabled=true", "lora.r=4", "merge_lora_on_save=true")
    trainer = PreferenceTrainer(cfg)
    summary = trainer.train()
    from rewardkit.models.preference import PreferenceModel

    m = PreferenceModel.from_pretrained(summary["model_dir"])
    assert m.head_type == "uncertainty" and m.weights_kind == "full"  # LoRA merged on save
    imgs = [trainer.train_ds[i]["image_a"] for i in range(3)]
    want, want_sigma = trainer.model_raw.score(imgs, ["a", "b", "c"])
    got, got_sigma = m.score(imgs, ["a", "b", "c"])
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(got_sigma, want_sigma, atol=1e-5)


def test_chosen_rejected_and_pickapic_layouts(tmp_path):
    import datasets
    from PIL import Image

    from rewardkit.train.data import convert_pickapic, load_pairs

    Image.new("RGB", (8, 8), "white").save(tmp_path / "w.png")
    Image.new("RGB", (8, 8), "black").save(tmp_path / "k.png")
    f = tmp_path / "cr.jsonl"
    f.write_text(json.dumps({"caption": "p", "chosen": "w.png", "rejected": "k.png"}) + "\n")
    ds, base = load_pairs(str(f))
    assert ds[0]["image_a"] == "w.png" and ds[0]["label"] == "A" and ds[0]["prompt"] == "p" and base == tmp_path
    pp = datasets.Dataset.from_dict({"caption": ["a", "b", "c"], "jpg_0": [b"0", b"1", b"2"], "jpg_1": [b"3", b"4", b"5"],
                                     "label_0": [1.0, 0.0, 0.5], "label_1": [0.0, 1.0, 0.5], "best_image_uid": ["", "", ""]})
    conv = convert_pickapic(pp)
    assert conv["label"] == ["A", "B", "tie"] and set(conv.column_names) == {"prompt", "image_a", "image_b", "label"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "image_a": "w.png", "image_b": "k.png", "label": "C"}) + "\n")
    with pytest.raises(ValueError, match="row 0"):
        load_pairs(str(bad))


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="optim.lrr"):
        tiny_cfg(tmp_path, "optim.lrr=1")
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        PreferenceTrainer(tiny_cfg(tmp_path, "global_batch_size=6"))
    with pytest.raises(ValueError, match="uncertainty"):
        PreferenceTrainer(tiny_cfg(tmp_path, "loss.kind=uncertainty"))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PreferenceTrainer(tiny_cfg(tmp_path, "data.synthetic_size=4"))


def test_cli_train_needs_a_kind(capsys):
    from rewardkit.cli import main

    assert main(["train"]) == 2
    assert "preference" in capsys.readouterr().err  # a usage error, on stderr


def test_bf16_autocast_and_gradient_checkpointing_step(tmp_path):
    cfg = tiny_cfg(tmp_path, "max_steps=2", "data.eval=null", "mixed_precision=bf16",
                   "model.gradient_checkpointing=true", "log_every=1")
    trainer = PreferenceTrainer(cfg)
    vlm = trainer.model_raw.vlm  # the attribute's name changed in transformers 5.23
    assert getattr(vlm, "is_activation_checkpointing", None) or vlm.is_gradient_checkpointing
    trainer.train()
    train = [r for r in metrics(tmp_path) if r["split"] == "train"]
    assert len(train) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    assert trainer.model_raw.head.proj.weight.dtype == torch.float32


def test_resume_drops_a_half_written_metrics_record(tmp_path):
    """Bug: a kill while metrics.jsonl took a record left half a line, on which every resume failed (json.loads
    in the truncation on resume)."""
    from types import SimpleNamespace

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"step": 3, "lo')
    tr = SimpleNamespace(out=tmp_path, acc=SimpleNamespace(is_main_process=True))
    PreferenceTrainer._truncate_metrics(tr, 2)
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]


def test_resume_refuses_a_changed_data_order(tmp_path):
    PreferenceTrainer(tiny_cfg(tmp_path, "max_steps=1", "data.eval=null")).train()
    assert latest_checkpoint(tmp_path).name == "step-00000001"
    with pytest.raises(ValueError, match="seed changed"):
        PreferenceTrainer(tiny_cfg(tmp_path, "max_steps=2", "data.eval=null", "seed=1")).train()


def test_replica_fingerprint_detects_any_change():
    from rewardkit.train.trainer import _replica_fingerprint

    g = torch.Generator().manual_seed(0)
    params = [torch.randn(1000, generator=g), torch.randn(7, 3, generator=g)]
    same = [p.clone() for p in params]
    assert torch.equal(_replica_fingerprint(params, chunk=64), _replica_fingerprint(same, chunk=64))
    same[0][999] += 1e-6
    assert not torch.equal(_replica_fingerprint(params, chunk=64), _replica_fingerprint(same, chunk=64))
    swapped = [params[0].flip(0), params[1]]  # same sum and sum of squares, different order
    assert not torch.equal(_replica_fingerprint(params), _replica_fingerprint(swapped))


def test_edit_pairs_with_source_images_train(tmp_path):
    """Edit data: each row carries its source image, shown before each candidate."""
    from PIL import Image

    Image.new("RGB", (32, 32), (120, 60, 30)).save(tmp_path / "src.png")
    rows = []
    for i in range(8):
        Image.new("RGB", (32, 32), (40 + 20 * i, 90, 200)).save(tmp_path / f"e{i}.png")
    for i in range(8):
        rows.append({"prompt": "make it blue", "sources": ["src.png"], "image_a": f"e{i}.png",
                     "image_b": f"e{(i + 3) % 8}.png", "label": "A" if i > (i + 3) % 8 else "B", "margin": 0.1})
    (tmp_path / "edits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cfg = tiny_cfg(out, f"data.train={tmp_path / 'edits.jsonl'}", f"data.eval={tmp_path / 'edits.jsonl'}",
                   "max_steps=1")
    trainer = PreferenceTrainer(cfg)
    batch = trainer.train_collate([trainer.train_ds[0], trainer.train_ds[1]])
    # 2 pairs -> 4 sequences, each with the source and the candidate: 8 images in one forward
    assert batch["inputs"]["input_ids"].shape[0] == 4 and batch["inputs"]["image_grid_thw"].shape[0] == 8
    assert batch["margin"].tolist() == pytest.approx([0.1, 0.1])
    summary = trainer.train()
    assert summary["eval_pairs"] == 8

    from rewardkit import load_reward

    r = load_reward("preference", model=summary["model_dir"])
    assert r([tmp_path / "e0.png"], "make it blue", sources=[[tmp_path / "src.png"]]).valid.all()


def test_cli_print_config(capsys):
    import yaml

    from rewardkit.cli import main

    assert main(["train", "preference", "--config", str(TINY), "--print-config", "optim.lr=0.5", "lora.r=3"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["optim"]["lr"] == 0.5 and cfg["lora"]["r"] == 3 and cfg["model"]["backbone"] == "tiny:qwen2_5_vl"
    assert main(["train", "preference", "--config", str(TINY), "--print-config", "optim.lrr=1"]) == 2


def test_parquet_with_embedded_images(tmp_path):
    from PIL import Image

    from rewardkit.train.data import PairCollator, load_pairs, synthetic_brightness_pairs

    synthetic_brightness_pairs(5, seed=3).to_parquet(str(tmp_path / "pairs.parquet"))
    ds, _ = load_pairs(str(tmp_path / "pairs.parquet"))
    assert len(ds) == 5 and isinstance(ds[0]["image_a"], Image.Image)

    class Enc:  # records what the collator hands to the model's encoder
        def encode(self, images, prompts, sources):
            self.seen = (len(images), list(prompts), sources)
            return {}

    enc = Enc()
    out = PairCollator(enc)([ds[0], ds[1]])
    assert enc.seen[0] == 4 and enc.seen[1] == [ds[0]["prompt"], ds[1]["prompt"]] * 2 and enc.seen[2] is None
    assert out["labels"].tolist() == [{"A": 0, "B": 1}[ds[i]["label"]] for i in range(2)]
