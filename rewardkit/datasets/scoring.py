"""Score a whole dataset with a reward, shard by shard, streaming, resumable (``rewardkit score --dataset``).

:func:`score_dataset` reads each shard a batch at a time (:mod:`.readers`), scores the batch, appends the
rows to that shard's score file and renames the file into place when the shard is done (:mod:`.output`).
Memory follows ``batch_size``: no shard, and never the dataset, is held in memory. Under ``torchrun`` the
shards are dealt out over the ranks (shard ``i`` to rank ``i % world``), each rank on its own device.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import UsageError
from .output import ShardWriter, check_manifest, finished, reward_description
from .readers import Columns, count_rows, id_type, iter_batches, resolve
from .sources import Dataset, open_dataset


@dataclasses.dataclass
class ScoreSummary:
    """What a run did: rows scored now, invalid among them, shards scored now / already done, seconds."""

    output: str
    rows: int = 0
    invalid: int = 0
    shards_scored: int = 0
    shards_skipped: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def _invalid_record(reason: str, dims: Sequence[str]) -> dict[str, Any]:
    return {"score": None, "valid": False, "error": reason, "dimensions": {d: None for d in dims}}


def score_batch(reward: Any, batch: dict[str, list], on_error: str = "nan", batch_size: int | None = None,
                where: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
    """Score one reader batch: one record per row (``RewardOutput.records`` form), rows that failed before
    the model (null image, missing member) invalid with their reason. ``on_error="raise"`` stops at the first
    bad row with a :class:`UsageError` naming it (``where(i)``)."""
    from ..errors import RewardInputError

    n = len(batch["id"])
    dims = list(getattr(reward, "dimensions", ()) or ())
    records: list[dict[str, Any] | None] = [None] * n
    todo = []
    for i, err in enumerate(batch["error"]):
        if err is None:
            todo.append(i)
        elif on_error == "raise":
            raise UsageError(f"{where(i) if where else f'row {i}'}: {err}")
        else:
            records[i] = _invalid_record(err, dims)
    if todo:
        srcs = batch.get("sources")
        try:
            out = reward([batch["image"][i] for i in todo], [batch["prompt"][i] for i in todo],
                         sources=None if srcs is None else [srcs[i] for i in todo],
                         on_error=on_error, batch_size=batch_size or len(todo))
        except RewardInputError as exc:
            if exc.index is None or not 0 <= exc.index < len(todo):
                raise
            i = todo[exc.index]
            raise UsageError(f"{where(i) if where else f'row {i}'}: {exc.reason}") from None
        for i, rec in zip(todo, out.records()):
            records[i] = rec
    return records  # type: ignore[return-value]


def plan(dataset: Any, reward_or_desc: Any, columns: Columns, *, format: str | None = None, split: str | None = None,
         num_shards: int | None = None, needs_prompt: bool = True) -> tuple[Dataset, Columns, dict[str, Any]]:
    """Open the dataset, resolve the columns and describe the reward (shared by the local and Ray engines)."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, format=format, split=split,
                                                                   num_shards=num_shards)
    cols = resolve(ds, columns, needs_prompt)
    desc = reward_or_desc if isinstance(reward_or_desc, dict) else reward_description(reward_or_desc, cols.as_dict())
    return ds, cols, desc


def manifest_extra(ds: Dataset) -> dict[str, Any]:
    return {"format": ds.format, "inputs": ds.spec, "split": ds.split, "shards": [s.name for s in ds.shards],
            "shard_paths": [str(s) for s in ds.shards]}


