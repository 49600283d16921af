"""Packaging workarounds applied to an official package's environment after pip (scripts/parity.sh).

``python shims.py install NAME`` runs inside the environment NAME. Each fix says why; none changes a number the
official code computes.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import sysconfig
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])


def _find(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    return Path(spec.origin).parent if spec and spec.origin else None


def torchvision_without_compiled_ops() -> None:
    """PyPI's torchvision wheels are CUDA builds: their compiled ops (nms, roi_align, ...) do not load beside the
    CPU torch, and ``torchvision/_meta_registrations.py`` then fails at import ("operator torchvision::nms does
    not exist") because it registers fake kernels for those ops unconditionally. The official preprocessing
    only uses torchvision's pure-Python transforms, so the meta registrations (used by torch.compile for the
    C++ ops, which cannot run here anyway) are replaced by an empty module."""
    tv = SITE / "torchvision"
    if not tv.is_dir():
        return
    (tv / "_meta_registrations.py").write_text(
        "# emptied by rewardkit scripts/parity/shims.py: the CUDA build's compiled ops do not load beside CPU torch\n")


def hpsv2_bpe_vocabulary() -> None:
    """The hpsv2 1.2.0 wheel ships its vendored open_clip without ``bpe_simple_vocab_16e6.txt.gz``, which
    ``hpsv2/src/open_clip/tokenizer.py`` opens at import (``default_bpe()``): any ``import hpsv2.src.open_clip``
    fails. The file is OpenAI CLIP's BPE vocabulary, the same one open_clip_torch ships; it is copied over."""
    dst = SITE / "hpsv2" / "src" / "open_clip" / "bpe_simple_vocab_16e6.txt.gz"
    src = SITE / "open_clip" / "bpe_simple_vocab_16e6.txt.gz"
    if not dst.is_file():
        if not src.is_file():
            sys.exit(f"shims: {src} missing (open_clip_torch not installed?)")
        shutil.copyfile(src, dst)


FIXES = {
    "hpsv2": [torchvision_without_compiled_ops, hpsv2_bpe_vocabulary],
    "imagereward": [torchvision_without_compiled_ops],
    "aesthetic": [torchvision_without_compiled_ops],
    "hpsv3": [torchvision_without_compiled_ops],
    "vqascore": [torchvision_without_compiled_ops],
    "geneval": [torchvision_without_compiled_ops],
}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        sys.exit("usage: shims.py install NAME")
    for fix in FIXES.get(sys.argv[2], []):
        fix()
