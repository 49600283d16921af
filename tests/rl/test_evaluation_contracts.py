"""rl/evaluation.py's smaller contracts, on a stand-in trainer (no model, no training loop; found by mutation
testing, issue 39): which prompts a process samples and in which batches, the noise each prompt gets, what the
sampler and the scorer are called with, the per-reward means (finite values only, summed over processes, a
batch-relative composite's z-scores left out), the grid gathered in prompt order, and the PNG sheet.

The evaluation's noise is specified as one generator per prompt drawn from the run's seed stream
(``rewardkit.rl.runtime._seed(seed, _EVAL=5, i)`` for prompt ``i``'s starting noise, ``(seed, 5, n + i)`` for an
SDE solver's step noise): the expected noise below is drawn from that stream directly, by index, and the
tests also check it does not depend on the batch size or on the process."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rewardkit.rl.evaluation import _gather_grid, evaluate, write_grid
from rewardkit.rl.runtime import _seed

RES = 4  # image side
EVAL_STREAM = 5  # runtime._EVAL, written out


def expected_noise(seed, i):
    """Prompt i's starting noise: ``[1, 3, RES, RES]`` from its own generator (the stand-in's latent shape)."""
    return torch.randn((1, 3, RES, RES), generator=torch.Generator().manual_seed(_seed(seed, EVAL_STREAM, i)))


def image_of(noise):
    """The stand-in decoder: x * 0.75 + 0.5 (values below 0 and above 1 occur, so the grid's clamp matters)."""
    return noise * 0.75 + 0.5


class Policy:
    def __init__(self):
        self.encoded = []
        self.shapes = []

    def encode(self, texts):
        self.encoded.append(list(texts))
        return ("cond", tuple(texts))

    def latent_shape(self, b, res):
        self.shapes.append((b, res))
        return (b, 3, res, res)

    def decode(self, x0):
        return image_of(x0).double()  # float64: evaluate hands the scorer float32


class Scorer:
    """Scores from each prompt row's ``values`` ({component: value}); ``finalize`` concatenates (the real one's
    contract for non-deferred rewards: rewardkit.rl.scoring._RewardScorer.finalize)."""

    def __init__(self, deferred=(), fail=False):
        self.deferred = set(deferred)
        self.calls = []
        self.prompt_ids = None
        self.fail = fail

    def __call__(self, images, texts, metadata):
        if self.fail:
            raise RuntimeError("scorer failed")
        self.calls.append((images, list(texts), list(metadata)))
        keys = metadata[0]["values"].keys()
        col = {k: torch.tensor([m["values"][k] for m in metadata], dtype=torch.float64) for k in keys}
        comps = {k: v for k, v in col.items() if "." not in k and k != "total"}
        dims = {k: v for k, v in col.items() if "." in k}
        return {"total": col["total"], "components": comps, "dimensions": dims, "errors": [None] * len(texts)}

    def finalize(self, results, prompt_ids):
        self.prompt_ids = prompt_ids
        cat = lambda xs: torch.cat(xs)  # noqa: E731
        return {"total": cat([r["total"] for r in results]),
                "components": {k: cat([r["components"][k] for r in results]) for k in results[0]["components"]},
                "dimensions": {k: cat([r["dimensions"][k] for r in results]) for k in results[0]["dimensions"]},
                "errors": [e for r in results for e in r["errors"]]}


class Dist:
    def __init__(self, rank=0, world=1, others=None):
        self.rank, self.world = rank, world
        self.others = others or {}  # rank -> that process's grid buffer
        self.gathered = []

    def gather_cat(self, x):
        self.gathered.append(x.clone())
        if self.world == 1:
            return x
        return torch.cat([x if r == self.rank else self.others[r] for r in range(self.world)])


class Trainer:
    """What evaluate uses of NFTTrainer (rewardkit.rl.evaluation.EvaluatedTrainer)."""

    def __init__(self, prompts, *, batch_size=2, eval_grid=0, seed=7, rank=0, world=1, ema=True, values=None,
                 scorer=None, others=None):
        self.cfg = SimpleNamespace(seed=seed, eval_grid=eval_grid, sample=SimpleNamespace(
            batch_size=batch_size, resolution=RES, eval_num_steps=3, eval_solver="sde-test", eval_guidance_scale=4.5))
        self.dist = Dist(rank, world, others)
        self.device = torch.device("cpu")
        self.policy = Policy()
        self.scorer = scorer or Scorer()
        self.trainable = [torch.nn.Parameter(torch.full((2,), 1.0)), torch.nn.Parameter(torch.full((3,), 2.0))]
        self.ema = [torch.full((2,), -1.0), torch.full((3,), -2.0)] if ema else None
        self.eval_prompts = list(prompts)
        values = values or [{"total": float(i), "pick": float(i)} for i in range(len(prompts))]
        self.eval_metadata = [{"row": i, "values": v} for i, v in enumerate(values)]
        self.rollouts = []

    def _rollout(self, c_orig, c_opt, noise, gen, steps=None, solver=None, use_old=True, guidance_scale=None):
        self.rollouts.append({"c_orig": c_orig, "c_opt": c_opt, "noise": noise.clone(), "gen": gen, "steps": steps,
                              "solver": solver, "use_old": use_old, "guidance_scale": guidance_scale,
                              "weights": [p.detach().clone() for p in self.trainable]})
        return noise


PROMPTS = [f"prompt {i}" for i in range(5)]


def test_batches_noise_and_sampler_arguments_of_one_process():
    """5 prompts, batch size 2, one process: batches [0, 1], [2, 3], [4], each prompt's noise from its own
    generator (seed, 5, i), the step generators (seed, 5, 5 + i), the eval sampler's options, use_old=False, the
    EMA weights in the sampler and the trained ones back afterwards; the scorer gets float32 images of exactly
    those latents and each prompt's metadata row; finalize gets the prompt ids [0..4] as int64.
    Bugs caught: another seed stream or index (i + 1, the step noise sharing the starting noise's index), the
    batch boundaries, the sampler's number of steps / solver / guidance / use_old, the latent batch of 1 per prompt,
    float64 images reaching the scorer, metadata rows out of step with the prompts."""
    tr = Trainer(PROMPTS, batch_size=2, seed=7)
    metrics, grid, grid_prompts = evaluate(tr)
    assert tr.policy.encoded == [["prompt 0", "prompt 1"], ["prompt 2", "prompt 3"], ["prompt 4"]]
    assert tr.policy.shapes == [(1, RES)] * 3
    ids = [[0, 1], [2, 3], [4]]
    for r, batch in zip(tr.rollouts, ids):
        cond = ("cond", tuple(PROMPTS[i] for i in batch))
        assert r["c_orig"] == cond and r["c_opt"] == cond
        torch.testing.assert_close(r["noise"], torch.cat([expected_noise(7, i) for i in batch]), rtol=0, atol=0)
        assert len(r["gen"]) == len(batch)
        for g, i in zip(r["gen"], batch):
            want = torch.Generator().manual_seed(_seed(7, EVAL_STREAM, 5 + i))
            assert torch.equal(torch.randn(6, generator=g), torch.randn(6, generator=want))
        assert (r["steps"], r["solver"], r["use_old"], r["guidance_scale"]) == (3, "sde-test", False, 4.5)
        assert [w.tolist() for w in r["weights"]] == [[-1.0, -1.0], [-2.0, -2.0, -2.0]]   # the EMA values
    assert [p.tolist() for p in tr.trainable] == [[1.0, 1.0], [2.0, 2.0, 2.0]]                # given back
    for (images, texts, rows), batch in zip(tr.scorer.calls, ids):
        assert images.dtype == torch.float32
        want = torch.cat([image_of(expected_noise(7, i)) for i in batch]).double().float()
        torch.testing.assert_close(images, want, rtol=0, atol=0)
        assert texts == [PROMPTS[i] for i in batch] and [m["row"] for m in rows] == batch
    assert tr.scorer.prompt_ids.dtype == torch.long and tr.scorer.prompt_ids.tolist() == [0, 1, 2, 3, 4]
    assert metrics == {"eval/reward/total/mean": 2.0, "eval/reward/pick/mean": 2.0}
    assert grid.shape == (0,) and grid_prompts == []


def test_noise_is_the_prompts_whatever_the_batch_size_and_the_process(monkeypatch):
    """Process 1 of 2 samples prompts 1 and 3 (prompt i on process i % 2), each with the same noise as a single
    process with batch size 1 gives it. Bugs caught: rank and world swapped in the slice, noise drawn per batch or
    per position instead of per prompt."""
    tr = Trainer(PROMPTS, batch_size=3, rank=1, world=2)
    reduced = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t: reduced.append(t.clone()))
    evaluate(tr)
    assert tr.policy.encoded == [["prompt 1", "prompt 3"]]
    one = Trainer(PROMPTS, batch_size=1)
    evaluate(one)
    by_prompt = {tuple(r["c_orig"][1]): r["noise"] for r in one.rollouts}
    torch.testing.assert_close(tr.rollouts[0]["noise"], torch.cat([by_prompt[("prompt 1",)], by_prompt[("prompt 3",)]]),
                               rtol=0, atol=0)
    assert tr.scorer.prompt_ids.tolist() == [1, 3]
    assert len(reduced) == 1


