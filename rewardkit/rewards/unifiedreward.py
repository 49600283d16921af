"""UnifiedReward (Wang et al. 2025, CodeGoat24/UnifiedReward): a generative judge (stock Qwen2.5-VL / Qwen3-VL
checkpoints, e.g. ``CodeGoat24/UnifiedReward-qwen-7b``) with its own prompts, on the judge engine (any backend).

Templates (``template=``, files under ``rewardkit/templates/unifiedreward/``, each citing its source script):

- ``"t2i"`` (default, UnifiedReward 1.0): pointwise, key elements and a score from 1 to 5 after
  ``Final Score:`` (score in [1, 5]); pairwise (``compare``), exactly one kind of conclusion, "Image 1 is better",
  "Image 2 is better" or "Both images are equally good" (1, 0, 0.5).
- ``"2.0"`` (UnifiedReward-2.0): pointwise ``Alignment / Coherence / Style Score (1-5): X`` lines, each in
  [1, 5], as dimensions; the score is their mean (rewardkit's choice: upstream reports the three). Pairwise:
  per axis ``Image 1: x`` / ``Image 2: y`` relative scores in [0, 1] summing to 1 (within 0.01); the verdict
  for image 1 is the mean of its three relative scores.
- ``"think"`` (UnifiedReward-Think): pairwise only, a chain of thought ending in exactly one
  ``<answer>Image 1 is better</answer>`` (or Image 2). Calling the reward pointwise raises; use ``compare``.
- ``"edit"`` (UnifiedReward-Edit, task ``edit``: ``reward(edited, instruction, sources=[[source], ...])``):
  two prompts per sample, instruction following over [source, edited] (``[editing success, over-editing]``) and
  quality over [edited] (``[naturalness, artifacts]``), each a JSON ``{"reasoning": ..., "score": [a, b]}`` with
  scores in [0, 25]. The score is VIEScore's ``sqrt(min(instruction scores) * min(quality scores))`` in [0, 25];
  the four scores and both minima are dimensions. No native pairwise prompt with a stated answer format was
  published, so ``compare`` uses the default ``sigmoid((s_a - s_b) / T)`` on the pointwise scores.

``compare`` asks both orders by default: ``P(a) = (v(a, b) + 1 - v(b, a)) / 2`` (cancels position bias). The
whole answer is the sample's rationale.

Decoding as each template's source scripts: greedy; ``t2i`` and ``think`` (transformers ``generate`` scripts)
send the images as decoded and allow 512 new tokens; ``2.0`` and ``edit`` (UnifiedReward's vLLM client,
``vllm_qwen/vllm_request.py``) send every image re-encoded as JPEG at quality 95 and allow 4096 new tokens.
``reencode=`` (``"auto"``: the template's; ``"none"``; ``"jpeg<quality>"``) and ``max_new_tokens=`` (None: the
template's) override them.

Parsing is strict: an answer without a well-formed verdict / score, with contradictory or repeated ones, or with a
value outside its scale gives NaN and the reason (the answer text stays in ``rationales``), never a default score.

    load_reward("unifiedreward", judge="transformers:CodeGoat24/UnifiedReward-qwen-7b",
                judge_kwargs={"dtype": "bfloat16"})
    load_reward("unifiedreward", template="edit", judge=...)(edited, "add a hat", sources=[[source]])
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..judges.base import DECIMAL
from ..judges.policy import (JUDGE_FAILURE_PREFIX, JudgeError, JudgePolicyMixin, call_on_error, call_rows,
                             describe_failure, is_judge_failure, join_reasons, judge_policy)
from ..reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput
from ._judge_setup import judge_from_config, judge_overrides, scored_template

__all__ = ["UnifiedReward", "jpeg_roundtrip", "parse_final_score", "parse_pair_verdict", "parse_axis_scores", "parse_pair_axis_scores",
           "parse_think_verdict", "parse_edit_scores"]

_MARKER = re.compile(r"Final Score\s*:", re.IGNORECASE)
# after the marker: optional bold, a plain decimal number, optional "/5" or "/ 5", optional bold, optional
# full stop, then the end of the line. Nothing else ("4 out of 5", "3-4", "five", "1e1" are refused).
# ASCII digits only: Python's \d would also take "４" (fullwidth) or "٣" (Arabic-Indic) as a score.
_VALUE = re.compile(rf"[ \t]*(?:\*\*)?[ \t]*({DECIMAL})[ \t]*(?:/[ \t]*([0-9]+))?[ \t]*(?:\*\*)?[ \t]*\.?[ \t]*(?:\r?\n|$)")
_VERDICTS = (("Image 1 is better", 1.0), ("Image 2 is better", 0.0), ("Both images are equally good", 0.5))


def parse_final_score(text: Any, lo: float = 1.0, hi: float = 5.0) -> tuple[float | None, str | None]:
    """The number after ``Final Score:`` -> ``(value, None)`` or ``(None, reason)``.

    Every ``Final Score:`` in the answer must carry the same well-formed number, inside ``[lo, hi]``.
    """
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    marks = list(_MARKER.finditer(text))
    if not marks:
        return None, "no 'Final Score:' in the answer"
    values = []
    for m in marks:
        v = _VALUE.match(text, m.end())
        if v is None:
            return None, f"malformed score after 'Final Score:': {text[m.end():m.end() + 30]!r}"
        if v.group(2) is not None and float(v.group(2)) != hi:
            return None, f"score given out of {v.group(2)}, expected out of {hi:g}"
        values.append(float(v.group(1)))
    if len(set(values)) > 1:
        return None, f"contradictory final scores {values}"
    x = values[0]
    if not (math.isfinite(x) and lo <= x <= hi):
        return None, f"score {x:g} outside [{lo:g}, {hi:g}]"
    return x, None


def parse_pair_verdict(text: Any) -> tuple[float | None, str | None]:
    """UnifiedReward's pairwise conclusion -> (1.0 image 1 / 0.0 image 2 / 0.5 equal, None) or (None, reason).

    Case-insensitive substring test as UnifiedReward's own evaluation, but an answer holding two different
    conclusions is refused instead of resolved by test order."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    low = text.lower()
    found = {v for phrase, v in _VERDICTS if phrase.lower() in low}
    if not found:
        return None, "no conclusion ('Image 1 is better', 'Image 2 is better' or 'Both images are equally good')"
    if len(found) > 1:
        return None, "contradictory conclusions in the answer"
    return found.pop(), None


