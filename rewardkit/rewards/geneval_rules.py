"""GenEval's rules as pure functions over detections (no model): which detections count, the verdict per prompt.

Everything here follows djghosh13/geneval ``evaluation/evaluate_images.py`` (commit 16f1681; cited ``EI:<line>``)
and, for the reward forms flow_grpo / DiffusionNFT train on, yifan123/reward-server ``reward_server/gen_eval.py``
(commit 7131478; cited ``RS:<line>``; NVlabs/DiffusionNFT ``flow_grpo/gen_eval.py`` is the same logic). Written
from reading those files, not copied.

Detections are given per class, in the detector's class order (:data:`OBJECT_NAMES`), as mmdet's
``inference_detector`` gives them: ``boxes[c]`` a float ``[n, 5]`` array of ``x1, y1, x2, y2, score``.
:func:`select_objects` keeps, per class, the ``(class index, row)`` pairs GenEval keeps; :func:`evaluate` and
:func:`evaluate_reward` judge them against one prompt's metadata. Colours are asked of a callback
(``colors_of(classname, rows) -> list of colour names``), so the rules run on hand-built detections in tests and on
CLIP in the reward.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = ["OBJECT_NAMES", "COLORS", "COLOR_TEMPLATES", "TAGS", "THRESHOLD", "COUNTING_THRESHOLD", "MAX_OBJECTS",
           "NMS_THRESHOLD", "POSITION_THRESHOLD", "RELATIONS", "check_metadata", "select_objects", "compute_iou",
           "relative_position", "evaluate", "evaluate_reward", "boxes_json"]

#: the detector's 80 COCO classes in its output order, as GenEval names them (``evaluation/object_names.txt``,
#: read at EI:73-74; e.g. "computer mouse", "tv remote", "hair drier")
OBJECT_NAMES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow",
    "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee",
    "skis", "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard",
    "tennis racket", "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock",
    "vase", "scissors", "teddy bear", "hair drier", "toothbrush")

#: the colour classes, in this order (EI:80)
COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
#: zero-shot templates per object class, ``{c}`` the colour (EI:113-117)
COLOR_TEMPLATES: tuple[str, ...] = ("a photo of a {{c}} {classname}", "a photo of a {{c}}-colored {classname}",
                                    "a photo of a {{c}} object")
#: the six GenEval tags (prompts/evaluation_metadata.jsonl; RS:326 lists them for the per-tag rewards)
TAGS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
#: the relations the position rule gives (EI:156-159)
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")

THRESHOLD = 0.3            # detection score threshold (EI:271)
COUNTING_THRESHOLD = 0.9   # ... for prompts tagged "counting" (EI:272, used at EI:221)
MAX_OBJECTS = 16           # per class, after the threshold (EI:273, used at EI:225)
NMS_THRESHOLD = 1.0        # "max_overlap" 1.0: no NMS (EI:274, used at EI:229-232)
POSITION_THRESHOLD = 0.1   # position margin, a fraction of both boxes' sizes (EI:275, used at EI:149)


def check_metadata(md: Any) -> str | None:
    """Why ``md`` is not a GenEval metadata record the rules can judge (None when it is).

    The record is one line of ``prompts/evaluation_metadata.jsonl``: ``tag`` (one of :data:`TAGS`), ``include``
    (a list of ``{"class", "count"[, "color"][, "position": [relation, index]]}``), optional ``exclude``
    (``{"class", "count"}``) and ``prompt``. Upstream would crash (KeyError) or silently misjudge on the cases
    refused here."""
    if not isinstance(md, Mapping):
        return f"GenEval metadata must be a dict (tag, include, exclude, prompt), got {type(md).__name__}"
    if "tag" not in md:
        return "GenEval metadata has no 'tag' (the counting threshold depends on it)"
    if md["tag"] not in TAGS:
        return f"GenEval metadata: unknown tag {md['tag']!r} (expected one of {', '.join(TAGS)})"
    if "include" not in md:
        return "GenEval metadata has no 'include' list (the objects the prompt asks for)"
    for key in ("include", "exclude"):
        reqs = md.get(key, [])
        if not isinstance(reqs, list):
            return f"GenEval metadata: {key!r} must be a list, got {type(reqs).__name__}"
        for j, req in enumerate(reqs):
            where = f"GenEval metadata {key}[{j}]"
            if not isinstance(req, Mapping):
                return f"{where} must be a dict, got {type(req).__name__}"
            if req.get("class") not in OBJECT_NAMES:
                return f"{where}: class {req.get('class')!r} is not one of GenEval's 80 object names"
            cnt = req.get("count")
            if isinstance(cnt, bool) or not isinstance(cnt, int) or cnt < 1:
                return f"{where}: count must be an integer >= 1, got {cnt!r}"
            if key == "exclude":
                continue
            if "color" in req and req["color"] not in COLORS:
                return f"{where}: color {req['color']!r} is not one of {', '.join(COLORS)}"
            if "position" in req:
                pos = req["position"]
                if (not isinstance(pos, (list, tuple)) or len(pos) != 2 or pos[0] not in RELATIONS
                        or isinstance(pos[1], bool) or not isinstance(pos[1], int) or not 0 <= pos[1] < j):
                    return (f"{where}: position must be [relation, index of an earlier include entry] with relation "
                            f"one of {', '.join(RELATIONS)}, got {pos!r}")
    return None


def compute_iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """IoU with GenEval's inclusive pixel convention (``+ 1`` on widths and heights; EI:126-133)."""
    def area(b: Sequence[float]) -> float:
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)
    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0