def test_means_keep_finite_values_sum_over_processes_in_float64_and_skip_deferred_z_scores(monkeypatch):
    """Per key: sum of the finite values / their count, both summed over processes (all_reduce on a
    ``[keys, 2]`` float64 tensor, keys sorted); NaN when no value is finite. A batch-relative composite
    (``scorer.deferred``) logs neither its component, nor the total, nor its axes' ``z`` / ``z_vetoed``; its raw
    axis scores and another reward's ``z`` are logged. Values: 1e8 and 1 sum to 100000001, which float32 rounds to
    1e8 (the mean must be 50000000.5).
    Bugs caught: NaN or inf counted, a float32 statistics tensor, no all_reduce with two processes (or one with
    one process), the deferred filter inverted or checking the wrong part of a key."""
    nan, inf = float("nan"), float("inf")
    values = [{"total": 1e8, "comp": nan, "pick": 1.0, "empty": nan, "comp.aes/raw": 0.25, "comp.aes/z": 1.0,
               "comp.aes/z_vetoed": 1.0, "pick.aes/z": 3.0},
              {"total": 1.0, "comp": nan, "pick": nan, "empty": nan, "comp.aes/raw": 0.75, "comp.aes/z": -1.0,
               "comp.aes/z_vetoed": -1.0, "pick.aes/z": inf},
              {"total": nan, "comp": nan, "pick": 4.0, "empty": nan, "comp.aes/raw": 0.5, "comp.aes/z": 0.0,
               "comp.aes/z_vetoed": 0.0, "pick.aes/z": 5.0}]
    tr = Trainer(PROMPTS[:3], batch_size=2, values=values)
    metrics, _, _ = evaluate(tr)
    assert metrics == pytest.approx({"eval/reward/total/mean": 50000000.5, "eval/reward/pick/mean": 2.5,
                                     "eval/reward/comp/mean": nan, "eval/reward/empty/mean": nan,
                                     "eval/reward/comp.aes/raw/mean": 0.5, "eval/reward/comp.aes/z/mean": 0.0,
                                     "eval/reward/comp.aes/z_vetoed/mean": 0.0, "eval/reward/pick.aes/z/mean": 4.0},
                                    nan_ok=True, rel=0, abs=0)
    assert metrics["eval/reward/total/mean"] == 50000000.5
    # deferred: the composite "comp"
    tr = Trainer(PROMPTS[:3], batch_size=2, values=values, scorer=Scorer(deferred={"comp"}))
    metrics, _, _ = evaluate(tr)
    assert metrics == pytest.approx({"eval/reward/pick/mean": 2.5, "eval/reward/empty/mean": nan,
                                     "eval/reward/comp.aes/raw/mean": 0.5, "eval/reward/pick.aes/z/mean": 4.0},
                                    nan_ok=True, rel=0, abs=0)
    # two processes: this one (rank 0: prompts 0, 2, 4) and the other's [keys, 2] (sum, count) rows, keys sorted
    tr = Trainer(PROMPTS, batch_size=2, rank=0, world=2,
                 values=[{"total": float(i), "pick": 10.0 * i} for i in range(5)])
    seen = []

    def all_reduce(t):
        seen.append((t.dtype, t.shape, t.clone()))
        t += torch.tensor([[1000.0, 2.0], [100.0, 2.0]], dtype=t.dtype)   # pick: (10 + 30) * ..., total: 1 + 3

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    metrics, _, _ = evaluate(tr)
    assert [(d, tuple(s)) for d, s, _ in seen] == [(torch.float64, (2, 2))]
    assert seen[0][2].tolist() == [[0.0 + 20.0 + 40.0, 3.0], [0.0 + 2.0 + 4.0, 3.0]]   # pick, total
    assert metrics == {"eval/reward/pick/mean": (60.0 + 1000.0) / 5, "eval/reward/total/mean": (6.0 + 100.0) / 5}


