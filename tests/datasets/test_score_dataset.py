"""``rewardkit score --dataset`` / ``rewardkit.datasets.score_dataset``: Parquet, WebDataset and Hugging Face
datasets in, one Parquet score file per shard out; resume per shard; bad input named.

Expected scores come from calling the reward directly on the decoded images (the documented ``Reward`` call),
not from the dataset path under test.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tests.helpers.data_files import png_bytes, wds_set, write_tar  # noqa: E402


def write_parquet_set(root: Path, shards: int = 2, rows: int = 5, corrupt: tuple[int, int] | None = None) -> list[dict]:
    """``root/part-<s>.parquet`` with uid / image bytes / prompt; returns every row in order."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(shards):
        recs = [{"uid": s * 1000 + i, "image": png_bytes(s * 1000 + i), "prompt": f"a photo of thing {s}-{i}"}
                for i in range(rows)]
        if corrupt == (s, 2):
            recs[2]["image"] = b"not an image at all"
        pq.write_table(pa.Table.from_pylist(recs), root / f"part-{s}.parquet")
        out += recs
    return out


@pytest.fixture(scope="module")
def reward(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("pickscore", model=str(tiny_clip_dir))


def direct(reward, images, prompts) -> list[float]:
    return [float(x) for x in reward(images, prompts, on_error="nan").scores.tolist()]


def read_dir(out: Path):
    man = json.loads((out / "_rewardkit_scores.json").read_text())
    return pa.concat_tables([pq.read_table(out / f"{n}.parquet") for n in man["shards"]]).to_pandas(), man


def test_parquet_scores_match_the_reward_and_carry_ids_and_metadata(reward, tmp_path):
    from rewardkit.datasets import score_dataset

    rows = write_parquet_set(tmp_path / "data", corrupt=(1, 2))
    summary = score_dataset(reward, tmp_path / "data", tmp_path / "out", id_column="uid", batch_size=3,
                            progress=False)
    assert (summary.rows, summary.invalid, summary.shards_scored) == (10, 1, 2)
    df, man = read_dir(tmp_path / "out")
    assert man["shards"] == ["part-0", "part-1"] and man["reward"] == "pickscore"
    assert df["id"].tolist() == [r["uid"] for r in rows]
    assert df["row"].tolist() == list(range(5)) * 2
    want = direct(reward, [r["image"] for r in rows], [r["prompt"] for r in rows])
    got = df["score"].tolist()
    assert np.isnan(got[7]) and np.isnan(want[7])
    assert not df["valid"][7] and "image" in df["error"][7].lower()
    # batches of 3 here, of 10 there: within float rounding of the score scale (the CLIP tower's last layer runs
    # one row per image, whose matmul kernels block by the batch size)
    scale = np.nanmax(np.abs(want))
    np.testing.assert_allclose(np.delete(got, 7), np.delete(want, 7), rtol=1e-6, atol=1e-6 * scale)
    meta = json.loads(pq.read_schema(tmp_path / "out" / "part-0.parquet").metadata[b"rewardkit"])
    assert meta["reward"] == "pickscore" and meta["config"]["model"] and meta["fingerprint"] == man["fingerprint"]
    assert meta["input_shard"].endswith("part-0.parquet") and meta["rewardkit_version"]


def test_paths_relative_to_the_shard_and_hf_image_structs(reward, tmp_path):
    from rewardkit.datasets import score_dataset

    d = tmp_path / "data"
    (d / "imgs").mkdir(parents=True)
    imgs = [png_bytes(i) for i in range(3)]
    for i, b in enumerate(imgs):
        (d / "imgs" / f"{i}.png").write_bytes(b)
    pq.write_table(pa.table({"file": [f"imgs/{i}.png" for i in range(3)], "caption": ["x", "y", "z"]}),
                   d / "a.parquet")
    pq.write_table(pa.table({"file": [{"bytes": b, "path": None} for b in imgs], "caption": ["x", "y", "z"]}),
                   tmp_path / "b.parquet")
    score_dataset(reward, d / "a.parquet", tmp_path / "o1", image_column="file", progress=False)
    score_dataset(reward, tmp_path / "b.parquet", tmp_path / "o2", image_column="file", progress=False)
    want = direct(reward, imgs, ["x", "y", "z"])
    for o in ("o1", "o2"):
        df, _ = read_dir(tmp_path / o)
        np.testing.assert_allclose(df["score"], want, rtol=1e-6)


def test_webdataset_shards_stream_with_keys_and_per_sample_errors(reward, tmp_path):
    from rewardkit.datasets import score_dataset

    samples = wds_set(tmp_path / "wds")
    del samples[5]["png"]  # shard 1, sample 1 has no image member
    write_tar(tmp_path / "wds" / "shard-001.tar", samples[4:])
    summary = score_dataset(reward, str(tmp_path / "wds" / "shard-{000..001}.tar"), tmp_path / "out",
                            prompt_column="txt", progress=False)
    assert (summary.rows, summary.invalid) == (8, 1)
    df, man = read_dir(tmp_path / "out")
    assert man["shards"] == ["shard-000", "shard-001"]
    assert df["id"].tolist() == [s["__key__"] for s in samples]
    assert "no image member" in df["error"][5]
    ok = [i for i in range(8) if i != 5]
    want = direct(reward, [samples[i]["png"] for i in ok], [samples[i]["txt"].decode() for i in ok])
    np.testing.assert_allclose(df["score"][ok], want, rtol=1e-6)


def test_hf_save_to_disk_with_image_feature(reward, tmp_path):
    datasets = pytest.importorskip("datasets")
    from rewardkit.datasets import score_dataset

    imgs = [Image.open(io.BytesIO(png_bytes(i))).convert("RGB") for i in range(6)]
    ds = datasets.Dataset.from_dict({"image": imgs, "prompt": [f"p{i}" for i in range(6)], "key": list("abcdef")},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "prompt": datasets.Value("string"),
                                                                "key": datasets.Value("string")}))
    ds.save_to_disk(str(tmp_path / "hf"))
    summary = score_dataset(reward, tmp_path / "hf", tmp_path / "out", id_column="key", num_shards=2,
                            batch_size=4, progress=False)
    assert (summary.rows, summary.shards_scored) == (6, 2)
    df, man = read_dir(tmp_path / "out")
    assert man["format"] == "hf" and df["id"].tolist() == list("abcdef")
    # batches of 4 vs one call of 6: float32 matmul order differs in the last bit
    np.testing.assert_allclose(df["score"], direct(reward, imgs, [f"p{i}" for i in range(6)]), rtol=1e-5, atol=1e-5)


