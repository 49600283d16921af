"""Accuracy harness: MMRB2, GenAI-Bench and EditReward-Bench for any reward.

    >>> from rewardkit.bench import evaluate
    >>> result = evaluate("pickscore", "mmrb2/t2i,genaibench/t2i")
    >>> result["mmrb2/t2i"].metrics["mmrb2_official"].value
    >>> result.save("pickscore.json"); print(result.markdown())

Specs (versioned YAML) live in ``rewardkit/bench/specs/``; metrics are pure functions in
:mod:`rewardkit.bench.metrics`. Attributes load lazily: importing this package imports no heavy library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "BenchResult", "BenchmarkResult", "get_spec", "list_benchmarks", "BenchmarkSpec",
           "BenchDataError", "markdown_report", "plot_records", "load_records", "write_synthetic_benchmarks"]

_LAZY = {
    "evaluate": "harness", "BenchResult": "harness", "BenchmarkResult": "harness",
    "get_spec": "spec", "list_benchmarks": "spec", "BenchmarkSpec": "spec",
    "BenchDataError": "data",
    "markdown_report": "report", "plot_records": "report", "load_records": "report",
    "write_synthetic_benchmarks": "synthetic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
