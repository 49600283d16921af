"""OCR text-rendering reward: the text a prompt asks for (in quotes) vs the text Tesseract reads.

    score = 1 - min(d, |t|) / |t|        d = edit distance between normalised target t and normalised read r

Rules (all configurable, defaults follow flow_grpo / DiffusionNFT's OCR reward so numbers compare):

- **Target text**: every quoted span of the prompt, in order, joined by one space: ``"..."``, ``“...”``,
  ``«...»``, ``‘...’``, and ``'...'`` when the quotes are not inside a word (so "a cat's 'OPEN' sign" yields
  ``OPEN``). A prompt without quoted text is not applicable: NaN with that reason.
- **Case**: ignored (both sides case-folded) unless ``case_sensitive=True``.
- **Whitespace**: ``whitespace="remove"`` (default) deletes all whitespace on both sides (OCR often breaks or
  merges words); ``"collapse"`` turns each run into one space and strips the ends.
- **Match**: ``match="full"`` (default) compares the target with everything read; ``"substring"`` uses the
  closest substring of the read text (semi-global alignment), so other text in the image is not penalised
  (use an anti-hacking detector for unrequested text).
- **Normalisation**: ``normalize_by="target"`` (default) divides by the target length and clips the score at
  0; ``"max"`` divides by ``max(|t|, |r|)``.

Tesseract (``tesseract-ocr`` from the system package manager, ``pytesseract`` from the ``ocr`` extra) runs
in a subprocess per image, so images are read by a small thread pool; nothing is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import torch
from PIL import Image, ImageOps

from .._imports import require
from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput

__all__ = ["OCRReward", "OCRConfig", "extract_quoted", "normalize_text", "edit_distance",
           "substring_edit_distance", "ocr_similarity"]

_QUOTE_PATTERNS = [
    r'"([^"]*)"',                 # straight double quotes
    r"\u201c([^\u201d]*)\u201d",  # “ ”
    r"\u00ab([^\u00bb]*)\u00bb",  # « »
    r"\u2018([^\u2019]*)\u2019",  # ‘ ’
    r"(?<![\w'])'([^']+)'(?![\w'])",  # 'single' not part of a word (apostrophes are not quotes)
]
_QUOTED = re.compile("|".join(_QUOTE_PATTERNS))


def extract_quoted(prompt: str) -> list[str]:
    """The quoted spans of ``prompt`` in order of appearance (empty spans dropped)."""
    spans = []
    for m in _QUOTED.finditer(prompt):
        text = next(g for g in m.groups() if g is not None).strip()
        if text:
            spans.append(text)
    return spans


def normalize_text(text: str, *, case_sensitive: bool = False, whitespace: str = "remove") -> str:
    """Apply the case and whitespace rules (``whitespace`` is "remove" or "collapse")."""
    if not case_sensitive:
        text = text.casefold()
    if whitespace == "remove":
        return re.sub(r"\s+", "", text)
    if whitespace == "collapse":
        return re.sub(r"\s+", " ", text).strip()
    raise ValueError(f"whitespace must be 'remove' or 'collapse', got {whitespace!r}")


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit cost insert / delete / substitute). O(|a| |b|) time, O(|b|) memory."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def substring_edit_distance(pattern: str, text: str) -> int:
    """Smallest edit distance between ``pattern`` and any substring of ``text`` (free leading / trailing text)."""
    prev = [0] * (len(text) + 1)  # aligning an empty pattern anywhere costs nothing
    for i, cp in enumerate(pattern, 1):
        cur = [i]
        for j, ct in enumerate(text, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (cp != ct)))
        prev = cur
    return min(prev)


def ocr_similarity(target: str, read: str, *, match: str = "full", normalize_by: str = "target") -> tuple[float, int]:
    """``(score, distance)`` for already normalised strings; ``target`` must be non-empty."""
    if not target:
        raise ValueError("target text is empty")
    if match == "full":
        d = edit_distance(target, read)
    elif match == "substring":
        d = substring_edit_distance(target, read)
    else:
        raise ValueError(f"match must be 'full' or 'substring', got {match!r}")
    if normalize_by == "target":
        return 1.0 - min(d, len(target)) / len(target), d
    if normalize_by == "max":
        return 1.0 - d / max(len(target), len(read)), d
    raise ValueError(f"normalize_by must be 'target' or 'max', got {normalize_by!r}")


@dataclass
class OCRConfig(RewardConfig):
    case_sensitive: bool = False
    whitespace: str = "remove"       # "remove" | "collapse"
    match: str = "full"              # "full" | "substring"
    normalize_by: str = "target"     # "target" | "max"
    lang: str = "eng"                # Tesseract language pack(s), e.g. "eng+deu"
    psm: int = 3                     # Tesseract page segmentation mode (3 = automatic; 11 = sparse text)
    min_side: int = 0                # upscale images whose shorter side is below this (0 = never)
    tesseract_cmd: str = "tesseract"
    num_workers: int = 0             # concurrent Tesseract processes (0 = min(4, CPU count))
    timeout_s: float = 30.0          # per image; a timeout marks the sample invalid


class OCRReward(Reward):
    """1 - normalised edit distance between the prompt's quoted text and Tesseract's reading of the image."""

    name: ClassVar[str] = "ocr"
    tasks = frozenset({"t2i"})
    score_range = (0.0, 1.0)
    dimensions = ("edit_distance",)
    extras = ("ocr",)
    thread_safe = True  # each image is read by its own Tesseract subprocess
    Config = OCRConfig

    def __init__(self, config=None, /, **overrides):
        super().__init__(config, **overrides)
        cfg = self.config
        normalize_text("", whitespace=cfg.whitespace)  # validates the option
        ocr_similarity("x", "x", match=cfg.match, normalize_by=cfg.normalize_by)
        if cfg.num_workers < 0:
            raise ValueError("num_workers must be >= 0 (0 = automatic)")
        self._workers = cfg.num_workers or min(4, os.cpu_count() or 1)
        self._pytesseract = require("pytesseract", "ocr", purpose="the OCR reward")
        exe = shutil.which(cfg.tesseract_cmd)
        if exe is None:
            raise RuntimeError(
                f"the Tesseract executable {cfg.tesseract_cmd!r} was not found. Install it with your system "
                "package manager, e.g. `apt-get install tesseract-ocr` (Debian/Ubuntu), `brew install tesseract` "
                "(macOS), or pass tesseract_cmd=/path/to/tesseract")
        self._exe = exe

    def read_text(self, image: Image.Image) -> str:
        """Tesseract's reading of one RGB image (raw, before the case / whitespace rules)."""
        cfg = self.config
        img = image.convert("L")
        if cfg.min_side and min(img.size) < cfg.min_side:
            scale = cfg.min_side / min(img.size)
            img = img.resize((round(img.width * scale), round(img.height * scale)), Image.Resampling.BICUBIC)
        img = ImageOps.expand(img, border=10, fill=int(img.getpixel((0, 0))))  # Tesseract needs a margin
        pt = self._pytesseract
        pt.pytesseract.tesseract_cmd = self._exe
        return pt.image_to_string(img, lang=cfg.lang, config=f"--psm {cfg.psm}", timeout=cfg.timeout_s)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        cfg = self.config
        n = len(batch)
        scores = torch.full((n,), float("nan"))
        dist = torch.full((n,), float("nan"))
        errors: list[str | None] = [None] * n
        details: list[dict | None] = [None] * n
        targets = [" ".join(extract_quoted(p)) for p in batch.prompts]
        todo = [i for i in range(n) if targets[i]]
        for i in range(n):
            if not targets[i]:
                errors[i] = "not applicable: the prompt requests no quoted text"

        def read(i: int) -> tuple[int, str | None, str | None]:
            try:
                return i, self.read_text(batch.images[i]), None
            except RuntimeError as exc:  # pytesseract raises RuntimeError on timeout, TesseractError on failure
                return i, None, f"tesseract failed: {exc}"

        workers = min(self._workers, max(len(todo), 1))
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                results = list(pool.map(read, todo))
        else:
            results = [read(i) for i in todo]
        for i, raw, err in results:
            if err is not None:
                errors[i] = err
                continue
            t = normalize_text(targets[i], case_sensitive=cfg.case_sensitive, whitespace=cfg.whitespace)
            r = normalize_text(raw, case_sensitive=cfg.case_sensitive, whitespace=cfg.whitespace)
            if not t:
                errors[i] = "not applicable: the quoted text is empty after normalisation"
                continue
            s, d = ocr_similarity(t, r, match=cfg.match, normalize_by=cfg.normalize_by)
            scores[i], dist[i] = s, float(d)
            details[i] = {"target": targets[i], "read": raw.strip()}
        return RewardOutput(scores=scores, errors=errors, dimensions={"edit_distance": dist}, details=details,
                            info={"reward": "ocr", "match": cfg.match, "whitespace": cfg.whitespace,
                                  "case_sensitive": cfg.case_sensitive, "normalize_by": cfg.normalize_by})

    @classmethod
    def tiny(cls, workdir: str) -> "OCRReward":
        """The real reward: Tesseract is the one model available offline without a download."""
        return cls(num_workers=2)