class _Interrupting:
    """The reward, interrupted (KeyboardInterrupt) on its ``after``-th call: a run killed mid-shard."""

    def __init__(self, reward, after: int):
        self.reward, self.after, self.calls = reward, after, 0
        self.name, self.dimensions, self.uses_prompt, self.config = reward.name, reward.dimensions, True, reward.config

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls == self.after:
            raise KeyboardInterrupt
        return self.reward(*a, **k)


def test_resume_skips_finished_shards_and_redoes_the_interrupted_one(reward, tmp_path):
    from rewardkit.datasets import score_dataset

    write_parquet_set(tmp_path / "data", shards=3, rows=4)
    score_dataset(reward, tmp_path / "data", tmp_path / "full", batch_size=2, progress=False)
    flaky = _Interrupting(reward, after=4)  # shard 0 = calls 1-2, shard 1 = 3 then interrupted at 4
    with pytest.raises(KeyboardInterrupt):
        score_dataset(flaky, tmp_path / "data", tmp_path / "out", batch_size=2, progress=False)
    out = tmp_path / "out"
    assert (out / "part-0.parquet").exists() and not (out / "part-1.parquet").exists()
    assert not (out / "_partial" / "part-1").exists()  # fewer rows than one row group: nothing committed yet
    done_before = (out / "part-0.parquet").stat().st_mtime_ns
    counting = _Interrupting(reward, after=-1)
    summary = score_dataset(counting, tmp_path / "data", out, batch_size=2, progress=False)
    assert (summary.shards_skipped, summary.shards_scored, summary.rows) == (1, 2, 8)
    assert counting.calls == 4  # shards 1 and 2, two batches each: no row of shard 0 scored twice
    assert (out / "part-0.parquet").stat().st_mtime_ns == done_before
    assert not list(out.glob("*.tmp"))
    a, _ = read_dir(tmp_path / "full")
    b, _ = read_dir(out)
    assert a.equals(b)


