"""Documented options of the OCR reward, each with a test that fails when the option is ignored or mis-wired: ``lang``
and ``psm`` reach Tesseract, the text options, defaults, ``min_side`` upscaling, the timeout, ``num_workers``, a
missing executable and a failing Tesseract. A fake ``tesseract`` executable records what it is asked."""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
import textwrap
import time

import pytest

pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from rewardkit import load_reward  # noqa: E402


# ============================================================================================== OCR options
FAKE_TESSERACT = textwrap.dedent("""\
    #!{python}
    # stand-in for the tesseract CLI: `tesseract IN OUTBASE [-l LANG] [--psm N] txt`
    import json, os, sys, time
    from PIL import Image
    args = sys.argv[1:]
    start = time.time()
    time.sleep(float(os.environ.get("FAKE_TESSERACT_SLEEP", "0")))
    with Image.open(args[0]) as im:
        size = im.size
    info = {{"args": args[2:], "size": list(size), "start": start, "end": time.time()}}
    with open(args[1] + ".txt", "w") as f:
        f.write(os.environ.get("FAKE_TESSERACT_TEXT", "OPEN") + "\\n")
    log = os.environ.get("FAKE_TESSERACT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(info) + "\\n")
    """)


@pytest.fixture
def fake_tesseract(tmp_path, monkeypatch):
    pytest.importorskip("pytesseract")
    exe = tmp_path / "fake-tesseract"
    exe.write_text(FAKE_TESSERACT.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_TESSERACT_LOG", str(log))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return str(exe), calls


def test_ocr_lang_and_psm_reach_tesseract(fake_tesseract):
    exe, calls = fake_tesseract
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1)
    out = ocr([Image.new("RGB", (40, 30), "white")], ['a sign "OPEN"'])
    assert out.valid.all() and out.scores[0].item() == 1.0 and out.details[0]["read"] == "OPEN"
    assert calls()[-1]["args"] == ["-l", "eng", "--psm", "3", "txt"]        # the defaults
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1, lang="eng+deu", psm=11)
    ocr([Image.new("RGB", (40, 30), "white")], ['a sign "OPEN"'])
    assert calls()[-1]["args"] == ["-l", "eng+deu", "--psm", "11", "txt"]


@pytest.mark.parametrize("read,prompt,options,want", [
    # default: case folded, whitespace removed, full match, divided by |t| and clipped: "open" vs "shopopennow"
    ("Shop OPEN now", '"open"', {}, 0.0),                                   # d = 7 -> 1 - min(7, 4) / 4
    ("Shop OPEN now", '"open"', {"match": "substring"}, 1.0),               # closest substring: d = 0
    ("OPEN", '"open"', {}, 1.0),
    ("OPEN", '"open"', {"case_sensitive": True}, 0.0),                      # d = 4
    ("a b", '"ab"', {}, 1.0),                                               # "ab" vs "ab"
    ("a b", '"ab"', {"whitespace": "collapse"}, 0.5),                       # "ab" vs "a b": d = 1
    ("abcd", '"ab"', {}, 0.0),                                              # d = 2 -> 1 - 2 / 2
    ("abcd", '"ab"', {"normalize_by": "max"}, 0.5),                         # 1 - 2 / max(2, 4)
    ("HELLO WORLD", 'a sign "hello" and a banner "world"', {}, 1.0),         # spans joined by a space
])
def test_ocr_text_options_reach_the_reward(fake_tesseract, monkeypatch, read, prompt, options, want):
    exe, _ = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_TEXT", read)
    out = load_reward("ocr", tesseract_cmd=exe, num_workers=1, **options)([Image.new("RGB", (40, 30), "white")],
                                                                          [prompt])
    assert out.valid.all() and out.scores[0].item() == pytest.approx(want)
    assert out.details[0]["read"] == read


