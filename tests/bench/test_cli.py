"""`rewardkit bench --data-dir` cannot silently score the wrong data; invalid runs exit non-zero; the PNG says
which metric each bar shows, draws each metric's chance level, and keeps 0 % apart from missing."""

from __future__ import annotations

import json

import math
import shutil

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("xxhash")

from rewardkit.bench.data import BenchDataError, check_distinct_files, load_comparisons, resolve_local_files  # noqa: E402
from rewardkit.bench.report import chance_level, plot_records  # noqa: E402
from rewardkit.bench.spec import get_spec  # noqa: E402
from rewardkit.bench.synthetic import SYNTHETIC_LAYOUT, write_synthetic_benchmarks  # noqa: E402
from rewardkit.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-cli")
    write_synthetic_benchmarks(root, n_pairs=12, n_groups=3)
    return root


def test_only_t2i_parquet_is_not_mmrb2_edit(data_root, tmp_path):
    only = tmp_path / "mmrb2"
    (only / "t2i").mkdir(parents=True)
    shutil.copy(data_root / SYNTHETIC_LAYOUT["mmrb2/t2i"], only / "t2i")
    assert len(resolve_local_files(get_spec("mmrb2/t2i"), only)) == 1
    with pytest.raises(BenchDataError, match="config 'edit'"):
        resolve_local_files(get_spec("mmrb2/edit"), only)
    # a flat folder cannot say which config its file is: refused with the way out, never guessed
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(data_root / SYNTHETIC_LAYOUT["mmrb2/t2i"], flat)
    for name in ("mmrb2/t2i", "mmrb2/edit"):
        with pytest.raises(BenchDataError, match=r"no file whose path names .*=FILE.parquet"):
            resolve_local_files(get_spec(name), flat)
    # the file itself, given directly, is taken as is
    rows, _ = load_comparisons(get_spec("mmrb2/t2i"), flat / "test-00000-of-00001.parquet")
    assert len(rows) == 12


def test_split_names_match_exactly(data_root, tmp_path):
    src = data_root / SYNTHETIC_LAYOUT["genaibench/t2i"]
    old = tmp_path / "genaibench" / "image_generation"
    old.mkdir(parents=True)
    shutil.copy(src, old / "train-00000-of-00001.parquet")
    shutil.copy(src, old / "train_v1-00000-of-00001.parquet")
    with pytest.raises(BenchDataError, match="split 'test_v1'"):
        resolve_local_files(get_spec("genaibench/t2i"), tmp_path / "genaibench")
    shutil.copy(src, old / "test_v1-00000-of-00001.parquet")
    files = resolve_local_files(get_spec("genaibench/t2i"), tmp_path / "genaibench")
    assert [f.name for f in files] == ["test_v1-00000-of-00001.parquet"]
    # flat, prefixed names from other tools
    (tmp_path / "named").mkdir()
    shutil.copy(src, tmp_path / "named" / "image_generation_test_v1.parquet")
    assert len(resolve_local_files(get_spec("genaibench/t2i"), tmp_path / "named")) == 1


