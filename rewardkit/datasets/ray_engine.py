"""The Ray engine of ``rewardkit score --dataset ... --engine ray``: the local engine's work spread over a cluster.

:func:`score_dataset_ray` writes the same shards, score files, manifest and resume as the local engine
(:func:`rewardkit.datasets.score_dataset`), with the reading and scoring spread over the cluster. Each
unfinished shard is one read task that cuts it into the very batches the local engine scores (same rows, same
order, same size), the batches go to ``concurrency`` reward actors, and the driver receives only the scores
(ordered, ``preserve_order``) and writes each shard's file atomically. So ``--engine ray`` writes the same
bytes as the local engine, a finished shard is never rescored, and an interrupted one is redone.
:func:`run_on_ray` is the pipeline itself, shared with PARROT's stage 1 (:mod:`.parrot`). ``ray`` is imported
only when a function here runs (``pip install 'rewardkit-vision[ray]'``). For a Ray Data pipeline of your own,
:class:`rewardkit.integrations.ray.RewardScorer`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from .scoring import RewardSpec, _as_spec

__all__ = ["score_dataset_ray", "run_on_ray"]


class _Box:
    """An opaque holder: Ray keeps it as a Python object column instead of converting lists to Arrow types, so
    a batch reaches the actor exactly as the reader produced it (bytes stay bytes, None stays None)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __getstate__(self):
        return self.value

    def __setstate__(self, value):
        self.value = value


class _ChunkScorer:
    """Actor of ``--engine ray``: scores one local-engine batch (a whole row of the chunk stream) per call."""

    def __init__(self, spec: RewardSpec, on_error: str, batch_size: int):
        self.reward = spec.build()
        self.on_error, self.batch_size = on_error, batch_size

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        from .scoring import score_batch

        batch = row["batch"].value
        if "bad" in batch:  # the shard's read failed here: passed on to the driver
            return {"shard": row["shard"], "start": row["start"], "result": _Box(batch)}
        where = lambda i: f"{row['path']} row {row['start'] + i} (id {batch['id'][i]!r})"  # noqa: E731
        recs = score_batch(self.reward, batch, self.on_error, self.batch_size, where=where)
        dims = list(getattr(self.reward, "dimensions", ()) or ())  # the instance's, as the local engine uses
        return {"shard": row["shard"], "start": row["start"], "result": _Box((batch["id"], recs, dims))}


def _chunks(ds: Any, cols: Any, batch_size: int, starts: dict[int, int] | None = None):
    """flat_map function: one unfinished shard -> its batches, exactly as the local engine reads them (from the
    row an interrupted run's committed row groups end at, ``starts[index]``). A shard that cannot be read past
    some row ends with one ``{"bad": reason}`` row (the driver quarantines it or stops)."""
    from .readers import iter_batches
    from .scoring import ShardReadError, read_guarded

    def read(item: dict[str, Any]):
        shard = ds.shards[item["index"]]
        start = (starts or {}).get(item["index"], 0)
        try:
            for batch in read_guarded(iter_batches(ds, shard, cols, batch_size, start=start), shard):
                yield {"shard": shard.name, "path": str(shard), "start": start, "batch": _Box(batch)}
                start += len(batch["id"])
        except ShardReadError as exc:
            yield {"shard": shard.name, "path": str(shard), "start": start, "batch": _Box({"bad": str(exc)})}

    return read


