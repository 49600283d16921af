"""Benchmark records reproduce their own numbers: every metric recomputed from the record's per-sample
margins (and its stored tie threshold) equals the stored value, over several rewards and benchmarks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("xxhash")

import torch  # noqa: E402

from rewardkit.bench import evaluate  # noqa: E402
from rewardkit.bench import metrics as M  # noqa: E402
from rewardkit.bench.synthetic import SYNTHETIC_LAYOUT, write_synthetic_benchmarks  # noqa: E402
from rewardkit.reward import Reward, RewardBatch, RewardOutput  # noqa: E402


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-records")
    write_synthetic_benchmarks(root)
    return root


class Irrational(Reward):
    """A deterministic score with many significant digits: brightness scaled by an irrational factor, plus a
    per-image jitter, so margins (and fitted thresholds) do not survive rounding to 10 decimals."""

    name = "test-irrational"
    tasks = frozenset({"t2i", "edit"})

    def __init__(self, factor: float = math.pi, quantum: float = 0.0, **kw):
        super().__init__(**kw)
        self.factor, self.quantum = factor, quantum

    def _score(self, batch: RewardBatch) -> RewardOutput:
        out = []
        for im in batch.images:
            a = np.asarray(im, dtype=np.float64)
            s = self.factor * a.mean() / 255.0 + 1e-3 * math.sin(a[0, 0, 0] + 3 * a[-1, -1, -1])
            if self.quantum:  # coarse scores: many equal margins, a threshold > 0 pays off with human ties
                s = round(s / self.quantum) * self.quantum * self.factor
            out.append(s)
        return RewardOutput(scores=torch.tensor(out, dtype=torch.float64))


def test_threshold_is_stored_exactly():
    v = M.MetricValue(0.5, 4, {"threshold": 0.123456789012345678, "at_zero": 1 / 3})
    d = json.loads(json.dumps(v.to_dict()))
    assert d["threshold"] == 0.123456789012345678  # exact: the boundary pair stays a tie
    assert d["at_zero"] == round(1 / 3, 10)


@pytest.mark.parametrize("factor,quantum", [(math.pi, 0.0), (1 / 3, 0.05), (math.sqrt(2), 0.1),
                                            (0.7071067811865476, 0.02), (math.pi / 9, 0.03)])
def test_every_record_recomputes_to_its_own_numbers(tmp_path, data_root, factor, quantum):
    res = evaluate(Irrational(factor=factor, quantum=quantum), ",".join(SYNTHETIC_LAYOUT), data_dir=data_root,
                   cache_dir=None, n_boot=0, per_sample=True, progress=False)
    rec = json.loads(res.save(tmp_path / "r.json").read_text())  # what users keep: the JSON record
    checked = 0
    for name, br in rec["benchmarks"].items():
        if br.get("skipped"):
            continue
        h = np.array([s["label"] for s in br["samples"]], dtype=np.int64)
        m = np.array([np.nan if s["margin"] is None else s["margin"] for s in br["samples"]], dtype=np.float64)
        for metric, stored in br["metrics"].items():
            if metric == "accuracy_with_ties":
                again = M.accuracy_with_ties_at(h, m, stored["threshold"])  # the stored threshold, applied
                assert round(again, 10) == stored["value"], (name, metric, again, stored)
                assert M.accuracy_with_ties(h, m).to_dict()["value"] == stored["value"]
                checked += 1
            elif metric == "accuracy_without_ties":
                assert round(M.accuracy_without_ties(h, m).value, 10) == stored["value"], (name, metric)
                checked += 1
    assert checked >= 10