def select_objects(boxes: Sequence[np.ndarray], tag: str, *, threshold: float = THRESHOLD,
                   counting_threshold: float = COUNTING_THRESHOLD, max_objects: int = MAX_OBJECTS,
                   nms_threshold: float = NMS_THRESHOLD) -> dict[str, list[tuple[int, int]]]:
    """The detections GenEval keeps, per class name: ``(class index, row in boxes[class])`` in decreasing score.

    Per class (EI:219-236): rows sorted by score, highest first (``np.argsort`` reversed, as upstream, so ties keep
    upstream's order); kept when the score is *strictly above* the threshold (0.9 for ``counting`` prompts, else
    0.3); at most ``max_objects``; then a greedy overlap filter that is off at the default 1.0. Classes with no
    detection kept are absent."""
    conf = threshold if tag != "counting" else counting_threshold
    out: dict[str, list[tuple[int, int]]] = {}
    for c, name in enumerate(OBJECT_NAMES):
        b = np.asarray(boxes[c], dtype=np.float32).reshape(-1, 5)
        order = np.argsort(b[:, 4])[::-1]
        order = order[b[order, 4] > conf][:max_objects].tolist()
        kept: list[tuple[int, int]] = []
        while order:
            top = order.pop(0)
            kept.append((c, top))
            if nms_threshold != 1:
                order = [o for o in order if compute_iou(b[top], b[o]) < nms_threshold]
        if kept:
            out[name] = kept
    return out


def relative_position(box_a: Sequence[float], box_b: Sequence[float],
                      threshold: float = POSITION_THRESHOLD) -> set[str]:
    """Where box A is relative to box B (EI:136-160): the centre offset, shrunk towards 0 on each axis by
    ``threshold`` x (A's size + B's size) on that axis (at most to 0), divided by the *unshrunk* offset's length;
    an axis component beyond +-0.5 gives the relation (image y grows downwards: negative dy is "above").
    Offsets all shrunk below 1e-3 give no relation."""
    a = np.asarray(box_a, dtype=np.float64)[:4]
    b = np.asarray(box_b, dtype=np.float64)[:4]
    ca, cb = (a[:2] + a[2:]) / 2, (b[:2] + b[2:]) / 2
    da, db = np.abs(a[2:] - a[:2]), np.abs(b[2:] - b[:2])
    off = ca - cb
    rev = np.maximum(np.abs(off) - threshold * (da + db), 0) * np.sign(off)
    if np.all(np.abs(rev) < 1e-3):
        return set()
    dx, dy = rev / np.linalg.norm(off)
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


ColorsOf = Callable[[str, list], list]


def _color_reason(req: Mapping[str, Any], colors: list[str], op: str = ">=") -> str:
    # EI:187-191 / RS:231-235 (both write ">=")
    return (f"expected {req['color']} {req['class']}{op}{req['count']}, found {colors.count(req['color'])} "
            f"{req['color']}; and " + ", ".join(f"{colors.count(c)} {c}" for c in COLORS if c in colors))


