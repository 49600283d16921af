"""Prompt sets for the NFT trainer: ``builtin:NAME``, a ``.txt`` file (one prompt a line) or a ``.jsonl`` file
whose rows are ``{"prompt": ..., <any other fields>}``: the row (its ``prompt`` included, as flow_grpo's and
DiffusionNFT's ``GenevalPromptDataset`` pass it, and as rewardkit's flow_grpo drop-in receives it) is that
prompt's metadata, handed to the rewards with each of its samples (``{split}_metadata.jsonl``, e.g. GenEval's
``tag`` / ``include`` / ``exclude``; flow_grpo's GenEval scorer sends the server only the metadata, so the
evaluator reads ``metadata["prompt"]`` there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import iter_jsonl

__all__ = ["BUILTIN_PROMPTS", "load_prompts", "load_prompt_set"]

BUILTIN_PROMPTS = {
    "geneval_tiny": [
        "a photo of a cat", "a photo of two dogs", "a red car and a blue bicycle", "a photo of a banana",
        "a green bowl to the left of a cup", "three birds on a branch", "a yellow umbrella", "a photo of a clock",
        "a black sink and a white toilet", "a cow below a tv", "a purple vase", "two apples on a table",
        "a photo of a giraffe and a zebra", "an orange kite in the sky", "a brown bear", "four books",
    ],
    # held out from geneval_tiny: the tiny recipes' evaluation prompts
    "geneval_tiny_eval": [
        "a photo of a horse", "a white teapot", "two cups on a desk", "a blue chair next to a lamp",
        "a photo of a sheep", "a pink flower in a vase", "three oranges", "a red stop sign",
    ],
}


def load_prompt_set(spec: str) -> tuple[list[str], list[dict[str, Any]]]:
    """``(prompts, metadata)`` from ``builtin:NAME``, a ``.txt`` file (one prompt a line; metadata ``{}``) or a
    ``.jsonl`` file: one object per line with a string ``"prompt"``; the row is that prompt's metadata, its
    ``prompt`` included as in flow_grpo (``{"prompt": "two dogs", "tag": "counting", "include": [...]}``)."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_PROMPTS:
            raise ValueError(f"unknown builtin prompt set {name!r}; choose from {sorted(BUILTIN_PROMPTS)}")
        return list(BUILTIN_PROMPTS[name]), [{} for _ in BUILTIN_PROMPTS[name]]
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts, metadata = [], []
    if path.suffix == ".jsonl":
        for lineno, rec in iter_jsonl(path):
            if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string 'prompt'")
            prompts.append(rec["prompt"])
            metadata.append(dict(rec))  # the whole row, as flow_grpo / DiffusionNFT (train_nft_sd3.py:102-109)
    else:
        prompts = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        metadata = [{} for _ in prompts]
    if not prompts or any(not p.strip() for p in prompts):
        raise ValueError(f"{path}: no prompts (or an empty prompt)")
    return prompts, metadata


def load_prompts(spec: str) -> list[str]:
    """The prompts of :func:`load_prompt_set` (without their metadata)."""
    return load_prompt_set(spec)[0]
