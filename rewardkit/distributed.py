"""Data-parallel helpers over ``torch.distributed`` (launched by ``torchrun`` / ``accelerate launch``).

- :func:`gather_combine`: a batch- or group-normalised :class:`~rewardkit.compose.Composite` across ranks:
  each rank scores its slice with ``comp.axis_scores(...)``; the per-axis values are gathered and the formula
  (z-scores, veto, gates) runs once over the whole batch, so every rank gets the same rewards as one call over
  all the images.
- :func:`shard_indices` / :func:`gather_in_order`: sharded scoring for ``rewardkit score`` / ``bench``
  (inputs split by rank, outputs merged back in input order).

Nothing here initialises a process group: the launcher does (``torchrun`` sets ``RANK`` / ``WORLD_SIZE``;
:func:`init_from_env` joins it with the gloo backend on CPU, NCCL on GPU). Without a process group every
function degrades to the single-process result.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["is_distributed", "rank", "world_size", "init_from_env", "gather_objects", "gather_axis_scores",
           "gather_combine", "shard_indices", "gather_in_order", "barrier", "launched_world_size"]


def _dist():
    import torch.distributed as dist

    return dist


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return _dist().get_rank() if is_distributed() else 0


def world_size() -> int:
    return _dist().get_world_size() if is_distributed() else 1


def launched_world_size() -> int:
    """``WORLD_SIZE`` set by torchrun / accelerate launch (1 when not launched that way)."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def init_from_env(backend: str | None = None) -> bool:
    """Join the process group a launcher described in the environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``). Returns True when running distributed. Idempotent."""
    dist = _dist()
    if launched_world_size() <= 1 or not dist.is_available():
        return False
    if not dist.is_initialized():
        import torch

        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend=backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return dist.get_world_size() > 1


