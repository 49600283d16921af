"""``rewardkit compose prepare | score`` end to end (tiny Qwen-VL judge, tiny CLIP, Tesseract)."""

from __future__ import annotations

import json
import shutil

import pytest

from rewardkit.cli import main
from rewardkit.compose.rubric import RubricCache


def test_prepare_writes_caches_with_honest_failures(tiny_qwen2_5_vl_dir, tmp_path, capsys):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(f"""
reward:
  judge: "transformers:{tiny_qwen2_5_vl_dir}"
  axes:
    - {{name: faithfulness, reward: faithfulness, options: {{questions: {tmp_path}/f.jsonl, max_new_tokens: 8}}}}
    - {{name: constraint, reward: constraints, gate: intent,
        options: {{questions: {tmp_path}/c.jsonl, max_new_tokens: 8}}}}
  detectors: {{reward: detectors, options: {{applicability_cache: {tmp_path}/d.jsonl,
                                           detectors: [unrequested_text]}}}}
""")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red apple\n\n{\"prompt\": \"a sign that says 'OPEN'\"}\n")
    # nothing parses with a random judge: the run says so and exits 3 (finished, some entries missing)
    assert main(["compose", "prepare", "--config", str(cfg), "--prompts", str(prompts), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert "2 unique prompts read" in err
    assert "faithfulness: question trees parsed for 0 of 2 prompts asked (2 unparsed)" in err
    assert "constraint: intent labelled for 0 of 2 (0 strict, 2 unparsed)" in err
    assert "detectors: detector enablement recorded for 2 of 2 prompts" in err
    f = RubricCache(tmp_path / "f.jsonl")
    assert len(f) == 2
    # a random tiny judge writes no parseable JSON: recorded as a failure, never as made-up questions
    assert all(f.get(p)["questions"] == [] and "unparsed" in f.get(p)["error"] for p in ("a red apple", "a sign that says 'OPEN'"))
    c = RubricCache(tmp_path / "c.jsonl")
    assert c.get("a red apple")["intent"] is None and "unparsed intent" in c.get("a red apple")["intent_error"]
    d = RubricCache(tmp_path / "d.jsonl")
    assert set(d.get("a red apple")["applies"]) == {"unrequested_text"}


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract-ocr is not installed")
def test_score_composite_from_yaml(tiny_clip_dir, tmp_path, capsys):
    from PIL import Image, ImageDraw, ImageFont

    items = []
    for k, word in enumerate(["OPEN", "SALE", "EXIT"]):
        im = Image.new("RGB", (320, 120), "white")
        ImageDraw.Draw(im).text((40, 30), word if k < 2 else "XQZW", fill="black", font=ImageFont.load_default(size=44))
        im.save(tmp_path / f"{k}.png")
        items.append({"prompt": f'a sign that says "{word}"', "image": f"{k}.png"})
    (tmp_path / "items.jsonl").write_text("\n".join(json.dumps(i) for i in items) + "\n")
    cfg = tmp_path / "r.yaml"
    cfg.write_text(f"""
reward:
  normalize: batch
  axes:
    - {{name: text, reward: ocr, weight: 1.0}}
    - {{name: clip, reward: clipscore, weight: 0.0, options: {{model: "{tiny_clip_dir}", device: cpu}}}}
""")
    out = tmp_path / "scores.jsonl"
    assert main(["compose", "score", "--config", str(cfg), "--jsonl", str(tmp_path / "items.jsonl"),
                 "-o", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert "scoring 3 image(s) with the composite (2 axes)" in printed.err and "all 3 images scored" in printed.err
    assert printed.out.splitlines()[0].split() == ["image", "score"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    raw = [r["dimensions"]["text/raw"] for r in rows]
    assert raw[:2] == [1.0, 1.0] and raw[2] < 1.0
    # z over the batch of three: two equal maxima and one lower value -> (+1/sqrt2, +1/sqrt2, -sqrt2) * s/(s+eps)
    # (the composite default is the RL convention (x - mean) / (std + 1e-4))
    mean = sum(raw) / 3
    std = (sum((x - mean) ** 2 for x in raw) / 3) ** 0.5
    shrink = std / (std + 1e-4)
    assert [r["score"] for r in rows] == pytest.approx([0.70710678 * shrink, 0.70710678 * shrink, -1.41421356 * shrink],
                                                       abs=1e-5)
    assert main(["compose", "score", "--config", str(cfg), "--jsonl", str(tmp_path / "items.jsonl"),
                 "-o", str(out), "--no-progress", "--set", "normalize=none"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    clip = [r["dimensions"]["clip/raw"] for r in rows]
    assert [r["score"] for r in rows] == pytest.approx([1.0 + 0.0 * clip[0], 1.0, raw[2]])