_NUM = rf"({DECIMAL})"  # a plain non-negative ASCII decimal: no sign, no exponent, no "nan"
_AXES = ("Alignment", "Coherence", "Style")


def parse_axis_scores(text: Any, axes: Sequence[str] = _AXES, lo: float = 1.0,
                      hi: float = 5.0) -> tuple[dict[str, float] | None, str | None]:
    """UnifiedReward-2.0 pointwise lines ``<Axis> Score (1-5): X`` -> ``({axis: value}, None)`` or
    ``(None, reason)``. Each axis must be named on exactly one line, in exactly that form, with a value in
    ``[lo, hi]`` (optional ``**`` bold around the label or the value)."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    out: dict[str, float] = {}
    for axis in axes:
        lines = [ln for ln in text.splitlines() if re.search(rf"\b{axis} Score\b", ln, re.IGNORECASE)]
        if not lines:
            return None, f"no '{axis} Score' in the answer"
        if len(lines) > 1:
            return None, f"'{axis} Score' given {len(lines)} times"
        m = re.fullmatch(rf"[ \t]*(?:[-*][ \t]+)?(?:\*\*)?{axis} Score \(1-5\)(?:\*\*)?[ \t]*:(?:\*\*)?[ \t]*"
                         rf"(?:\*\*)?{_NUM}(?:\*\*)?[ \t]*\.?[ \t]*", lines[0], re.IGNORECASE)
        if m is None:
            return None, f"malformed '{axis} Score' line: {lines[0].strip()[:60]!r}"
        x = float(m.group(1))
        if not (lo <= x <= hi):  # NaN-safe (a NaN fails both comparisons)
            return None, f"{axis} score {x:g} outside [{lo:g}, {hi:g}]"
        out[axis.lower()] = x
    return out, None


def parse_pair_axis_scores(text: Any, axes: Sequence[str] = _AXES,
                           tol: float = 0.01) -> tuple[dict[str, tuple[float, float]] | None, str | None]:
    """UnifiedReward-2.0 pairwise blocks ``<Axis> Score:`` / ``Image 1: x`` / ``Image 2: y`` ->
    ``({axis: (x, y)}, None)`` or ``(None, reason)``. Each axis exactly once, both values in [0, 1], summing to
    1 within ``tol``."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    out: dict[str, tuple[float, float]] = {}
    for axis in axes:
        n = len(re.findall(rf"\b{axis} Score\b", text, re.IGNORECASE))
        if n != 1:
            return None, f"'{axis} Score' given {n} times" if n else f"no '{axis} Score' in the answer"
        m = re.search(rf"(?:^|\n)[ \t]*(?:\*\*)?{axis} Score(?:\*\*)?[ \t]*:(?:\*\*)?[ \t]*\r?\n"
                      rf"[ \t]*(?:[-*][ \t]+)?Image 1[ \t]*:[ \t]*{_NUM}[ \t]*\r?\n"
                      rf"[ \t]*(?:[-*][ \t]+)?Image 2[ \t]*:[ \t]*{_NUM}[ \t]*(?:\r?\n|$)", text, re.IGNORECASE)
        if m is None:
            return None, f"malformed '{axis} Score' block (expected 'Image 1: x' and 'Image 2: y' lines)"
        a, b = float(m.group(1)), float(m.group(2))
        if not (0.0 <= a <= 1.0 and 0.0 <= b <= 1.0):
            return None, f"{axis} relative scores {a:g}, {b:g} outside [0, 1]"
        if not (abs(a + b - 1.0) <= tol):
            return None, f"{axis} relative scores {a:g} + {b:g} do not sum to 1"
        out[axis.lower()] = (a, b)
    return out, None


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_think_verdict(text: Any) -> tuple[float | None, str | None]:
    """UnifiedReward-Think's ``<answer>Image 1 is better</answer>`` -> (1.0 / 0.0, None) or (None, reason).

    Exactly one ``<answer>`` block, holding exactly "Image 1 is better" or "Image 2 is better" (case and a final
    full stop aside)."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    opened = len(re.findall(r"<answer>", text, re.IGNORECASE))
    if opened > 1:  # refused before the lazy block search, which is quadratic in the number of opening tags
        return None, f"{opened} <answer> blocks"
    blocks = _ANSWER.findall(text) if opened else []
    if not blocks:
        return None, "no <answer>...</answer> block" if not opened else "unclosed <answer> block"
    if len(blocks) > 1 or opened != 1:
        return None, f"{max(opened, len(blocks))} <answer> blocks"
    got = blocks[0].strip()
    got = got[:-1].rstrip() if got.endswith(".") else got
    verdict = {"image 1 is better": 1.0, "image 2 is better": 0.0}.get(got.lower())
    if verdict is None:
        return None, f"<answer> holds {blocks[0].strip()[:60]!r}, not 'Image 1 is better' or 'Image 2 is better'"
    return verdict, None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _refuse_duplicate_keys(pairs: list) -> dict:
    out: dict = {}
    dup = []
    for k, v in pairs:
        if k in out:
            dup.append(k)
        out[k] = v
    if dup:  # json.loads would keep the last one silently (e.g. a second "sc\\u006fre" the text count misses)
        raise ValueError(f"key(s) {sorted(set(dup))[:3]} given twice")
    return out


def parse_edit_scores(text: Any, lo: float = 0.0, hi: float = 25.0) -> tuple[list[float] | None, str | None]:
    """UnifiedReward-Edit's JSON answer ``{"reasoning": "...", "score": [a, b]}`` -> ``([a, b], None)`` or
    ``(None, reason)``.

    The answer holds one JSON object (text or a code fence around it is allowed; a trailing comma before a
    closing brace, as in the prompt's own example, is tolerated) with exactly the keys ``score`` and optionally
    ``reasoning`` (a string); ``score`` is a list of exactly two numbers in ``[lo, hi]``; ``"score"`` appears once.
    """
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    n = len(re.findall(r'"score"\s*:', text))
    if n != 1:
        return None, f'"score" given {n} times' if n else 'no "score" in the answer'
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None, "no JSON object in the answer"
    body = re.sub(r",\s*([}\]])", r"\1", text[start:end + 1])
    try:
        obj = json.loads(body, parse_constant=_refuse_constant, object_pairs_hook=_refuse_duplicate_keys)
    except (ValueError, RecursionError) as exc:
        return None, f"unreadable JSON answer ({str(exc)[:60]})"
    if not isinstance(obj, dict):
        return None, "the JSON answer is not an object"
    extra = sorted(set(obj) - {"score", "reasoning"})
    if extra:
        return None, f"unexpected keys {extra} in the JSON answer"
    if "reasoning" in obj and not isinstance(obj["reasoning"], str):
        return None, "reasoning is not a string"
    sc = obj.get("score")
    if not isinstance(sc, list) or len(sc) != 2:
        return None, f"score must be a list of two numbers, got {json.dumps(sc)[:40]}"
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in sc):
        return None, f"score {json.dumps(sc)[:40]} holds a non-number"
    try:
        vals = [float(v) for v in sc]
    except OverflowError:  # an integer too large for a float
        return None, f"score {json.dumps(sc)[:40]} outside [{lo:g}, {hi:g}]"
    if not all(lo <= v <= hi for v in vals):  # NaN-safe
        return None, f"score {vals} outside [{lo:g}, {hi:g}]"
    return vals, None


#: template ``pointwise_format`` / ``pairwise_format`` values (the t2i 1.0 template's are the defaults)
POINTWISE_FORMATS = ("final_score", "acs", "edit_json")
PAIRWISE_FORMATS = ("verdict", "pair_scores", "think_verdict")


def jpeg_roundtrip(image: Any, quality: int) -> Any:
    """``image`` as UnifiedReward's vLLM client sends it: ``convert("RGB")``, saved as JPEG at ``quality``
    (``vllm_qwen/vllm_request.py``, ``_encode_image``), decoded again (RGB PIL image)."""
    from io import BytesIO

    from PIL import Image

    buf = BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=int(quality))
    with Image.open(BytesIO(buf.getvalue())) as out:
        return out.convert("RGB")


def _jpeg_quality(spec: str) -> int | None:
    if spec == "none":
        return None
    m = re.fullmatch(r"jpeg([0-9]{1,3})", spec)
    if m is None or not 1 <= int(m.group(1)) <= 100:
        raise ValueError(f"reencode must be 'auto', 'none' or 'jpeg<quality 1-100>' (e.g. 'jpeg95'), got {spec!r}")
    return int(m.group(1))


@dataclass
class UnifiedRewardConfig(RewardConfig):
    #: judge spec for :func:`rewardkit.judges.load_judge`; or pass a backend object as ``judge=``
    judge: str = ""
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    #: shorthand for ``judge="transformers:<model>"``; device / dtype merged into judge_kwargs
    model: str = ""
    device: str | None = None
    dtype: str | None = None
    #: template under rewardkit/templates/unifiedreward/ (or a YAML path): pointwise, pairwise, score range
    template: str = "t2i"
    #: None: the template's (UnifiedReward's scripts: 512 for t2i / think, 4096 for 2.0 / edit)
    max_new_tokens: int | None = None
    #: the images as sent: "auto" (the template's: "jpeg95" for 2.0 / edit, as their vLLM client; "none" for
    #: t2i / think), "none" (as decoded) or "jpeg<quality>" (JPEG round trip at that quality, 1-100)
    reencode: str = "auto"
    #: compare(): ask both orders and average (True) or only (a, b)
    both_orders: bool = True
    #: what a failing judge call gives (rewardkit.judges.policy): "auto" (follow the call's on_error), "nan", "raise"
    on_judge_error: str = "auto"
    batch_size: int = 8
    # images from files, bytes, PIL: "official" (as the original package reads them) or "corrected" (EXIF
    # rotation, 16-bit / 257, transparency on white); docs/zoo.md "Input policy"
    input_policy: str = "official"


class UnifiedReward(JudgePolicyMixin, Reward):
    """UnifiedReward judge with its published prompts (t2i 1.0 / 2.0 / Think, edit; docs/zoo.md)."""

    name: ClassVar[str] = "unifiedreward"
    tasks = frozenset({"t2i", "edit"})  # the family; an instance takes its template's task
    score_range = (1.0, 5.0)
    extras = ("hf",)
    compare_temperature = 0.5
    Config = UnifiedRewardConfig

    def __init__(self, config=None, /, *, judge: Any = None, **overrides: Any) -> None:
        super().__init__(config, **judge_overrides(overrides, judge=judge))
        cfg = self.config
        t, self.max_new_tokens, self.score_range = scored_template(
            cfg, "unifiedreward", owner=self.name, default_max_new_tokens=512)
        self.template = t
        self.reencode = str(t.get("reencode", "none") if cfg.reencode == "auto" else cfg.reencode)
        self.jpeg_quality = _jpeg_quality(self.reencode)
        self._sent: dict[int, tuple[Any, Any]] = {}
        lo, hi = self.score_range
        self.compare_temperature = (hi - lo) / 8.0  # 0.5 on the 1-5 scale
        task = str(t.get("task", "t2i"))
        if task not in ("t2i", "edit"):
            raise ValueError(f"template {t.id}: task must be 't2i' or 'edit', got {task!r}")
        self.tasks = frozenset({task})
        self.pointwise_format = t.get("pointwise_format", "final_score" if "pointwise" in t.fields else None)
        self.pairwise_format = t.get("pairwise_format", "verdict" if "pairwise" in t.fields else None)
        if self.pointwise_format is not None and self.pointwise_format not in POINTWISE_FORMATS:
            raise ValueError(f"template {t.id}: pointwise_format must be one of {POINTWISE_FORMATS}")
        if self.pairwise_format is not None and self.pairwise_format not in PAIRWISE_FORMATS:
            raise ValueError(f"template {t.id}: pairwise_format must be one of {PAIRWISE_FORMATS}")
        if (self.pointwise_format == "edit_json") != (task == "edit"):
            raise ValueError(f"template {t.id}: the edit_json pointwise format goes with task 'edit' only")
        self.dimensions = {"acs": ("alignment", "coherence", "style"),
                           "edit_json": ("editing_success", "overediting", "naturalness", "artifacts",
                                         "semantic_consistency", "perceptual_quality")}.get(self.pointwise_format, ())
        self.compare_is_symmetric = bool(cfg.both_orders) and self.pairwise_format is not None
        self.judge = judge_from_config(judge, cfg, owner=self.name)
        self.default_batch_size = cfg.batch_size

    def _call_scope(self):
        return self.judge.session()

    def _official_rgb(self, im):
        """The template's scripts: UnifiedReward's vLLM client (2.0, edit: JPEG-encoded) ``convert("RGB")``s; its
        transformers scripts (t2i, think) go through qwen-vl-utils ``to_rgb`` (RGBA on white, other modes
        ``convert("RGB")``)."""
        from ..models.zoo import official_convert_rgb, official_qwen_vl_rgb

        native_jpeg = str(self.template.get("reencode", "none")) != "none"
        return official_convert_rgb(im) if native_jpeg else official_qwen_vl_rgb(im)

    def _ask(self, convs: list) -> tuple[list[str], list[str | None]]:
        """The judge's answers and, per conversation, the failure of its request (None when answered). A
        failure that the policy (``on_judge_error``) does not turn into NaN raises; under the NaN policy a failure
        of the whole batch fails every conversation of it."""
        isolate = judge_policy(self.config.on_judge_error) == "nan"
        try:
            outs, failed = call_rows(self.judge, "generate", convs, isolate=isolate, n=1, temperature=0.0,
                                     max_new_tokens=self.max_new_tokens)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the judge policy says NaN
            if not (isolate and is_judge_failure(exc)):
                raise
            return [""] * len(convs), [describe_failure(exc)] * len(convs)
        finally:
            self._sent.clear()  # re-encoded images live for one batch of conversations
        if len(outs) != len(convs):
            raise JudgeError(f"the judge returned {len(outs)} answers for {len(convs)} conversations")
        return ([o[0] if o else "" for o in outs],
                [None if e is None else f"{JUDGE_FAILURE_PREFIX}: {e}" for e in failed])

    def _turn(self, images: list, text: str) -> list[dict[str, Any]]:
        """One user turn, images first (as UnifiedReward's scripts send them), re-encoded as the template's
        scripts do (the same object for an image that appears in several conversations of a batch)."""
        return [{"role": "user", "content": [*({"type": "image", "image": self._as_sent(im)} for im in images),
                                             {"type": "text", "text": text}]}]

    def _as_sent(self, im: Any) -> Any:
        if self.jpeg_quality is None:
            return im
        hit = self._sent.get(id(im))
        if hit is None or hit[0] is not im:  # (the entry holds ``im``, so its id cannot be reused meanwhile)
            hit = self._sent[id(im)] = (im, jpeg_roundtrip(im, self.jpeg_quality))
        return hit[1]

    def _score(self, batch: RewardBatch) -> RewardOutput:
        if self.pointwise_format is None:
            raise NotImplementedError(f"template {self.template.id} has no pointwise prompt (UnifiedReward-Think "
                                      "is pairwise only): use reward.compare(images_a, images_b, prompt)")
        if self.pointwise_format == "edit_json":
            return self._score_edit(batch)
        convs = [self._turn([im], self.template.render("pointwise", prompt=p))
                 for im, p in zip(batch.images, batch.prompts)]
        texts, failed = self._ask(convs)
        lo, hi = self.score_range
        scores, errors = [], []
        dims: dict[str, list[float]] = {d: [] for d in self.dimensions}
        for t, fail in zip(texts, failed):
            if fail is not None:  # the request failed: no answer to parse
                v, why, axes = None, fail, None
                for d in self.dimensions:
                    dims[d].append(float("nan"))
            elif self.pointwise_format == "acs":
                axes, why = parse_axis_scores(t, lo=lo, hi=hi)
                v = None if axes is None else sum(axes.values()) / len(axes)
                for d in self.dimensions:
                    dims[d].append(float("nan") if axes is None else axes[d])
            else:
                v, why = parse_final_score(t, lo, hi)
            scores.append(float("nan") if v is None else v)
            errors.append(why)
        return RewardOutput(scores=torch.tensor(scores), valid=torch.tensor([e is None for e in errors]),
                            errors=errors, rationales=texts, dimensions=dims,
                            info=self._info())

    def _info(self) -> dict[str, Any]:
        return {"template": self.template.id, "judge": self.judge.describe(), "images": self.reencode,
                "max_new_tokens": self.max_new_tokens}

    def _score_edit(self, batch: RewardBatch) -> RewardOutput:
        """Two prompts per sample (instruction following on [source, edited], quality on [edited]), one
        ``generate`` call; score = sqrt(min(instruction scores) * min(quality scores))."""
        n = len(batch)
        srcs = batch.sources or [[] for _ in range(n)]
        convs = []
        for im, p, src in zip(batch.images, batch.prompts, srcs):
            if len(src) != 1:
                raise ValueError(f"UnifiedReward-Edit takes exactly one source image per sample, got {len(src)}")
            convs.append(self._turn([src[0], im], self.template.render("instruction_following", prompt=p)))
            convs.append(self._turn([im], self.template.render("quality")))
        texts, failed = self._ask(convs)
        lo, hi = self.score_range
        nan = float("nan")
        scores, errors, rats = [], [], []
        dims: dict[str, list[float]] = {d: [] for d in self.dimensions}
        for i in range(n):
            sc_text, pq_text = texts[2 * i], texts[2 * i + 1]
            sc, why_sc = (None, failed[2 * i]) if failed[2 * i] else parse_edit_scores(sc_text, lo, hi)
            pq, why_pq = (None, failed[2 * i + 1]) if failed[2 * i + 1] else parse_edit_scores(pq_text, lo, hi)
            for d, v in zip(("editing_success", "overediting"), sc or (nan, nan)):
                dims[d].append(v)
            for d, v in zip(("naturalness", "artifacts"), pq or (nan, nan)):
                dims[d].append(v)
            dims["semantic_consistency"].append(min(sc) if sc else nan)
            dims["perceptual_quality"].append(min(pq) if pq else nan)
            # a failed request leads the reason with its prefix (a score cache must not store it)
            why = join_reasons([("instruction-following answer", why_sc), ("quality answer", why_pq)])
            scores.append(math.sqrt(min(sc) * min(pq)) if sc and pq else nan)
            errors.append(why or None)
            rats.append(f"{sc_text}\n---\n{pq_text}")
        return RewardOutput(scores=torch.tensor(scores), valid=torch.tensor([e is None for e in errors]),
                            errors=errors, rationales=rats, dimensions=dims, info=self._info())

    def _verdict(self, text: str) -> tuple[float | None, str | None]:
        """P(image 1 better) from one pairwise answer, per the template's format."""
        if self.pairwise_format == "think_verdict":
            return parse_think_verdict(text)
        if self.pairwise_format == "pair_scores":
            axes, why = parse_pair_axis_scores(text)
            return (None, why) if axes is None else (sum(a for a, _ in axes.values()) / len(axes), None)
        return parse_pair_verdict(text)

    def compare(self, images_a: Any, images_b: Any, prompt: str | Sequence[str] | None = None, *,
                sources: Sequence[Any] | None = None, metadata: Sequence[dict[str, Any] | None] | None = None,
                batch_size: int | None = None, on_error: str = "raise") -> PairwiseOutput:
        """P(a preferred over b) from UnifiedReward's pairwise prompt (see the module docstring); a template
        without one (``edit``) compares its pointwise scores (``Reward.compare``)."""
        from .. import media
        from ..errors import RewardInputError

        if self.pairwise_format is None:
            return super().compare(images_a, images_b, prompt, sources=sources, metadata=metadata,
                                   batch_size=batch_size, on_error=on_error)
        if on_error not in ("raise", "nan"):
            raise ValueError(f"on_error must be 'raise' or 'nan', got {on_error!r}")
        a, b = media.split_batch(images_a), media.split_batch(images_b)
        if len(a) != len(b):
            raise RewardInputError(f"compare got {len(a)} images_a but {len(b)} images_b")
        if sources is not None:
            raise RewardInputError("unifiedreward's text-to-image prompts take no sources")
        n = len(a)
        prompts = self._prompts(prompt, n)
        errors: list[str | None] = [None] * n
        pil: list[tuple[Any, Any] | None] = [None] * n
        for i in range(n):
            errors[i] = self._check_prompt(prompts[i])
            if errors[i] is None:
                try:
                    pil[i] = (self.decode_image(a[i]), self.decode_image(b[i]))
                except media._Bad as exc:
                    errors[i] = str(exc)
            if errors[i] is not None and on_error == "raise":
                raise RewardInputError(errors[i], index=i)
        prob = torch.full((n,), float("nan"))
        rationales: list[str | None] = [None] * n
        ok = [i for i in range(n) if errors[i] is None]
        orders = 2 if self.config.both_orders else 1
        chunk = batch_size or self.default_batch_size or max(len(ok), 1)
        with call_on_error(on_error):  # on_judge_error="auto" follows this call's on_error
            with self._lock, self._call_scope():
                for s in range(0, len(ok), chunk):
                    idx = ok[s:s + chunk]
                    convs = []
                    for i in idx:
                        text = self.template.render("pairwise", prompt=prompts[i])
                        pairs = [pil[i], pil[i][::-1]][:orders]
                        for first, second in pairs:
                            convs.append(self._turn([first, second], text))
                    texts, failed = self._ask(convs)
                    for j, i in enumerate(idx):
                        answers = texts[j * orders:(j + 1) * orders]
                        fails = failed[j * orders:(j + 1) * orders]
                        rationales[i] = "\n---\n".join(answers)
                        v_ab, why = (None, fails[0]) if fails[0] else self._verdict(answers[0])
                        if v_ab is not None and orders == 2:
                            v_ba, why2 = (None, fails[1]) if fails[1] else self._verdict(answers[1])
                            # a failed request keeps its reason's prefix (a score cache must not store it)
                            why = None if v_ba is not None else (why2 if fails[1] else f"swapped order: {why2}")
                            v = None if v_ba is None else 0.5 * (v_ab + 1.0 - v_ba)
                        else:
                            v = v_ab
                        if v is None:
                            errors[i] = why
                        else:
                            prob[i] = v
        valid = torch.isfinite(prob)
        return PairwiseOutput(prob_a=prob, valid=valid, errors=errors, rationales=rationales,
                              info={**self._info(),
                                    "compare": "pairwise, both orders" if orders == 2 else "pairwise"})

    @classmethod
    def tiny(cls, workdir: str) -> "UnifiedReward":
        """On a tiny random Qwen2.5-VL judge (its answers do not parse: every sample is NaN + reason)."""
        from pathlib import Path

        from ..testing import save_tiny_checkpoint

        path = Path(workdir) / "tiny-unifiedreward-judge"
        if not (path / "config.json").is_file():
            save_tiny_checkpoint("qwen2_5_vl", path)
        return cls(judge=f"transformers:{path}", judge_kwargs={"device": "cpu"}, max_new_tokens=6)
