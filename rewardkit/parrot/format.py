"""PARROT's answer formats and their strict parsers (pure functions, no model).

Pointwise critique (the RationalRewards student, the projection stage, the GCR loop)::

    Text Faithfulness: <reasoning>
    Score: 3.5
    Image Faithfulness: <reasoning>
    Score: N/A
    Physical and Visual Quality: <reasoning>
    Score: 2
    Text Rendering: <reasoning>
    Score: N/A
    Summary: <defects in one paragraph>
    Refined Request: <the request rewritten to fix the defects>

Pairwise rationale (the anchored teacher, the student's native pairwise answer)::

    Text Faithfulness: <comparison>
    Scores: A = 3.5, B = 2
    ... (the four dimensions)
    Summary: <why>
    Preferred: A

Scores are the appendix's 1–4 scale with float interpolation, or N/A (no source image for a text-to-image
request; no text asked for). Parsing is strict: each dimension header once, exactly one score line per
section, a well-formed number inside [1, 4] or N/A. Anything else is a :class:`ParseError` naming the
dimension; never a fallback value (the authors' released code falls back to 2.5).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

from ..judges.base import DECIMAL

__all__ = ["DIMENSIONS", "TITLES", "ParseError", "Critique", "PairRationale", "parse_score", "parse_pointwise",
           "parse_pairwise", "parse_prediction", "consistency_view", "CONSISTENCY_VIEWS", "mean_score", "to_unit",
           "needs_refinement", "SCORE_MIN", "SCORE_MAX"]

DIMENSIONS = ("text_faithfulness", "image_faithfulness", "physical_quality", "text_rendering")
#: header labels as they appear in answers (the first is what templates ask for; the others are accepted)
TITLES = {
    "text_faithfulness": ("Text Faithfulness",),
    "image_faithfulness": ("Image Faithfulness",),
    "physical_quality": ("Physical and Visual Quality", "Physical/Visual Quality", "Physical & Visual Quality",
                         "Physical Quality", "Visual Quality"),
    "text_rendering": ("Text Rendering",),
}
SCORE_MIN, SCORE_MAX = 1.0, 4.0
NA = None  # an N/A dimension in parsed values


class ParseError(ValueError):
    """An answer does not follow the format. ``dimension`` names the section at fault (None: global)."""

    def __init__(self, message: str, dimension: str | None = None) -> None:
        super().__init__(message)
        self.dimension = dimension


# ASCII digits only (rewardkit.judges.base.DECIMAL, the rule every judge parser shares): "３" is not a 3
_NUM = rf"(?:{DECIMAL}|\.[0-9]+)"
_VALUE_RE = re.compile(rf"^\**\s*(?P<v>{_NUM}|N\s*/\s*A|NA|n\s*/\s*a)\s*\**\s*(?:/\s*4(?:\.0+)?)?\s*\**\s*\.?\s*$",
                       re.IGNORECASE)
_TRAIL = ("summary", "refined request", "preferred")


def parse_score(text: str, *, allow_na: bool = True) -> float | None:
    """``"3.5"``, ``"**3**"``, ``"3/4"`` -> 3.5 / 3.0; ``"N/A"`` -> None. :class:`ParseError` for anything else,
    including numbers outside [1, 4] and non-finite values."""
    m = _VALUE_RE.match(text.strip())
    if not m:
        raise ParseError(f"score {text.strip()[:40]!r} is not a number in [1, 4] or N/A")
    v = m.group("v")
    if not re.match(_NUM + "$", v):
        if not allow_na:
            raise ParseError("N/A is not allowed here")
        return NA
    x = float(v)
    if not (math.isfinite(x) and SCORE_MIN <= x <= SCORE_MAX):
        raise ParseError(f"score {x:g} is outside [1, 4]")
    return x


def _header_re(labels: Sequence[str]) -> re.Pattern:
    alt = "|".join(re.escape(t).replace(r"\ ", r"\s+") for t in labels)
    return re.compile(rf"^[ \t]*(?:[#>*\-]+[ \t]*)*\**(?:{alt})\**[ \t]*(?:\([^)\n]*\))?[ \t]*\**[ \t]*:", re.IGNORECASE | re.MULTILINE)


_HEADERS = {d: _header_re(t) for d, t in TITLES.items()}
_TRAIL_RE = re.compile(r"^[ \t]*(?:[#>*\-]+[ \t]*)*\**(summary|refined\s+request|preferred)\**[ \t]*\**[ \t]*:",
                       re.IGNORECASE | re.MULTILINE)
_SCORE_LINE = re.compile(r"^[ \t]*(?:[#>*\-]+[ \t]*)*\**score\**[ \t]*\**[ \t]*:(?P<rest>.*)$", re.IGNORECASE | re.MULTILINE)
_SCORES_LINE = re.compile(r"^[ \t]*(?:[#>*\-]+[ \t]*)*\**scores\**[ \t]*\**[ \t]*:(?P<rest>.*)$",
                          re.IGNORECASE | re.MULTILINE)
_PAIR_RE = re.compile(r"^\s*(?:image\s+)?A\s*[=:]\s*(?P<a>[^,;]+?)\s*[,;]\s*(?:image\s+)?B\s*[=:]\s*(?P<b>.+?)\s*$",
                      re.IGNORECASE)


def _sections(text: str, dims: Sequence[str]) -> dict[str, str]:
    """dimension -> its section text (from its header to the next header / trailing field)."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError("empty answer")
    starts: list[tuple[int, int, str]] = []
    for d in dims:
        hits = list(_HEADERS[d].finditer(text))
        if not hits:
            raise ParseError(f"no '{TITLES[d][0]}:' section", d)
        if len(hits) > 1:
            raise ParseError(f"'{TITLES[d][0]}' appears {len(hits)} times", d)
        starts.append((hits[0].start(), hits[0].end(), d))
    bounds = sorted([s for s, _, _ in starts] + [m.start() for m in _TRAIL_RE.finditer(text)] + [len(text)])
    out = {}
    for s, e, d in starts:
        nxt = min(b for b in bounds if b > s)
        out[d] = text[e:nxt]
    return out