def test_a_different_reward_config_refuses_the_folder(reward, tmp_path, tiny_clip_dir):
    from rewardkit import load_reward
    from rewardkit.commands import UsageError
    from rewardkit.datasets import score_dataset

    write_parquet_set(tmp_path / "data", shards=1, rows=2)
    score_dataset(reward, tmp_path / "data", tmp_path / "out", progress=False)
    other = load_reward("clipscore", model=str(tiny_clip_dir))
    with pytest.raises(UsageError, match="different reward.*pickscore.*clipscore"):
        score_dataset(other, tmp_path / "data", tmp_path / "out", progress=False)
    with pytest.raises(UsageError, match="different reward.*columns"):
        score_dataset(reward, tmp_path / "data", tmp_path / "out", id_column="uid", progress=False)
    again = score_dataset(reward, tmp_path / "data", tmp_path / "out", progress=False)
    assert (again.shards_skipped, again.rows) == (1, 0)


def _cli(*argv: str) -> int:
    from rewardkit.cli import main

    return main(list(argv))


def test_cli_dataset_form_writes_scores_and_resumes(tiny_clip_dir, tmp_path, capsys):
    write_parquet_set(tmp_path / "data", shards=2, rows=3, corrupt=(0, 2))
    args = ["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "data" / "*.parquet"),
            "--output", str(tmp_path / "out"), "--id-column", "uid", "--no-progress"]
    assert _cli(*args) == 3  # one corrupt row: finished, some rows invalid
    assert "scored 6 row(s) in 2 shard(s) (1 invalid" in capsys.readouterr().err
    assert _cli(*args) == 0
    assert "scored 0 row(s) in 0 shard(s) (0 invalid); 2 shard(s) already done" in capsys.readouterr().err
    assert _cli(*args[:-1], "--set", "scale=2.0", "--no-progress") == 2
    assert "different reward (config scale" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["not_a_tar", "missing_column", "schema_mismatch", "truncated_tar"])