def test_one_process_never_all_reduces():
    """torch.distributed.all_reduce without a process group raises: a single process must not call it."""
    assert not torch.distributed.is_initialized()
    metrics, _, _ = evaluate(Trainer(PROMPTS[:2]))
    assert metrics == {"eval/reward/total/mean": 0.5, "eval/reward/pick/mean": 0.5}


def test_the_grid_is_the_first_eval_grid_images_in_prompt_order():
    """eval_grid 3 of 5 prompts, batch size 2: the first three prompts' images, clamped to [0, 1] and rounded to
    k/255 (the uint8 gather), in prompt order, and their prompts. eval_grid above the number of prompts gives all
    of them. Bugs caught: min / max swapped, ``i <= grid_n``, no clamp (uint8 wrap-around), truncation instead of
    rounding, the wrong prompts returned."""
    tr = Trainer(PROMPTS, batch_size=2, eval_grid=3)
    _, grid, grid_prompts = evaluate(tr)
    want = np.stack([np.clip(image_of(expected_noise(7, i))[0].numpy(), 0, 1) for i in range(3)])
    want = np.round(want * 255) / 255   # half to even, as torch.round
    assert grid.dtype == torch.float32 and grid.shape == (3, 3, RES, RES)
    np.testing.assert_allclose(grid.numpy(), want, rtol=0, atol=1e-7)
    assert ((want == 0) | (want == 1)).any() and grid_prompts == PROMPTS[:3]
    tr = Trainer(PROMPTS[:2], batch_size=2, eval_grid=9)
    _, grid, grid_prompts = evaluate(tr)
    assert grid.shape == (2, 3, RES, RES) and grid_prompts == PROMPTS[:2]


