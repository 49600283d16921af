"""GenEval detector parity: mmdet 2.x's own Mask2Former (``inference_detector``) vs rewardkit's conversion to
transformers, on a tiny random checkpoint in mmdet's key layout; and GenEval's colour classifier (open_clip +
clip_benchmark) vs rewardkit's on a tiny CLIP.

    python scripts/parity/geneval_mmdet.py run [WORKDIR]      # rewardkit's environment; needs GENEVAL_PARITY_PY

``GENEVAL_PARITY_PY`` is the interpreter of an environment with ``mmcv==1.7.1`` (the pure-Python build),
``mmdet==2.28.2``, ``open_clip_torch``, ``clip-benchmark``, ``pycocotools``, ``opencv-python-headless`` and torch
(docs/zoo.md, "geneval", says how it was built). mmcv's compiled ops are not built there: ``mmcv.ops`` imports
with a loader whose functions raise if called. On the CPU, mmcv's ``MultiScaleDeformableAttention`` runs its
pure-PyTorch path (``multi_scale_deformable_attn_pytorch``) and never calls them; the other ops are
training-only (``point_sample`` in the loss).

The official side (``official`` mode, in that environment) builds GenEval's config
(``mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py``) with the tiny widths of
:func:`rewardkit.convert.tiny_geneval.mmdet_mask2former_state_dict`, loads that state dict **strictly** (so the
tiny key layout is mmdet's own), and runs ``inference_detector`` on image files, as GenEval does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TINY = dict(embed=16, depths=[1, 1, 2, 1], heads=[1, 2, 2, 4], feat=32, attn_heads=4, enc_layers=1, enc_ffn=64,
            dec_layers=2, dec_ffn=64, queries=12)


def _no_compiled_ops() -> None:
    import mmcv.utils.ext_loader as el

    class _NoExt:
        def __getattr__(self, name):
            def missing(*a, **k):
                raise RuntimeError(f"mmcv compiled op {name} is not built in this parity environment")
            return missing

    el.load_ext = lambda name, funcs: _NoExt()


def official(ckpt: str, images: str, out: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    _no_compiled_ops()
    import mmcv
    import mmdet
    import numpy as np
    import torch
    from mmdet.apis import inference_detector, init_detector

    cfg = mmcv.Config.fromfile(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs", "mask2former",
                                            "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py"))
    t = TINY
    bb = cfg.model.backbone
    bb.embed_dims, bb.depths, bb.num_heads, bb.init_cfg = t["embed"], t["depths"], t["heads"], None
    h = cfg.model.panoptic_head
    h.in_channels = [t["embed"] * 2 ** i for i in range(4)]
    h.feat_channels = h.out_channels = t["feat"]
    h.num_queries = t["queries"]
    pd = h.pixel_decoder
    pd.encoder.num_layers = t["enc_layers"]
    pd.encoder.transformerlayers.attn_cfgs.embed_dims = t["feat"]
    pd.encoder.transformerlayers.attn_cfgs.num_heads = t["attn_heads"]
    pd.encoder.transformerlayers.ffn_cfgs.embed_dims = t["feat"]
    pd.encoder.transformerlayers.ffn_cfgs.feedforward_channels = t["enc_ffn"]
    pd.positional_encoding.num_feats = t["feat"] // 2
    h.positional_encoding.num_feats = t["feat"] // 2
    td = h.transformer_decoder
    td.num_layers = t["dec_layers"]
    td.transformerlayers.attn_cfgs.embed_dims = t["feat"]
    td.transformerlayers.attn_cfgs.num_heads = t["attn_heads"]
    td.transformerlayers.ffn_cfgs.embed_dims = t["feat"]
    td.transformerlayers.ffn_cfgs.feedforward_channels = t["dec_ffn"]
    td.transformerlayers.feedforward_channels = t["dec_ffn"]
    model = init_detector(cfg, None, device="cpu")
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    report = {"missing": list(missing), "unexpected": list(unexpected), "images": {}}
    for name in sorted(os.listdir(images)):
        result = inference_detector(model, os.path.join(images, name))
        bbox, segm = result
        report["images"][name] = {
            "boxes": [b.tolist() for b in bbox],
            "masks": [[np.packbits(np.asarray(m, dtype=bool)).tolist() for m in ms] for ms in segm]}
    Path(out).write_text(json.dumps(report))


def run(work: str | None) -> int:
    import numpy as np

    from rewardkit.convert import convert
    from rewardkit.convert.tiny_geneval import write_tiny_geneval_detector
    from rewardkit.rewards import geneval_rules as rules
    from rewardkit.rewards._geneval_detect import detect, per_class
    from rewardkit.testing import random_images, save_tiny_checkpoint

    py = os.environ.get("GENEVAL_PARITY_PY")
    if not py:
        print("set GENEVAL_PARITY_PY to the mmdet 2.x environment's python (see the module docstring)")
        return 2
    root = Path(work or tempfile.mkdtemp(prefix="geneval-parity-"))
    (root / "images").mkdir(parents=True, exist_ok=True)
    t = TINY
    ckpt = write_tiny_geneval_detector(root / "m2f.pth", embed=t["embed"], depths=tuple(t["depths"]),
                                       heads=tuple(t["heads"]), feat=t["feat"], attn_heads=t["attn_heads"],
                                       enc_layers=t["enc_layers"], enc_ffn=t["enc_ffn"], dec_layers=t["dec_layers"],
                                       dec_ffn=t["dec_ffn"], queries=t["queries"])
    sizes = [(64, 48), (48, 64), (80, 80), (100, 40), (1000, 800), (800, 1200)]  # the last two need no resize
    for i, im in enumerate(random_images(len(sizes), seed=11, sizes=sizes)):
        im.save(root / "images" / f"{i:05}.png")
    subprocess.run([py, __file__, "official", str(ckpt), str(root / "images"), str(root / "official.json")],
                   check=True)
    off = json.loads((root / "official.json").read_text())
    print(f"mmdet load_state_dict: missing {off['missing']}, unexpected {off['unexpected']}")
    if not (root / "conv" / "rewardkit.json").is_file():
        clip = save_tiny_checkpoint("clip", root / "clip")
        convert("geneval", ckpt, root / "conv", clip=str(clip))
    import transformers
    from PIL import Image

    model = transformers.Mask2FormerForUniversalSegmentation.from_pretrained(str(root / "conv" / "detector")).eval()
    worst_box = worst_score = 0.0
    mask_diff = n_det = kept_same = kept_total = count_mismatch = 0
    unresized_exact = []
    for name, want in off["images"].items():
        im = Image.open(root / "images" / name).convert("RGB")
        import torch

        with torch.no_grad():
            res = detect(model, [im])[0]
        boxes, rows = per_class(res, 80)
        if im.size in ((1000, 800), (800, 1200)):  # no resize: the same input tensor as mmdet's
            unresized_exact.append(all(np.array_equal(np.asarray(want["boxes"][c], dtype=np.float32).reshape(-1, 5)[
                np.argsort(-np.asarray(want["boxes"][c], dtype=np.float32).reshape(-1, 5)[:, 4], kind="stable")][:, :4],
                boxes[c][np.argsort(-boxes[c][:, 4], kind="stable")][:, :4]) for c in range(80)))
        for c in range(80):
            # GenEval keeps detections scoring above 0.3: compare those (top-k membership near score 0 can change
            # with a one-level resize difference, and does not matter to GenEval), sorted by score
            a = np.asarray(want["boxes"][c], dtype=np.float32).reshape(-1, 5)
            b = boxes[c]
            ia_all = [i for i in np.argsort(-a[:, 4], kind="stable") if a[i, 4] > rules.THRESHOLD]
            ib_all = [i for i in np.argsort(-b[:, 4], kind="stable") if b[i, 4] > rules.THRESHOLD]
            if len(ia_all) != len(ib_all):
                count_mismatch += 1
                continue
            for ia, ib in zip(ia_all, ib_all):
                worst_box = max(worst_box, float(np.abs(a[ia, :4] - b[ib, :4]).max()))
                worst_score = max(worst_score, float(abs(a[ia, 4] - b[ib, 4])))
                ma = np.unpackbits(np.asarray(want["masks"][c][ia], dtype=np.uint8))[: im.size[0] * im.size[1]]
                mb = res["masks"][rows[c][ib]].numpy().reshape(-1)
                mask_diff += int((ma.astype(bool) != mb).sum())
                n_det += 1
        for tag in ("single_object", "counting"):
            ours = rules.select_objects(boxes, tag)
            theirs = rules.select_objects([np.asarray(x, dtype=np.float32).reshape(-1, 5) for x in want["boxes"]], tag)
            kept_total += 1
            kept_same += int({k: len(v) for k, v in ours.items()} == {k: len(v) for k, v in theirs.items()})
    print(f"detections above 0.3 compared: {n_det} (classes whose count above 0.3 differs: {count_mismatch}); "
          f"max |box| diff {worst_box:.3g} px; max |score| diff {worst_score:.3g}; mask pixels that differ: "
          f"{mask_diff}; GenEval's kept objects per class equal on {kept_same}/{kept_total} (image, tag) pairs; "
          f"images needing no resize with every box equal: {sum(unresized_exact)}/{len(unresized_exact)}")
    return 0 if count_mismatch == 0 and kept_same == kept_total else 1


if __name__ == "__main__":
    if sys.argv[1] == "official":
        official(*sys.argv[2:5])
    else:
        sys.exit(run(sys.argv[2] if len(sys.argv) > 2 else None))
