"""HPSv2 parity, official side (runs in the `hpsv2` package's virtual environment, see scripts/parity.sh).

``python hpsv2.py INPUTS OUT``:

1. builds a tiny OpenCLIP model with the package's own vendored open_clip, through the very call of
   ``hpsv2/img_score.py`` ``initialize_model()`` (same keyword arguments: ``precision='amp'``,
   ``light_augmentation=True``, ``output_dict=True``, ...) but a tiny registered model config instead of
   ``ViT-H-14``; every weight is perturbed (seeded) so no parameter sits at a neutral initial value;
2. saves it as the published files are saved: ``{'state_dict': ...}`` in fp16, ``OUT/HPS_v2.1_compressed.pt``;
3. scores every (image path, prompt) pair with ``hpsv2.img_score.score(path, prompt, cp=...)``, the function
   the public ``hpsv2.score`` delegates to (``hpsv2/__init__.py``), with the tiny model placed in its
   ``model_dict`` cache (``initialize_model`` builds the model only when that cache is empty);
4. writes the package's BPE vocabulary (the OpenAI CLIP BPE, what ``SimpleTokenizer`` reads) as transformers
   CLIP tokenizer files in ``OUT/tokenizer`` (vocab.json / merges.txt), for ``rewardkit convert --tokenizer``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs, write_scores  # noqa: E402

#: tiny ViT-H-14 look-alike: the same code paths (GELU, no quick-GELU), 224 px, patch 14, real 49408 vocabulary
TINY = {"embed_dim": 32,
        "vision_cfg": {"image_size": 224, "layers": 2, "width": 64, "head_width": 32, "patch_size": 14},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
NAME = "parity-tiny-ViT"


def _create(out: Path):
    """The tiny model through ``initialize_model()``'s call (its keyword arguments, model name and pretrained tag
    aside): (model, preprocess_val)."""
    from hpsv2.src.open_clip import add_model_config, create_model_and_transforms

    cfg_path = out / f"{NAME}.json"
    cfg_path.write_text(json.dumps(TINY))
    add_model_config(cfg_path)
    model, _, preprocess_val = create_model_and_transforms(
        NAME, None, precision="amp", device="cpu", jit=False, force_quick_gelu=False, force_custom_text=False,
        force_patch_dropout=False, force_image_size=None, pretrained_image=False, image_mean=None, image_std=None,
        light_augmentation=True, aug_cfg={}, output_dict=True, with_score_predictor=False,
        with_region_predictor=False)
    return model, preprocess_val


def load_scorer(out_dir: str):
    """``f(image_paths, prompt) -> [score]``: the official call on the checkpoint ``main`` wrote in OUT (for
    benchmarks/peers.py). ``img_score.score`` reloads the checkpoint on every call, as it does for users."""
    import torch
    from hpsv2 import img_score

    warnings.filterwarnings("ignore")
    out = Path(out_dir)
    model, preprocess_val = _create(out)
    img_score.model_dict["model"] = model
    img_score.model_dict["preprocess_val"] = preprocess_val
    ckpt = str(out / "HPS_v2.1_compressed.pt")

    def score(paths: list, prompt: str) -> list:
        with torch.no_grad():
            return [float(x) for x in img_score.score(list(paths), prompt, cp=ckpt, hps_version="v2.1")]
    return score


def main(inputs: str, out_dir: str) -> None:
    import torch

    warnings.filterwarnings("ignore")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from hpsv2 import img_score
    from hpsv2.src.open_clip.tokenizer import _tokenizer

    torch.manual_seed(0)
    model, preprocess_val = _create(out)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "logit_scale":
                continue
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    sd = {k: v.half() for k, v in model.state_dict().items()}  # the published files are fp16
    ckpt = out / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": sd}, ckpt)

    img_score.model_dict["model"] = model
    img_score.model_dict["preprocess_val"] = preprocess_val
    images, prompts = read_inputs(inputs)
    scores: dict = {}
    for im in images:
        for j, prompt in enumerate(prompts):
            try:
                scores[key(im, j)] = float(img_score.score(im["path"], prompt, cp=str(ckpt), hps_version="v2.1")[0])
            except Exception as exc:  # noqa: BLE001 - recorded: the official path crashed on this input
                scores[key(im, j)] = f"{type(exc).__name__}: {exc}"[:300]
    from importlib.metadata import version

    write_scores(out / "official.json", scores, package="hpsv2", version=version("hpsv2"),
                 call="hpsv2.img_score.score(path, prompt, cp=ckpt, hps_version='v2.1')")

    tok = out / "tokenizer"
    tok.mkdir(exist_ok=True)
    enc = dict(_tokenizer.encoder)
    # the package names its specials <start_of_text> / <end_of_text>; the same ids (49406 / 49407) carry the
    # transformers CLIP names
    enc["<|startoftext|>"] = enc.pop("<start_of_text>")
    enc["<|endoftext|>"] = enc.pop("<end_of_text>")
    (tok / "vocab.json").write_text(json.dumps(enc, ensure_ascii=False))
    merges = sorted(_tokenizer.bpe_ranks, key=_tokenizer.bpe_ranks.get)
    (tok / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    (tok / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    print(f"  official: {sum(isinstance(v, float) for v in scores.values())} scores, "
          f"{sum(not isinstance(v, float) for v in scores.values())} crashes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
