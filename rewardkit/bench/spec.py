"""Benchmark specs: versioned YAML files shipped in ``rewardkit/bench/specs/``.

A spec names the dataset (hub id / config / split, or ``data_files`` inside the repository), the files to
look for in a local copy, the column mapping, the label encoding and the metrics. Bump ``version`` whenever
a change would alter a reported number; result records carry it.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import safe_load_yaml
from ..errors import ConfigError

__all__ = ["BenchmarkSpec", "get_spec", "list_benchmarks", "SPEC_DIR", "LABEL_KINDS", "KNOWN_METRICS"]

SPEC_DIR = Path(__file__).with_name("specs")
LABEL_KINDS = ("chosen_ab", "vote_type", "ranking")
KNOWN_METRICS = ("mmrb2_official", "accuracy_without_ties", "accuracy_with_ties", "genaibench_4way",
                 "group_accuracy")
SUBSETS = ("single_source",)

# Friendlier / paper names -> canonical spec names.
ALIASES = {
    "mmrb2": "mmrb2/t2i",
    "genaibench/image_generation": "genaibench/t2i",
    "genaibench/image_edition": "genaibench/edit",
    "genai-bench/t2i": "genaibench/t2i",
    "genai-bench/edit": "genaibench/edit",
    "editreward": "editreward/2pair",
    "editreward/k2": "editreward/2pair",
    "editreward/k3": "editreward/3pair",
    "editreward/k4": "editreward/4pair",
    "editreward_bench": "editreward/2pair",
}


@dataclass(frozen=True)
class BenchmarkSpec:
    """One benchmark subset. ``fields`` maps canonical names (id, prompt, sources, image_a, image_b, label,
    letters, model_a, model_b, extra) to dataset columns."""

    name: str
    version: str
    title: str
    dataset: str
    split: str
    task: str
    fields: dict[str, Any]
    label: str
    metrics: tuple[str, ...]
    primary: tuple[str, ...]
    config: str | None = None
    data_files: str | None = None
    local_files: tuple[str, ...] = ("*.parquet",)
    filter: dict[str, Any] = field(default_factory=dict)
    strip_image_tags: bool = False
    group_id: dict[str, Any] | None = None
    categories: tuple[str, ...] = ()
    subsets: tuple[str, ...] = ()
    licence: str = ""
    gated: bool = False
    notes: str = ""
    path: str = ""

    @property
    def family(self) -> str:
        return self.name.split("/")[0]

    def identity(self) -> dict[str, Any]:
        """What a result record stores about the spec."""
        return {"name": self.name, "version": self.version, "dataset": self.dataset, "config": self.config,
                "split": self.split, "data_files": self.data_files, "label": self.label, "task": self.task}

    @classmethod
    def from_file(cls, path: Path) -> "BenchmarkSpec":
        data = safe_load_yaml(path.read_text(encoding="utf-8"), source=path)  # a tag / alias bomb: ConfigError
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a benchmark spec must be a mapping")
        known = set(cls.__dataclass_fields__) - {"path"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown spec key(s) {unknown}")
        for key in ("name", "version", "dataset", "split", "task", "fields", "label", "metrics", "primary"):
            if data.get(key) in (None, "", []):
                raise ConfigError(f"{path}: spec needs {key!r}")
        for key in ("metrics", "primary", "local_files", "categories", "subsets"):
            if key in data:
                data[key] = tuple(data[key] or ())
        data["version"] = str(data["version"])
        spec = cls(**data, path=str(path))
        spec.validate()
        return spec

    def validate(self) -> None:
        where = self.path or self.name
        if self.label not in LABEL_KINDS:
            raise ConfigError(f"{where}: label must be one of {LABEL_KINDS}, got {self.label!r}")
        bad = [m for m in (*self.metrics, *self.primary) if m not in KNOWN_METRICS]
        if bad:
            raise ConfigError(f"{where}: unknown metric(s) {bad}; known: {KNOWN_METRICS}")
        if any(p not in self.metrics for p in self.primary):
            raise ConfigError(f"{where}: primary metrics must be listed in metrics")
        for key in ("image_a", "image_b", "label", "prompt"):
            if not self.fields.get(key):
                raise ConfigError(f"{where}: fields.{key} is required")
        if self.label == "ranking" and not self.fields.get("letters"):
            raise ConfigError(f"{where}: ranking labels need fields.letters (the comparison_type column)")
        if "genaibench_4way" in self.metrics and self.label != "vote_type":
            raise ConfigError(f"{where}: genaibench_4way needs vote_type labels")
        if "group_accuracy" in self.metrics and not self.group_id:
            raise ConfigError(f"{where}: group_accuracy needs group_id")
        bad_sub = [s for s in self.subsets if s not in SUBSETS]
        if bad_sub:
            raise ConfigError(f"{where}: unknown subset(s) {bad_sub}; known: {SUBSETS}")


@functools.lru_cache(maxsize=None)
def _all_specs() -> dict[str, BenchmarkSpec]:
    out: dict[str, BenchmarkSpec] = {}
    for path in sorted(SPEC_DIR.glob("*.yaml")):
        spec = BenchmarkSpec.from_file(path)
        if spec.name in out:
            raise ConfigError(f"two specs are named {spec.name!r}: {out[spec.name].path} and {path}")
        out[spec.name] = spec
    return out


def list_benchmarks() -> list[str]:
    """Names of every shipped benchmark spec, sorted."""
    return sorted(_all_specs())


def get_spec(name: str | Path | BenchmarkSpec) -> BenchmarkSpec:
    """A spec by name (``"mmrb2/edit"``), alias (``"genaibench/image_edition"``) or path to a YAML file."""
    if isinstance(name, BenchmarkSpec):
        return name
    s = str(name).strip()
    if s.endswith((".yaml", ".yml")):
        p = Path(s)
        if not p.is_file():
            raise ConfigError(f"benchmark spec file not found: {p}")
        return BenchmarkSpec.from_file(p)
    specs = _all_specs()
    key = s.lower().replace("_", "-") if s.lower() not in specs else s.lower()
    for cand in (s, s.lower(), key, key.replace("-", "_")):
        if cand in specs:
            return specs[cand]
        if cand in ALIASES:
            return specs[ALIASES[cand]]
    close = difflib.get_close_matches(s.lower(), list(specs) + list(ALIASES), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"unknown benchmark {s!r}.{hint} Known: {', '.join(specs)}")
