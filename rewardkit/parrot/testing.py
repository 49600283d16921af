"""A scripted PARROT teacher: a protocol-level :class:`~rewardkit.judges.JudgeBackend` whose answers follow
hand-computable rules, for tests and smoke runs of the pipeline's bookkeeping (filter arithmetic, N/A,
keep-rate reports, resume). It is not a model: it never looks at anything but image brightness and the
markers below. The same code paths run end to end on real tiny Qwen judges in the test suite.

Rules. An image's quality is ``q = 1 + 3 * mean brightness / 255`` rounded to 0.5 (in [1, 4]).

- pointwise (student question, projection): Text Faithfulness = Physical Quality = q; Image Faithfulness
  N/A for text-to-image, 3 for edits; Text Rendering N/A unless the request contains a double quote (then 2).
- anchored rationale: per-dimension scores of A and B as above, each dimension's reasoning describes both
  images' brightness and then states the given label as the winner ("Image B is better here."), the summary
  states it again and ``Preferred:`` = the given label (stage 2 never sees that line; the sentences it does).
- consistency: answers from the evidence it is shown, never from a verdict sentence: the image whose
  ``Scores:`` lines sum higher (the ``full`` view); without score lines (``evidence_only``), the image whose
  stated brightness figures ("mean brightness N of 255") sum higher; equal -> "The evaluation does not
  separate the two images." (non-predictive, unparseable). So a rationale is kept iff its content
  (brightness) supports the label.
- student pairwise question: the brighter image.

Markers in the request change the behaviour: ``[garbage]`` -> the anchored rationale is prose without the
format (unparseable); ``[contrary]`` -> the rationale prefers the brighter image whatever the label (the
paper's "label-ignoring rationale"); ``[vague]`` -> the consistency answer is "Both images look fine."
(unparseable prediction); ``[badproj]`` -> the projection answer is prose; ``[fail]`` -> every call whose
batch contains this request raises ``RuntimeError`` (a judge failure).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ..judges.base import JudgeBackend

__all__ = ["ScriptedTeacher", "quality"]


def quality(im: Any) -> float:
    """1 + 3 * mean brightness / 255, rounded to the nearest 0.5."""
    b = float(np.asarray(im.convert("L"), dtype=np.float64).mean())
    return round((1 + 3 * b / 255) * 2) / 2


def _parts(conv) -> tuple[list[Any], str]:
    imgs, text = [], []
    for msg in conv:
        c = msg.get("content")
        if isinstance(c, list):
            imgs += [x["image"] for x in c if x.get("type") == "image"]
            text += [x["text"] for x in c if x.get("type") == "text"]
    return imgs, "\n".join(text)


def _request(text: str) -> str:
    i = text.find('"')
    j = text.find('"\n', i + 1) if i >= 0 else -1
    return text[i + 1:j] if i >= 0 and j > i else ""


def _looks(im: Any) -> str:
    b = float(np.asarray(im.convert("L"), dtype=np.float64).mean())
    return f"{'bright' if b >= 170 else 'dark' if b < 85 else 'mid-grey'} (mean brightness {b:.0f} of 255)"


#: the brightness figures of one argument of :meth:`ScriptedTeacher._pair` ("Image A looks ... (mean brightness
#: 200 of 255), Image B looks ... (mean brightness 50 of 255)")
_FIGURES = re.compile(r"Image A looks [^()\n]*\(mean brightness (\d+) of 255\), Image B looks [^()\n]*"
                      r"\(mean brightness (\d+) of 255\)")


def _fmt(x: float | None) -> str:
    return "N/A" if x is None else f"{x:g}"


class ScriptedTeacher(JudgeBackend):
    """Rule-based teacher (see the module docstring). ``calls`` records (method, number of conversations)."""

    kind = "scripted"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": "parrot-scripted-teacher"}

    def _dims(self, im, request: str, edit: bool) -> dict[str, float | None]:
        q = quality(im)
        return {"Text Faithfulness": q, "Image Faithfulness": 3.0 if edit else None,
                "Physical and Visual Quality": q, "Text Rendering": 2.0 if '"' in request else None}

    def _pointwise(self, im, request: str, edit: bool) -> str:
        lines = []
        for name, v in self._dims(im, request, edit).items():
            lines += [f"{name}: scripted reasoning about {name.lower()}.", f"Score: {_fmt(v)}"]
        lines += ["Summary: scripted summary.", f"Refined Request: {request}, highly detailed, well lit"]
        return "\n".join(lines)

    def _pair(self, a, b, request: str, edit: bool, preferred: str) -> str:
        da, db = self._dims(a, request, edit), self._dims(b, request, edit)
        lines = []
        for name in da:
            if da[name] is None:
                lines += [f"{name}: not applicable.", "Scores: A = N/A, B = N/A"]
            else:
                lines += [f"{name}: Image A looks {_looks(a)}, Image B looks {_looks(b)}. Image {preferred} is better here.",
                          f"Scores: A = {_fmt(da[name])}, B = {_fmt(db[name])}"]
        lines += [f"Summary: Image {preferred} is better overall.", f"Preferred: {preferred}"]
        return "\n".join(lines)

    def _answer(self, conv) -> str:
        imgs, text = _parts(conv)
        req = _request(text)
        if "[fail]" in req:
            raise RuntimeError("scripted judge failure")
        if "--- evaluation ---" in text:  # consistency
            if "[vague]" in req:
                return "Both images look fine."
            body = text.split("--- evaluation ---", 1)[1].split("--- end ---", 1)[0]
            margin = 0.0
            scored = [ln for ln in body.splitlines() if ln.strip().startswith("Scores:")]
            for line in scored:
                if "N/A" not in line:
                    a, b = (float(x.split("=")[1]) for x in line.split(":", 1)[1].split(","))
                    margin += a - b
            if not scored:  # the arguments alone: the brightness figures they state
                for a, b in _FIGURES.findall(body):
                    margin += float(a) - float(b)
            return "A" if margin > 0 else "B" if margin < 0 else "The evaluation does not separate the two images."
        edit = "The first image is the source image." in text
        if "--- reference comparison ---" in text:  # projection
            return "This image is pretty good overall." if "[badproj]" in req else self._pointwise(imgs[-1], req, edit)
        if "Human annotators preferred Image" in text:  # anchored rationale
            if "[garbage]" in req:
                return "Image A and image B are both images of the request, one is preferred."
            label = text.split("Human annotators preferred Image", 1)[1].strip()[0]
            a, b = imgs[-2], imgs[-1]
            if "[contrary]" in req:
                label = "A" if quality(a) >= quality(b) else "B"
            return self._pair(a, b, req, edit, label)
        if "Compare them on the four dimensions" in text:  # student pairwise
            a, b = imgs[-2], imgs[-1]
            return self._pair(a, b, req, edit, "A" if quality(a) >= quality(b) else "B")
        return self._pointwise(imgs[-1], req, edit)

    def generate(self, conversations: Sequence, *, n: int = 1, temperature: float = 0.0, max_new_tokens: int = 256,
                 stop: Sequence[str] | None = None, seed: int | None = None) -> list[list[str]]:
        self.calls.append(("generate", len(conversations)))
        return [[self._answer(c)] * n for c in conversations]

    def choice_probs(self, conversations: Sequence, choices: Sequence[str]):
        raise NotImplementedError("the scripted PARROT teacher only generates")
