"""``rewardkit convert KIND SRC DST``: one-off, offline conversion of official reward checkpoints to rewardkit
directories (safetensors + config + processor / tokenizer files + ``rewardkit.json`` naming the reward).

    >>> from rewardkit.convert import convert
    >>> convert("hpsv2", "HPS_v2.1_compressed.pt", "hpsv2.1")       # then load_reward("hpsv2", model="hpsv2.1")

Pickled sources are read only here, through torch's weights-only (allow-list) unpickler; see
:mod:`rewardkit.convert._io`. The runtime rewards only ever read the safetensors written here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["convert", "CONVERTERS"]

#: kind -> "module:function" (relative to this package); each function is ``f(src, dst, **options) -> Path``.
CONVERTERS: dict[str, str] = {
    "hpsv2": ".hpsv2:convert_hpsv2",
    "aesthetic": ".aesthetic:convert_aesthetic",
    "imagereward": ".imagereward:convert_imagereward",
    "hpsv3": ".hpsv3:convert_hpsv3",
    "editreward": ".editreward:convert_editreward",
    "geneval": ".geneval:convert_geneval",
}


def convert(kind: str, src: str | Path, dst: str | Path, **options: Any) -> Path:
    """Convert ``src`` (an official checkpoint file) into the rewardkit directory ``dst``."""
    if kind not in CONVERTERS:
        raise ValueError(f"unknown converter {kind!r}; choose from {sorted(CONVERTERS)}")
    mod, _, fn = CONVERTERS[kind].partition(":")
    return getattr(importlib.import_module(mod, __name__), fn)(src, dst, **options)
