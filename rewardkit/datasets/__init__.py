"""Scoring and filtering datasets of millions of rows: Parquet, Hugging Face datasets, WebDataset shards.

=============================  ==========================================================================
:func:`score_dataset`          score every row into one Parquet score file per input shard (streaming,
                               resumable per shard, torchrun-sharded)
:func:`score_dataset_ray`      the same files from a Ray cluster (``--engine ray``, :mod:`.ray_engine`)
:class:`RewardSpec`            a reward as a recipe: either engine loads it only if a shard is left
:func:`filter_dataset`         keep the rows a score expression / top-k / top-p selects, written in the
                               input's own format
:func:`open_dataset`           resolve paths, globs, ``save_to_disk`` folders and hub ids into shards
:func:`parse_expression`       the safe expression language of ``rewardkit filter`` (no ``eval``)
=============================  ==========================================================================

For a Ray Data pipeline of your own, :mod:`rewardkit.integrations.ray`. See ``docs/datasets.md``. Nothing heavy
is imported until a function runs (pyarrow / datasets load inside them).
"""

from __future__ import annotations

from .._imports import lazy_getattr

_LAZY = {
    "score_dataset": "rewardkit.datasets.scoring",
    "score_batch": "rewardkit.datasets.scoring",
    "ScoreSummary": "rewardkit.datasets.scoring",
    "RewardSpec": "rewardkit.datasets.scoring",
    "score_dataset_ray": "rewardkit.datasets.ray_engine",
    "filter_dataset": "rewardkit.datasets.filtering",
    "FilterReport": "rewardkit.datasets.filtering",
    "open_dataset": "rewardkit.datasets.sources",
    "Dataset": "rewardkit.datasets.sources",
    "Shard": "rewardkit.datasets.sources",
    "Columns": "rewardkit.datasets.readers",
    "parse_expression": "rewardkit.datasets.expr",
    "read_scores": "rewardkit.datasets.output",
}
__all__ = sorted(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY, globals())
