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
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

from ..judges.base import DECIMAL

__all__ = ["DIMENSIONS", "TITLES", "ParseError", "Critique", "PairRationale", "parse_score", "parse_pointwise",
           "parse_pairwise", "parse_prediction", "strip_verdict", "is_verdict", "mean_score", "to_unit", "needs_refinement", "SCORE_MIN",
           "SCORE_MAX"]

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


# ---------------------------------------------------------------------------------------------- verdicts
#: a candidate named in a sentence: "Image A", "picture b", a standalone capital A / B, first / second ...
_CAND_RE = re.compile(r"(?:\b(?:images?|pictures?|imgs?|candidates?|options?|photos?|results?|generations?)\s*"
                      r"[\(\[\"'*_]*[AaBb]\b)|(?-i:\b[AB]\b)|\b(?:first|second|former|latter|left|right|"
                      r"1st|2nd|one|two)\b", re.IGNORECASE)
#: words and signs that state which candidate wins (any form: "better", "preferable", "wins", "favoured" ...)
_VERDICT_WORD_RE = re.compile(
    r"\b(?:better|best|prefer\w*|pref|win|wins|winning|winner\w*|won|loser\w*|los(?:e|es|ing|t)\s+(?:to|against)|"
    r"superior\w*|inferior\w*|"
    r"outperform\w*|outshin\w*|outdo\w*|outclass\w*|favou?r\w*|choos\w*|chos\w*|choice|pick\w*|select\w*|"
    r"go(?:es|ing)?\s+(?:with|for)|ahead|beat\w*|has\s+the\s+edge|edges?\s+out|verdict\w*|conclu\w*|"
    r"stronger|weaker|worse|worst|recommend\w*|victor\w*|surpass\w*|dominates?|trumps?|excels?|exceed\w*|"
    r"prevail\w*|answer\w*|decision|decide\w*|judg\w*|rank\w*|overall|standout|on\s+top|"
    r"lean(?:s|ing|ed)?\s+(?:towards?|to))\b"
    r"|(?:image\s*)?\b[AB]\s*(?:[<>≻≺≥≤≫≪]=?|>>|<<)\s*(?:image\s*)?[AB]\b|[✓✔✅→⇒]", re.IGNORECASE)
_SENT_SPLIT = re.compile(r"(?<=[.!?;])\s+|\n+")
#: words that carry no evidence: a sentence naming a candidate with nothing else ("Overall, Image B.",
#: "It is B.", "Image B it is!", "The label is B.") is a verdict
_FILLER = frozenset("""overall so thus hence therefore clearly obviously definitely certainly surely it is it's its
    the a an this that here then go my i i'd id would say final finally yes in short sum all and easily simply just
    for me to label labelled labeled takes take nod goes keep clear pick ideal""".split())
#: letters that look like A / B (Cyrillic, Greek, Cherokee, small capitals): read as A / B when judging
_LOOKALIKES = str.maketrans({"\u0410": "A", "\u0430": "a", "\u0412": "B", "\u0391": "A", "\u0392": "B",
                             "\u13aa": "A", "\u13f4": "B", "\u1d00": "a", "\u0299": "b"})


def _clean(text: str) -> str:
    """NFKC (fullwidth / mathematical letters -> ASCII) without invisible format characters (zero-width
    spaces, soft hyphens, bidi marks): what stage 2 is shown is exactly what was checked for verdicts."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")


def _bare_candidate(s: str) -> bool:
    if not _CAND_RE.search(s):
        return False
    return all(w in _FILLER for w in re.findall(r"[^\W_]+(?:'[^\W_]+)?", _CAND_RE.sub(" ", s).lower()))


def is_verdict(sentence: str) -> bool:
    """True when ``sentence`` says which candidate wins: it names a candidate (``Image A``, a standalone
    ``A`` / ``B``, ``the first image``, ``the latter`` ...) and a verdict word (``better``, ``prefer``,
    ``wins``, ``superior``, ``choose``, ``>`` ...), or it is a bare answer (``"B"``, ``"Answer: A"``).
    Deliberately broad: a sentence that mixes evidence with a verdict is dropped whole."""
    s = _clean(sentence).translate(_LOOKALIKES).strip()
    if not s:
        return False
    if parse_prediction(s) is not None or parse_prediction(s.rsplit(":", 1)[-1]) is not None:
        return True
    if _bare_candidate(s):
        return True
    return bool(_CAND_RE.search(s)) and bool(_VERDICT_WORD_RE.search(s))


def _evidence(text: str | None) -> str:
    if not text:
        return ""
    kept = [s.strip() for s in _SENT_SPLIT.split(_clean(text)) if s.strip() and not is_verdict(s)]
    return " ".join(kept)


def strip_verdict(rationale: str) -> str:
    """The evidence of a pairwise rationale with every verdict removed, for PARROT's stage 2.

    The consistency check must recover the preference from the rationale's *content*; a rationale that says
    "Preferred: B" (stage 1 is told the label) would otherwise hand the label back. The result is rebuilt from
    the parse (:func:`parse_pairwise`): per dimension its reasoning and its ``Scores:`` line, then the
    summary, in the canonical format. Dropped: the ``Preferred:`` field, any text before the first dimension
    or after the summary, and every sentence of a reasoning / the summary that :func:`is_verdict` flags
    ("Image A is better", "A wins", "I prefer B", "the second image is superior", "Answer: A", "Overall,
    Image B." ...), judged after NFKC with invisible format characters removed and A / B look-alike letters
    read as A / B (the text shown is NFKC without format characters). The
    paper's C.2 shows the teacher the rationale "in full (per-dimension arguments, scores and summary)": the
    scores and the evidence stay. Idempotent. :class:`ParseError` if the rationale does not parse."""
    scores, reasons = _pair_sections(rationale, t2i=False)  # the stage-1 parse (cleaning only the texts below)
    lines = []
    for d in DIMENSIONS:
        a, b = scores[d]
        reason = _evidence(reasons[d])
        lines.append(f"{TITLES[d][0]}: {reason}".rstrip())
        lines.append("Scores: A = N/A, B = N/A" if a is None else f"Scores: A = {a:g}, B = {b:g}")
    lines.append(f"Summary: {_evidence(_field(rationale, 'summary'))}".rstrip())
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