def test_gathered_grid_takes_prompt_i_from_process_i_mod_world():
    """_gather_grid with 2 processes and a grid of 3: each sends ceil(3 / 2) = 2 uint8 slots; prompt i is slot
    i // 2 of process i % 2. This is process 1 (prompt 1, one image; its second slot stays zero)."""
    other = torch.stack([torch.full((3, RES, RES), v, dtype=torch.uint8) for v in (10, 30)])   # process 0: prompts 0, 2
    tr = Trainer(PROMPTS, rank=1, world=2, eval_grid=3, others={0: other})
    grid = _gather_grid(tr, [torch.full((3, RES, RES), 20 / 255)], 3)
    assert tr.dist.gathered[0].dtype == torch.uint8 and tr.dist.gathered[0].shape == (2, 3, RES, RES)
    assert tr.dist.gathered[0][1].eq(0).all()
    assert [int(round(float(g.mean()) * 255)) for g in grid] == [10, 20, 30]
    assert _gather_grid(tr, [], 0).shape == (0,)


def test_the_grid_buffer_reaches_the_collective_on_the_trainers_device():
    """NCCL gathers CUDA tensors only: the uint8 buffer is handed to ``gather_cat`` on ``tr.device``. Shown with
    the ``meta`` device (no data, no GPU needed): the stand-in collective records the device it was given and
    answers with both processes' buffers as a real one would (on the device; evaluate copies them back).
    Bug caught: the buffer left on the CPU (``.to(None)``), which only fails on a GPU run with 2+ processes."""
    got = []
    mine = torch.full((1, 3, RES, RES), 20, dtype=torch.uint8)
    other = torch.full((1, 3, RES, RES), 10, dtype=torch.uint8)

    class MetaDist:
        rank, world = 1, 2

        def gather_cat(self, x):
            got.append((x.device.type, x.dtype, tuple(x.shape)))
            return torch.cat([other, mine])

    tr = Trainer(PROMPTS, eval_grid=2)
    tr.dist, tr.device = MetaDist(), torch.device("meta")
    grid = _gather_grid(tr, [torch.full((3, RES, RES), 20 / 255)], 2)
    assert got == [("meta", torch.uint8, (1, 3, RES, RES))]
    assert [int(round(float(g.mean()) * 255)) for g in grid] == [10, 20]


