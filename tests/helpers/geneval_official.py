"""GenEval's official rule functions, transcribed for parity tests (reference code, not rewardkit's).

Sources (read with the repository tools, transcribed line by line, model calls replaced by arguments):

- djghosh13/geneval @ 16f1681 ``evaluation/evaluate_images.py``: ``compute_iou`` (L126-133), ``relative_position``
  (L136-160), ``evaluate`` (L163-210), the detection selection loop of ``evaluate_image`` (L219-236), constants
  (L271-275);
- yifan123/reward-server @ 7131478 ``reward_server/gen_eval.py``: ``evaluate_reward`` (L199-262).

``color_classification(image, found_objects, classname)`` is an argument (``colors``) here: the tests pass a fixed
colour per object. Objects are ``(box, mask)`` pairs as upstream keeps them.
"""

from __future__ import annotations

import numpy as np

COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
NMS_THRESHOLD = 1.0
POSITION_THRESHOLD = 0.1


def compute_iou(box_a, box_b):
    area_fn = lambda box: max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)  # noqa: E731
    i_area = area_fn([
        max(box_a[0], box_b[0]), max(box_a[1], box_b[1]),
        min(box_a[2], box_b[2]), min(box_a[3], box_b[3])
    ])
    u_area = area_fn(box_a) + area_fn(box_b) - i_area
    return i_area / u_area if u_area else 0


def relative_position(obj_a, obj_b):
    boxes = np.array([obj_a[0], obj_b[0]])[:, :4].reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised_offset = np.maximum(np.abs(offset) - POSITION_THRESHOLD * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised_offset) < 1e-3):
        return set()
    dx, dy = revised_offset / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5: relations.add("left of")  # noqa: E701
    if dx > 0.5: relations.add("right of")  # noqa: E701
    if dy < -0.5: relations.add("above")  # noqa: E701
    if dy > 0.5: relations.add("below")  # noqa: E701
    return relations


def select(bbox, segm, classnames, metadata):
    """evaluate_images.py L219-236 (the loop over classes inside ``evaluate_image``)."""
    detected = {}
    confidence_threshold = THRESHOLD if metadata['tag'] != "counting" else COUNTING_THRESHOLD
    for index, classname in enumerate(classnames):
        ordering = np.argsort(bbox[index][:, 4])[::-1]
        ordering = ordering[bbox[index][ordering, 4] > confidence_threshold]
        ordering = ordering[:MAX_OBJECTS].tolist()
        detected[classname] = []
        while ordering:
            max_obj = ordering.pop(0)
            detected[classname].append((bbox[index][max_obj], None if segm is None else segm[index][max_obj]))
            ordering = [
                obj for obj in ordering
                if NMS_THRESHOLD == 1 or compute_iou(bbox[index][max_obj], bbox[index][obj]) < NMS_THRESHOLD
            ]
        if not detected[classname]:
            del detected[classname]
    return detected


def evaluate(colors_of, objects, metadata):
    correct = True
    reason = []
    matched_groups = []
    for req in metadata.get('include', []):
        classname = req['class']
        matched = True
        found_objects = objects.get(classname, [])[:req['count']]
        if len(found_objects) < req['count']:
            correct = matched = False
            reason.append(f"expected {classname}>={req['count']}, found {len(found_objects)}")
        else:
            if 'color' in req:
                colors = colors_of(found_objects, classname)
                if colors.count(req['color']) < req['count']:
                    correct = matched = False
                    reason.append(
                        f"expected {req['color']} {classname}>={req['count']}, found " +
                        f"{colors.count(req['color'])} {req['color']}; and " +
                        ", ".join(f"{colors.count(c)} {c}" for c in COLORS if c in colors)
                    )
            if 'position' in req and matched:
                expected_rel, target_group = req['position']
                if matched_groups[target_group] is None:
                    correct = matched = False
                    reason.append(f"no target for {classname} to be {expected_rel}")
                else:
                    for obj in found_objects:
                        for target_obj in matched_groups[target_group]:
                            true_rels = relative_position(obj, target_obj)
                            if expected_rel not in true_rels:
                                correct = matched = False
                                reason.append(
                                    f"expected {classname} {expected_rel} target, found " +
                                    f"{' and '.join(true_rels)} target"
                                )
                                break
                        if not matched:
                            break
        if matched:
            matched_groups.append(found_objects)
        else:
            matched_groups.append(None)
    for req in metadata.get('exclude', []):
        classname = req['class']
        if len(objects.get(classname, [])) >= req['count']:
            correct = False
            reason.append(f"expected {classname}<{req['count']}, found {len(objects[classname])}")
    return correct, "\n".join(reason)


def evaluate_reward(colors_of, objects, metadata):
    correct = True
    reason = []
    rewards = []
    matched_groups = []
    for req in metadata.get('include', []):
        classname = req['class']
        matched = True
        found_objects = objects.get(classname, [])
        rewards.append(1 - abs(req['count'] - len(found_objects)) / req['count'])
        if len(found_objects) != req['count']:
            correct = matched = False
            reason.append(f"expected {classname}=={req['count']}, found {len(found_objects)}")
            if 'color' in req or 'position' in req:
                rewards.append(0.0)
        else:
            if 'color' in req:
                colors = colors_of(found_objects, classname)
                rewards.append(1 - abs(req['count'] - colors.count(req['color'])) / req['count'])
                if colors.count(req['color']) != req['count']:
                    correct = matched = False
                    reason.append(
                        f"expected {req['color']} {classname}>={req['count']}, found " +
                        f"{colors.count(req['color'])} {req['color']}; and " +
                        ", ".join(f"{colors.count(c)} {c}" for c in COLORS if c in colors)
                    )
            if 'position' in req and matched:
                expected_rel, target_group = req['position']
                if matched_groups[target_group] is None:
                    correct = matched = False
                    reason.append(f"no target for {classname} to be {expected_rel}")
                    rewards.append(0.0)
                else:
                    for obj in found_objects:
                        for target_obj in matched_groups[target_group]:
                            true_rels = relative_position(obj, target_obj)
                            if expected_rel not in true_rels:
                                correct = matched = False
                                reason.append(
                                    f"expected {classname} {expected_rel} target, found " +
                                    f"{' and '.join(true_rels)} target"
                                )
                                rewards.append(0.0)
                                break
                        if not matched:
                            break
                    rewards.append(1.0)
        if matched:
            matched_groups.append(found_objects)
        else:
            matched_groups.append(None)
    reward = sum(rewards) / len(rewards) if rewards else 0
    return correct, reward, "\n".join(reason)


def mmdet_patch_merging(x, hw, norm_w, norm_b, reduction_w):
    """mmdet 2.x ``PatchMerging.forward`` (mmdet/models/utils/transformer.py) for an even-sized map: ``nn.Unfold``
    with a 2x2 kernel and stride 2, LayerNorm over the 4C features, bias-free linear reduction."""
    import torch

    b, length, c = x.shape
    h, w = hw
    x = x.view(b, h, w, c).permute(0, 3, 1, 2)
    x = torch.nn.functional.unfold(x, kernel_size=2, stride=2)  # [B, 4C, L'] with feature index c * 4 + k
    x = x.transpose(1, 2)
    x = torch.nn.functional.layer_norm(x, (4 * c,), norm_w, norm_b, eps=1e-5)
    return x @ reduction_w.t()
