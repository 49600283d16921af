"""`rewardkit view`: what the report's data holds (fast; the page itself is tested in a real browser in
tests/view/test_browser.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rewardkit.view import build_report, collect, embed_json
from rewardkit.view.images import ImageStore
from rewardkit.view.multi import average_ranks, rewards_section, spearman
from rewardkit.view.rl import eval_grids
from rewardkit.view.scores import ViewInputError

from tests.helpers.view_rows import EXAMPLES, XSS, score_rows, write_jsonl


def payload_of(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="rk-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def test_score_rows_keep_every_field_and_embed_thumbnails(tmp_path):
    rows = score_rows(tmp_path)
    f = write_jsonl(tmp_path / "judge.jsonl", rows)
    out = build_report([f], tmp_path / "r.html")
    data = payload_of(out.read_text(encoding="utf-8"))
    (sec,) = data["sections"]
    assert sec["kind"] == "scores" and sec["label"] == "judge" and sec["dims"] == ["alignment", "quality"]
    for want, got in zip(rows, sec["rows"]):
        assert (got["prompt"], got["score"], got["valid"], got["error"]) == (
            want["prompt"], want["score"], want["valid"], want["error"])
        assert got["dims"] == want["dimensions"] and got["path"] == want["image"]
        im = data["images"][got["img"]]
        assert im["name"] == Path(want["image"]).name
        thumb = Image.open(io.BytesIO(base64.b64decode(im["src"].split(",", 1)[1])))
        assert thumb.size == Image.open(want["image"]).size  # examples are 256 px: not upscaled, not cut
    assert sec["rows"][0]["info"]["details"]["dimensions"]["alignment"]["hypotheses"][1]["rationale"] == "blurry"
    assert sec["rows"][0]["info"]["rationale"] == rows[0]["rationale"]


def test_thumbnails_are_downscaled_to_the_longest_side(tmp_path):
    big = tmp_path / "big.png"
    Image.new("RGB", (1000, 400), (200, 30, 30)).save(big)
    store = ImageStore(tmp_path, size=256)
    key = store.add_path(big)
    assert store.add_path(tmp_path / "." / "big.png") == key  # one copy per file
    im = Image.open(io.BytesIO(base64.b64decode(store.table()[key]["src"].split(",", 1)[1])))
    assert im.size == (256, 102)  # 400 * 256 / 1000 = 102.4
    missing = store.add_path(tmp_path / "gone.png")
    assert store.table()[missing] == {"missing": "file not found", "name": "gone.png"}


def test_untrusted_text_cannot_leave_the_json_element(tmp_path):
    rows = score_rows(tmp_path)
    html = build_report([write_jsonl(tmp_path / "s.jsonl", rows)], tmp_path / "r.html").read_text(encoding="utf-8")
    body = re.search(r'id="rk-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in body and ">" not in body and "&" not in body
    assert payload_of(html)["sections"][0]["rows"][2]["prompt"] == "{{JS}} {{DATA}}"  # not substituted
    # exactly two script elements: the JSON and ours, and the CSP allows ours by its hash, nothing remote
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
    assert [a for a, _ in scripts] == [' type="application/json" id="rk-data"', ""]
    js_hash = base64.b64encode(hashlib.sha256(scripts[1][1].encode()).digest()).decode()
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    css_hash = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1).replace("&#x27;", "'")
    assert csp == (f"default-src 'none'; img-src data: 'self'; style-src 'sha256-{css_hash}'; "
                   f"script-src 'sha256-{js_hash}'; base-uri 'none'; form-action 'none'")
    assert "innerHTML" not in scripts[1][1] and "http://" not in scripts[1][1].replace("http://www.w3.org/2000/svg", "")
    assert embed_json({"a": "\u2028</script>&"}) == '{"a":"\\u2028\\u003c/script\\u003e\\u0026"}'


def test_parquet_with_paths_and_bytes(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shutil.copy(EXAMPLES / "t2i_red_apple.png", tmp_path / "apple.png")
    raw = (EXAMPLES / "t2i_open_sign.png").read_bytes()
    t = pa.table({"id": ["a", "b"], "image": [{"bytes": None, "path": "apple.png"}, {"bytes": raw, "path": "sign.png"}],
                  "prompt": ["an apple", "a sign"], "score": [0.5, None], "valid": [True, False],
                  "error": [None, "no answer"], "aesthetic": [6.5, None], "note": ["x", "y"]})
    pq.write_table(t, tmp_path / "scores.parquet")
    (sec,) = collect([tmp_path / "scores.parquet"], store := ImageStore(tmp_path))
    assert sec["dims"] == ["aesthetic"]
    assert [(r["id"], r["score"], r["valid"], r["error"], r["dims"]) for r in sec["rows"]] == [
        ("a", 0.5, True, None, {"aesthetic": 6.5}), ("b", None, False, "no answer", {"aesthetic": None})]
    assert sec["rows"][0]["info"] == {"note": "x"}
    imgs = store.table()
    assert imgs[sec["rows"][0]["img"]]["name"] == "apple.png" and "src" in imgs[sec["rows"][0]["img"]]
    assert imgs[sec["rows"][1]["img"]]["name"] == "sign.png" and "src" in imgs[sec["rows"][1]["img"]]


def test_ranks_and_spearman_by_hand():
    assert average_ranks([0.1, 0.9, 0.5, 0.5]) == [4.0, 1.0, 2.5, 2.5]
    # d = (0, 1, 1, 0): rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None


def test_two_rewards_joined_ranked_and_disagreements_flagged(tmp_path):
    rows = score_rows(tmp_path)
    rows[1].update(score=0.1, valid=True, error=None)
    a = write_jsonl(tmp_path / "clip.jsonl", rows)
    other = [dict(r) for r in reversed(rows)]  # another order: joined on image file + prompt
    other[0]["image"] = os.path.relpath(other[0]["image"])  # the same file, named from another directory
    for r, s in zip(other, (0.3, 0.2, 0.1)):
        r["score"] = s
    b = write_jsonl(tmp_path / "pick.jsonl", other)
    secs = collect([a, b], ImageStore(tmp_path))
    multi = secs[0]
    assert multi["kind"] == "rewards" and multi["rewards"] == ["clip", "pick"] and multi["n_common"] == 3
    by_prompt = {r["prompt"]: r for r in multi["rows"]}
    # clip: 0.8125 > 0.1 > -2e-5 -> ranks 1, 2, 3; pick: the sign 0.3, the house 0.2, the apple 0.1 -> 3, 2, 1
    assert by_prompt[XSS[0]]["scores"] == [0.8125, 0.1] and by_prompt[XSS[0]]["ranks"] == [1.0, 3.0]
    assert by_prompt[XSS[2]]["ranks"] == [3.0, 1.0] and by_prompt[XSS[1]]["ranks"] == [2.0, 2.0]
    assert by_prompt[XSS[0]]["gap"] == 1.0 and by_prompt[XSS[1]]["gap"] == 0.0
    assert multi["spearman"][0][1] == pytest.approx(-1.0)
    assert [s["kind"] for s in secs] == ["rewards", "scores", "scores"]
    assert rewards_section([secs[1]]) is None  # one reward: nothing to compare
    # a row one reward could not score: shown as invalid there, left out of the ranks (computed over the rest)
    other[0].update(score=None, valid=False, error="no answer")  # the sign, under pick
    secs = collect([a, write_jsonl(tmp_path / "pick.jsonl", other)], ImageStore(tmp_path))
    by_prompt = {r["prompt"]: r for r in secs[0]["rows"]}
    assert secs[0]["n_common"] == 2
    assert by_prompt[XSS[2]]["valid"] == [True, False] and by_prompt[XSS[2]]["errors"] == [None, "no answer"]
    assert by_prompt[XSS[2]]["ranks"] == [None, None] and by_prompt[XSS[2]]["gap"] is None
    assert by_prompt[XSS[0]]["ranks"] == [1.0, 2.0] and by_prompt[XSS[1]]["ranks"] == [2.0, 1.0]


def test_compare_output_is_a_pairs_section(tmp_path):
    score_rows(tmp_path)
    f = write_jsonl(tmp_path / "compare.jsonl", [
        {"image_a": str(tmp_path / "t2i_red_apple.png"), "image_b": str(tmp_path / "t2i_open_sign.png"),
         "prompt": "an apple", "prob_a": 0.75, "valid": True, "error": None, "score_a": 1.5, "score_b": 0.4}])
    (sec,) = collect([f], ImageStore(tmp_path))
    assert sec["kind"] == "pairs"
    assert {k: sec["rows"][0][k] for k in ("prob_a", "score_a", "score_b", "valid")} == {
        "prob_a": 0.75, "score_a": 1.5, "score_b": 0.4, "valid": True}


def test_rl_run_series_and_grids(tmp_path):
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    recs = [{"epoch": 0, "global_step": 0, "eval/reward/pickscore/mean": 0.2, "time/sample_s": 0.5},
            {"epoch": 1, "reward/pickscore/mean": 0.3, "policy_loss": 1.5, "kl_div": float("nan")},
            {"epoch": 2, "reward/pickscore/mean": 0.5, "policy_loss": 1.2, "eval/reward/pickscore/mean": 0.4},
            {"final": True, "eval/reward/pickscore/mean": 0.45}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for name in ("eval-epoch-000002.png", "eval-epoch-000000.png", "eval/step_7.png", "eval-epoch-000004.png.tmp.png"):
        Image.new("RGB", (64, 32), (0, 90, 0)).save(run / name, format="PNG")
    assert [(e, p.name) for e, p in eval_grids(run)] == [
        (0, "eval-epoch-000000.png"), (2, "eval-epoch-000002.png"), (7, "step_7.png")]
    html = build_report([run], tmp_path / "r.html").read_text(encoding="utf-8")
    (sec,) = payload_of(html)["sections"]
    assert sec["series"]["reward/pickscore/mean"] == [[1.0, 0.3], [2.0, 0.5]]
    assert sec["series"]["eval/reward/pickscore/mean"] == [[0.0, 0.2], [2.0, 0.4]]
    assert "kl_div" not in sec["series"]  # NaN: not a point
    assert sec["groups"]["time per epoch (s)"] == ["time/sample_s"]
    assert not any("global_step" in ks for ks in sec["groups"].values())  # a counter, not a curve
    assert sec["groups"]["reward (train mean; evaluation of the EMA weights dashed)"] == [
        "reward/pickscore/mean", "eval/reward/pickscore/mean"]
    assert sec["final"]["eval/reward/pickscore/mean"] == 0.45 and sec["n_epochs"] == 3 and sec["curves"] is None
    assert [g["epoch"] for g in sec["grids"]] == [0, 2, 7]


def test_bench_record_without_wrong_pairs_uses_per_sample_rows(tmp_path):
    rec = {"schema": "rewardkit.bench.result/1", "rewardkit_version": "0", "reward": {"name": "clip", "config": {}},
           "benchmarks": {"mmrb2/t2i": {
               "spec": {"version": "1"}, "primary": "accuracy_without_ties", "skipped": None,
               "metrics": {"accuracy_without_ties": {"value": 0.5, "ci95": [0.25, 0.75], "n": 4, "n_model_ties": 1}},
               "categories": {"source": {"x": {"accuracy_without_ties": {"value": 1.0, "n": 2}}}}, "subsets": {},
               "samples": [{"id": "p0", "label": 1, "margin": 0.5}, {"id": "p1", "label": 1, "margin": -0.25},
                           {"id": "p2", "label": -1, "margin": 0.75}, {"id": "p3", "label": 0, "margin": 0.1},
                           {"id": "p4", "label": -1, "margin": None}]}}}
    (tmp_path / "old.json").write_text(json.dumps(rec))
    (sec,) = collect([tmp_path / "old.json"], ImageStore(tmp_path))
    b = sec["records"][0]["benchmarks"][0]
    assert b["metrics"]["accuracy_without_ties"] == {"value": 0.5, "ci95": [0.25, 0.75], "n": 4,
                                                     "notes": {"n_model_ties": 1}}
    assert b["categories"] == {"source": {"x": {"value": 1.0, "n": 2}}}
    assert b["wrong"]["n_wrong"] == 2 and [p["id"] for p in b["wrong"]["pairs"]] == ["p2", "p1"]


def test_folder_thumbnails_beside_the_html(tmp_path):
    rows = score_rows(tmp_path)
    out = build_report([write_jsonl(tmp_path / "s.jsonl", rows)], tmp_path / "rep" / "r.html", thumbs="folder")
    imgs = payload_of(out.read_text(encoding="utf-8"))["images"]
    assert len(imgs) == 3
    for im in imgs.values():
        assert (out.parent / im["src"]).is_file() and im["src"].startswith("r_files/")
        assert (out.parent / im["full"]).resolve() == (tmp_path / im["name"]).resolve()  # the original


@pytest.mark.skipif(os.name == "nt", reason="':' cannot be in a Windows file name")
def test_links_to_files_with_scheme_like_names_stay_relative(tmp_path):
    """Issue 36 item 10: image links were raw relative paths, so a file named `javascript:alert(1).png` or a
    folder named `https:` became a link with that scheme. Each path segment is percent-encoded; the link still
    resolves to the file."""
    from urllib.parse import unquote, urlsplit

    odd = tmp_path / "https:" / "x?y#z 100%"
    odd.mkdir(parents=True)
    names = [odd / "javascript:alert(1).png", odd / "data:text.png", tmp_path / "https:" / "plain.png"]
    for n in names:
        Image.new("RGB", (8, 8), (10, 200, 30)).save(n, format="PNG")
    rows = [{"image": str(n), "prompt": "p", "score": 1.0, "valid": True, "error": None} for n in names]
    out = build_report([write_jsonl(tmp_path / "s.jsonl", rows)], tmp_path / "r.html", thumbs="folder")
    imgs = payload_of(out.read_text(encoding="utf-8"))["images"]
    fulls = sorted(im["full"] for im in imgs.values())
    assert len(fulls) == 3
    for link in fulls + [im["src"] for im in imgs.values()]:
        parts = urlsplit(link)
        assert parts.scheme == "" and parts.netloc == "" and parts.query == "" and parts.fragment == "", link
    assert sorted((out.parent / unquote(f)).resolve() for f in fulls) == sorted(n.resolve() for n in names)
    assert "https%3A/x%3Fy%23z%20100%25/javascript%3Aalert%281%29.png" in fulls


def test_cli(tmp_path, capsys):
    from rewardkit.cli import main

    f = write_jsonl(tmp_path / "s.jsonl", score_rows(tmp_path))
    assert main(["view", str(f), "-o", str(tmp_path / "r.html")]) == 0
    assert "r.html" in capsys.readouterr().err and (tmp_path / "r.html").is_file()
    (tmp_path / "bad.jsonl").write_text('{"image": "a.png"}\n')
    assert main(["view", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "x.html")]) == 2
    assert "bad.jsonl:1: a score row needs 'score' and 'valid'" in capsys.readouterr().err
    assert main(["view", str(f), str(f), "-o", str(tmp_path / "two.html"), "--label", "A", "B", "--title", "<t>"]) == 0
    html = (tmp_path / "two.html").read_text(encoding="utf-8")
    assert [s["label"] for s in payload_of(html)["sections"]] == ["A vs B", "A", "B"]
    assert "<title>&lt;t&gt;</title>" in html
    assert main(["view", str(f), "-o", str(tmp_path / "y.html"), "--label", "A", "B"]) == 2  # 2 labels, 1 input
    assert main(["view", str(f), "-o", str(tmp_path / "x.txt")]) == 2
    with pytest.raises(ViewInputError, match="no inputs"):
        build_report([], tmp_path / "y.html")


def test_a_corrupt_file_is_unreadable_not_missing(tmp_path):
    """Issue 40 item 8: a file that is there but cannot be decoded was labelled "missing"."""
    bad = tmp_path / "corrupt.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    store = ImageStore(tmp_path)
    key = store.add_path(bad)
    entry = store.table()[key]
    assert entry["unreadable"] is True and entry["name"] == "corrupt.png" and "src" not in entry
    key = store.add_path(tmp_path / "gone.png")
    gone = store.table()[key]
    assert gone == {"missing": "file not found", "name": "gone.png"}  # a missing one stays "missing"
    js = (Path(__file__).resolve().parents[2] / "rewardkit" / "view" / "assets" / "view.js").read_text()
    assert '(im.unreadable ? "unreadable image " : "missing image ")' in js


def _decode(uri: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


def test_embed_mode_keeps_a_full_resolution_image_within_a_budget(tmp_path):
    """Issue 40 item 8: the enlarged view in embed mode was the 256-px thumbnail stretched. An image larger than
    its thumbnail also embeds itself at up to `full_size` (default 1024) on its longest side, until the enlarged
    images total `full_budget` bytes; past it the entry says why there is no original."""
    paths = []
    for i, (w, h) in enumerate([(600, 240), (1300, 260), (200, 100)]):
        p = tmp_path / f"im{i}.png"  # smooth gradients: quick to encode, unlike noise
        g = np.add.outer(np.linspace(0, 120, h), np.linspace(0, 120, w)).astype(np.uint8)
        Image.fromarray(np.stack([g, 255 - g, np.full_like(g, 90 + 40 * i)], axis=-1)).save(p)
        paths.append(p)
    store = ImageStore(tmp_path, size=256)
    keys = [store.add_path(p) for p in paths]
    t = [store.table()[k] for k in keys]
    assert _decode(t[0]["src"]).size == (256, 102) and _decode(t[0]["full"]).size == (600, 240)
    assert t[0]["full_size"] == [600, 240]
    assert _decode(t[1]["full"]).size == (1024, 205)  # bounded by full_size (260 * 1024 / 1300 = 204.8)
    assert t[2]["full"] == t[2]["src"] and "full_note" not in t[2]  # small: the thumbnail is the image
    assert store.full_bytes == sum(len(base64.b64decode(x["full"].split(",", 1)[1])) for x in t[:2])
    # a budget that holds the first enlarged image only
    first = len(base64.b64decode(t[0]["full"].split(",", 1)[1]))
    small = ImageStore(tmp_path, size=256, full_budget=first + 10)
    ka, kb = (small.add_path(p) for p in paths[:2])
    a, b = small.table()[ka], small.table()[kb]
    assert a["full"] != a["src"] and b["full"] == b["src"] and "budget" in b["full_note"]
    assert small.full_bytes <= first + 10
    off = ImageStore(tmp_path, size=256, full_size=0)
    kc = off.add_path(paths[0])
    c = off.table()[kc]
    assert c["full"] == c["src"] and off.full_bytes == 0
    # through the CLI: the documented default budget and a page that is bounded by it
    from rewardkit.cli import main

    rows = [{"image": str(p), "prompt": "p", "score": 1.0, "valid": True, "error": None} for p in paths]
    out = tmp_path / "r.html"
    assert main(["view", str(write_jsonl(tmp_path / "s.jsonl", rows)), "-o", str(out), "--full-budget", "0.5"]) == 0
    imgs = payload_of(out.read_text(encoding="utf-8"))["images"].values()
    assert sum(len(im["full"]) for im in imgs if im["full"] != im["src"]) <= 0.5 * 2**20 * 4 / 3 + 100


def test_dataset_score_folder_is_joined_back_to_its_images_and_prompts(tmp_path, tiny_clip_dir):
    """Issue 40 item 10: `view` on `score --dataset` output showed "no image" on every row. The score folder's
    manifest names the dataset and its columns; each score is shown with its row's image and prompt."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rewardkit.cli import main

    shutil.copy(EXAMPLES / "t2i_open_sign.png", tmp_path / "sign.png")
    data = tmp_path / "data"
    data.mkdir()
    imgs = [(EXAMPLES / "t2i_red_apple.png").read_bytes(), (EXAMPLES / "t2i_house_sunset.png").read_bytes()]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the Hugging Face Image layout
    pq.write_table(pa.table({"caption": ["an apple", "a house"],
                             "img": pa.array([{"bytes": b, "path": None} for b in imgs], struct)}),
                   data / "part-0.parquet")
    pq.write_table(pa.table({"caption": ["a sign"], "img": pa.array([{"bytes": None, "path": "../sign.png"}], struct)}),
                   data / "part-1.parquet")
    scores = tmp_path / "scores"
    assert main(["score", "--dataset", str(data), "--image-column", "img", "--prompt-column", "caption",
                 "-r", "clipscore", "-m", str(tiny_clip_dir), "--output", str(scores), "--no-progress"]) == 0
    out = build_report([scores], tmp_path / "r.html")
    data_ = payload_of(out.read_text(encoding="utf-8"))
    (sec,) = data_["sections"]
    assert sec["kind"] == "scores" and sec["source"]["columns"]["image"] == "img" and "note" not in sec
    got = {r["prompt"]: r for r in sec["rows"]}
    assert set(got) == {"an apple", "a house", "a sign"}
    want = {r["id"]: r["score"] for f in sorted(scores.glob("*.parquet")) for r in pq.read_table(f).to_pylist()}
    assert sorted(r["score"] for r in sec["rows"]) == pytest.approx(sorted(want.values()))
    for prompt, src in (("an apple", EXAMPLES / "t2i_red_apple.png"), ("a sign", tmp_path / "sign.png")):
        im = data_["images"][got[prompt]["img"]]
        assert _decode(im["src"]).tobytes() == Image.open(src).convert("RGB").tobytes()  # 256 px: not resized
    assert got["an apple"]["path"] == "part-0:0" and got["a sign"]["path"].endswith("sign.png")
    # the source moved away: the scores are still shown, and the page says why there are no images
    shutil.rmtree(data)
    sec = payload_of(build_report([scores], tmp_path / "r2.html").read_text(encoding="utf-8"))["sections"][0]
    assert len(sec["rows"]) == 3 and all(r["img"] is None for r in sec["rows"])
    assert "source dataset could not be read" in sec["note"]
