"""Rewards in your own Ray Data pipeline: :class:`RewardScorer`, a callable class for ``map_batches``.

:class:`RewardScorer` is the class to hand to ``map_batches`` (one reward per actor, loaded once;
``concurrency`` actors, ``num_gpus`` each)::

    import ray
    from rewardkit.integrations.ray import RewardScorer

    ds = ray.data.read_parquet("s3://bucket/images/")
    ds = ds.map_batches(RewardScorer, fn_constructor_kwargs={"reward": "pickscore", "image_column": "image",
                        "prompt_column": "prompt"}, batch_size=64,
                        compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)
    ds.write_parquet("s3://bucket/scores/")      # every input column plus score / valid / error / dim_*

``rewardkit score --dataset ... --engine ray`` is the dataset engine of :mod:`rewardkit.datasets.ray_engine`
(:func:`score_dataset_ray`, :func:`run_on_ray`, re-exported here, as is :class:`RewardSpec`). ``ray`` is never
imported by this module: Ray Data imports it when it runs the class (``pip install 'rewardkit-vision[ray]'``).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..datasets.ray_engine import run_on_ray, score_dataset_ray
from ..datasets.scoring import RewardSpec, _as_spec

__all__ = ["RewardSpec", "RewardScorer", "score_dataset_ray", "run_on_ray"]


class RewardScorer:
    """A Ray Data ``map_batches`` callable class: scores ``image_column`` against ``prompt_column`` and adds
    ``score`` / ``valid`` / ``error`` / ``dim_<name>`` columns to the batch (invalid rows: NaN and a reason).

    Args:
        reward: a registry name, a :class:`RewardSpec` or ``{"name": ..., "config": ..., "kwargs": {...}}``.
        image_column: images as encoded bytes, paths, ``{bytes, path}`` structs or arrays.
        prompt_column: prompts (None for prompt-free rewards).
        source_columns: columns of source / reference images (editing rewards).
        batch_size: chunk size inside the reward (default: the whole Ray batch in one call).
    """

    def __init__(self, reward: Any, image_column: str = "image", prompt_column: str | None = "prompt",
                 source_columns: Sequence[str] = (), batch_size: int | None = None, on_error: str = "nan",
                 base_dir: str = ""):
        self.reward = _as_spec(reward).build()
        self.image_column, self.prompt_column = image_column, prompt_column
        self.source_columns, self.batch_size, self.on_error = list(source_columns), batch_size, on_error
        self.base_dir = base_dir

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from ..datasets.output import dim_column
        from ..datasets.readers import resolve_image
        from ..datasets.scoring import score_batch

        cols = {k: list(v) for k, v in batch.items()}
        n = len(next(iter(cols.values()))) if cols else 0
        images, errors = [], []
        for v in cols[self.image_column]:
            img, err = resolve_image(_py(v), self.base_dir)
            images.append(img)
            errors.append(err)
        prompts = [_py(p) for p in cols[self.prompt_column]] if self.prompt_column else [None] * n
        srcs = None
        if self.source_columns:
            srcs = [[resolve_image(_py(cols[c][i]), self.base_dir)[0] for c in self.source_columns] for i in range(n)]
        recs = score_batch(self.reward, {"id": list(range(n)), "image": images, "prompt": prompts,
                                         "sources": srcs, "error": errors}, self.on_error, self.batch_size)
        out = dict(batch)
        out["score"] = np.array([np.nan if r["score"] is None else r["score"] for r in recs], dtype=np.float64)
        out["valid"] = np.array([r["valid"] for r in recs], dtype=bool)
        out["error"] = np.array([r["error"] or "" for r in recs], dtype=object)
        for d in getattr(self.reward, "dimensions", ()) or ():
            out[dim_column(d)] = np.array([np.nan if (r.get("dimensions") or {}).get(d) is None
                                           else r["dimensions"][d] for r in recs], dtype=np.float64)
        return out


def _py(v: Any) -> Any:
    """A numpy scalar / 0-d array from a Ray batch as the Python value it holds."""
    import numpy as np

    if isinstance(v, np.ndarray) and v.dtype == object and v.ndim == 0:
        return v.item()
    if isinstance(v, (np.bytes_, np.str_)):
        return v.item()
    return v