def test_bad_datasets_stop_with_exit_2_naming_shard_and_column(tiny_clip_dir, tmp_path, capsys, case):
    if case == "not_a_tar":
        wds_set(tmp_path / "d", shards=1)
        (tmp_path / "d" / "shard-001.tar").write_bytes(b"this is not a tar archive" * 40)
        data, expect = str(tmp_path / "d" / "*.tar"), ["shard-001.tar", "not a readable tar"]
    elif case == "truncated_tar":
        wds_set(tmp_path / "d", shards=1, rows=3)
        raw = (tmp_path / "d" / "shard-000.tar").read_bytes()
        (tmp_path / "d" / "shard-000.tar").write_bytes(raw[:1500])
        data, expect = str(tmp_path / "d"), ["shard-000.tar", "truncated"]
    elif case == "missing_column":
        write_parquet_set(tmp_path / "d", shards=1)
        data, expect = str(tmp_path / "d"), ["part-0.parquet", "no column 'picture'", "uid, image, prompt"]
    else:
        write_parquet_set(tmp_path / "d", shards=1)
        pq.write_table(pa.table({"uid": ["x"], "image": ["a.png"], "prompt": ["p"]}), tmp_path / "d" / "part-9.parquet")
        data, expect = str(tmp_path / "d"), ["part-9.parquet", "column 'image' is string", "schema mismatch"]
    extra = ["--image-column", "picture"] if case == "missing_column" else []
    rc = _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", data, "--output",
              str(tmp_path / "out"), "--no-progress", *extra)
    err = capsys.readouterr().err
    assert rc == 2, err
    for e in expect:
        assert e in err, err
    if case != "truncated_tar":  # checked before any shard is scored
        assert not list((tmp_path / "out").glob("*.parquet"))


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_deals_shards_over_ranks_and_writes_the_one_process_bytes(tiny_clip_dir, tmp_path):
    import os
    import subprocess
    import sys

    write_parquet_set(tmp_path / "data", shards=3, rows=4, corrupt=(2, 2))
    common = ["score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--device", "cpu", "--dataset",
              str(tmp_path / "data"), "--batch-size", "3", "--no-progress"]
    assert _cli(*common, "--output", str(tmp_path / "one")) == 3
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "rewardkit.cli", *common, "--output", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "scored 12 row(s) in 3 shard(s) (1 invalid" in proc.stderr, proc.stderr[-3000:]
    for name in ("part-0.parquet", "part-1.parquet", "part-2.parquet", "_rewardkit_scores.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_source_columns_give_each_row_its_source_images(tmp_path):
    """One source column of single images plus one of image lists: each row's sources, in column order."""
    from rewardkit.datasets import open_dataset
    from rewardkit.datasets.readers import Columns, iter_batches, resolve

    a, b, c = png_bytes(1), png_bytes(2), png_bytes(3)
    pq.write_table(pa.table({"image": [a, b], "prompt": ["x", "y"], "src": [b, None],
                             "refs": [[c, a], [c]]}), tmp_path / "e.parquet")
    ds = open_dataset(tmp_path / "e.parquet")
    cols = resolve(ds, Columns(sources=["src", "refs"]), needs_prompt=True)
    (batch,) = list(iter_batches(ds, ds.shards[0], cols, 8))
    assert batch["sources"][0] == [b, c, a]
    assert batch["error"] == [None, "source column 'src': no image (the cell is null)"]


def test_hf_prefix_loads_with_load_dataset(reward, tmp_path):
    """``hf:PATH`` goes through ``datasets.load_dataset`` (the hub-id code path), here on a local folder."""
    pytest.importorskip("datasets")
    from rewardkit.datasets import open_dataset, score_dataset

    rows = write_parquet_set(tmp_path / "data", shards=1, rows=4)
    ds = open_dataset(f"hf:{tmp_path / 'data'}", split="train")
    assert ds.format == "hf" and len(ds.hf) == 4 and ds.split == "train"
    score_dataset(reward, ds, tmp_path / "out", id_column="uid", progress=False)
    df, man = read_dir(tmp_path / "out")
    assert df["id"].tolist() == [r["uid"] for r in rows] and man["format"] == "hf"
    np.testing.assert_allclose(df["score"], direct(reward, [r["image"] for r in rows], [r["prompt"] for r in rows]),
                               rtol=1e-5, atol=1e-5)


def test_score_files_hold_few_row_groups_and_on_error_raise_names_the_row(reward, tmp_path, tiny_clip_dir, capsys):
    from rewardkit.datasets import score_dataset
    from rewardkit.datasets import output

    write_parquet_set(tmp_path / "data", shards=1, rows=9, corrupt=(0, 2))
    old, output.ROW_GROUP = output.ROW_GROUP, 4
    try:
        score_dataset(reward, tmp_path / "data", tmp_path / "out", batch_size=2, progress=False)
    finally:
        output.ROW_GROUP = old
    meta = pq.ParquetFile(tmp_path / "out" / "part-0.parquet").metadata
    assert meta.num_rows == 9 and meta.num_row_groups == 3  # 4 + 4 + 1 rows, not one group per batch of 2
    rc = _cli("score", "-r", "pickscore", "-m", str(tiny_clip_dir), "--dataset", str(tmp_path / "data"),
              "--output", str(tmp_path / "o2"), "--on-error", "raise", "--id-column", "uid", "--no-progress")
    err = capsys.readouterr().err
    assert rc == 2 and "part-0.parquet row 2 (id 2)" in err, err
    assert not (tmp_path / "o2" / "part-0.parquet").exists()


def test_the_ray_engine_lives_in_datasets_and_the_old_imports_still_work():
    """Issue 39 item 3: both dataset engines live in ``rewardkit.datasets`` (``scoring`` local, ``ray_engine`` Ray);
    ``rewardkit.integrations.ray`` keeps ``RewardScorer`` and hands on the names that moved, as the same objects.
    Catches a moved name not re-exported (users' ``from rewardkit.integrations.ray import ...`` breaking) and a
    second copy of a class left behind (``isinstance`` against the old path failing)."""
    import rewardkit.datasets as datasets
    import rewardkit.integrations.ray as glue
    from rewardkit.datasets import ray_engine, scoring

    assert glue.RewardSpec is datasets.RewardSpec is scoring.RewardSpec
    assert glue.score_dataset_ray is datasets.score_dataset_ray is ray_engine.score_dataset_ray
    assert glue.run_on_ray is ray_engine.run_on_ray
    assert sorted(glue.__all__) == ["RewardScorer", "RewardSpec", "run_on_ray", "score_dataset_ray"]
    assert glue.RewardScorer.__module__ == "rewardkit.integrations.ray"
    assert scoring.is_spec(glue.RewardSpec("pickscore"))  # the local engine takes the recipe from either path