def barrier() -> None:
    if is_distributed():
        _dist().barrier()


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` without a process group).

    Objects travel pickled between the processes of one job (which trust each other); never use this with
    peers outside the job.
    """
    if not is_distributed():
        return [obj]
    dist = _dist()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_axis_scores(axis_scores: Any, group: Any = None) -> tuple[Any, list[int]]:
    """All ranks' :class:`~rewardkit.compose.composite.AxisScores`, concatenated in rank order, and the
    number of samples each rank contributed."""
    from .compose.composite import AxisScores

    parts = [AxisScores.from_payload(p) for p in gather_objects(axis_scores.to_payload(), group)]
    return AxisScores.cat(parts), [len(p) for p in parts]


def gather_combine(composite: Any, axis_scores: Any, *, group_keys: Sequence[Any] | None = None, local: bool = False,
                   group: Any = None) -> Any:
    """Gather every rank's axis scores and apply the composite's formula over the whole batch.

    Args:
        composite: the :class:`~rewardkit.compose.Composite` (same config on every rank).
        axis_scores: this rank's ``composite.axis_scores(images, prompts, metadata=...)``.
        group_keys: this rank's group keys for ``normalize="group"`` (e.g. prompt ids); default the keys
            ``axis_scores`` recorded (the prompt, or ``metadata[group_by]``). Gathered like the scores.
        local: return only this rank's samples (in its input order) instead of the whole batch.

    Returns:
        a ``RewardOutput`` over all ranks' samples in rank order (identical on every rank), or this rank's
        slice of it with ``local=True``. Equal to one call of the composite over all the samples.
    """
    if group_keys is not None:
        if len(group_keys) != len(axis_scores):
            raise ValueError(f"got {len(group_keys)} group keys for {len(axis_scores)} samples")
        axis_scores = _with_keys(axis_scores, list(group_keys))
    full, sizes = gather_axis_scores(axis_scores, group)
    out = composite.combine(full)
    if not local:
        return out
    r = _dist().get_rank(group) if is_distributed() else 0
    start = sum(sizes[:r])
    return _slice(out, start, start + sizes[r])


def _with_keys(ax: Any, keys: list[Any]) -> Any:
    import dataclasses

    return dataclasses.replace(ax, group_keys=keys)


def _slice(out: Any, a: int, b: int) -> Any:
    from .reward import RewardOutput

    return RewardOutput(scores=out.scores[a:b], valid=out.valid[a:b], errors=out.errors[a:b],
                        dimensions={k: v[a:b] for k, v in out.dimensions.items()},
                        rationales=None if out.rationales is None else out.rationales[a:b], info=dict(out.info),
                        details=None if out.details is None else out.details[a:b])


# ---------------------------------------------------------------------- sharded scoring
def shard_indices(n: int, rank_: int | None = None, world: int | None = None) -> list[int]:
    """The input positions this rank scores: contiguous blocks, sizes differing by at most one, rank order
    = input order (so concatenating the ranks' outputs restores the input order)."""
    rank_ = rank() if rank_ is None else rank_
    world = world_size() if world is None else world
    base, extra = divmod(n, world)
    start = rank_ * base + min(rank_, extra)
    return list(range(start, start + base + (1 if rank_ < extra else 0)))


def gather_in_order(items: Sequence[Any], group: Any = None) -> list[Any]:
    """Concatenate every rank's ``items`` in rank order (each rank's items being its :func:`shard_indices`
    block in input order) on every rank."""
    out: list[Any] = []
    for part in gather_objects(list(items), group):
        out.extend(part)
    return out


def shard_by_chunks(n: int, chunk: int, rank_: int | None = None, world: int | None = None) -> list[int]:
    """Like :func:`shard_indices`, but each rank gets whole chunks of ``chunk`` consecutive items (a
    contiguous block of chunks), so every model call sees exactly the batch a single process would give it:
    sharded scores are bit-identical to an unsharded run on the same kind of device."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    n_chunks = -(-n // chunk)
    mine = shard_indices(n_chunks, rank_, world)
    if not mine:
        return []
    return list(range(mine[0] * chunk, min((mine[-1] + 1) * chunk, n)))


def local_device(requested: Any = None) -> Any:
    """The device a rank should use: ``cuda:LOCAL_RANK`` when CUDA is available and the user asked for
    "cuda" or nothing (ranks beyond the GPU count share GPUs round-robin); anything explicit (``cpu``,
    ``cuda:1``) is kept."""
    import torch

    if requested not in (None, "cuda") or not torch.cuda.is_available():
        return requested
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"


class ScoreShards:
    """Sharded ``rewardkit score``: which items this rank scores, where it writes them, and the merge.

    Each rank writes its rows as it scores them to ``OUTPUT.rank<r>-of-<w>.part`` (nothing is lost on
    interruption); at the end every rank's rows are gathered in input order, rank 0 writes ``OUTPUT``
    atomically and prints the table, and the part files are removed.
    """

    def __init__(self, n: int, chunk: int):
        self.rank, self.world = rank(), world_size()
        self.indices = shard_by_chunks(n, chunk)

    @classmethod
    def from_env(cls, n: int, chunk: int) -> "ScoreShards | None":
        """None unless launched by torchrun / accelerate launch with more than one process."""
        if launched_world_size() <= 1:
            return None
        init_from_env()
        return cls(n, chunk) if is_distributed() else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def select(self, items: Sequence[Any]) -> list[Any]:
        return [items[i] for i in self.indices]

    def part_path(self, output: Any) -> Any:
        from pathlib import Path

        if output is None:
            return None
        output = Path(output)
        return output.with_name(f"{output.name}.rank{self.rank}-of-{self.world}.part")

    def merge(self, rows: list[Any], output: Any = None) -> list[Any] | None:
        """All ranks' rows in input order on rank 0 (None on the others); rank 0 writes ``output``."""
        import json
        from pathlib import Path

        merged = gather_in_order(rows)
        if self.is_main and output is not None:
            output = Path(output)
            tmp = output.with_name(output.name + ".tmp")
            with tmp.open("w", encoding="utf-8") as fh:
                for row in merged:
                    fh.write(json.dumps(row) + "\n")
            os.replace(tmp, output)
        barrier()
        part = self.part_path(output)
        if part is not None and part.exists():
            part.unlink()
        return merged if self.is_main else None


def shard_keys(keys: Sequence[Any], chunk: int) -> list[Any]:
    """This rank's whole-chunk block of ``keys`` (all of them without a process group)."""
    if not is_distributed():
        return list(keys)
    return [keys[i] for i in shard_by_chunks(len(keys), chunk)]


def merge_rows(found: dict, rows: Sequence[tuple]) -> int:
    """Add every rank's freshly computed ``(key, *values)`` rows to ``found`` as ``{key: values}`` (a no-op
    without a process group, where ``found`` already holds them). Returns how many rows all ranks computed."""
    if not is_distributed():
        return len(rows)
    merged = gather_in_order(list(rows))
    for row in merged:
        found[row[0]] = tuple(row[1:])
    return len(merged)


def sum_over_ranks(x: int | float) -> int | float:
    """``x`` summed over every rank (``x`` itself without a process group)."""
    return sum(gather_objects(x)) if is_distributed() else x


def exit_together(code: int) -> int:
    """A command's exit code, the same on every rank. Without a process group: ``code``. Under torchrun every
    rank must pass the same ``code`` (the commands compute it from what all ranks gathered); but torchrun SIGTERMs
    the other workers as soon as it sees one exit non-zero, so a rank still writing (rank 0) or tearing down
    would report -15 instead. So: wait until rank 0 has written everything (a barrier), flush, and leave at once
    (``os._exit``, skipping the interpreter's teardown), so that every rank exits with ``code`` within torchrun's
    monitor interval."""
    if not is_distributed():
        return code
    import logging
    import sys

    barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