def test_ocr_defaults_are_the_documented_ones(fake_tesseract):
    from rewardkit.rewards.ocr import OCRConfig

    cfg = OCRConfig()
    assert (cfg.lang, cfg.psm, cfg.min_side, cfg.num_workers, cfg.case_sensitive, cfg.whitespace, cfg.match,
            cfg.normalize_by) == ("eng", 3, 0, 0, False, "remove", "full", "target")
    exe, _ = fake_tesseract
    assert load_reward("ocr", tesseract_cmd=exe)._workers == min(4, os.cpu_count() or 1)   # 0 = min(4, CPUs)


def test_ocr_min_side_upscales_small_images(fake_tesseract):
    exe, calls = fake_tesseract
    im = Image.new("RGB", (100, 50), "white")   # W x H
    load_reward("ocr", tesseract_cmd=exe, num_workers=1)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [100 + 20, 50 + 20]           # never upscaled by default; a 10 px margin
    load_reward("ocr", tesseract_cmd=exe, num_workers=1, min_side=200)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [400 + 20, 200 + 20]          # shorter side 50 -> 200: x4
    load_reward("ocr", tesseract_cmd=exe, num_workers=1, min_side=40)([im], ['"OPEN"'])
    assert calls()[-1]["size"] == [100 + 20, 50 + 20]           # already large enough


@pytest.mark.slow
def test_ocr_timeout_marks_the_sample_invalid(fake_tesseract, monkeypatch):
    exe, _ = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_SLEEP", "20")
    ocr = load_reward("ocr", tesseract_cmd=exe, num_workers=1, timeout_s=0.5)
    t0 = time.monotonic()
    out = ocr([Image.new("RGB", (40, 30), "white")], ['"OPEN"'], on_error="nan")
    assert time.monotonic() - t0 < 10
    assert not out.valid[0] and math.isnan(out.scores[0].item())
    assert "tesseract failed" in out.errors[0] and "timeout" in out.errors[0]


@pytest.mark.slow
def test_ocr_num_workers_bounds_concurrent_processes(fake_tesseract, monkeypatch):
    exe, calls = fake_tesseract
    monkeypatch.setenv("FAKE_TESSERACT_SLEEP", "0.4")
    ims = [Image.new("RGB", (40, 30), "white")] * 4

    def max_overlap(rows):
        events = sorted([(r["start"], 1) for r in rows] + [(r["end"], -1) for r in rows], key=lambda e: (e[0], e[1]))
        cur = best = 0
        for _, d in events:
            cur += d
            best = max(best, cur)
        return best

    load_reward("ocr", tesseract_cmd=exe, num_workers=1)(ims, ['"OPEN"'] * 4)
    assert len(calls()) == 4 and max_overlap(calls()) == 1
    n = len(calls())
    load_reward("ocr", tesseract_cmd=exe, num_workers=4)(ims, ['"OPEN"'] * 4)
    assert max_overlap(calls()[n:]) >= 2
    with pytest.raises(ValueError, match="num_workers"):
        load_reward("ocr", tesseract_cmd=exe, num_workers=-1)


def test_ocr_missing_executable_is_a_clear_error(tmp_path):
    pytest.importorskip("pytesseract")
    with pytest.raises(RuntimeError, match="apt-get install tesseract-ocr"):
        load_reward("ocr", tesseract_cmd=str(tmp_path / "no-such-tesseract"))


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract-ocr is not installed")
def test_ocr_real_tesseract_failure_is_an_invalid_sample():
    """A language pack that is not installed makes Tesseract fail: the sample is invalid with its message."""
    pytest.importorskip("pytesseract")
    ocr = load_reward("ocr", lang="xx-not-a-language", num_workers=1)
    out = ocr([Image.new("RGB", (60, 30), "white")], ['"OPEN"'], on_error="nan")
    assert not out.valid[0] and out.errors[0].startswith("tesseract failed")
    assert os.path.exists(shutil.which("tesseract"))
