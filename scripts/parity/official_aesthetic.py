"""LAION aesthetic predictor parity (scripts/parity.sh).

The predictor (christophschuhmann/improved-aesthetic-predictor) is not on PyPI; its packaged form is
``ImageReward.models.AestheticScore`` in the image-reward package (OpenAI ``clip`` ViT-L/14 image embedding,
L2-normalised, then the same activation-free ``MLP(768)``), run here in the image-reward environment.

``python official_aesthetic.py official INPUTS OUT`` (image-reward environment):

1. builds a small ``clip.model.CLIP`` (OpenAI's class; 224 px, patch 14, projection 768 as ViT-L/14, so the
   ``MLP(768)`` fits) and saves it as the published files are, a TorchScript archive, which
   ``clip.load(path, jit=False)`` accepts for a file path (rebuilding ``CLIP`` from its state dict);
2. builds ``AestheticScore`` with ``clip.load`` pointed at that file (the class hard-codes the "ViT-L/14" download),
   perturbs and saves its ``MLP`` as ``OUT/aesthetic.pth`` (a flat ``layers.*`` state dict, as the published file);
3. scores every image with ``AestheticScore.score(None, path)`` (the prompt is unused);
4. writes the OpenAI CLIP BPE as transformers tokenizer files (for the converted CLIP's processor).

``python official_aesthetic.py hfclip OUT`` (rewardkit's environment): the saved OpenAI CLIP as a transformers
``CLIPModel`` directory (``--clip`` of ``rewardkit convert aesthetic``), through rewardkit's OpenCLIP mapping (OpenAI
names) with OpenAI CLIP's quick-GELU, and the OpenAI CLIP image processor settings.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import key, read_inputs, write_scores  # noqa: E402

CLIP = dict(embed_dim=768, image_resolution=224, vision_layers=2, vision_width=128, vision_patch_size=14,
            context_length=77, vocab_size=49408, transformer_width=64, transformer_heads=1, transformer_layers=2)


def _official_modules():
    """(``clip``, the ``ImageReward.models.AestheticScore`` module)."""
    import importlib
    import importlib.util
    import types

    # ImageReward/__init__.py imports its ReFL training script (accelerate, datasets, diffusers): skipped, as in
    # official_imagereward.py
    spec = importlib.util.find_spec("ImageReward")
    pkg = types.ModuleType("ImageReward")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["ImageReward"] = pkg
    import clip
    return clip, importlib.import_module("ImageReward.models.AestheticScore")  # the module, not the class


def load_scorer(out_dir: str):
    """``f(image_paths, prompt) -> [score]``: ``AestheticScore.score(None, paths)`` on the files ``official``
    wrote in OUT (for benchmarks/peers.py)."""
    import torch

    warnings.filterwarnings("ignore")
    out = Path(out_dir).resolve()
    clip, AS = _official_modules()
    real_load = clip.load
    AS.clip.load = lambda name, **kw: real_load(str(out / "openai-clip-tiny.pt"), **kw)
    scorer = AS.AestheticScore(download_root=str(out), device="cpu")
    scorer.mlp.load_state_dict(torch.load(out / "aesthetic.pth", weights_only=True))
    scorer.eval()

    def score(paths: list, prompt: str) -> list:
        with torch.no_grad():
            r = scorer.score(None, list(paths) if len(paths) > 1 else paths[0])
        return [float(x) for x in r] if isinstance(r, list) else [float(r)]
    return score


def official(inputs: str, out_dir: str) -> None:
    import torch

    warnings.filterwarnings("ignore")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clip, AS = _official_modules()
    from clip.simple_tokenizer import SimpleTokenizer

    torch.manual_seed(0)
    model = clip.model.CLIP(**CLIP)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "logit_scale":
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    clip_path = out / "openai-clip-tiny.pt"
    torch.save(model.state_dict(), out / "openai-clip-tiny-state.pt")
    # the published ViT-L-14.pt is a TorchScript archive, which clip.load reads with torch.jit.load (its
    # state-dict fallback re-reads an already consumed file handle and fails on current torch): traced likewise
    model.eval()
    example = (torch.zeros(1, 3, 224, 224), torch.zeros(1, 77, dtype=torch.long))
    torch.jit.save(torch.jit.trace(model, example, check_trace=False), str(clip_path))

    real_load = clip.load
    AS.clip.load = lambda name, **kw: real_load(str(clip_path), **kw)  # instead of downloading "ViT-L/14"
    scorer = AS.AestheticScore(download_root=str(out), device="cpu")
    with torch.no_grad():
        for p in scorer.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / p.shape[-1] ** 0.5))
    torch.save(scorer.mlp.state_dict(), out / "aesthetic.pth")
    scorer.eval()

    images, prompts = read_inputs(inputs)
    scores: dict = {}
    with torch.no_grad():
        for im in images:
            try:
                s: float | str = float(scorer.score(None, im["path"]))
            except Exception as exc:  # noqa: BLE001 - recorded: the official path crashed on this input
                s = f"{type(exc).__name__}: {exc}"[:300]
            for j in range(len(prompts)):
                scores[key(im, j)] = s
    from importlib.metadata import version

    write_scores(out / "official.json", scores, package="image-reward (AestheticScore) + openai-clip",
                 version=f"{version('image-reward')} / {version('openai-clip')}",
                 call="ImageReward.models.AestheticScore(...).score(None, image_path)")
    tok = SimpleTokenizer()
    d = out / "tokenizer"
    d.mkdir(exist_ok=True)
    (d / "vocab.json").write_text(json.dumps(tok.encoder, ensure_ascii=False))
    merges = sorted(tok.bpe_ranks, key=tok.bpe_ranks.get)
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    print(f"  official: {sum(isinstance(v, float) for v in scores.values())} scores, "
          f"{sum(not isinstance(v, float) for v in scores.values())} crashes")


def hfclip(out_dir: str) -> None:
    import torch
    import transformers

    from rewardkit.convert.openclip import clip_config_from_openclip, openclip_to_hf

    out = Path(out_dir)
    sd = torch.load(out / "openai-clip-tiny-state.pt", weights_only=True)
    tok = transformers.CLIPTokenizer(vocab_file=str(out / "tokenizer" / "vocab.json"),
                                     merges_file=str(out / "tokenizer" / "merges.txt"))
    cfg = clip_config_from_openclip(sd, vision_heads=CLIP["vision_width"] // 64,
                                    text_heads=CLIP["transformer_heads"], eos_token_id=tok.eos_token_id,
                                    bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    for tower in ("text_config", "vision_config"):
        cfg[tower]["hidden_act"] = "quick_gelu"  # OpenAI CLIP's QuickGELU (clip/model.py)
    config = transformers.CLIPConfig(**cfg)
    model = transformers.CLIPModel(config)
    missing, unexpected = model.load_state_dict(openclip_to_hf(sd, cfg), strict=False)
    if unexpected or [k for k in missing if not k.endswith("position_ids")]:
        sys.exit(f"hfclip: missing {missing}, unexpected {unexpected}")
    dst = out / "hf-clip"
    model.save_pretrained(dst)
    ip = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    transformers.CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(dst)


if __name__ == "__main__":
    if sys.argv[1] == "hfclip":
        hfclip(sys.argv[2])
    else:
        official(sys.argv[2], sys.argv[3])
