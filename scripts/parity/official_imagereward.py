"""ImageReward parity (scripts/parity.sh).

``python official_imagereward.py tokenizer OUT`` (rewardkit's environment): writes OUT/bert-base-uncased/, a
small uncased WordPiece vocabulary (``vocab.txt``) with BERT's specials, from ``rewardkit.convert.tiny`` (the
real bert-base-uncased files cannot be fetched offline). The official ``init_tokenizer()`` calls
``BertTokenizer.from_pretrained('bert-base-uncased')``, which reads a local directory of that name first: the
official run happens with OUT as its working directory.

``python official_imagereward.py official INPUTS OUT`` (the image-reward package's environment):

1. builds ``ImageReward.ImageReward.ImageReward(med_config, device='cpu')``, the package's own class, with a small
   ``med_config.json`` (the published keys; hidden size stays 768, which ``MLP(768)`` requires; one layer) and
   ``create_vit`` (``ImageReward/models/BLIP/blip.py``) returning the package's own ``VisionTransformer`` at a
   small width and depth instead of ViT-L (the 'large' branch is hard-coded; ViT-L has 300 M parameters);
2. perturbs every weight (seeded) and saves ``model.state_dict()`` as ``OUT/ImageReward.pt`` (the published
   file is ``torch.save(state_dict)``);
3. loads it back with ``ImageReward.load(path, device='cpu', med_config=...)`` and scores each image path with
   ``model.score(prompt, path)`` (``inference_rank`` for a list gives the same per-image values).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs, write_scores  # noqa: E402

VIT = {"embed_dim": 256, "depth": 2, "num_heads": 4, "patch_size": 16}  # heads = width / 64, as ViT-L (the converter's default)


def tokenizer(out: str) -> None:
    from rewardkit.convert.tiny import save_tiny_bert_tokenizer

    d = Path(out) / "bert-base-uncased"
    save_tiny_bert_tokenizer(d)
    vocab = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    (d / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    for f in ("tokenizer.json", "special_tokens_map.json"):  # one source of truth: vocab.txt, as bert-base-uncased
        (d / f).unlink(missing_ok=True)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                                                         "model_max_length": 512}))


def _import_without_refl() -> None:
    """``ImageReward/__init__.py`` also imports ``ReFL`` (its diffusion fine-tuning script: accelerate, datasets,
    diffusers at import time), which scoring never uses. The package is registered without running its
    ``__init__``, so ``ImageReward.utils`` (``load``) and ``ImageReward.ImageReward`` import as they are."""
    import importlib.util
    import types

    spec = importlib.util.find_spec("ImageReward")
    pkg = types.ModuleType("ImageReward")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["ImageReward"] = pkg


def _official_classes(out: Path):
    """(``ImageReward.utils``, ``ImageReward.ImageReward.ImageReward``) with the small ViT in place of ViT-L; the
    working directory becomes OUT (BertTokenizer.from_pretrained('bert-base-uncased') -> ./bert-base-uncased)."""
    os.chdir(out)
    _import_without_refl()
    from ImageReward import utils as RM  # ImageReward/__init__.py does `from .utils import *`: RM.load is utils.load
    from ImageReward.ImageReward import ImageReward
    from ImageReward.models.BLIP import blip_pretrain
    from ImageReward.models.BLIP.vit import VisionTransformer

    def small_vit(vit, image_size, use_grad_checkpointing=False, ckpt_layer=0, drop_path_rate=0):
        assert vit == "large"
        return VisionTransformer(img_size=image_size, patch_size=VIT["patch_size"], embed_dim=VIT["embed_dim"],
                                 depth=VIT["depth"], num_heads=VIT["num_heads"],
                                 use_grad_checkpointing=use_grad_checkpointing, ckpt_layer=ckpt_layer,
                                 drop_path_rate=0.1 or drop_path_rate), VIT["embed_dim"]

    blip_pretrain.create_vit = small_vit
    return RM, ImageReward


def load_scorer(out_dir: str):
    """``f(image_paths, prompt) -> [score]``: ``ImageReward.load(...).score(prompt, paths)`` on the checkpoint
    ``official`` wrote in OUT (for benchmarks/peers.py)."""
    import torch

    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    RM, _ = _official_classes(out)
    model = RM.load(str(out / "ImageReward.pt"), device="cpu", med_config=str(out / "med_config.json"))

    def score(paths: list, prompt: str) -> list:
        paths = [str(Path(p).resolve()) for p in paths]
        with torch.no_grad():
            r = model.score(prompt, paths if len(paths) > 1 else paths[0])
        return [float(x) for x in r] if isinstance(r, list) else [float(r)]
    return score


def official(inputs: str, out_dir: str) -> None:
    import torch

    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    inputs = str(Path(inputs).resolve())
    RM, ImageReward = _official_classes(out)
    vocab = len((out / "bert-base-uncased" / "vocab.txt").read_text().splitlines()) + 2  # + [DEC], [ENC]
    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 128,
           "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
           "num_attention_heads": 12, "num_hidden_layers": 1, "pad_token_id": 0, "type_vocab_size": 2,
           "vocab_size": vocab, "encoder_width": 768, "add_cross_attention": True}
    med_path = out / "med_config.json"
    med_path.write_text(json.dumps(med))
    torch.manual_seed(0)
    model = ImageReward(med_config=str(med_path), device="cpu")
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ckpt = out / "ImageReward.pt"
    torch.save(model.state_dict(), ckpt)
    del model

    model = RM.load(str(ckpt), device="cpu", med_config=str(med_path))
    images, prompts = read_inputs(inputs)
    scores: dict = {}
    with torch.no_grad():
        for im in images:
            for j, prompt in enumerate(prompts):
                try:
                    scores[key(im, j)] = float(model.score(prompt, im["path"]))
                except Exception as exc:  # noqa: BLE001 - recorded: the official path crashed on this input
                    scores[key(im, j)] = f"{type(exc).__name__}: {exc}"[:300]
    from importlib.metadata import version

    write_scores(out / "official.json", scores, package="image-reward", version=version("image-reward"),
                 call="ImageReward.load(path, device='cpu', med_config=...).score(prompt, image_path)")
    print(f"  official: {sum(isinstance(v, float) for v in scores.values())} scores, "
          f"{sum(not isinstance(v, float) for v in scores.values())} crashes")


if __name__ == "__main__":
    if sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2])
    else:
        official(sys.argv[2], sys.argv[3])
