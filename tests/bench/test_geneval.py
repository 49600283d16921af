"""``rewardkit bench geneval``: the official layout in, the official per-image results and summary out.

The summary's reference is djghosh13/geneval's ``evaluation/summary_scores.py``: the official script itself
when a checkout is given (``GENEVAL_REPO``), else its pandas code transcribed line for line in
``tests/helpers/geneval_summary_official.py``, run by a Python with pandas (``REWARDKIT_PANDAS_PYTHON``, or the
parity environment ``~/.cache/rewardkit/parity/geneval-summary``); plus a hand-computed case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewardkit.bench import geneval as ge
from tests.helpers.geneval_layouts import METADATA, BrightIsCorrect, write_layout, write_metadata

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
OFFICIAL_KEYS = ["filename", "tag", "prompt", "correct", "reason", "metadata", "details"]  # evaluate_images.py:247-258


def _rec(tag, correct, meta):
    return {"tag": tag, "correct": correct, "metadata": meta}


# tags appear in the order counting, colors, single_object (not alphabetical: the official groupby(sort=False))
RECORDS = [_rec("counting", True, "m1"), _rec("counting", False, "m1"), _rec("colors", False, "m2"),
           _rec("counting", False, "m3"), _rec("colors", False, "m2"), _rec("single_object", True, "m4"),
           _rec("counting", True, "m3")]


def test_summary_hand_computed():
    s = ge.summarize(RECORDS)
    # 7 images; prompts m1..m4; 3 correct images; prompts with any correct: m1, m3, m4 -> 3 / 4
    # counting 2 / 4, colors 0 / 2, single_object 1 / 1; overall (0.5 + 0 + 1) / 3
    assert (s["images"], s["prompts"]) == (7, 4)
    assert s["correct_images"] == 3 / 7 and s["correct_prompts"] == 0.75
    assert s["tasks"] == [("counting", 0.5, 2, 4), ("colors", 0.0, 0, 2), ("single_object", 1.0, 1, 1)]
    assert s["overall"] == 0.5
    text = ge.format_summary(s)
    assert text.splitlines()[4:6] == ["% correct images: 42.86%", "% correct prompts: 75.00%"]
    assert "counting         = 50.00% (2 / 4)" in text and text.endswith("(avg. over tasks): 0.50000\n")


def _pandas_python():
    cands = [os.environ.get("REWARDKIT_PANDAS_PYTHON"),
             str(Path.home() / ".cache/rewardkit/parity/geneval-summary/bin/python")]
    for c in cands:
        if c and Path(c).is_file() and subprocess.run([c, "-c", "import pandas, numpy"],
                                                      capture_output=True).returncode == 0:
            return c
    return None


def _records_file(tmp_path, records):
    recs = [{"filename": f"x/{i:05}.png", "prompt": "p", "reason": "", "details": "{}", **r}
            for i, r in enumerate(records)]
    return ge.write_results(recs, tmp_path / "results.jsonl")


MANY = [_rec(t, (i * 7 + j) % 3 == 0, json.dumps({"i": i, "t": t}))
        for i, t in enumerate(["position", "colors", "counting", "two_object", "color_attr", "single_object"] * 3)
        for j in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("records", [RECORDS, MANY], ids=["hand", "many"])
def test_summary_equals_the_official_pandas_computation(tmp_path, records):
    py = _pandas_python()
    if py is None:
        pytest.skip("no Python with pandas (set REWARDKIT_PANDAS_PYTHON or make the geneval-summary parity venv)")
    path = _records_file(tmp_path, records)
    official = subprocess.run([py, str(HELPERS / "geneval_summary_official.py"), str(path)], capture_output=True,
                              text=True, check=True).stdout
    assert ge.format_summary(ge.summarize(ge.read_results(path))) == official


@pytest.mark.slow
def test_summary_equals_the_official_script(tmp_path):
    repo, py = os.environ.get("GENEVAL_REPO"), _pandas_python()
    if not repo or py is None:
        pytest.skip("set GENEVAL_REPO to a djghosh13/geneval checkout (and have a Python with pandas)")
    path = _records_file(tmp_path, MANY)
    official = subprocess.run([py, str(Path(repo) / "evaluation/summary_scores.py"), str(path)],
                              capture_output=True, text=True, check=True).stdout
    assert ge.format_summary(ge.summarize(ge.read_results(path))) == official


def _run(args, capsys):
    from rewardkit.cli import main

    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def bright_reward(monkeypatch):
    from tests.helpers.geneval_layouts import register_bright

    return register_bright(monkeypatch)


def test_bench_geneval_writes_the_official_records_and_prints_the_official_table(tmp_path, capsys, bright_reward):
    levels = [[255, 0], [255, 255], [0, 0], [210, 10], [255], [0, 130, 140]]
    root = write_layout(tmp_path / "outputs", levels)
    meta = write_metadata(tmp_path / "evaluation_metadata.jsonl")
    out = tmp_path / "res" / "results.jsonl"
    code, stdout, _ = _run(["bench", "geneval", "--images", str(root), "--metadata", str(meta),
                            "--reward", bright_reward, "--outfile", str(out), "--batch-size", "3"], capsys)
    assert code == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [list(r) for r in recs] == [OFFICIAL_KEYS] * 12
    assert [r["filename"] for r in recs[:2]] == [str(root / "00000/samples/00000.png"),
                                                 str(root / "00000/samples/00001.png")]
    assert [json.loads(r["metadata"]) for r in recs] == [METADATA[i] for i, lv in enumerate(levels) for _ in lv]
    assert BrightIsCorrect.seen == [METADATA[i] for i, lv in enumerate(levels) for _ in lv]  # metadata reached it
    assert json.loads(recs[0]["details"]) == {"bench": [[0.0, 0.0, 4.0, 4.0, 0.9]]}
    # hand-computed: correct images 1+2+0+1+1+2 = 7 of 12; prompts with one: 5 of 6; tags 1/2, 1, 0, 1/2, 1, 2/3
    assert "Total images: 12\nTotal prompts: 6\n% correct images: 58.33%\n% correct prompts: 83.33%" in stdout
    assert "single_object    = 50.00% (1 / 2)" in stdout and "color_attr       = 66.67% (2 / 3)" in stdout
    assert stdout.endswith(f"Overall score (avg. over tasks): {(0.5 + 1 + 0 + 0.5 + 1 + 2 / 3) / 6:.5f}\n")
    assert stdout == ge.format_summary(ge.summarize(ge.read_results(out)))


def test_bench_geneval_refuses_a_broken_layout(tmp_path, capsys, bright_reward):
    root = write_layout(tmp_path / "outputs", [[255], [0]])
    other = [dict(METADATA[0], prompt="another prompt")] + METADATA[1:]
    code, _, err = _run(["bench", "geneval", "--images", str(root), "--metadata",
                         str(write_metadata(tmp_path / "m.jsonl", other)), "--reward", bright_reward], capsys)
    assert code == 2 and "differs from row 0" in err
    (root / "00001" / "samples" / "00000.png").unlink()
    code, _, err = _run(["bench", "geneval", "--images", str(root), "--reward", bright_reward], capsys)
    assert code == 2 and "no samples" in err
    code, _, err = _run(["bench", "geneval", "--reward", bright_reward], capsys)
    assert code == 2 and "--images" in err
    code, _, err = _run(["bench", "--images", str(root), "--reward", bright_reward], capsys)
    assert code == 2 and "bench geneval" in err


def test_layout_reader_follows_the_official_file_rules(tmp_path):
    root = write_layout(tmp_path / "o", [[255, 255], [0]])
    (root / "00000" / "samples" / "grid.png").write_bytes(b"")      # not NNNNN.png: skipped officially too
    (root / "notes").mkdir()                                         # not all digits: skipped
    folders = ge.read_layout(root)
    assert [(f.name, [p.name for p in f.images]) for f in folders] == [("00000", ["00000.png", "00001.png"]),
                                                                       ("00001", ["00000.png"])]


def test_an_image_without_a_verdict_stops_the_bench(tmp_path):
    """The official summary has no way to leave an image out: an invalid sample is an error, not a 0."""
    import torch

    from rewardkit.reward import Reward, RewardOutput

    class Broken(Reward):
        name = "broken"
        uses_prompt = False

        def _score(self, batch):
            return RewardOutput.invalid(len(batch), "detector failed")

    folders = ge.read_layout(write_layout(tmp_path / "o", [[255]]))
    with pytest.raises(ValueError, match="detector failed"):
        ge.score_layout(folders, Broken())
    del torch


def test_with_the_registered_geneval_reward(tmp_path):
    """Runs once the geneval reward is registered (its tiny instance; the verdicts of random weights mean
    nothing, the records' shape and the summary do)."""
    from rewardkit.registry import get_reward_class, list_rewards

    if "geneval" not in list_rewards():
        pytest.skip("no reward registered as 'geneval' on this branch")
    folders = ge.read_layout(write_layout(tmp_path / "o", [[255, 0], [128]]))
    recs = ge.score_layout(folders, get_reward_class("geneval").tiny(str(tmp_path / "tiny")))
    assert [list(r) for r in recs] == [OFFICIAL_KEYS] * 3
    assert ge.summarize(recs)["images"] == 3
