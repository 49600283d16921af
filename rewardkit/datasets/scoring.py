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
from .output import (ShardWriter, check_manifest, finished, quarantine, record_quarantine, reward_description,
                     unquarantine)
from .readers import Columns, count_rows, id_type, iter_batches, resolve
from .sources import Dataset, open_dataset

#: what reading a broken shard raises (pyarrow's errors are OSError / ValueError subclasses)
READ_ERRORS = (UsageError, OSError, ValueError, EOFError)


class ShardReadError(Exception):
    """A shard that cannot be read past some row (corrupt file); ``--skip-bad-shards`` quarantines it."""


def read_guarded(batches: Any, shard: Any) -> Any:
    """``batches`` with any read failure turned into a :class:`ShardReadError` naming the shard (so that a
    failure of the reward, which runs between two reads, is never taken for a bad shard)."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except READ_ERRORS as exc:
            msg = str(exc) if isinstance(exc, UsageError) else f"{shard}: {type(exc).__name__}: {exc}"
            raise ShardReadError(msg) from exc
        yield batch


@dataclasses.dataclass
class ScoreSummary:
    """What a run did: rows scored now, invalid among them, shards scored now / already done, seconds."""

    output: str
    rows: int = 0
    invalid: int = 0
    shards_scored: int = 0
    shards_skipped: int = 0
    seconds: float = 0.0
    quarantined: list = dataclasses.field(default_factory=list)  # [{shard, path, reason}] (--skip-bad-shards)

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
         num_shards: int | None = None, needs_prompt: bool = True, bad: dict[str, str] | None = None
         ) -> tuple[Dataset, Columns, dict[str, Any]]:
    """Open the dataset, resolve the columns and describe the reward (shared by the local and Ray engines).
    ``bad``: collect unreadable shards there instead of stopping (``--skip-bad-shards``)."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, format=format, split=split,
                                                                   num_shards=num_shards)
    cols = resolve(ds, columns, needs_prompt, bad)
    desc = reward_or_desc if isinstance(reward_or_desc, dict) else reward_description(reward_or_desc, cols.as_dict())
    return ds, cols, desc


def manifest_extra(ds: Dataset) -> dict[str, Any]:
    return {"format": ds.format, "inputs": ds.spec, "split": ds.split, "shards": [s.name for s in ds.shards],
            "shard_paths": [str(s) for s in ds.shards]}


@dataclasses.dataclass
class RewardSpec:
    """A reward as a picklable recipe, not a model: ``load_reward(name, config, **kwargs)``, built where it scores
    (in each Ray actor; by the local engine only once a shard is left to score)."""

    name: str
    config: Any = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self) -> Any:
        from ..registry import load_reward

        return load_reward(self.name, self.config, **self.kwargs)

    def describe(self) -> Any:
        """An object with the reward's ``name`` and ``config`` (no model loaded): what the manifest records."""
        from ..config import build_config
        from ..registry import get_reward_class
        from ..reward import _device_arg

        cls = get_reward_class(self.name)
        kw = dict(self.kwargs)
        if "device" in kw:
            kw["device"] = _device_arg(kw["device"])
        return _Described(cls.name, build_config(cls.Config, self.config, kw), tuple(cls.dimensions or ()),
                          cls.uses_prompt)


@dataclasses.dataclass
class _Described:
    name: str
    config: Any
    dimensions: tuple[str, ...]
    uses_prompt: bool


def _as_spec(reward: Any) -> RewardSpec:
    if isinstance(reward, RewardSpec):
        return reward
    if isinstance(reward, str):
        return RewardSpec(reward)
    if isinstance(reward, dict):
        return RewardSpec(**reward)
    raise TypeError("reward must be a registry name, a RewardSpec or a dict of its fields, "
                    f"got {type(reward).__name__}")


def is_spec(reward: Any) -> bool:
    """A recipe (``describe()`` without a model, ``build()`` to load), e.g. :class:`RewardSpec`, rather than a
    loaded reward."""
    return callable(getattr(reward, "describe", None)) and callable(getattr(reward, "build", None))