def test_an_empty_prompt_list_is_refused_and_a_failure_gives_the_trained_weights_back():
    with pytest.raises(ValueError, match=r"^no evaluation prompts: they load when eval_every > 0 \(eval_prompts\)$"):
        evaluate(Trainer([]))
    tr = Trainer(PROMPTS[:2], scorer=Scorer(fail=True))
    with pytest.raises(RuntimeError, match="scorer failed"):
        evaluate(tr)
    assert [p.tolist() for p in tr.trainable] == [[1.0, 1.0], [2.0, 2.0, 2.0]]
    tr = Trainer(PROMPTS[:2], ema=False)   # no EMA: the trained weights sample
    evaluate(tr)
    assert [w.tolist() for w in tr.rollouts[0]["weights"]] == [[1.0, 1.0], [2.0, 2.0, 2.0]]


def test_write_grid_sheet_layout(tmp_path):
    """5 images of 2 x 3 pixels, 4 columns: a 2-row sheet (4 x 12 pixels), image i at row i // 4, column i % 4,
    clamped and rounded to uint8, the 3 empty cells white; written through a temporary name (none left) and the
    path returned. 2 images with 4 columns make a 1 x 2 sheet; no image writes nothing and returns None."""
    from PIL import Image

    vals = [-0.5, 0.2, 0.5, 0.999, 1.7]
    images = torch.stack([torch.full((3, 2, 3), v) for v in vals])
    images[1, 1, 0, 0] = 0.6   # one green pixel of image 1
    path = tmp_path / "grid.png"
    assert write_grid(images, path) == path
    arr = np.asarray(Image.open(path))
    assert arr.shape == (4, 12, 3) and arr.dtype == np.uint8
    u8 = [0, 51, 128, 255, 255]   # round(v * 255) after the clamp: 0.2 -> 51, 0.5 -> 127.5 -> 128, 0.999 -> 254.7
    for i, v in enumerate(u8):
        r, c = divmod(i, 4)
        cell = arr[r * 2:(r + 1) * 2, c * 3:(c + 1) * 3].copy()
        if i == 1:
            assert cell[0, 0].tolist() == [51, 153, 51]
            cell[0, 0, 1] = 51
        assert (cell == v).all(), (i, cell)
    assert (arr[2:4, 3:12] == 255).all()   # empty cells: white
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.png"]
    assert np.asarray(Image.open(write_grid(images[:2], tmp_path / "two.png"))).shape == (2, 6, 3)
    assert write_grid(images[:0], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
