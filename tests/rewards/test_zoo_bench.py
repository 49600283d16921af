"""`rewardkit bench` runs the published rewards (tiny converted checkpoints) on the synthetic benchmark data."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    from rewardkit.bench.synthetic import write_synthetic_benchmarks

    root = tmp_path_factory.mktemp("zoo-bench-data")
    write_synthetic_benchmarks(root, n_pairs=6, n_groups=2)
    return root


@pytest.mark.parametrize("name,benchmarks", [
    ("hpsv2", ("mmrb2/t2i", "genaibench/t2i")), ("aesthetic", ("mmrb2/t2i", "genaibench/t2i")),
    ("imagereward", ("mmrb2/t2i", "genaibench/t2i")), ("hpsv3", ("mmrb2/t2i",)),
    ("editreward", ("genaibench/edit", "editreward/2pair")), ("vqascore", ("mmrb2/t2i",))])
def test_bench_runs_zoo_reward(name, benchmarks, data_root, tmp_path, capsys):
    from rewardkit.cli import main
    from rewardkit.registry import get_reward_class

    reward = get_reward_class(name).tiny(str(tmp_path))
    model = reward.config.model or reward.config.judge.partition(":")[2]  # judge rewards: the judge checkpoint
    out = tmp_path / "out"
    rc = main(["bench", "--reward", name, "--model", model, "--benchmark", ",".join(benchmarks),
               "--data-dir", str(data_root), "--no-cache", "--output-dir", str(out), "--bootstrap", "0",
               "--no-progress", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(next(out.glob("*.json")).read_text())
    for b in benchmarks:
        res = rec["benchmarks"][b]
        assert res["counts"]["n_invalid_samples"] == 0 and res["counts"]["n_scored_now"] > 0
        primary = res["metrics"][res["primary"]]
        assert 0.0 <= primary["value"] <= 1.0 and primary["n"] > 0
