"""Lazy imports of optional dependencies, failing with the exact ``pip install`` line."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

from .errors import MissingDependencyError

# import name -> the pip extra that provides it
EXTRA_OF: dict[str, str] = {
    "transformers": "hf",
    "accelerate": "hf",
    "safetensors": "hf",
    "tokenizers": "hf",
    "httpx": "judge",
    "vllm": "vllm",
    "peft": "train",
    "trl": "train",
    "datasets": "bench",
    "diffusers": "rl",
    "scipy": "bench",
    "matplotlib": "bench",
    "pyarrow": "bench",
    "xxhash": "bench",
    "pytesseract": "ocr",
    "starlette": "serve",
    "uvicorn": "serve",
    "ray": "ray",
}

# pip extra -> import names it must provide (used by `rewardkit ls` to say what is installed)
MODULES_OF_EXTRA: dict[str, tuple[str, ...]] = {
    "hf": ("transformers", "accelerate", "safetensors"),
    "judge": ("httpx",),
    "vllm": ("vllm",),
    "train": ("transformers", "peft", "trl", "datasets"),
    "rl": ("diffusers", "transformers", "peft", "accelerate"),
    "bench": ("datasets", "scipy", "matplotlib"),
    "ocr": ("pytesseract",),
    "serve": ("starlette", "uvicorn", "httpx"),
}


def is_available(module: str) -> bool:
    """True when ``module`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def extra_installed(extra: str) -> bool:
    return all(is_available(m) for m in MODULES_OF_EXTRA.get(extra, ()))


def require(module: str, extra: str | None = None, purpose: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        # Only translate "this package is missing"; a broken install must surface as itself.
        if getattr(exc, "name", None) not in (top, module) and is_available(top):
            raise
        raise MissingDependencyError(top, extra or EXTRA_OF.get(top, "all"), purpose) from exc


def lazy_getattr(module: str, table: dict[str, str], namespace: dict[str, Any]):
    """A module ``__getattr__`` (PEP 562) that imports ``name`` from ``table[name]`` on first use and caches it
    in ``namespace`` (the module's ``globals()``): public names without import-time cost."""

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