def _field(text: str, name: str) -> str | None:
    """The text of a trailing field (``Summary``, ``Refined Request``, ``Preferred``): to the next field."""
    hits = [m for m in _TRAIL_RE.finditer(text) if re.sub(r"\s+", " ", m.group(1).lower()) == name]
    if not hits:
        return None
    m = hits[-1]
    later = [x.start() for x in _TRAIL_RE.finditer(text) if x.start() > m.start()]
    return text[m.end():min(later) if later else len(text)].strip()


def _reasoning(section: str, line: re.Match) -> str:
    return (section[:line.start()] + section[line.end():]).strip()


@dataclass
class Critique:
    """A parsed pointwise critique: ``scores[d]`` in [1, 4] or None (N/A) for each of the four dimensions."""

    scores: dict[str, float | None]
    reasons: dict[str, str]
    summary: str | None = None
    refined_request: str | None = None
    notes: list[str] = field(default_factory=list)

    def applicable(self) -> dict[str, float]:
        return {d: v for d, v in self.scores.items() if v is not None}


def parse_pointwise(text: str, *, t2i: bool = False) -> Critique:
    """Strictly parse a pointwise critique. ``t2i=True``: image faithfulness is N/A whatever the answer says
    (there is no source image; a number there is recorded in ``notes`` and ignored)."""
    secs = _sections(text, DIMENSIONS)
    scores: dict[str, float | None] = {}
    reasons: dict[str, str] = {}
    notes: list[str] = []
    for d in DIMENSIONS:
        lines = list(_SCORE_LINE.finditer(secs[d]))
        if len(lines) != 1:
            raise ParseError(f"{TITLES[d][0]}: {len(lines)} 'Score:' lines (need exactly 1)", d)
        try:
            v = parse_score(lines[0].group("rest"))
        except ParseError as exc:
            raise ParseError(f"{TITLES[d][0]}: {exc}", d) from None
        if d == "image_faithfulness" and t2i and v is not None:
            notes.append(f"image_faithfulness score {v:g} ignored: text-to-image request (N/A)")
            v = None
        scores[d] = v
        reasons[d] = _reasoning(secs[d], lines[0])
    refined = _field(text, "refined request")
    return Critique(scores=scores, reasons=reasons, summary=_field(text, "summary"),
                    refined_request=refined or None, notes=notes)


@dataclass
class PairRationale:
    """A parsed pairwise rationale: per dimension ``(score A, score B)`` (None = N/A) and the stated preference."""

    scores: dict[str, tuple[float | None, float | None]]
    reasons: dict[str, str]
    preferred: str  # "A" | "B"
    summary: str | None = None


def parse_pairwise(text: str, *, t2i: bool = False) -> PairRationale:
    """Strictly parse a pairwise rationale (format in the module docstring). Image faithfulness must be N/A
    for both images of a text-to-image pair (a number there is a format error: the template says N/A)."""
    scores, reasons = _pair_sections(text, t2i=t2i)
    pref = _field(text, "preferred")
    if pref is None:
        raise ParseError("no 'Preferred:' line")
    p = parse_prediction(pref)
    if p is None:
        raise ParseError(f"'Preferred: {pref[:40]}' is not A or B")
    return PairRationale(scores=scores, reasons=reasons, preferred=p, summary=_field(text, "summary"))


