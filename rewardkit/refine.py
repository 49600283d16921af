"""Generate–critique–refine (GCR, RationalRewards §2.2 / appendix E.2): test-time prompt tuning with a
reasoning reward.

    >>> from rewardkit.refine import refine, DiffusersGenerator
    >>> critic = rewardkit.load_reward("rational", model="runs/parrot-qwen3vl/student")
    >>> result = refine(DiffusersGenerator(pipe, num_inference_steps=28), ["a red bicycle"], critic=critic)
    >>> result.records[0]["status"], result.images_after[0]

1. the generator draws one image per request (a diffusers pipeline through :class:`DiffusersGenerator`, or
   any callable ``generator(prompts, sources=..., seed=...) -> list of images``), all requests in one batch;
2. the critic (``rational``, or any reward whose per-sample ``details`` carry ``scores`` (1-4 / None = N/A)
   and a ``refined_request``) critiques every image;
3. a sample is refined iff some applicable dimension scores below ``threshold`` (default 3.0; N/A ignored):
   its refined request is sent back to the generator (one batch for all refined samples) and the new image is
   critiqued again **against the user's request**, like the first image: before and after are scores of the
   same question (the refined request is the generator's input, not the goal; a critique against it would let
   a refinement that drops part of the request score higher). One iteration by default (the paper's
   setting); ``iterations`` > 1 repeats on the samples still below the threshold, each round's refined
   request coming from the critique of the latest image against the user's request.

Never a silent pass: a critique that did not parse is NaN, which never counts as "good" (status
``critique_failed``: the sample is not refined, since there is no refined request to use, and the
record says why); a low score without a refined request is ``no_refined_request``. ``status`` is one of
``accepted`` (every applicable dimension >= threshold), ``refined``, ``critique_failed``,
``no_refined_request``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["refine", "RefineResult", "DiffusersGenerator", "decide"]

STATUSES = ("accepted", "refined", "critique_failed", "no_refined_request")


class DiffusersGenerator:
    """Wrap a diffusers pipeline as a GCR generator: ``pipe(prompt=[...], image=sources?, generator=seeded,
    **kwargs).images``. Edit pipelines get the first source image of each sample as ``image``."""

    def __init__(self, pipe: Any, **kwargs: Any) -> None:
        self.pipe = pipe
        self.kwargs = kwargs

    def __call__(self, prompts: Sequence[str], *, sources: Sequence[Sequence[Any]] | None = None,
                 seed: int | None = None) -> list[Any]:
        import torch

        kw = dict(self.kwargs)
        if seed is not None:
            dev = getattr(self.pipe, "device", "cpu")
            kw["generator"] = [torch.Generator(device=dev).manual_seed(seed + i) for i in range(len(prompts))]
        if sources is not None and any(sources):
            kw["image"] = [s[0] for s in sources]
        out = self.pipe(prompt=list(prompts), **kw)
        images = out.images if hasattr(out, "images") else out[0]
        if isinstance(images, torch.Tensor):
            images = list(images)
        return list(images)


@dataclass
class RefineResult:
    """Per prompt: ``records[i]`` (JSON-serialisable: prompt, status, scores before / after on the critic's
    dimensions, the refined request(s), the critic's error), and the images before / after (after = before
    when the sample was not refined)."""

    records: list[dict[str, Any]]
    images_before: list[Any]
    images_after: list[Any]
    info: dict[str, Any] = field(default_factory=dict)


def _dim_scores(out: Any, i: int) -> dict[str, float | None] | None:
    """The critic's 1-4 / None scores of sample ``i`` (None when the critique is invalid)."""
    if not bool(out.valid[i]):
        return None
    det = (out.details or [None] * len(out))[i] or {}
    if isinstance(det.get("scores"), dict):
        return dict(det["scores"])
    # a generic reward: its dimensions, NaN read as "does not apply" on a valid sample
    return {k: (None if math.isnan(float(v[i])) else float(v[i])) for k, v in out.dimensions.items()}


def decide(scores: dict[str, float | None] | None, refined_request: str | None, threshold: float = 3.0) -> str:
    """GCR's decision for one critique -> a status (see the module docstring). ``scores`` None = invalid."""
    from .parrot.format import needs_refinement

    if scores is None or not any(v is not None for v in scores.values()):
        return "critique_failed"
    if not needs_refinement(scores, threshold):
        return "accepted"
    return "refined" if refined_request and refined_request.strip() else "no_refined_request"


def refine(generator: Callable[..., list[Any]], prompts: Sequence[str], *, critic: Any,
           sources: Sequence[Sequence[Any]] | None = None, threshold: float = 3.0, iterations: int = 1,
           seed: int | None = 0, batch_size: int | None = None, images: Sequence[Any] | None = None) -> RefineResult:
    """Run GCR over ``prompts`` (see the module docstring). ``images`` skips the first generation (critique
    and refine given images)."""
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite number, got {threshold!r}")
    prompts = list(prompts)
    n = len(prompts)
    srcs = list(sources) if sources is not None else None
    if srcs is not None and len(srcs) != n:
        raise ValueError(f"got {n} prompts but {len(srcs)} source entries")
    before = list(images) if images is not None else list(generator(prompts, sources=srcs, seed=seed))
    if len(before) != n:
        raise ValueError(f"the generator returned {len(before)} images for {n} prompts")

    def critique(ims, ps, idx):
        return critic(ims, ps, sources=None if srcs is None else [srcs[i] for i in idx], batch_size=batch_size,
                      on_error="nan")

    out0 = critique(before, prompts, list(range(n)))
    records: list[dict[str, Any]] = []
    current = list(before)
    cur_out = [(out0, i) for i in range(n)]
    for i in range(n):
        records.append({"prompt": prompts[i], "status": None, "score_before": out0.tolist()[i],
                        "dimensions_before": _dim_scores(out0, i), "error_before": out0.errors[i],
                        "refined_prompts": [], "score_after": out0.tolist()[i],
                        "dimensions_after": _dim_scores(out0, i), "error_after": out0.errors[i], "iterations": 0})
    active = list(range(n))
    for it in range(iterations):
        todo, new_prompts = [], []
        for i in active:
            out, j = cur_out[i]
            det = (out.details or [None] * len(out))[j] or {}
            status = decide(_dim_scores(out, j), det.get("refined_request"), threshold)
            if it == 0:  # later rounds only revisit refined samples: their status stays "refined"
                records[i]["status"] = status
            if status == "refined":
                todo.append(i)
                new_prompts.append(det["refined_request"].strip())
        if not todo:
            break
        imgs = generator(new_prompts, sources=None if srcs is None else [srcs[i] for i in todo],
                         seed=None if seed is None else seed + 7919 * (it + 1))
        if len(imgs) != len(todo):
            raise ValueError(f"the generator returned {len(imgs)} images for {len(todo)} refined prompts")
        out = critique(imgs, [prompts[i] for i in todo], todo)  # the user's request, as before
        for j, i in enumerate(todo):
            current[i] = imgs[j]
            cur_out[i] = (out, j)
            r = records[i]
            r["refined_prompts"].append(new_prompts[j])
            r["iterations"] = it + 1
            r["score_after"] = out.tolist()[j]
            r["dimensions_after"] = _dim_scores(out, j)
            r["error_after"] = out.errors[j]
        active = todo
    info = {"threshold": threshold, "iterations": iterations, "seed": seed, "critiqued_against": "user_prompt",
            "critic": getattr(critic, "name", type(critic).__name__), "critic_info": dict(out0.info)}
    return RefineResult(records=records, images_before=before, images_after=current, info=info)
