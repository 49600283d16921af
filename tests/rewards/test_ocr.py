"""OCR reward: text rules and edit distances by hand, Tesseract on images rendered with known text."""

from __future__ import annotations

import shutil

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from rewardkit.rewards.ocr import (edit_distance, extract_quoted, normalize_text, ocr_similarity,
                                   substring_edit_distance)

needs_tesseract = pytest.mark.skipif(shutil.which("tesseract") is None,
                                     reason="tesseract-ocr is not installed (.ci/install-system-deps.sh)")

WORDS = ["OPEN", "Hello World", "COFFEE SHOP", "Sale 50%", "rewardkit", "STOP", "Welcome Home", "Bakery",
         "EXIT", "Good Morning", "NO PARKING", "Happy Birthday", "Fresh Bread", "Hotel", "Library", "Diffusion",
         "Quantum Cafe", "Big Sale", "Pizza", "Sunrise 2026"]


def render(text: str, size=(384, 128), font_size=44, fg=(0, 0, 0), bg=(255, 255, 255)) -> Image.Image:
    im = Image.new("RGB", size, bg)
    d = ImageDraw.Draw(im)
    font = ImageFont.load_default(size=font_size)
    w = d.textlength(text, font=font)
    d.text(((size[0] - w) / 2, (size[1] - font_size) / 2), text, fill=fg, font=font)
    return im


def test_extract_quoted_rules():
    assert extract_quoted('a sign that says "OPEN" and "24/7"') == ["OPEN", "24/7"]
    assert extract_quoted("a cat's hat with 'MEOW' on it") == ["MEOW"]
    assert extract_quoted("the dog's bowl and the cat's toy") == []
    assert extract_quoted("“Café” in curly quotes, «Bonjour» too, and ‘hi’") == ["Café", "Bonjour", "hi"]
    assert extract_quoted('empty "" and "  " spans are dropped') == []


def test_normalize_text_rules():
    assert normalize_text("  Hello \n World ") == "helloworld"
    assert normalize_text("  Hello \n World ", whitespace="collapse") == "hello world"
    assert normalize_text("Hello", case_sensitive=True) == "Hello"
    assert normalize_text("STRASSE straße") == "strassestrasse"   # casefold, not lower
    with pytest.raises(ValueError):
        normalize_text("x", whitespace="keep")


def test_edit_distances_hand_computed():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "") == 3
    assert edit_distance("flaw", "lawn") == 2
    assert substring_edit_distance("open", "xxopenyy") == 0
    assert substring_edit_distance("open", "xxopanyy") == 1
    assert substring_edit_distance("abc", "") == 3


def test_similarity_normalisations():
    # target "hello" (5), read "helo": d = 1
    assert ocr_similarity("hello", "helo") == (pytest.approx(0.8), 1)
    # clip at 0 when the read text is far longer than the target
    assert ocr_similarity("ab", "xyzxyzxyz")[0] == 0.0
    # "max": d / max(len) = 7 / 9
    assert ocr_similarity("ab", "xyzxyzxyz", normalize_by="max")[0] == pytest.approx(1 - 9 / 9)
    assert ocr_similarity("hello", "helo", normalize_by="max")[0] == pytest.approx(0.8)
    assert ocr_similarity("open", "shopopennow", match="substring") == (1.0, 0)
    assert ocr_similarity("open", "shopopennow", match="full")[1] == 7


@pytest.fixture(scope="module")
def ocr():
    if shutil.which("tesseract") is None:
        pytest.skip("tesseract-ocr is not installed")
    from rewardkit import load_reward

    return load_reward("ocr")


@pytest.mark.slow
@needs_tesseract
def test_clean_renders_read_exactly(ocr):
    out = ocr([render(w) for w in WORDS], [f'a shop sign that says "{w}"' for w in WORDS])
    exact = int((out.scores == 1.0).sum())
    assert exact >= 0.9 * len(WORDS), [d["read"] for d in out.details]
    assert out.valid.all()
    assert out.details[0]["target"] == "OPEN"


@needs_tesseract
def test_misspelled_render_scores_by_edit_distance(ocr):
    # image shows HELLO, prompt asks for HELLP: one substitution over 5 characters
    out = ocr([render("HELLO"), render("WORLD", fg=(250, 250, 250), bg=(10, 10, 10))],
              ['a sign reading "HELLP"', 'white text "world" on black'])
    assert float(out.scores[0]) == pytest.approx(0.8)
    assert float(out.dimensions["edit_distance"][0]) == 1.0
    assert float(out.scores[1]) == 1.0                 # case ignored, light-on-dark read


@needs_tesseract
def test_blank_image_scores_zero_and_no_quote_is_nan(ocr):
    out = ocr([Image.new("RGB", (200, 80), "white"), render("OPEN")], ['a sign "OPEN"', "a sign with no quotes"])
    assert float(out.scores[0]) == 0.0 and out.valid[0]
    assert torch.isnan(out.scores[1]) and not out.valid[1]
    assert "requests no quoted text" in out.errors[1]
