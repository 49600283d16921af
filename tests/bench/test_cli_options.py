"""`rewardkit bench` command-line options that had no test (issue 16): --limit, --by, bad --limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewardkit.bench.synthetic import write_synthetic_benchmarks


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench-cli-data")
    write_synthetic_benchmarks(root)
    return root


def test_bench_limit_and_by(tmp_path, data_root, tiny_clip_dir, capsys):
    from rewardkit.cli import main

    out = tmp_path / "out"
    rc = main(["bench", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--set", "convention=cosine",
               "--benchmark", "mmrb2/t2i,editreward/2pair", "--data-dir", str(data_root), "--no-cache",
               "--output-dir", str(out), "--bootstrap", "0", "--no-progress", "--device", "cpu",
               "--limit", "5", "--by", "model_a", "--ignore-sources"])
    assert rc == 0
    rec = json.loads(next(out.glob("*.json")).read_text())
    for name in ("mmrb2/t2i", "editreward/2pair"):
        assert rec["benchmarks"][name]["counts"]["n_comparisons"] == 5          # the first 5 only
    b = rec["benchmarks"]["mmrb2/t2i"]
    assert b["metrics"]["mmrb2_official"]["n_pairs"] == 5
    by_model = b["categories"]["model_a"]
    assert set(by_model) and all(k.startswith("model-") for k in by_model)
    # the per-category pair counts add up to the limited set
    assert sum(c["mmrb2_official"]["n_pairs"] for c in by_model.values()) == 5
    assert "by `model_a`" in capsys.readouterr().out


def test_bench_limit_must_be_positive(tmp_path, data_root, tiny_clip_dir, capsys):
    from rewardkit.cli import main

    assert main(["bench", "--reward", "clipscore", "--model", str(tiny_clip_dir), "--benchmark", "mmrb2/t2i",
                 "--data-dir", str(data_root), "--no-cache", "--output-dir", str(tmp_path), "--limit", "0",
                 "--device", "cpu"]) == 2  # a usage error
    assert "--limit must be >= 1" in capsys.readouterr().err


def test_retry_invalid_rescores_only_cached_invalid_samples(tmp_path, data_root):
    """docs/bench.md: invalid scores are cached; `--retry-invalid` (retry_invalid=True) re-queries exactly those."""
    import numpy as np
    import torch

    from rewardkit.bench.harness import evaluate
    from rewardkit.reward import Reward, RewardBatch, RewardOutput

    class Flaky(Reward):
        name = "test-flaky-brightness"
        tasks = frozenset({"t2i"})
        uses_prompt = False

        def __init__(self, fail: bool):
            super().__init__()
            self.fail, self.n_scored = fail, 0

        def _score(self, batch: RewardBatch) -> RewardOutput:
            self.n_scored += len(batch)
            vals = torch.tensor([float(np.asarray(im, dtype=np.float32).mean()) for im in batch.images])
            bad = (vals.round() % 2 == 0) & torch.tensor(self.fail)       # a deterministic half fails
            return RewardOutput(scores=torch.where(bad, torch.full_like(vals, float("nan")), vals),
                                errors=["transient" if b else None for b in bad.tolist()])

    kw = dict(data_dir=data_root, cache_dir=tmp_path / "cache", n_boot=0, progress=False, limit=8)
    first = Flaky(fail=True)
    r1 = evaluate(first, "mmrb2/t2i", **kw)
    n_bad = r1["mmrb2/t2i"].counts["n_invalid_samples"]
    assert 0 < n_bad < first.n_scored
    again = Flaky(fail=False)
    evaluate(again, "mmrb2/t2i", **kw)
    assert again.n_scored == 0                           # invalid results are cached too
    retry = Flaky(fail=False)
    r3 = evaluate(retry, "mmrb2/t2i", retry_invalid=True, **kw)
    assert retry.n_scored == n_bad                       # only the invalid ones are asked again
    assert r3["mmrb2/t2i"].counts["n_invalid_samples"] == 0


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
