"""GenEval (Ghosh et al. 2023) as a reward: a COCO instance detector and a CLIP colour classifier judge whether an
image shows what its prompt's GenEval metadata asks (objects, counts, colours, relative positions).

    >>> rk = load_reward("geneval", model="geneval/")          # written by `rewardkit convert geneval ...`
    >>> out = rk(images, prompts, metadata=[{"tag": "counting", "include": [{"class": "clock", "count": 2}],
    ...                                     "exclude": [{"class": "clock", "count": 3}],
    ...                                     "prompt": "a photo of two clocks"}])

``metadata[i]`` is one line of GenEval's ``prompts/evaluation_metadata.jsonl`` (``tag``, ``include``, ``exclude``,
``prompt``; an include entry is ``{"class", "count"[, "color"][, "position": [relation, index]]}``). A sample
without it, or with a malformed one (unknown tag / class / colour / relation, a count below 1, a position that
refers to a later entry), is NaN with the reason, never 0.

Forms (``form=``), named as flow_grpo / DiffusionNFT log them (their ``multi_score`` keys):

- ``"accuracy"`` (default): GenEval's own verdict, 1.0 when every requirement holds, else 0.0 (``correct`` in
  djghosh13/geneval ``evaluation/evaluate_images.py``: at least ``count`` objects, the asked colour and side,
  no excluded class) -- what the GenEval benchmark counts; flow_grpo's reward server returns it as ``rewards``.
- ``"strict_accuracy"``: the reward server's ``strict_rewards`` (yifan123/reward-server ``gen_eval.py``
  ``evaluate_reward``): *exactly* ``count`` objects and ``count`` of the asked colour; ``exclude`` not checked.
- ``"score"``: the reward server's partial ``scores``, the value flow_grpo / DiffusionNFT train on as
  ``geneval``: the mean of per-requirement terms (``1 - |count - found| / count`` ...; can be negative), see
  :func:`rewardkit.rewards.geneval_rules.evaluate_reward`.

All three are always computed and returned as ``dimensions`` (``accuracy``, ``strict_accuracy``, ``score``).

Per-sample ``details`` (a dict per sample; None for an invalid sample) -- the keys of the record GenEval's
``evaluate_images.py`` writes (EI:238-249), so a benchmark writer adds ``filename`` and dumps the rest as is:

- ``tag`` (str), ``prompt`` (str: ``metadata["prompt"]``, else the call's prompt)
- ``correct`` (bool): GenEval's verdict
- ``reason`` (str): GenEval's reasons for a 0, one per line, in its words (``expected clock>=2, found 1``,
  ``expected red car>=1, found 0 red; and 1 blue``, ``expected dog right of target, found left of target``,
  ``no target for dog to be right of``, ``expected clock<3, found 3``); empty when correct
- ``metadata`` (str): ``json.dumps(metadata)``, as GenEval writes it
- ``details`` (str): ``json.dumps({class name: [[x1, y1, x2, y2, score], ...]})``, the kept detections per class
  in decreasing score, as GenEval writes them

and the reward server's extra fields (reward-server ``gen_eval.py``, ``evaluate_image``):

- ``strict_correct`` (bool), ``score`` (float): the ``strict_accuracy`` / ``score`` forms' values
- ``strict_reason`` (str): the reason ``evaluate_reward`` gives (the server returns it as ``reason``)

plus ``colors`` (dict: class name -> the colour CLIP gave each judged object, only for classes whose colour was
asked).

Detector: Mask2Former (Swin-S, COCO instances; ``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco``) run on
transformers' ``Mask2FormerForUniversalSegmentation`` (no mmcv / mmdet), converted once from the official mmdet
checkpoint by ``rewardkit convert geneval``; mmdet's test pipeline and instance post-processing are reimplemented
in :mod:`rewardkit.rewards._geneval_detect`. Colours: CLIP ViT-L/14 (OpenAI) zero-shot on each object's masked
crop over a grey (#999) background, GenEval's three templates averaged as clip_benchmark does.
Rule constants (score threshold 0.3, 0.9 for ``counting``, 16 objects per class, no NMS, position margin 0.1):
:mod:`rewardkit.rewards.geneval_rules`; GenEval's ``--options`` are config fields (``threshold``,
``counting_threshold``, ``max_objects``, ``max_overlap``, ``position_threshold``). ``detector_channels="bgr"``
feeds the detector as flow_grpo's reward server does (RGB arrays that mmdet takes for BGR); the default ``"rgb"`` is
the benchmark's (image files). Parity with mmdet 2.28 and open_clip + clip_benchmark: ``bash scripts/parity.sh
geneval`` (figures in docs/zoo.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..reward import Reward, RewardBatch, RewardConfig, RewardOutput
from . import geneval_rules as rules

__all__ = ["GenEval", "GenEvalConfig", "FORMS"]

FORMS = ("accuracy", "strict_accuracy", "score")


@dataclass
class GenEvalConfig(RewardConfig):
    model: str = ""                 # directory written by `rewardkit convert geneval`
    #: "accuracy" (GenEval's verdict), "strict_accuracy" / "score" (flow_grpo's reward server); module docs
    form: str = "accuracy"
    device: str | None = None
    dtype: str = "float32"
    batch_size: int = 8
    # GenEval's `--options` (evaluate_images.py:271-275), defaults as published
    threshold: float = rules.THRESHOLD
    counting_threshold: float = rules.COUNTING_THRESHOLD
    max_objects: int = rules.MAX_OBJECTS
    max_overlap: float = rules.NMS_THRESHOLD
    position_threshold: float = rules.POSITION_THRESHOLD
    #: "rgb": the detector sees the image as GenEval's benchmark feeds it (files read by mmdet as BGR, swapped to
    #: RGB); "bgr": as flow_grpo's reward server feeds it (RGB arrays taken for BGR and swapped)
    detector_channels: str = "rgb"
    #: mmdet's test-pipeline resize (keep the aspect ratio, fit into long x short); the tiny test model uses less
    img_scale: tuple = (1333, 800)


class GenEval(Reward):
    """GenEval's verdict on an image for its prompt's metadata (objects, counts, colours, positions)."""

    name: ClassVar[str] = "geneval"
    tasks = frozenset({"t2i"})
    extras = ("hf",)
    dimensions = FORMS
    score_range = (0.0, 1.0)
    Config = GenEvalConfig

    def __init__(self, config=None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        from pathlib import Path

        import transformers

        from ..convert._io import read_manifest
        from ..devices import resolve_device
        from ..models.clip import CLIPBackbone
        from ..models.vlm import from_pretrained_safetensors, resolve_dtype

        cfg = self.config
        if cfg.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {cfg.form!r}")
        if cfg.detector_channels not in ("rgb", "bgr"):
            raise ValueError(f"detector_channels must be 'rgb' or 'bgr', got {cfg.detector_channels!r}")
        if len(tuple(cfg.img_scale)) != 2 or min(int(v) for v in cfg.img_scale) < 32:
            raise ValueError(f"img_scale must be (long, short) sides of at least 32 pixels, got {cfg.img_scale!r}")
        if cfg.batch_size < 1 or cfg.max_objects < 1:
            raise ValueError("batch_size and max_objects must be >= 1")
        if not cfg.model:
            raise ValueError("geneval needs model=<directory written by `rewardkit convert geneval "
                             "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth DIR`>")
        self.manifest = read_manifest(cfg.model, "geneval")
        root = Path(cfg.model)
        self._device = resolve_device(cfg.device) if cfg.device else torch.device("cpu")
        self.detector = from_pretrained_safetensors(transformers.Mask2FormerForUniversalSegmentation,
                                                    str(root / self.manifest.get("detector", "detector")),
                                                    dtype=resolve_dtype(cfg.dtype))
        self.detector.to(self._device).eval().requires_grad_(False)
        self.clip = CLIPBackbone(str(root / self.manifest.get("clip_dir", "clip")), device=self._device,
                                 dtype=cfg.dtype, text_cleaning="openclip")
        self.num_classes = int(self.detector.config.num_labels)
        if self.num_classes != len(rules.OBJECT_NAMES):
            raise ValueError(f"the detector has {self.num_classes} classes; GenEval's rules name 80 COCO classes")
        self.score_range = None if cfg.form == "score" else (0.0, 1.0)  # partial scores can be negative
        self.default_batch_size = cfg.batch_size
        self._classifiers: dict[str, torch.Tensor] = {}

    def to(self, device):
        self.detector.to(device)
        self.clip.to(device)
        self._device = device
        return self

    # ------------------------------------------------------------------ colours
    def _classifier(self, classname: str) -> torch.Tensor:
        """``[D, 10]`` zero-shot weights for one object class (clip_benchmark's ``zero_shot_classifier``: each
        colour's templates embedded, L2-normalised, averaged, normalised again; evaluate_images.py:109-118)."""
        if classname not in self._classifiers:
            cols = []
            for color in rules.COLORS:
                texts = [t.format(classname=classname).format(c=color) for t in rules.COLOR_TEMPLATES]
                emb, _ = self.clip.embed_texts(texts)
                mean = emb.mean(dim=0)
                cols.append(mean / mean.norm())
            self._classifiers[classname] = torch.stack(cols, dim=1)
        return self._classifiers[classname]

    def _colors(self, image: Any, classname: str, crops: list[tuple[list[float], Any]]) -> list[str]:
        """GenEval's ``color_classification`` (evaluate_images.py:83-123): each object's mask pastes the image over a
        #999 grey canvas, cropped to its box, OpenAI CLIP's transform, argmax of 100 x cosine."""
        from PIL import Image

        from ..models.zoo import clip_image_embeddings, openai_clip_pixels

        blank = Image.new("RGB", image.size, color="#999")
        ims = []
        for box, mask in crops:
            im = Image.composite(image, blank, Image.fromarray(mask)) if mask is not None else image
            ims.append(im.crop(tuple(box[:4])))  # PIL rounds float boxes
        size = int(self.clip.model.config.vision_config.image_size)
        feats = clip_image_embeddings(self.clip.model, openai_clip_pixels(ims, size))
        logits = 100.0 * feats @ self._classifier(classname).to(feats.device)
        return [rules.COLORS[int(j)] for j in logits.argmax(dim=1).tolist()]

    # ------------------------------------------------------------------ scoring
    def _score(self, batch: RewardBatch) -> RewardOutput:
        from ._geneval_detect import detect, per_class

        cfg = self.config
        n = len(batch)
        errors: list[str | None] = [None] * n
        details: list[dict[str, Any] | None] = [None] * n
        dims = {f: torch.full((n,), float("nan")) for f in FORMS}
        todo = []
        for i, md in enumerate(batch.metadata):
            if not md:
                errors[i] = ("geneval needs the prompt's GenEval metadata: metadata=[{'tag': ..., 'include': [...], "
                             "'exclude': [...], 'prompt': ...}] (a line of GenEval's evaluation_metadata.jsonl)")
                continue
            err = rules.check_metadata(md)
            if err:
                errors[i] = err
                continue
            todo.append(i)
        by_size: dict[tuple[int, int], list[int]] = {}
        for i in todo:
            by_size.setdefault(batch.images[i].size, []).append(i)
        results: dict[int, dict] = {}
        for idx in by_size.values():
            for i, res in zip(idx, detect(self.detector, [batch.images[i] for i in idx],
                                          bgr=cfg.detector_channels == "bgr", scale=tuple(cfg.img_scale))):
                results[i] = res
        for i in todo:
            md, res, image = batch.metadata[i], results[i], batch.images[i]
            boxes, rows = per_class(res, self.num_classes)
            objects = rules.select_objects(boxes, md["tag"], threshold=cfg.threshold,
                                           counting_threshold=cfg.counting_threshold, max_objects=cfg.max_objects,
                                           nms_threshold=cfg.max_overlap)
            masks = res["masks"]
            seen: dict[tuple, list[str]] = {}

            def box_of(o, boxes=boxes):
                return boxes[o[0]][o[1]]

            def colors_of(name, objs, image=image, boxes=boxes, rows=rows, masks=masks, seen=seen):
                key = (name, tuple(objs))
                if key not in seen:
                    crops = [(boxes[c][r].tolist(), masks[rows[c][r]].cpu().numpy()) for c, r in objs]
                    seen[key] = self._colors(image, name, crops)
                return seen[key]

            correct, reason = rules.evaluate(objects, md, colors_of, box_of=box_of,
                                             position_threshold=cfg.position_threshold)
            strict, score, sreason = rules.evaluate_reward(objects, md, colors_of, box_of=box_of,
                                                           position_threshold=cfg.position_threshold)
            dims["accuracy"][i] = float(correct)
            dims["strict_accuracy"][i] = float(strict)
            dims["score"][i] = score
            details[i] = {"tag": md["tag"], "prompt": md.get("prompt", batch.prompts[i]), "correct": bool(correct),
                          "reason": reason, "metadata": json.dumps(md),
                          "details": json.dumps(rules.boxes_json(objects, box_of)),
                          "strict_correct": bool(strict), "score": score, "strict_reason": sreason,
                          "colors": {name: cols for (name, _), cols in seen.items()}}
        return RewardOutput(scores=dims[cfg.form].clone(), errors=errors, dimensions=dims, details=details,
                            info={"model": cfg.model, "form": cfg.form, "detector_channels": cfg.detector_channels})

    @classmethod
    def tiny(cls, workdir: str) -> "GenEval":
        from pathlib import Path

        from ..convert import convert
        from ..convert.tiny_geneval import write_tiny_geneval_detector
        from ..testing import save_tiny_checkpoint

        root = Path(workdir)
        out = root / "tiny-geneval"
        if not (out / "rewardkit.json").is_file():
            clip = save_tiny_checkpoint("clip", root / "tiny-clip")
            src = write_tiny_geneval_detector(root / "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth")
            convert("geneval", src, out, clip=str(clip))
        return cls(model=str(out), device="cpu", img_scale=(96, 64))
