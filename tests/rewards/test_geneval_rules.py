"""GenEval's rules (rewardkit.rewards.geneval_rules) against the official functions transcribed in
tests/helpers/geneval_official.py, on hand-built detections; hand-computed cases for the counting threshold and
the position rule, each with the bug it catches."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rewardkit.rewards import geneval_rules as rules
from tests.helpers import geneval_official as official

N = len(rules.OBJECT_NAMES)


def _color(box) -> str:
    return rules.COLORS[int(box[0] * 7 + box[1] * 3) % len(rules.COLORS)]


def _empty():
    return [np.zeros((0, 5), dtype=np.float32) for _ in range(N)]


def _scenario(rng: random.Random):
    classes = rng.sample(rules.OBJECT_NAMES, 3)
    boxes = _empty()
    for name in classes:
        k = rng.randint(0, 6)
        rows = []
        for _ in range(k):
            x0, y0 = rng.randint(0, 80), rng.randint(0, 80)
            w, h = rng.choice([0, 1, 5, 10, 20, 40]), rng.choice([0, 1, 5, 10, 20, 40])
            s = rng.choice([0.3, 0.9, 0.31, 0.89, 0.95, rng.uniform(0.1, 1.0)])
            rows.append([x0, y0, x0 + w, y0 + h, s])
        boxes[rules.OBJECT_NAMES.index(name)] = np.array(rows, dtype=np.float32).reshape(-1, 5)
    tag = rng.choice(rules.TAGS)
    a, b, _ = classes
    inc: list[dict] = [{"class": a, "count": rng.randint(1, 3)}]
    if rng.random() < 0.5:
        inc[0]["color"] = rng.choice(rules.COLORS)
    if tag in ("two_object", "position", "color_attr") or rng.random() < 0.3:
        second = {"class": b, "count": rng.randint(1, 2)}
        if rng.random() < 0.6:
            second["position"] = [rng.choice(rules.RELATIONS), 0]
        if rng.random() < 0.4:
            second["color"] = rng.choice(rules.COLORS)
        inc.append(second)
    md = {"tag": tag, "include": inc, "prompt": "p"}
    if rng.random() < 0.5:
        md["exclude"] = [{"class": rng.choice(classes), "count": rng.randint(1, 4)}]
    return boxes, md


def _ours(boxes, md):
    objs = rules.select_objects(boxes, md["tag"])

    def box_of(o):
        return boxes[o[0]][o[1]]

    def colors_of(name, found):
        return [_color(box_of(o)) for o in found]

    got_eval = rules.evaluate(objs, md, colors_of, box_of=box_of)
    got_rew = rules.evaluate_reward(objs, md, colors_of, box_of=box_of)
    return objs, box_of, got_eval, got_rew


def _theirs(boxes, md):
    det = official.select(boxes, None, list(rules.OBJECT_NAMES), md)

    def colors_of(found, classname):
        return [_color(o[0]) for o in found]

    return det, official.evaluate(colors_of, det, md), official.evaluate_reward(colors_of, det, md)


def test_random_detections_every_tag_match_the_official_functions():
    rng = random.Random(0)
    seen_tags, verdicts = set(), set()
    for _ in range(600):
        boxes, md = _scenario(rng)
        assert rules.check_metadata(md) is None, md
        objs, box_of, (c, reason), (sc, score, sreason) = _ours(boxes, md)
        det, (oc, oreason), (osc, oscore, osreason) = _theirs(boxes, md)
        assert {k: [box_of(o).tolist() for o in v] for k, v in objs.items()} == \
               {k: [b.tolist() for b, _ in v] for k, v in det.items()}
        assert (c, reason) == (oc, oreason), md
        assert (sc, sreason) == (osc, osreason), md
        assert score == pytest.approx(oscore, abs=1e-12), md
        assert rules.boxes_json(objs, box_of) == {k: [b.tolist() for b, _ in v] for k, v in det.items()}
        seen_tags.add(md["tag"])
        verdicts.add((c, sc))
    assert seen_tags == set(rules.TAGS)
    assert len(verdicts) >= 3  # both verdicts of both forms occur


def test_compute_iou_and_relative_position_match_official_on_a_grid():
    rng = random.Random(1)
    for _ in range(400):
        a = [rng.randint(0, 50) for _ in range(2)]
        a += [a[0] + rng.randint(0, 30), a[1] + rng.randint(0, 30), 0.5]
        b = [rng.randint(0, 50) for _ in range(2)]
        b += [b[0] + rng.randint(0, 30), b[1] + rng.randint(0, 30), 0.5]
        assert rules.compute_iou(a, b) == official.compute_iou(a, b)
        if a[:2] != b[:2] or a[2:4] != b[2:4]:
            assert rules.relative_position(a, b) == official.relative_position((np.array(a), None),
                                                                               (np.array(b), None))


def test_counting_threshold_hand_computed():
    # one clock at 0.85 and one at 0.95: "two clocks" needs both above 0.9 (strictly) when tagged counting
    boxes = _empty()
    clock = rules.OBJECT_NAMES.index("clock")
    boxes[clock] = np.array([[0, 0, 10, 10, 0.95], [20, 0, 30, 10, 0.85], [40, 0, 50, 10, 0.9]], dtype=np.float32)
    counting = {"tag": "counting", "include": [{"class": "clock", "count": 2}],
                "exclude": [{"class": "clock", "count": 3}], "prompt": "a photo of two clocks"}
    assert [r for _, r in rules.select_objects(boxes, "counting")["clock"]] == [0]  # 0.9 itself is not kept
    assert [r for _, r in rules.select_objects(boxes, "two_object")["clock"]] == [0, 2, 1]
    _, _, (c, reason), (sc, score, _) = _ours(boxes, counting)
    assert (c, reason) == (False, "expected clock>=2, found 1")
    assert (sc, score) == (False, pytest.approx(0.5))  # 1 - |2 - 1| / 2
    # the planted bug (the 0.3 threshold on counting prompts) keeps 3 clocks and breaks the exclude rule
    planted = rules.select_objects(boxes, "counting", counting_threshold=rules.THRESHOLD)
    assert len(planted["clock"]) == 3


def test_position_rule_hand_computed():
    a = [0, 0, 10, 10, 0.9]
    # centres 5 and 8 (offset -3), sizes 10 + 10: the 0.1 margin shrinks |dx| to 1, 1/3 of the offset: no relation
    assert rules.relative_position(a, [3, 0, 13, 10, 0.9]) == set()
    # without the margin (the planted bug) the same boxes would read "left of"
    assert rules.relative_position(a, [3, 0, 13, 10, 0.9], threshold=0.0) == {"left of"}
    # centres 5 and 17: |dx| = 12 - 2 = 10, 10 / 12 > 0.5: left of; the image y axis points down: "above"
    assert rules.relative_position(a, [12, 0, 22, 10, 0.9]) == {"left of"}
    assert rules.relative_position(a, [0, 30, 10, 40, 0.9]) == {"above"}
    # a diagonal offset (20, 20): each axis 18 / 28.28 = 0.64 > 0.5: two relations
    assert rules.relative_position([20, 20, 30, 30], [0, 0, 10, 10]) == {"right of", "below"}
    boxes = _empty()
    boxes[rules.OBJECT_NAMES.index("dog")] = np.array([[0, 0, 10, 10, 0.9]], dtype=np.float32)
    boxes[rules.OBJECT_NAMES.index("cat")] = np.array([[3, 0, 13, 10, 0.9]], dtype=np.float32)
    md = {"tag": "position", "include": [{"class": "cat", "count": 1},
                                         {"class": "dog", "count": 1, "position": ["left of", 0]}], "prompt": "p"}
    _, _, (c, reason), (sc, score, sreason) = _ours(boxes, md)
    assert (c, reason) == (False, "expected dog left of target, found  target")
    # reward server: count terms 1, 1; the failing position adds 0 and then 1 (its quirk): 3 / 4
    assert (sc, score) == (False, pytest.approx(0.75))


@pytest.mark.parametrize("md, words", [
    (None, "must be a dict"),
    ({}, "no 'tag'"),
    ({"tag": "objects", "include": []}, "unknown tag"),
    ({"tag": "counting"}, "no 'include'"),
    ({"tag": "counting", "include": [{"class": "unicorn", "count": 1}]}, "80 object names"),
    ({"tag": "counting", "include": [{"class": "cat", "count": 0}]}, "count must be"),
    ({"tag": "counting", "include": [{"class": "cat", "count": True}]}, "count must be"),
    ({"tag": "colors", "include": [{"class": "cat", "count": 1, "color": "teal"}]}, "color 'teal'"),
    ({"tag": "position", "include": [{"class": "cat", "count": 1, "position": ["left of", 0]}]}, "position must"),
    ({"tag": "position", "include": [{"class": "cat", "count": 1},
                                     {"class": "dog", "count": 1, "position": ["beside", 0]}]}, "position must"),
    ({"tag": "counting", "include": [], "exclude": {"class": "cat"}}, "must be a list"),
])
def test_malformed_metadata_is_refused_with_the_reason(md, words):
    assert words in rules.check_metadata(md)
