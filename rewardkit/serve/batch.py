"""The reward server's dynamic batching: one queue and one worker thread per model replica (see
:mod:`rewardkit.serve.server`).

Each model replica has a queue and one worker. The worker takes the oldest request, then every compatible
request already waiting (up to ``max_batch`` images and ``max_batch_pixels`` decoded pixels; a request of
another kind, e.g. with metadata when the first has none, keeps its place in line for the next batch), waits at
most ``max_wait_ms`` for more while the batch is not full, and scores all of them in one reward call; outputs
are split back per request. Rewards whose scores depend on the other samples of a call (``batch_relative``,
e.g. z-scored composites) are never merged across requests.

**Closing a batch before its wait is over** (:class:`Connections`). When the server runs on its own protocol
(:func:`rewardkit.serve.server.uvicorn_config`), it knows its open connections, and which of them have been answered a
scoring request before ("known"). A batch stops waiting once every request in it came on a known connection and
no known connection is left without a request in the server (from the moment a request's result is set, its
connection counts as without one: the next batch, formed at once, waits for it). Every client the server knows of
is then in, and what would still come is a new connection, which the wait would not have been sure to catch
either. One client calling in a loop, or a fixed set of trainer workers, then never waits ``max_wait_ms``; a
request on a new connection (the first call of a client, or a pooled client opening one for a concurrent call)
still holds its batch open for late requests, and so does any known client that has not sent its next request yet.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..reward import PairwiseOutput, Reward, RewardOutput
from .config import ServerConfig

log = logging.getLogger("rewardkit.server")  # the server's logger: its redacting filter covers these records


#: where the server's protocol puts a request's :class:`Connection`: a key of the ASGI scope's ``state``
CONNECTION_KEY = "rewardkit.connection"


class Connection:
    """One open client connection, as batching sees it (made by :meth:`Connections.opened`)."""

    __slots__ = ("_idle", "open", "known", "busy")

    def __init__(self, idle: set):
        self._idle, self.open, self.known, self.busy = idle, True, False, False

    def submitted(self) -> bool:
        """A scoring request of this connection is queued; returns whether the connection was known before it."""
        was_known, self.busy = self.known, True
        self._idle.discard(self)
        return was_known

    def answered(self) -> None:
        """Its scoring request has its answer (or failed): the client may send the next one."""
        self.busy, self.known = False, True
        if self.open:
            self._idle.add(self)

    def lost(self) -> None:
        self.open = False
        self._idle.discard(self)


class Connections:
    """The server's open connections: ``idle`` holds the known ones (answered a scoring request before) that have
    no request in the server now. Fed by the connection protocol (opened / lost) and the request handlers
    (submitted / answered); read by the replicas' workers (see the module doc)."""

    def __init__(self) -> None:
        self.idle: set[Connection] = set()

    def opened(self) -> Connection:
        return Connection(self.idle)


@dataclass
class _Job:
    kind: str                      # "score" | "compare"
    images: list[Any]              # score: B images; compare: images_a + images_b (2B)
    prompts: list[Any]             # B
    sources: list[list[Any]] | None
    metadata: list[dict] | None
    pixels: int = 0                # decoded pixels of images and sources (from their headers)
    tensor: tuple | None = None    # float images: (C, H, W, dtype); they merge only with the same
    known: bool = False            # came on a connection answered before (see Connections)
    connection: Connection | None = field(repr=False, default=None)  # where it came from, when tracked
    future: asyncio.Future = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def cost(self) -> int:  # images through the model
        return len(self.images)

    def key(self) -> tuple:
        return (self.kind, self.sources is not None, self.metadata is not None, self.tensor)

    def answered(self) -> None:
        """Its connection may send its next request. Marked when the result is set, not when the handler resumes,
        so that the next batch, formed at once, waits for it (a batch formed between the two would close without
        it, and two halves of a wave of clients would keep alternating); once only."""
        if self.connection is not None:
            self.connection.answered()
            self.connection = None


def _decode(x: Any, reward: Any = None) -> Any:
    """An encoded wire image -> the RGB PIL image ``reward`` scores, under its input policy (decoded here, in the
    replica's thread, so that a request that timed out stops being decoded); anything that fails stays as it
    was, for the reward to report."""
    if not isinstance(x, (bytes, bytearray)):
        return x
    from .. import media

    try:
        return reward.decode_image(x) if hasattr(reward, "decode_image") else media.load_image(x)
    except Exception:  # noqa: BLE001 - reported per sample by the reward call, with its reason
        return x


