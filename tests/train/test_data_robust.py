"""Issue 9, item 10: bad preference-training data is found before step 1 (index + file), can be skipped
with the count logged, and never stops a run once it has started."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rewardkit.config import load_config
from rewardkit.train.data import DataRowError, PairCollator, load_pairs, preflight_pairs
from rewardkit.train.trainer import PreferenceTrainConfig, PreferenceTrainer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "arena_rm" / "tiny.yaml"
MISSING, BAD_HEADER, BAD_BODY = 3, 7, 9  # row indices


@pytest.fixture(scope="module")
def bad_folder(tmp_path_factory) -> Path:
    """24 pairs; row 3 names a missing file, row 7 a file that is not an image, row 9 a PNG whose header is
    fine but whose pixel data is cut (only decoding finds it)."""
    d = tmp_path_factory.mktemp("badpairs")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        tex = rng.uniform(0.3, 1.0, (32, 32, 3))
        Image.fromarray((tex * 250).astype("uint8")).save(d / f"{i}_bright.png")
        Image.fromarray((tex * 90).astype("uint8")).save(d / f"{i}_dark.png")
        rows.append({"prompt": "a texture", "image_a": f"{i}_bright.png", "image_b": f"{i}_dark.png", "label": "A"})
    rows[MISSING]["image_a"] = "gone.png"
    (d / "notes.png").write_bytes(b"this is not an image at all")
    rows[BAD_HEADER]["image_b"] = "notes.png"
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    (d / "cut.png").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    rows[BAD_BODY]["image_a"] = "cut.png"
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def tiny_cfg(out: Path, data: Path, *overrides: str) -> PreferenceTrainConfig:
    return load_config(PreferenceTrainConfig, TINY, [
        f"output_dir={out}", "progress=false", f"data.train={data}", "data.eval=null", "max_steps=3",
        "save_every=0", "log_every=1", *overrides])


def test_preflight_reports_every_bad_row_with_index_and_path(bad_folder, monkeypatch):
    from rewardkit import media

    def no_decoding(x, *a):
        raise AssertionError("the preflight must read headers only")

    monkeypatch.setattr(media, "_to_pil", no_decoding)
    ds, base = load_pairs(str(bad_folder))
    bad = preflight_pairs(ds, base, workers=4)
    assert [(b.index, b.column) for b in bad] == [(MISSING, "image_a"), (BAD_HEADER, "image_b")]
    assert bad[0].where.endswith("gone.png") and "file not found" in bad[0].reason
    assert bad[1].where.endswith("notes.png") and "not a recognised image" in bad[1].reason
    assert str(bad[0]).startswith(f"row {MISSING}: image_a (")


def test_preflight_reads_embedded_images_without_decoding():
    from rewardkit.train.data import synthetic_brightness_pairs

    ds = synthetic_brightness_pairs(8)
    assert preflight_pairs(ds) == []


def test_collator_names_row_and_file(bad_folder):
    ds, base = load_pairs(str(bad_folder))

    class Enc:  # the collator only needs encode(); decoding happens before it
        def encode(self, images, prompts, sources=None):
            return {"n": len(images)}

    with pytest.raises(DataRowError, match=rf"row {BAD_BODY}: image_a \(.*cut\.png\).*truncated"):
        PairCollator(Enc(), base)([ds[i] for i in (8, BAD_BODY)], [8, BAD_BODY])
    out = PairCollator(Enc(), base, skip_bad=True)([ds[i] for i in (8, BAD_BODY)], [8, BAD_BODY])
    assert out["keep"].tolist() == [True, False] and out["weight"].tolist() == [1.0, 0.0]
    assert out["skipped"][0].index == BAD_BODY and out["inputs"] == {"n": 4}


def test_training_fails_before_step_one_listing_every_bad_row(bad_folder, tmp_path):
    with pytest.raises(DataRowError) as info:
        PreferenceTrainer(tiny_cfg(tmp_path / "run", bad_folder))
    msg = str(info.value)
    assert f"row {MISSING}: image_a" in msg and "gone.png" in msg
    assert f"row {BAD_HEADER}: image_b" in msg and "notes.png" in msg
    assert "data.skip_bad_rows=true" in msg
    listed = [json.loads(x) for x in (tmp_path / "run" / "bad_rows_train.jsonl").read_text().splitlines()]
    assert [r["index"] for r in listed] == [MISSING, BAD_HEADER]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_bad_rows_and_never_die_mid_run(bad_folder, tmp_path, workers, capfd):
    """Rows 3 and 7 are dropped by the preflight (count logged); row 9 passes the header check and fails
    only when decoded, mid-run: the run goes on and reports it."""
    out = tmp_path / "run"
    # global batch 22 = all remaining rows: each of the 2 steps (epochs) meets row 9
    cfg = tiny_cfg(out, bad_folder, "data.skip_bad_rows=true", f"data_workers={workers}", "global_batch_size=22",
                   "micro_batch_size=2", "num_epochs=2", "max_steps=2")
    summary = PreferenceTrainer(cfg).train()
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    info = next(r for r in recs if r["split"] == "info")
    assert info["bad_rows_skipped"] == 2 and info["train_pairs"] == 22
    train = [r for r in recs if r["split"] == "train"]
    assert train[-1]["step"] == 2 and train[-1]["rows_skipped"] == 2  # row 9, once per step
    assert all(np.isfinite(r["loss"]) for r in train)
    assert summary["model_dir"]
    assert all(r["pairs"] == 21 for r in train)
    assert f"row {BAD_BODY}: image_a" in capfd.readouterr().err  # named by its index in the data file  # the skipped row's placeholder is not in the metrics


def _pairs_with_a_bad_label(d: Path) -> Path:
    """12 pairs; row 4 has the label "maybe", row 6 names a missing image."""
    d.mkdir()
    rng = np.random.default_rng(1)
    rows = []
    for i in range(12):
        tex = rng.uniform(0.3, 1.0, (32, 32, 3))
        Image.fromarray((tex * 250).astype("uint8")).save(d / f"{i}_a.png")
        Image.fromarray((tex * 90).astype("uint8")).save(d / f"{i}_b.png")
        rows.append({"prompt": "a texture", "image_a": f"{i}_a.png", "image_b": f"{i}_b.png", "label": "A"})
    rows[4]["label"] = "maybe"
    rows[6]["image_b"] = "gone.png"
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_bad_labels_are_preflight_row_errors(tmp_path):
    """Bug: a bad label failed at load time (load_pairs' label check), before the preflight, so
    ``data.skip_bad_rows`` could not skip it. Loaded without that check, the preflight lists it with the others."""
    d = _pairs_with_a_bad_label(tmp_path / "pairs")
    with pytest.raises(ValueError, match="bad labels"):      # callers without a preflight still check at load
        load_pairs(str(d))
    ds, base = load_pairs(str(d), check_labels=False)
    assert len(ds) == 12
    assert [(b.index, b.column) for b in preflight_pairs(ds, base, workers=2)] == [(4, "label"), (6, "image_b")]


@pytest.mark.slow
def test_skip_bad_rows_drops_a_bad_label_like_any_bad_row(tmp_path):
    """The trainer end to end: the bad label is listed with the other bad rows (one error, both rows), and
    ``data.skip_bad_rows`` drops it (before: a ValueError at load, whatever skip_bad_rows said)."""
    d = _pairs_with_a_bad_label(tmp_path / "pairs")
    with pytest.raises(DataRowError) as info:
        PreferenceTrainer(tiny_cfg(tmp_path / "run", d))
    msg = str(info.value)
    assert "row 4: label" in msg and "'maybe'" in msg and "row 6: image_b" in msg
    trainer = PreferenceTrainer(tiny_cfg(tmp_path / "run2", d, "data.skip_bad_rows=true"))
    assert trainer.n_bad_rows == 2
    listed = [json.loads(x) for x in (tmp_path / "run2" / "bad_rows_train.jsonl").read_text().splitlines()]
    assert [(r["index"], r["column"]) for r in listed] == [(4, "label"), (6, "image_b")]
    # the evaluation file too (its labels were still checked at load: a ValueError whatever skip_bad_rows said)
    trainer = PreferenceTrainer(tiny_cfg(tmp_path / "run3", d, f"data.eval={d}", "data.skip_bad_rows=true"))
    listed = [json.loads(x) for x in (tmp_path / "run3" / "bad_rows_eval.jsonl").read_text().splitlines()]
    assert [(r["index"], r["column"]) for r in listed] == [(4, "label"), (6, "image_b")]
    assert len(trainer.eval_ds) == 10