def score_dataset(reward: Any, dataset: Any, output: str | Path, *, image_column: str | None = None,
                  prompt_column: str | None = None, source_columns: Sequence[str] = (), id_column: str | None = None,
                  format: str | None = None, split: str | None = None, num_shards: int | None = None,
                  batch_size: int = 64, on_error: str = "nan", overwrite: bool = False, progress: bool = True,
                  rank: int | None = None, world_size: int | None = None) -> ScoreSummary:
    """Score every row of ``dataset`` with ``reward`` into Parquet score shards under ``output``.

    Args:
        reward: a :class:`~rewardkit.Reward` (anything callable like one).
        dataset: Parquet files / folders, ``.tar`` shards or globs, a ``save_to_disk`` folder or a hub id (see
            :func:`~rewardkit.datasets.open_dataset`), or an opened :class:`~rewardkit.datasets.Dataset`.
        output: folder for ``<shard>.parquet`` score files and the resume manifest.
        image_column / prompt_column / source_columns / id_column: which columns hold what (WebDataset:
            extensions such as ``jpg`` / ``txt``, or ``json.<field>``). Defaults: ``image``, ``prompt`` (or
            ``caption`` / ``text``); WebDataset: the first image extension of each sample and ``txt``.
        batch_size: rows read and scored at a time (peak memory follows it).
        on_error: ``"nan"`` marks bad rows invalid with their reason; ``"raise"`` stops at the first.
        overwrite: rescore every shard even if the folder holds finished ones.
        rank / world_size: score only shards ``i`` with ``i % world_size == rank`` (default: from the
            ``torch.distributed`` process group, if any).

    Returns:
        a :class:`ScoreSummary` over this process's shards. Rerunning after an interruption skips finished
        shards; a different reward (configuration, columns) in the same ``output`` is refused.
    """
    from .._imports import require

    require("pyarrow", "data", "scoring datasets")
    if on_error not in ("nan", "raise"):
        raise ValueError(f"on_error must be 'nan' or 'raise', got {on_error!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ds, cols, desc = plan(dataset, reward, Columns(image_column, prompt_column, list(source_columns), id_column),
                          format=format, split=split, num_shards=num_shards,
                          needs_prompt=getattr(reward, "uses_prompt", True))
    if rank is None or world_size is None:
        from .. import distributed

        rank, world_size = distributed.rank(), distributed.world_size()
    out_dir = Path(output)
    check_manifest(out_dir, desc, manifest_extra(ds), overwrite=overwrite, write=rank == 0)
    _barrier(world_size)
    mine = [s for i, s in enumerate(ds.shards) if i % world_size == rank]
    todo = [s for s in mine if not finished(out_dir, s.name, desc)]
    summary = ScoreSummary(output=str(out_dir), shards_skipped=len(mine) - len(todo))
    from tqdm.auto import tqdm

    counts = [count_rows(ds, s) for s in todo]
    show = progress and rank == 0
    shard_bar = tqdm(total=len(todo), desc="shards", unit="shard", disable=not show, file=sys.stderr, position=0)
    row_bar = tqdm(total=None if None in counts else sum(counts), desc=f"rows ({desc['reward']})", unit="row",
                   disable=not show, file=sys.stderr, position=1, delay=0.5)
    dims = list(getattr(reward, "dimensions", ()) or ())
    t0 = time.perf_counter()
    idt = id_type(ds, cols)
    try:
        for shard in todo:
            writer = ShardWriter(out_dir, shard.name, str(shard), desc, idt, dims)
            try:
                for batch in iter_batches(ds, shard, cols, batch_size):
                    base = writer.rows
                    recs = score_batch(reward, batch, on_error, batch_size,
                                       where=lambda i: f"{shard} row {base + i} (id {batch['id'][i]!r})")
                    writer.write(batch["id"], recs)
                    row_bar.update(len(recs))
                writer.commit()
            except BaseException:
                writer.abort()  # the .tmp stays: a rerun redoes this shard from its first row
                raise
            summary.rows += writer.rows
            summary.invalid += writer.invalid
            summary.shards_scored += 1
            shard_bar.update(1)
    finally:
        row_bar.close()
        shard_bar.close()
        summary.seconds = time.perf_counter() - t0
    _barrier(world_size)
    return summary


def _barrier(world_size: int) -> None:
    if world_size > 1:
        from .. import distributed

        distributed.barrier()
