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


COLOR_CLIP = dict(embed_dim=32, vision_cfg=dict(image_size=224, layers=2, width=64, patch_size=14, head_width=32),
                  text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2))
CLASSNAMES = ("car", "computer mouse", "teddy bear")


def official_colors(out: str) -> None:
    """GenEval's ``color_classification`` (evaluate_images.py:83-123) with open_clip + clip_benchmark on a tiny
    OpenAI-style CLIP (QuickGELU), on the crops in ``OUT/crops.json``. ``amp=False``: GenEval runs clip_benchmark's
    default ``amp=True`` on CUDA (fp16); on this CPU that would be bfloat16, so both sides compare in fp32."""
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import open_clip
    import torch
    from clip_benchmark.metrics import zeroshot_classification as zsc
    from PIL import Image

    zsc.tqdm = lambda it, *a, **k: it
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**COLOR_CLIP, quick_gelu=True).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "logit_scale":
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    torch.save(model.state_dict(), Path(out) / "openclip-tiny-state.pt")
    tokenizer = open_clip.get_tokenizer("ViT-L-14")
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    d = Path(out) / "tokenizer"
    d.mkdir(exist_ok=True)
    # open_clip names its special tokens <start_of_text> / <end_of_text>; the transformers CLIP tokenizer expects
    # OpenAI's <|startoftext|> / <|endoftext|> (same ids)
    special = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {special.get(k, k): v for k, v in tok.encoder.items()}
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    merges = sorted(tok.bpe_ranks, key=tok.bpe_ranks.get)
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    transform = open_clip.image_transform(224, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN,
                                          std=open_clip.OPENAI_DATASET_STD)
    colors = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
    spec = json.loads((Path(out) / "crops.json").read_text())
    result = {}
    for item in spec:
        image = Image.open(item["image"]).convert("RGB")
        blank = Image.new("RGB", image.size, color="#999")
        crops = []
        for box, mask in zip(item["boxes"], item["masks"]):
            m = np.asarray(mask, dtype=bool)
            crops.append((transform(Image.composite(image, blank, Image.fromarray(m)).crop(box[:4])), 0))
        clf = zsc.zero_shot_classifier(model, tokenizer, colors, [
            f"a photo of a {{c}} {item['classname']}", f"a photo of a {{c}}-colored {item['classname']}",
            f"a photo of a {{c}} object"], "cpu", amp=False)
        loader = torch.utils.data.DataLoader(crops, batch_size=16)
        with torch.no_grad():
            pred, _ = zsc.run_classification(model, clf, loader, "cpu", amp=False)
        result[item["image"] + "|" + item["classname"]] = {"logits": pred.tolist(),
                                                           "colors": [colors[i] for i in pred.argmax(1).tolist()]}
    (Path(out) / "colors.json").write_text(json.dumps(result))