def score_dataset_ray(reward: Any, dataset: Any, output: str | Path, *, address: str | None = None,
                      concurrency: int = 1, num_gpus: float | None = None, image_column: str | None = None,
                      prompt_column: str | None = None, source_columns: Sequence[str] = (),
                      id_column: str | None = None, format: str | None = None, split: str | None = None,
                      num_shards: int | None = None, batch_size: int = 64, on_error: str = "nan",
                      overwrite: bool = False, progress: bool = True, skip_bad_shards: bool = False) -> Any:
    """:func:`rewardkit.datasets.score_dataset` on a Ray cluster (same arguments, same output folder).

    Args:
        reward: a registry name, a :class:`RewardSpec` or a dict of its fields (actors build the reward).
        address: the cluster (``"auto"``, ``"ray://host:10001"``); default: the running one, else a local one.
        concurrency: reward actors. num_gpus: GPUs per actor (default 1 if the cluster has GPUs, else 0).
    """
    from .._imports import require
    from .output import (ShardWriter, check_manifest, finished, partial_rows, quarantine,
                                   record_quarantine, unquarantine)
    from .readers import Columns, id_type
    from .scoring import ScoreSummary, manifest_extra, plan

    require("ray", "ray", "scoring on a Ray cluster")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if on_error not in ("nan", "raise"):
        raise ValueError(f"on_error must be 'nan' or 'raise', got {on_error!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    spec = _as_spec(reward)
    described = spec.describe()
    from .output import reward_description

    bad: dict[str, str] | None = {} if skip_bad_shards else None
    ds, cols, _ = plan(dataset, {}, Columns(image_column, prompt_column, list(source_columns), id_column),
                       format=format, split=split, num_shards=num_shards, needs_prompt=described.uses_prompt,
                       bad=bad)
    desc = reward_description(described, cols.as_dict())
    out_dir = Path(output)
    check_manifest(out_dir, desc, manifest_extra(ds), overwrite=overwrite)
    todo = [i for i, s in enumerate(ds.shards) if not finished(out_dir, s.name, desc)]
    summary = ScoreSummary(output=str(out_dir), shards_skipped=len(ds.shards) - len(todo))
    for i in [i for i in todo if bad and ds.shards[i].name in bad]:
        s = ds.shards[i]
        quarantine(out_dir, s.name, str(s), bad[s.name])
        summary.quarantined.append({"shard": s.name, "path": str(s), "reason": bad[s.name]})
    todo = [i for i in todo if not (bad and ds.shards[i].name in bad)]
    if not todo:
        record_quarantine(out_dir)
        return summary
    starts = {i: partial_rows(out_dir, ds.shards[i].name, desc) for i in todo}
    pipe = run_on_ray(todo, _chunks(ds, cols, batch_size, starts), _ChunkScorer,
                      {"spec": spec, "on_error": on_error, "batch_size": batch_size}, address=address,
                      concurrency=concurrency, num_gpus=num_gpus, progress=progress)
    dims = list(described.dimensions)
    idt = id_type(ds, cols)
    t0 = time.perf_counter()
    queue = [ds.shards[i] for i in todo]
    writer = None
    try:
        for res in pipe:
            res = {"shard": str(res["shard"]), "start": int(res["start"]), "result": res["result"]}
            while writer is None or writer.shard_name != res["shard"]:
                if writer is not None:  # the previous shard is complete (rows come in order)
                    _commit(writer, summary, out_dir, unquarantine)
                shard = queue.pop(0)
                if isinstance(res["result"].value, tuple):
                    dims = list(res["result"].value[2])
                writer = ShardWriter(out_dir, shard.name, str(shard), desc, idt, dims)
            if isinstance(res["result"].value, dict):  # the shard's read failed past its last good batch
                reason = res["result"].value["bad"]
                writer.abort()
                if bad is None:
                    from ..errors import UsageError

                    raise UsageError(reason)
                quarantine(out_dir, writer.shard_name, str(shard), reason)
                summary.quarantined.append({"shard": writer.shard_name, "path": str(shard), "reason": reason})
                summary.rows += writer.rows - writer.resumed
                summary.invalid += writer.invalid
                writer = _Skipped(writer.shard_name)
                continue
            if res["start"] != writer.rows:
                raise RuntimeError(f"shard {res['shard']}: batch at row {res['start']} arrived after "
                                   f"{writer.rows} rows (out of order)")
            ids, recs, _ = res["result"].value
            writer.write(list(ids), list(recs))
        if writer is not None:
            _commit(writer, summary, out_dir, unquarantine)
        for shard in queue:  # shards with no rows at all
            _commit(ShardWriter(out_dir, shard.name, str(shard), desc, idt, dims), summary, out_dir, unquarantine)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        summary.seconds = time.perf_counter() - t0
    record_quarantine(out_dir)
    return summary


def run_on_ray(shard_indices: Sequence[int], read: Any, actor_cls: type, ctor_kwargs: dict[str, Any], *,
               address: str | None = None, concurrency: int = 1, num_gpus: float | None = None,
               progress: bool = False):
    """The Ray Data pipeline behind ``--engine ray``: ``from_items(shards) -> flat_map(read) -> map(actor_cls)``,
    order preserved; yields the actors' result rows on the driver. ``read(item)`` turns ``{"index": i}`` into
    that shard's batch rows; ``actor_cls(**ctor_kwargs)`` is built once per actor (``concurrency`` actors,
    ``num_gpus`` each: default 1 when the cluster has GPUs)."""
    from .._imports import require

    ray = require("ray", "ray", "running on a Ray cluster")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if num_gpus is None:
        num_gpus = 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # results come back in shard / row order
    ctx.enable_progress_bars = progress
    pipe = ray.data.from_items([{"index": i} for i in shard_indices], override_num_blocks=max(len(shard_indices), 1))
    pipe = pipe.flat_map(read)
    pipe = pipe.map(actor_cls, fn_constructor_kwargs=ctor_kwargs, compute=ray.data.ActorPoolStrategy(size=concurrency),
                    num_gpus=num_gpus)
    yield from pipe.iter_rows()


class _Skipped:
    """Stands for a quarantined shard's writer until the next shard's rows arrive."""

    def __init__(self, shard_name: str):
        self.shard_name, self.rows = shard_name, -1

    def abort(self) -> None:
        pass


def _commit(writer: Any, summary: Any, out_dir: Any = None, unquarantine: Any = None) -> None:
    if isinstance(writer, _Skipped):
        return
    writer.commit()
    if unquarantine is not None:
        unquarantine(out_dir, writer.shard_name)
    summary.rows += writer.rows - writer.resumed
    summary.invalid += writer.invalid
    summary.shards_scored += 1