class _Replica:
    """One reward instance, one queue, one worker thread for model calls."""

    def __init__(self, reward: Reward, cfg: ServerConfig, index: int, connections: Connections | None = None):
        self.reward = reward
        self.connections = connections
        self.cfg = cfg
        self.index = index
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.queued_images = 0
        self.batches = 0
        self.merged_requests = 0
        self.closed_early = 0  # batches that stopped waiting because every known client was in
        self._held: collections.deque[_Job] = collections.deque()  # waiting jobs a batch passed over, in order
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rewardkit-replica{index}")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._worker())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    def submit(self, job: _Job) -> None:
        self.queued_images += job.cost
        self.queue.put_nowait(job)

    async def _next(self) -> _Job:
        if self._held:
            return self._held.popleft()
        return await self.queue.get()

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        mergeable = not getattr(self.reward, "batch_relative", False)
        while True:
            first = await self._next()
            jobs, cost, pixels = [first], first.cost, first.pixels
            deadline = loop.time() + self.cfg.max_wait_ms / 1000.0
            # every compatible job already waiting joins (jobs passed over before, then the queue); one of another
            # kind, or one that would overflow the batch (images or decoded pixels), keeps its place in line
            waiting = list(self._held) if mergeable else []
            skipped: list[_Job] = []
            # every request of the batch on a known connection: the batch may close once no known one is left idle
            all_known = first.known and self.connections is not None
            if mergeable:
                self._held.clear()
            while mergeable and cost < self.cfg.max_batch:
                if waiting:
                    job = waiting.pop(0)
                else:
                    try:
                        job = self.queue.get_nowait()
                    except asyncio.QueueEmpty:
                        if all_known and not self.connections.idle:  # type: ignore[union-attr]
                            self.closed_early += 1
                            break  # every client the server knows of is in: nobody known is still to come
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            break
                        try:
                            job = await asyncio.wait_for(self.queue.get(), remaining)
                        except asyncio.TimeoutError:
                            break
                if job.key() != first.key():
                    skipped.append(job)
                    continue
                if cost + job.cost > self.cfg.max_batch or pixels + job.pixels > self.cfg.max_batch_pixels:
                    skipped.append(job)  # the batch is as full as it gets: score it now
                    break
                jobs.append(job)
                all_known = all_known and job.known
                cost += job.cost
                pixels += job.pixels
            if mergeable:
                self._held.extend(skipped + waiting)  # in arrival order, ahead of the queue
            self.queued_images -= cost
            jobs = [j for j in jobs if not j.future.done()]  # timed out or disconnected while queued
            if not jobs:
                continue
            try:
                done = await loop.run_in_executor(self._executor, self._run, jobs)
            except Exception:
                # Per-sample problems come back as NaN; an exception is a call-level failure. When requests
                # were merged, score each alone so one request's failure does not fail its neighbours.
                log.exception("reward call failed")
                done = None
            if done is not None:
                self._deliver(done)
                continue
            for job in jobs:
                if job.future.done():
                    continue
                try:
                    self._deliver(await loop.run_in_executor(self._executor, self._run, [job]))
                except Exception as exc:
                    if not job.future.done():
                        job.answered()
                        job.future.set_exception(exc)

    def _deliver(self, done: list[tuple[_Job, dict]]) -> None:
        if not done:
            return
        self.batches += 1
        self.merged_requests += len(done)
        for j, r in done:
            if not j.future.done():
                j.answered()
                j.future.set_result(r)

    def _run(self, jobs: list[_Job]) -> list[tuple[_Job, dict]]:
        """Runs in the replica's thread: decodes the jobs' images (dropping a job as soon as its request is
        gone: timed out or disconnected), then one reward call for the rest, split back per job."""
        live = []
        for j in jobs:
            images, srcs = [], None
            for x in j.images:
                if j.future.done():
                    break
                images.append(_decode(x, self.reward))
            if j.sources is not None and not j.future.done():
                srcs = [[_decode(x, self.reward) for x in entry] for entry in j.sources]
            if j.future.done():
                continue  # its decoded pixels are dropped here, not scored
            j.images, j.sources = images, srcs
            live.append(j)
        if not live:
            return []
        jobs = live
        kind = jobs[0].kind
        prompts = [p for j in jobs for p in j.prompts]
        sources = None if jobs[0].sources is None else [s for j in jobs for s in j.sources]
        metadata = None if jobs[0].metadata is None else [m for j in jobs for m in j.metadata]
        tensor = jobs[0].tensor is not None

        def batch(images: list[Any]) -> Any:
            if not tensor:
                return images
            import torch

            return torch.stack(images)  # [B, 3, H, W]: the reward's tensor path, as in-process

        if kind == "score":
            out = self.reward(batch([x for j in jobs for x in j.images]), prompts, sources=sources,
                              metadata=metadata, on_error="nan")
            return list(zip(jobs, _split_score(out, [j.n for j in jobs])))
        a = [x for j in jobs for x in j.images[:j.n]]
        b = [x for j in jobs for x in j.images[j.n:]]
        pair = self.reward.compare(batch(a), batch(b), prompts, sources=sources, metadata=metadata, on_error="nan")
        return list(zip(jobs, _split_pair(pair, [j.n for j in jobs])))


def _split_score(out: RewardOutput, sizes: list[int]) -> list[dict]:
    full = out.to_dict()
    res, s = [], 0
    for n in sizes:
        part = {k: (full[k][s:s + n] if isinstance(full[k], list) else full[k])
                for k in ("scores", "valid", "errors", "rationales", "details")}
        part["dimensions"] = {d: v[s:s + n] for d, v in full["dimensions"].items()}
        part["info"] = full["info"]
        res.append(part)
        s += n
    return res


def _split_pair(out: PairwiseOutput, sizes: list[int]) -> list[dict]:
    full = out.to_dict()
    res, s = [], 0
    for n in sizes:
        part = {k: (v[s:s + n] if isinstance(v, list) else v) for k, v in full.items()}
        res.append(part)
        s += n
    return res