def evaluate(objects: Mapping[str, list], metadata: Mapping[str, Any], colors_of: ColorsOf, *,
             box_of: Callable[[Any], Sequence[float]], position_threshold: float = POSITION_THRESHOLD
             ) -> tuple[bool, str]:
    """GenEval's verdict (EI:163-210): every ``include`` entry has at least ``count`` objects of its class (the
    ``count`` most confident are the ones judged), of which at least ``count`` have the asked colour, and each
    of them stands in the asked relation to every object of the entry it refers to (that entry must have
    matched); no ``exclude`` class has ``count`` or more objects. Returns ``(correct, reason)``, the reasons
    joined by newlines (empty when correct)."""
    correct = True
    reasons: list[str] = []
    groups: list[list | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        matched = True
        found = list(objects.get(name, []))[:count]
        if len(found) < count:
            correct = matched = False
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        else:
            if "color" in req:
                colors = list(colors_of(name, found))
                if colors.count(req["color"]) < count:
                    correct = matched = False
                    reasons.append(_color_reason(req, colors))
            if "position" in req and matched:
                rel, target = req["position"]
                if groups[target] is None:
                    correct = matched = False
                    reasons.append(f"no target for {name} to be {rel}")
                else:
                    matched = _all_related(found, groups[target], rel, name, reasons, box_of, position_threshold)
                    correct = correct and matched
        groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        name = req["class"]
        n = len(objects.get(name, []))
        if n >= req["count"]:
            correct = False
            reasons.append(f"expected {name}<{req['count']}, found {n}")
    return correct, "\n".join(reasons)


def _all_related(found: list, targets: list, rel: str, name: str, reasons: list[str],
                 box_of: Callable[[Any], Sequence[float]], threshold: float) -> bool:
    """Every object of ``found`` in relation ``rel`` to every target; the first failure's reason (EI:195-204)."""
    for obj in found:
        for tgt in targets:
            true_rels = relative_position(box_of(obj), box_of(tgt), threshold)
            if rel not in true_rels:
                # upstream joins a set: the order of two relations follows Python's set iteration
                reasons.append(f"expected {name} {rel} target, found {' and '.join(true_rels)} target")
                return False
    return True


def evaluate_reward(objects: Mapping[str, list], metadata: Mapping[str, Any], colors_of: ColorsOf, *,
                    box_of: Callable[[Any], Sequence[float]], position_threshold: float = POSITION_THRESHOLD
                    ) -> tuple[bool, float, str]:
    """The reward-server's ``evaluate_reward`` (RS:199-262): ``(strict_correct, score, reason)``.

    ``strict_correct`` wants *exactly* ``count`` objects (all kept detections, not the first ``count``) and exactly
    ``count`` of the asked colour; ``exclude`` is not checked. ``score`` is the mean of partial terms: per include
    entry ``1 - |count - found| / count`` (negative when far more are found); a wrong count adds one 0 more when
    the entry asks a colour or a position; a colour term ``1 - |count - n_colour| / count``; a missing target adds
    0; a position check adds 0 on its first failure and then 1 in any case (upstream's quirk: RS:241-254
    appends 1.0 after the loop whether it failed or not). No include entry: score 0."""
    correct = True
    reasons: list[str] = []
    terms: list[float] = []
    groups: list[list | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        matched = True
        found = list(objects.get(name, []))
        terms.append(1 - abs(count - len(found)) / count)
        if len(found) != count:
            correct = matched = False
            reasons.append(f"expected {name}=={count}, found {len(found)}")
            if "color" in req or "position" in req:
                terms.append(0.0)
        else:
            if "color" in req:
                colors = list(colors_of(name, found))
                terms.append(1 - abs(count - colors.count(req["color"])) / count)
                if colors.count(req["color"]) != count:
                    correct = matched = False
                    reasons.append(_color_reason(req, colors))
            if "position" in req and matched:
                rel, target = req["position"]
                if groups[target] is None:
                    correct = matched = False
                    reasons.append(f"no target for {name} to be {rel}")
                    terms.append(0.0)
                else:
                    if not _all_related(found, groups[target], rel, name, reasons, box_of, position_threshold):
                        correct = matched = False
                        terms.append(0.0)
                    terms.append(1.0)
        groups.append(found if matched else None)
    score = sum(terms) / len(terms) if terms else 0
    return correct, float(score), "\n".join(reasons)


def boxes_json(objects: Mapping[str, list], box_of: Callable[[Any], Sequence[float]]) -> dict[str, list]:
    """The ``details`` field of GenEval's record before ``json.dumps`` (EI:245-248): class -> kept boxes as
    ``[x1, y1, x2, y2, score]`` lists, in decreasing score."""
    return {name: [[float(v) for v in box_of(o)] for o in objs] for name, objs in objects.items()}