def score_dataset(reward: Any, dataset: Any, output: str | Path, *, image_column: str | None = None,
                  prompt_column: str | None = None, source_columns: Sequence[str] = (), id_column: str | None = None,
                  format: str | None = None, split: str | None = None, num_shards: int | None = None,
                  batch_size: int = 64, on_error: str = "nan", overwrite: bool = False, progress: bool = True,
                  rank: int | None = None, world_size: int | None = None,
                  skip_bad_shards: bool = False) -> ScoreSummary:
    """Score every row of ``dataset`` with ``reward`` into Parquet score shards under ``output``.

    Args:
        reward: a :class:`~rewardkit.Reward` (anything callable like one), or a recipe with ``describe()`` and
            ``build()`` (:class:`RewardSpec`): then the resume manifest is checked first and the reward is
            loaded only if a shard is left to score.
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
        skip_bad_shards: a shard that cannot be read (not a Parquet / tar file, a missing column, corrupt past
            some row) is quarantined (``summary.quarantined``, the manifest's ``quarantined``) instead of
            stopping the run; a rerun tries it again.

    Returns:
        a :class:`ScoreSummary` over this process's shards. Rerunning after an interruption skips finished
        shards and resumes an interrupted one after its last committed row group (:data:`.output.ROW_GROUP`
        rows); a different reward (configuration, columns, weights' content) in the same ``output`` is refused.
    """
    from .._imports import require

    require("pyarrow", "data", "scoring datasets")
    if on_error not in ("nan", "raise"):
        raise ValueError(f"on_error must be 'nan' or 'raise', got {on_error!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    spec = reward if is_spec(reward) else None
    described = spec.describe() if spec is not None else reward
    bad: dict[str, str] | None = {} if skip_bad_shards else None
    ds, cols, desc = plan(dataset, described, Columns(image_column, prompt_column, list(source_columns), id_column),
                          format=format, split=split, num_shards=num_shards,
                          needs_prompt=getattr(described, "uses_prompt", True), bad=bad)
    if rank is None or world_size is None:
        from .. import distributed

        rank, world_size = distributed.rank(), distributed.world_size()
    out_dir = Path(output)
    check_manifest(out_dir, desc, manifest_extra(ds), overwrite=overwrite, write=rank == 0)
    _barrier(world_size)
    mine = [s for i, s in enumerate(ds.shards) if i % world_size == rank]
    todo = [s for s in mine if not finished(out_dir, s.name, desc)]
    summary = ScoreSummary(output=str(out_dir), shards_skipped=len(mine) - len(todo))
    for s in [s for s in todo if bad and s.name in bad]:
        quarantine(out_dir, s.name, str(s), bad[s.name])
        summary.quarantined.append({"shard": s.name, "path": str(s), "reason": bad[s.name]})
    todo = [s for s in todo if not (bad and s.name in bad)]
    if todo and spec is not None:  # only now: a finished rerun never loads a model
        reward = spec.build()
    from tqdm.auto import tqdm

    counts = [_count(ds, s) for s in todo]
    show = progress and rank == 0
    shard_bar = tqdm(total=len(todo), desc="shards", unit="shard", disable=not show, file=sys.stderr, position=0)
    row_bar = tqdm(total=None if None in counts else sum(counts), desc=f"rows ({desc['reward']})", unit="row",
                   disable=not show, file=sys.stderr, position=1, delay=0.5)
    dims = list(getattr(reward, "dimensions", ()) or ())
    t0 = time.perf_counter()
    idt = id_type(ds, cols) if todo else None
    try:
        for shard in todo:
            writer = ShardWriter(out_dir, shard.name, str(shard), desc, idt, dims)
            row_bar.update(writer.resumed)
            try:
                for batch in read_guarded(iter_batches(ds, shard, cols, batch_size, start=writer.resumed), shard):
                    base = writer.rows
                    recs = score_batch(reward, batch, on_error, batch_size,
                                       where=lambda i: f"{shard} row {base + i} (id {batch['id'][i]!r})")
                    writer.write(batch["id"], recs)
                    row_bar.update(len(recs))
                writer.commit()
            except ShardReadError as exc:
                writer.abort()
                if bad is None:
                    raise UsageError(str(exc)) from None
                quarantine(out_dir, shard.name, str(shard), str(exc))
                summary.quarantined.append({"shard": shard.name, "path": str(shard), "reason": str(exc)})
                summary.rows += writer.rows - writer.resumed
                summary.invalid += writer.invalid
                continue
            except BaseException:
                writer.abort()  # its committed row groups stay: a rerun resumes after the last of them
                raise
            unquarantine(out_dir, shard.name)
            summary.rows += writer.rows - writer.resumed
            summary.invalid += writer.invalid
            summary.shards_scored += 1
            shard_bar.update(1)
    finally:
        row_bar.close()
        shard_bar.close()
        summary.seconds = time.perf_counter() - t0
    _barrier(world_size)
    if rank == 0:
        record_quarantine(out_dir)
    return summary


def _count(ds: Dataset, shard: Any) -> int | None:
    try:
        return count_rows(ds, shard)
    except READ_ERRORS:
        return None  # a corrupt footer: the read says so, naming the shard


def _barrier(world_size: int) -> None:
    if world_size > 1:
        from .. import distributed

        distributed.barrier()
