"""Conversations of every PARROT stage and of the RationalRewards student, from one versioned template
(``rewardkit/templates/parrot/<name>.yaml``).

Image order (so that backends share prefixes): ``[source (edits)] + candidates``; all questions about a
pair start with the same system message and the same images.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..judges.templates import Template
from .format import consistency_view

__all__ = ["pointwise_conv", "pairwise_conv", "rationalize_conv", "consistency_conv", "project_conv"]


def _images(sources: Sequence[Any], cands: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"type": "image", "image": im} for im in [*sources, *cands]]


def _common(t: Template, request: str, sources: Sequence[Any], fmt_key: str) -> dict[str, str]:
    edit = bool(sources)
    return {"request_line": t.render("request_edit" if edit else "request_t2i", request=request),
            "t2i_note": "" if edit else " " + t["t2i_note"], "rubric": t["rubric"], "format": t[fmt_key]}


def _conv(t: Template, images: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": t["system"]},
            {"role": "user", "content": images + [{"type": "text", "text": text}]}]


def pointwise_conv(t: Template, request: str, image: Any, sources: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The student's (and GCR's) pointwise critique question: one candidate, no hint."""
    return _conv(t, _images(sources, [image]), t.render("pointwise", **_common(t, request, sources, "pointwise_format")))


def pairwise_conv(t: Template, request: str, image_a: Any, image_b: Any, sources: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The student's native pairwise question (no label)."""
    return _conv(t, _images(sources, [image_a, image_b]),
                 t.render("pairwise", **_common(t, request, sources, "pairwise_format")))


def rationalize_conv(t: Template, request: str, image_a: Any, image_b: Any, label: str,
                     sources: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Stage 1: the teacher sees the pair, the request (+ source) and the known label ("A" / "B")."""
    if label not in ("A", "B"):
        raise ValueError(f"anchored rationales need label 'A' or 'B', got {label!r}")
    return _conv(t, _images(sources, [image_a, image_b]),
                 t.render("rationalize", label=label, **_common(t, request, sources, "pairwise_format")))


def consistency_conv(t: Template, request: str, rationale: str, edit: bool, view: str = "full") -> list[dict[str, Any]]:
    """Stage 2: text only (no images, no label); the rationale alone must recover the preference. The rationale
    goes through :func:`~rewardkit.parrot.format.consistency_view` here (``view``: ``"full"``, the paper's
    arguments + scores + summary, or ``"evidence_only"``, the arguments alone), so no caller can hand the
    ``Preferred:`` line back."""
    line = t.render("request_text_edit" if edit else "request_text_t2i", request=request)
    text = t.render("consistency", request_line_text=line, shown=t[f"consistency_shown_{view}"],
                    rationale=consistency_view(rationale, view))
    return [{"role": "system", "content": t["system"]}, {"role": "user", "content": [{"type": "text", "text": text}]}]


def project_conv(t: Template, request: str, image: Any, slot: str, rationale: str,
                 sources: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Stage 3: one image of a verified pair, scored alone with the pair's rationale as a hint."""
    return _conv(t, _images(sources, [image]),
                 t.render("project", slot=slot, rationale=rationale, **_common(t, request, sources, "pointwise_format")))