def compare_colors(root: Path, py: str) -> tuple[int, int, float]:
    """Our colour path (``GenEval._colors``) vs :func:`official_colors` on the same crops: (equal colours, crops,
    max |logit| difference)."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    from rewardkit.convert.openclip import clip_config_from_openclip, openclip_to_hf
    from rewardkit.models.clip import CLIPBackbone
    from rewardkit.rewards.geneval import GenEval
    from rewardkit.testing import random_images

    cdir = root / "colors"
    cdir.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    spec = []
    for i, im in enumerate(random_images(3, seed=21, sizes=[(96, 80), (120, 64), (64, 64)])):
        path = cdir / f"img{i}.png"
        im.save(path)
        w, h = im.size
        boxes, masks = [], []
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            x1, y1 = int(rng.integers(x0 + 4, w + 1)), int(rng.integers(y0 + 4, h + 1))
            m = np.zeros((h, w), dtype=bool)
            m[y0:y1, x0:x1] = rng.random((y1 - y0, x1 - x0)) < 0.7
            boxes.append([float(x0), float(y0), float(x1), float(y1), 0.9])
            masks.append(m.tolist())
        spec.append({"image": str(path), "classname": CLASSNAMES[i], "boxes": boxes, "masks": masks})
    (cdir / "crops.json").write_text(json.dumps(spec))
    subprocess.run([py, __file__, "official_colors", str(cdir)], check=True)
    off = json.loads((cdir / "colors.json").read_text())
    sd = torch.load(cdir / "openclip-tiny-state.pt", weights_only=True)
    # transformers 5 takes vocab= / merges= (vocab_file= is silently ignored: an empty vocabulary)
    tok = transformers.CLIPTokenizer(vocab=str(cdir / "tokenizer" / "vocab.json"),
                                     merges=str(cdir / "tokenizer" / "merges.txt"))
    if tok("a photo of a red car")["input_ids"][:3] != [49406, 320, 1125]:
        raise SystemExit("the transformers tokenizer built from open_clip's BPE does not give OpenAI CLIP's ids")
    cfg = clip_config_from_openclip(sd, vision_heads=2, text_heads=2, eos_token_id=tok.eos_token_id,
                                    bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    for tower in ("text_config", "vision_config"):
        cfg[tower]["hidden_act"] = "quick_gelu"
    model = transformers.CLIPModel(transformers.CLIPConfig(**cfg))
    model.load_state_dict(openclip_to_hf(sd, cfg), strict=False)
    hf = cdir / "hf-clip"
    model.save_pretrained(hf)
    ip = transformers.CLIPImageProcessorPil(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    transformers.CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(hf)
    rk = GenEval.__new__(GenEval)  # only the colour path: no detector needed
    rk.clip = CLIPBackbone(str(hf), device="cpu", dtype="float32", text_cleaning="openclip")
    rk._classifiers = {}
    same = total = 0
    worst = 0.0
    for item in spec:
        image = Image.open(item["image"]).convert("RGB")
        crops = [(b, np.asarray(m, dtype=bool)) for b, m in zip(item["boxes"], item["masks"])]
        ours = rk._colors(image, item["classname"], crops)
        want = off[item["image"] + "|" + item["classname"]]
        same += sum(a == b for a, b in zip(ours, want["colors"]))
        total += len(ours)
        from rewardkit.models.zoo import clip_image_embeddings, openai_clip_pixels

        blank = Image.new("RGB", image.size, color="#999")
        ims = [Image.composite(image, blank, Image.fromarray(m)).crop(tuple(b[:4])) for b, m in crops]
        with torch.no_grad():
            feats = clip_image_embeddings(rk.clip.model, openai_clip_pixels(ims, 224))
            logits = 100.0 * feats @ rk._classifier(item["classname"])
        worst = max(worst, float((logits - torch.tensor(want["logits"])).abs().max()))
    return same, total, worst


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
    same, total, worst_logit = compare_colors(root, py)
    print(f"colours (open_clip + clip_benchmark vs rewardkit, tiny CLIP, fp32): {same}/{total} equal; "
          f"max |100 x cosine| difference {worst_logit:.3g}")
    # the pass mark: bit-identical inputs (no resize) give mmdet's boxes exactly, and the colours agree; resized
    # inputs differ by OpenCV's one-level rounding, which the random tiny model amplifies (figures above, docs/zoo.md)
    return 0 if same == total and all(unresized_exact) and unresized_exact else 1


if __name__ == "__main__":
    if sys.argv[1] == "official":
        official(*sys.argv[2:5])
    elif sys.argv[1] == "official_colors":
        official_colors(sys.argv[2])
    elif sys.argv[1] == "colors":  # the colour comparison alone
        root = Path(sys.argv[2])
        root.mkdir(parents=True, exist_ok=True)
        print("colours: %d/%d equal; max |100 x cosine| difference %.3g"
              % compare_colors(root, os.environ["GENEVAL_PARITY_PY"]))
    else:
        sys.exit(run(sys.argv[2] if len(sys.argv) > 2 else None))
