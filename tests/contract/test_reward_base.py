"""The base class plumbing: outputs, chunk merging, grads, locking, devices."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

from rewardkit import PairwiseOutput, Reward, RewardOutput
from rewardkit.reward import RewardBatch
from rewardkit.testing import random_images


class Brightness(Reward):
    name = "brightness"
    score_range = (0.0, 1.0)
    dimensions = ("red",)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        arr = [np.asarray(im, dtype=np.float64) / 255 for im in batch.images]
        return RewardOutput(scores=[a.mean() for a in arr], dimensions={"red": [a[..., 0].mean() for a in arr]},
                            rationales=[f"len={len(p)}" for p in batch.prompts], info={"chunk": len(batch)},
                            details=[{"i": i} for i in batch.indices])


def test_output_normalises_and_serialises():
    out = RewardOutput(scores=[1.0, float("nan"), float("inf")])
    assert out.scores.dtype == torch.float32 and out.valid.tolist() == [True, False, False]
    assert out.errors == [None, "non-finite score", "non-finite score"]
    assert out.tolist() == [1.0, None, None]
    d = out.to_dict()
    assert d["scores"] == [1.0, None, None]
    json.dumps(d, allow_nan=False)
    with pytest.raises(ValueError, match="dimension 'x' has 1 values for 3"):
        RewardOutput(scores=[1, 2, 3], dimensions={"x": [1]})
    inv = RewardOutput.invalid(2, "judge did not answer", dimensions=("a",))
    assert inv.errors == ["judge did not answer"] * 2 and torch.isnan(inv.dimensions["a"]).all()


def test_valid_mask_from_reward_is_respected():
    out = RewardOutput(scores=[0.5, 0.7], valid=[True, False], errors=[None, "unparseable answer: 'maybe'"])
    assert out.tolist() == [0.5, None] and out.errors[1] == "unparseable answer: 'maybe'"


def test_chunks_merge_with_indices_and_invalid_samples():
    r = Brightness()
    imgs = random_images(5)
    imgs[2] = b"junk"
    out = r(imgs, [f"p{i}" for i in range(5)], batch_size=2, on_error="nan")
    assert out.valid.tolist() == [True, True, False, True, True]
    assert out.rationales == ["len=2", "len=2", None, "len=2", "len=2"]
    assert out.details == [{"i": 0}, {"i": 1}, None, {"i": 3}, {"i": 4}]
    assert torch.isnan(out.dimensions["red"][2]) and torch.isfinite(out.dimensions["red"][[0, 1, 3, 4]]).all()
    assert out.info == {"chunk": 2}  # call-level info, later chunks win
    recs = out.records()
    assert recs[2] == {"score": None, "valid": False, "error": "bytes is not a recognised image format",
                       "dimensions": {"red": None}, "rationale": None}


def test_all_invalid_keeps_declared_dimensions():
    out = Brightness()([b"x", b"y"], "p", on_error="nan")
    assert not out.valid.any() and set(out.dimensions) == {"red"}


def test_single_image_and_tensor_batches():
    r = Brightness()
    assert len(r(random_images(1)[0], "p")) == 1
    assert len(r(torch.rand(3, 3, 8, 8), "p")) == 3
    assert len(r(np.zeros((2, 8, 8, 3), np.uint8), "p")) == 2
    assert len(r((im for im in random_images(2)), "p")) == 2  # generators


def test_default_compare_is_sigmoid_of_difference():
    r = Brightness()
    dark, light = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    cmp = r.compare([light, dark, dark], [dark, light, dark], "p")
    assert isinstance(cmp, PairwiseOutput)
    torch.testing.assert_close(cmp.prob_a, torch.sigmoid(torch.tensor([1.0, -1.0, 0.0])))
    bad = r.compare([light, b"junk"], [dark, dark], "p", on_error="nan")
    assert bad.valid.tolist() == [True, False] and bad.errors[1].startswith("a: ")
    with pytest.raises(Exception, match="2 images_a but 1 images_b"):
        r.compare([light, dark], [dark], "p")


def test_lower_is_better_flips_compare():
    class Distance(Brightness):
        higher_is_better = False

    cmp = Distance().compare([np.zeros((4, 4, 3), np.uint8)], [np.full((4, 4, 3), 255, np.uint8)], "p")
    assert float(cmp.prob_a[0]) > 0.5


def test_wrong_length_from_score_is_a_bug_not_a_score():
    class Broken(Brightness):
        def _score(self, batch):
            return RewardOutput(scores=[0.0])

    with pytest.raises(RuntimeError, match="returned 1 scores for 2 samples"):
        Broken()(random_images(2), "p")


def test_calls_run_in_inference_mode_even_when_differentiable():
    """Gradients go through score_tensor only: a call never builds a graph (an RL rollout scoring images that
    came out of a graph must not keep it alive), differentiable or not."""
    seen = {}

    class Probe(Brightness):
        def _score(self, batch):
            seen["inference"] = torch.is_inference_mode_enabled()
            return super()._score(batch)

    Probe()(random_images(1), "p")
    assert seen["inference"] is True

    class Diff(Reward):
        name = "diff"
        differentiable = True

        def _score(self, batch):
            seen["inference"] = torch.is_inference_mode_enabled()
            return RewardOutput(scores=torch.zeros(len(batch)))

    Diff()(random_images(1), "p")
    assert seen["inference"] is True


def test_calls_are_serialised_unless_thread_safe():
    active, peak = [0], [0]

    class Slow(Brightness):
        def _score(self, batch):
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            time.sleep(0.05)
            active[0] -= 1
            return super()._score(batch)

    r = Slow()
    threads = [threading.Thread(target=r, args=(random_images(1), "p")) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert peak[0] == 1


class WithModule(Brightness):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(2, 1)


def test_to_moves_modules_and_pickles():
    import pickle

    r = WithModule().to("cpu")
    assert r.device == torch.device("cpu")
    again = pickle.loads(pickle.dumps(r))
    assert isinstance(again, WithModule) and len(again(random_images(2), "p")) == 2


def test_progress_bar_over_chunks(monkeypatch):
    """progress=True shows one tqdm bar over the call's images (named after the reward, advanced chunk by
    chunk to the total); no bar when progress is off or there is a single chunk; the bar changes no score."""
    import tqdm.auto

    bars = []
    real = tqdm.auto.tqdm

    def spy(*a, **kw):
        bar = real(*a, **kw)
        bars.append(bar)
        return bar

    monkeypatch.setattr(tqdm.auto, "tqdm", spy)
    imgs = random_images(4)
    out = Brightness()(imgs, "p", batch_size=1, progress=True)
    assert [(b.total, b.n, b.desc, b.unit) for b in bars] == [(4, 4, "brightness", "img")]
    quiet = Brightness()(imgs, "p", batch_size=1, progress=False)
    one_chunk = Brightness()(imgs, "p", batch_size=8, progress=True)
    assert len(bars) == 1
    assert torch.equal(out.scores, quiet.scores) and torch.equal(out.scores, one_chunk.scores)