def test_two_benchmarks_on_the_same_files_are_refused(data_root, tiny_clip_dir, tmp_path, capsys):
    f = data_root / SYNTHETIC_LAYOUT["mmrb2/t2i"]
    rc = main(["bench", "-r", "clipscore", "-m", str(tiny_clip_dir), "--benchmark", "mmrb2/t2i,mmrb2/edit",
               "--data-dir", f"mmrb2/t2i={f}", f"mmrb2/edit={f}", "--no-cache", "--output-dir", str(tmp_path),
               "--ignore-sources", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "mmrb2/t2i and mmrb2/edit both resolve to" in err and "loading reward" not in err  # before the model
    # EditReward's K=2 and K=3 specs filter one combined file by its `dataset` column: allowed
    s2, s3 = get_spec("editreward/2pair"), get_spec("editreward/3pair")
    check_distinct_files({s2.name: (s2, [f]), s3.name: (s3, [f])})


def test_edit_benchmark_without_sources_warns(data_root, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(data_root / SYNTHETIC_LAYOUT["mmrb2/edit"])
    i = t.column_names.index("prompt_images")
    t = t.set_column(i, "prompt_images", pa.array([[] for _ in range(t.num_rows)], type=t.schema.field(i).type))
    (tmp_path / "edit").mkdir()
    pq.write_table(t, tmp_path / "edit" / "test-00000-of-00001.parquet")
    with pytest.warns(UserWarning, match="no row has a source image"):
        _, info = load_comparisons(get_spec("mmrb2/edit"), tmp_path)
    assert "no row has a source image" in info["warnings"][0]


def test_every_score_invalid_exits_3(data_root, tmp_path, monkeypatch, capsys):
    import torch

    from rewardkit import Reward, RewardOutput
    from rewardkit.commands import _common

    class Broken(Reward):
        name = "broken"
        tasks = frozenset({"t2i"})

        def _score(self, batch):
            n = len(batch)
            return RewardOutput(scores=torch.full((n,), float("nan")), valid=torch.zeros(n, dtype=torch.bool),
                                errors=["model said nothing"] * n)

    monkeypatch.setattr(_common, "load_reward_cli", lambda *a, **k: Broken())
    rc = main(["bench", "-r", "clipscore", "--benchmark", "mmrb2/t2i", "--data-dir", str(data_root), "--no-cache",
               "--output-dir", str(tmp_path), "--bootstrap", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 3 and "every score of this run is invalid (24 of 24)" in err and "model said nothing" in err


def test_chance_levels():
    assert chance_level("mmrb2_official", {}) == 0.5 and chance_level("accuracy_without_ties", {}) == 0.5
    assert chance_level("genaibench_4way", {}) == 0.25 and chance_level("accuracy_with_ties", {}) == pytest.approx(1 / 3)
    assert chance_level("group_accuracy", {"counts": {"n_comparisons": 18, "n_groups": 6}}) == 1 / math.factorial(3)
    assert chance_level("group_accuracy", {"counts": {"n_comparisons": 36, "n_groups": 6}}) == 1 / math.factorial(4)


def test_plot_labels_metrics_and_separates_zero_from_missing(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    texts, hlines, bars = [], [], []
    orig_text, orig_hl, orig_bar = Axes.text, Axes.hlines, Axes.bar
    monkeypatch.setattr(Axes, "text", lambda self, x, y, s, *a, **k: (texts.append((x, y, s)), orig_text(self, x, y, s, *a, **k))[1])
    monkeypatch.setattr(Axes, "hlines", lambda self, y, *a, **k: (hlines.append(y), orig_hl(self, y, *a, **k))[1])
    monkeypatch.setattr(Axes, "bar", lambda self, x, h, *a, **k: (bars.append((list(x), list(h), k)), orig_bar(self, x, h, *a, **k))[1])

    def br(metric, v, n=12, g=12):
        return {"primary": metric, "metrics": {metric: {"value": v, "ci95": None}}, "counts": {"n_comparisons": n, "n_groups": g}}

    rec = {"reward": {"name": "r", "config": {}}, "benchmarks": {
        "mmrb2/t2i": br("mmrb2_official", 0.0), "genaibench/t2i": br("genaibench_4way", 0.5),
        "editreward/3pair": br("group_accuracy", None, 18, 6)}}
    out = plot_records([rec], tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [s for _, _, s in texts]
    assert "0.0%\nMMRB2 official" in labels and "50.0%\n4-way" in labels and "missing" in labels
    assert sorted(hlines) == [25.0, 50.0]  # each bar's own chance level; none for the missing one
    zero = next(b for b in bars if b[1] == [0.8])
    assert zero[2].get("edgecolor") is not None  # a visible outlined stub, not an empty slot
    missing = next(b for b in bars if b[2].get("hatch"))
    assert missing[1] == [100]


# ------------------------------------------------------------------ records, names, refusals (issue 22)
def _judge_reward():
    import dataclasses

    import numpy as np
    import torch

    from rewardkit import Reward, RewardOutput
    from rewardkit.reward import RewardConfig

    @dataclasses.dataclass
    class Cfg(RewardConfig):
        judge: str = "openai:http://127.0.0.1:8000/v1"
        temperature: float = 0.0

    class Bright(Reward):
        name = "bright"
        tasks = frozenset({"t2i"})
        Config = Cfg

        def _score(self, batch):
            return RewardOutput(scores=torch.tensor([float(np.asarray(im).mean()) for im in batch.images]))

    return Bright


def _bench(data_root, tmp_path, *extra, reward=None, monkeypatch=None):
    from rewardkit.commands import _common

    cls = reward or _judge_reward()
    monkeypatch.setattr(_common, "load_reward_cli", lambda name, config, kwargs: cls(**kwargs))
    return main(["bench", "-r", "bright", "-b", "mmrb2/t2i", "--data-dir", str(data_root), "--no-cache",
                 "--output-dir", str(tmp_path / "out"), "--bootstrap", "0", "--no-progress", *extra])


def test_runs_of_one_reward_with_different_options_never_overwrite(data_root, tmp_path, monkeypatch, capsys):
    """The record name carries the configuration (--set options, the judge), so two configurations give two
    records; the report and plot labels tell them apart; rerunning one configuration says it replaces it."""
    from rewardkit.bench.report import labels, load_records

    cls = _judge_reward()
    assert _bench(data_root, tmp_path, reward=cls, monkeypatch=monkeypatch) == 0
    assert _bench(data_root, tmp_path, "--set", "judge=vllm:Qwen/Qwen3-VL-8B-Instruct", reward=cls,
                  monkeypatch=monkeypatch) == 0
    assert _bench(data_root, tmp_path, "--set", "temperature=0.7", reward=cls, monkeypatch=monkeypatch) == 0
    recs = sorted((tmp_path / "out").glob("*.json"))
    assert len(recs) == 3 and len({p.stem for p in recs}) == 3
    assert all(p.stem.startswith("bright-") for p in recs)
    capsys.readouterr()
    assert _bench(data_root, tmp_path, "--set", "temperature=0.7", reward=cls, monkeypatch=monkeypatch) == 0
    assert "note: replacing" in capsys.readouterr().err and len(list((tmp_path / "out").glob("*.json"))) == 3
    names = labels(load_records(recs))
    assert len(set(names)) == 3
    assert any("judge=vllm:Qwen/Qwen3-VL-8B-Instruct" in n for n in names)
    assert any("temperature=0.7" in n for n in names)
    # two runs of one configuration (two records, e.g. different benchmarks) stay apart too
    same = load_records([recs[0], recs[0]])
    assert labels(same) == [labels(same)[0], labels(same)[0] + " #2"]


def test_plot_legend_names_each_reward_by_its_colour_even_when_its_first_benchmark_was_skipped(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    seen = {}
    orig = Axes.legend
    monkeypatch.setattr(Axes, "legend", lambda self, *a, **k: (seen.update(k), orig(self, *a, **k))[1])

    def br(v):
        return {"primary": "mmrb2_official", "metrics": {"mmrb2_official": {"value": v, "ci95": None}}}

    skipped = {"reward": {"name": "edit-only", "config": {}},
               "benchmarks": {"mmrb2/t2i": {"skipped": "needs sources"}, "mmrb2/edit": br(0.6)}}
    full = {"reward": {"name": "both", "config": {}}, "benchmarks": {"mmrb2/t2i": br(0.7), "mmrb2/edit": br(0.5)}}
    plot_records([full, skipped], tmp_path / "p.png")
    by_label = {h.get_label(): h for h in seen["handles"]}
    from matplotlib.colors import to_rgba

    # each reward's legend entry is a filled patch in its bars' colour (C0, C1), not the hatched "missing" bar
    assert by_label["both"].get_facecolor() == to_rgba("C0")
    assert by_label["edit-only"].get_facecolor() == to_rgba("C1") and not by_label["edit-only"].get_hatch()
    assert "missing / skipped" in by_label


def test_mixed_shard_sets_and_duplicate_ids_are_refused(data_root, tmp_path, monkeypatch, capsys):
    root = tmp_path / "data"
    shutil.copytree(data_root, root)
    t2i = root / "mmrb2" / "t2i"
    good = t2i / "test-00000-of-00001.parquet"
    # a stale one-shard download beside a new two-shard one
    shutil.copy(good, t2i / "test-00000-of-00002.parquet")
    shutil.copy(good, t2i / "test-00001-of-00002.parquet")
    assert _bench(root, tmp_path, monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert "mixed shard sets" in err and "test-00000-of-00001.parquet" in err and "test-00001-of-00002.parquet" in err
    # a complete set whose shards repeat rows (ids) of each other
    good_copy = tmp_path / "good.parquet"
    shutil.copy(good, good_copy)
    good.unlink()
    assert _bench(root, tmp_path, monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert "appear in more than one file" in err and "test-00000-of-00002.parquet" in err and "test-00001-of-00002.parquet" in err
    # ids repeated within one file are the dataset's layout, not a stale copy: accepted
    import pyarrow as pa
    import pyarrow.parquet as pq

    (t2i / "test-00001-of-00002.parquet").unlink()
    table = pq.read_table(t2i / "test-00000-of-00002.parquet")
    pq.write_table(pa.concat_tables([table, table]), t2i / "test-00000-of-00001.parquet")
    (t2i / "test-00000-of-00002.parquet").unlink()
    assert _bench(root, tmp_path, monkeypatch=monkeypatch) == 0
    capsys.readouterr()
    # an incomplete set
    shutil.copy(good_copy, t2i / "test-00000-of-00002.parquet")
    (t2i / "test-00000-of-00001.parquet").unlink()
    assert _bench(root, tmp_path, monkeypatch=monkeypatch) == 2
    assert "incomplete shard set" in capsys.readouterr().err


def test_typos_and_bad_numbers_exit_2_with_the_valid_names(data_root, tmp_path, monkeypatch, capsys):
    # a NAME=DIR key that names no benchmark of the run would send it to the hub silently
    assert _bench(data_root, tmp_path, "--data-dir", f"mmrb2/t2x={data_root / 'mmrb2'}", monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert "'mmrb2/t2x'" in err and "valid keys: mmrb2, mmrb2/t2i" in err
    # a --by column no benchmark has
    assert _bench(data_root, tmp_path, "--by", "modle_a", monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert "'modle_a'" in err and "model_a" in err
    assert _bench(data_root, tmp_path, "--by", "prompt_metadata.categroy", monkeypatch=monkeypatch) == 2
    capsys.readouterr()
    assert _bench(data_root, tmp_path, "--by", "model_a", monkeypatch=monkeypatch) == 0  # the right name works
    assert _bench(data_root, tmp_path, "--bootstrap", "-5", monkeypatch=monkeypatch) == 2
    assert "--bootstrap must be >= 0" in capsys.readouterr().err
    assert _bench(data_root, tmp_path, "--wrong-examples", "-1", monkeypatch=monkeypatch) == 2
    assert "--wrong-examples must be >= 0" in capsys.readouterr().err
    assert _bench(data_root, tmp_path, "--wrong-examples", "2", monkeypatch=monkeypatch) == 0  # reaches the record
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")]
    assert len(rec["benchmarks"]["mmrb2/t2i"]["wrong_pairs"]["pairs"]) == 2


def test_evaluate_refuses_negative_bootstrap_and_unknown_keys(data_root):
    from rewardkit.bench import evaluate
    from rewardkit.bench.data import BenchDataError

    r = _judge_reward()()
    with pytest.raises(ValueError, match="n_boot"):
        evaluate(r, "mmrb2/t2i", data_dir=data_root, cache_dir=None, n_boot=-5, progress=False)
    with pytest.raises(BenchDataError, match="valid keys"):
        evaluate(r, "mmrb2/t2i", data_dir={"mmrb2/t2x": data_root}, cache_dir=None, n_boot=0, progress=False)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_exits_with_the_same_code_under_torchrun(data_root, tmp_path, tiny_clip_dir):
    """Some samples invalid (an undecodable image): exit 3. Under torchrun each rank returns 3, not only
    rank 0 (before, rank 1 returned 0 and torchrun's report named rank 0 alone)."""
    import os
    import re
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "data"
    shutil.copytree(data_root / "mmrb2", root / "mmrb2")
    f = root / "mmrb2" / "t2i" / "test-00000-of-00001.parquet"
    t = pq.read_table(f)
    col = "response_a_images"  # the spec's image_a column
    rows = t.column(col).to_pylist()
    rows[0] = [{"bytes": b"not an image", "path": None}]
    t = t.set_column(t.column_names.index(col), col, pa.array(rows, type=t.schema.field(col).type))
    pq.write_table(t, f)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "rewardkit.cli", "bench", "-r", "clipscore", "-m", str(tiny_clip_dir), "--device", "cpu", "-b",
           "mmrb2/t2i", "--data-dir", str(root), "--no-cache", "--bootstrap", "0", "--no-progress",
           "-o", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    codes = {int(r): int(c) for r, c in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n[^\n]*exitcode\s*:\s*(-?\d+)", proc.stderr)}
    assert codes == {0: 3, 1: 3}, proc.stderr[-4000:]
    assert len(list((tmp_path / "out").glob("*.json"))) == 1  # rank 0 wrote the record, once