def _pair_sections(text: str, *, t2i: bool) -> tuple[dict[str, tuple[float | None, float | None]], dict[str, str]]:
    """The four dimensions of a pairwise answer: ``(score A, score B)`` and reasoning per dimension."""
    secs = _sections(text, DIMENSIONS)
    scores: dict[str, tuple[float | None, float | None]] = {}
    reasons: dict[str, str] = {}
    for d in DIMENSIONS:
        lines = list(_SCORES_LINE.finditer(secs[d]))
        if len(lines) != 1:
            raise ParseError(f"{TITLES[d][0]}: {len(lines)} 'Scores:' lines (need exactly 1)", d)
        rest = lines[0].group("rest").strip()
        m = _PAIR_RE.match(rest)
        if m:
            try:
                a, b = parse_score(m.group("a")), parse_score(m.group("b"))
            except ParseError as exc:
                raise ParseError(f"{TITLES[d][0]}: {exc}", d) from None
        else:
            try:  # one N/A for both
                if parse_score(rest) is not None:
                    raise ParseError("one number for two images")
            except ParseError:
                raise ParseError(f"{TITLES[d][0]}: scores {rest[:40]!r} are not 'A = x, B = y' (1-4 or N/A)", d) from None
            a = b = None
        if (a is None) != (b is None):
            raise ParseError(f"{TITLES[d][0]}: N/A for one image only", d)
        if d == "image_faithfulness" and t2i and a is not None:
            raise ParseError(f"{TITLES[d][0]}: a text-to-image pair has no image faithfulness (N/A)", d)
        scores[d] = (a, b)
        reasons[d] = _reasoning(secs[d], lines[0])
    return scores, reasons


_PRED_RE = re.compile(r"^\s*(?:preferred\s*:\s*)?\**\s*(?:image\s+)?\**\s*(?P<x>[AB])\s*\**\s*\.?\s*$", re.IGNORECASE)


def parse_prediction(text: str) -> str | None:
    """``"A"``, ``"Image B"``, ``"**A**."``, ``"Preferred: B"`` -> "A" / "B"; anything else (prose, both
    letters, ties) -> None. Upper-case letters only: a lone "a" is an article."""
    if not isinstance(text, str):
        return None
    m = _PRED_RE.match(text.strip())
    if not m or m.group("x") not in "AB":
        return None
    return m.group("x")


# ---------------------------------------------------------------------------------------------- stage 2's view
#: what PARROT's consistency check (stage 2) is shown of a rationale: ``full`` (the paper's, appendix C.2) or
#: ``evidence_only``; see :func:`consistency_view`
CONSISTENCY_VIEWS = ("full", "evidence_only")


def consistency_view(rationale: str, view: str = "full") -> str:
    """What PARROT's stage 2 is shown of a pairwise rationale: rebuilt from its parse, never its ``Preferred:``
    line (the label stage 1 was told).

    - ``"full"`` (the default, the paper's reading: appendix C.2 presents the rationale "in full: per-dimension
      arguments, scores and summary"): per dimension its header, its reasoning and its ``Scores:`` line, then
      the ``Summary:`` (when the rationale has one);
    - ``"evidence_only"``: per dimension its header and reasoning only: no scores, no summary.

    Structural, not a word filter: every text the view keeps is kept verbatim, so a reasoning or a summary that
    names the winner ("Image B is better here") is shown as written. Neither view is blind to the label; the
    check asks whether the rationale, read as the teacher wrote it, recovers it. Dropped in both: the
    ``Preferred:`` field and any text before the first dimension or after the summary. ``ValueError`` for an
    unknown view, :class:`ParseError` when the rationale does not parse (as stage 1 parsed it)."""
    if view not in CONSISTENCY_VIEWS:
        raise ValueError(f"consistency view must be one of {CONSISTENCY_VIEWS}, got {view!r}")
    scores, reasons = _pair_sections(rationale, t2i=False)
    lines = []
    for d in DIMENSIONS:
        lines.append(f"{TITLES[d][0]}: {reasons[d]}".rstrip())
        if view == "full":
            a, b = scores[d]
            lines.append("Scores: A = N/A, B = N/A" if a is None else f"Scores: A = {a:g}, B = {b:g}")
    summary = _field(rationale, "summary")
    if view == "full" and summary:
        lines.append(f"Summary: {summary}")
    return "\n".join(lines)


def mean_score(scores: dict[str, float | None]) -> float:
    """The N/A-aware mean over applicable dimensions (NaN when every dimension is N/A)."""
    vals = [v for v in scores.values() if v is not None]
    return sum(vals) / len(vals) if vals else math.nan


def to_unit(mean: float) -> float:
    """[1, 4] -> [0, 1]: ``(m - 1) / 3`` (NaN stays NaN)."""
    return (mean - SCORE_MIN) / (SCORE_MAX - SCORE_MIN)


def needs_refinement(scores: dict[str, float | None], threshold: float = 3.0) -> bool:
    """GCR's rule: any applicable dimension below ``threshold`` (N/A ignored). A NaN score is never "good":
    it counts as below the threshold (callers should not refine from an unparsed critique at all)."""
    for v in scores.values():
        if v is None:
            continue
        if not (v >= threshold):  # NaN -> True
            return True
    return False
