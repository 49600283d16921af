"""PARROT stages 1-3 over any preference-pair dataset :func:`rewardkit.train.data.load_pairs` reads.

Files in ``output_dir`` (JSON Lines, readable with ``datasets.load_dataset("json", data_files=...)``; one
record per source row (per row and image for the projection), each with its provenance: ``teacher``,
``template`` (``parrot/<name>@<version>``), ``seed``, ``data`` and ``data_content`` (the dataset: where it lies
and what it is, :func:`~rewardkit.parrot.pipeline_provenance.dataset_identity`) and ``row`` (its index there)):

- ``rationales.jsonl``: stage 1, the anchored pairwise rationale of each pair (``status`` ok / unparseable /
  judge_failure / skipped, ``reason`` when not ok, ``dimension`` when one section was at fault);
- ``filtered.jsonl``: stage 2, the prediction from the rationale alone, without the label (``evidence``:
  exactly what the teacher was shown, :func:`~rewardkit.parrot.format.consistency_view` of the rationale in
  the configured ``consistency_view``: ``full``, the paper's, or ``evidence_only``; never the ``Preferred:``
  line) and ``kept`` (iff the prediction equals the label); ``reason`` is ``kept``, ``wrong_prediction``,
  ``unparseable_prediction``, ``unparseable_rationale``, ``judge_failure`` or ``skipped``;
- ``filter_report.json``: keep rate and rejection reasons (per dimension where it applies);
- ``projected.jsonl``: stage 3, each image of a kept pair critiqued alone (1-4 / N/A per dimension) with the
  verified rationale as a hint.

Resume: a stage skips the rows (keys) its file already holds and appends the rest, one flushed and fsynced
batch at a time; a partial last line left by a crash is cut off on reopening (a last record that parses is
kept); so a crashed run continues without duplicates or gaps. Records of judge failures are retried on the
next run (``retry_failed``). Only records of the same run are resumed from: a stage rerun in the same
``output_dir`` with another teacher, template, seed or dataset (by content: an edited file at the same path is
another dataset, the same file spelled another way is not) than its file's records is refused
(``ConfigError``, exit 2), never mixed with the old rationales; a stage never reads another dataset's records.

The teacher is any judge backend (``transformers:<ckpt>``, ``vllm:<ckpt>``, ``openai:<url>``), ``tiny:qwen2_5_vl``
/ ``tiny:qwen3_vl`` (a tiny random model: its answers are garbage and are dropped with reasons) or
``scripted`` (:class:`rewardkit.parrot.testing.ScriptedTeacher`, rule-based, for smoke runs). A batch whose
judge call fails is retried row by row, so one bad row does not take its neighbours with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from .format import CONSISTENCY_VIEWS
from .pipeline_config import DataCfg, ParrotConfig, SFTCfg, TeacherCfg
from .pipeline_provenance import ProvenanceChecks, dataset_identity
from .pipeline_report import REASONS, filter_report
from .pipeline_stages import filter_records, project_records, rationale_records
from .pipeline_store import JsonlStore

__all__ = ["ParrotConfig", "DataCfg", "TeacherCfg", "SFTCfg", "JsonlStore", "Pipeline", "load_teacher",
           "filter_report", "REASONS"]

#: exceptions a judge call may raise that count as a judge failure (a server down after its retries, a
#: timeout, CUDA OOM); anything else is a bug and propagates
JUDGE_ERRORS = (RuntimeError, OSError, TimeoutError)


# ---------------------------------------------------------------------------------------------- teacher
def load_teacher(cfg: TeacherCfg, workdir: str | Path) -> Any:
    """The teacher backend of ``cfg.judge`` (see the module docstring for the specs)."""
    from ..judges import BACKENDS, load_judge

    spec = cfg.judge
    if spec == "scripted":
        from .testing import ScriptedTeacher

        return ScriptedTeacher()
    if spec.startswith("tiny:"):
        from ..testing import save_tiny_checkpoint

        kind = spec.partition(":")[2]
        path = save_tiny_checkpoint(kind, Path(workdir) / f"tiny-teacher-{kind}")
        return load_judge(f"transformers:{path}", **{"device": "cpu", **cfg.judge_kwargs})
    if spec.partition(":")[0] not in BACKENDS:
        spec = f"transformers:{spec}"
    return load_judge(spec, **dict(cfg.judge_kwargs))


# ---------------------------------------------------------------------------------------------- pipeline
class Pipeline(ProvenanceChecks):
    """Stages 1-3 over one dataset with one teacher. ``teacher`` may be passed ready (tests, notebooks). The
    resume check (:meth:`check_stage`, :meth:`check_provenance`) is :class:`~.pipeline_provenance.ProvenanceChecks`'."""

    def __init__(self, cfg: ParrotConfig, *, teacher: Any = None, progress: bool = True,
                 load_data: bool = True) -> None:
        """``load_data=False``: no dataset of its own; rows come from the caller through
        :meth:`rationale_records` (the dataset path, :mod:`rewardkit.datasets.parrot`)."""
        from ..judges import check_temperature, load_template
        from ..train.data import load_pairs

        from ..errors import ConfigError

        check_temperature(cfg.teacher.temperature, "parrot teacher.temperature")
        if cfg.consistency_view not in CONSISTENCY_VIEWS:
            raise ConfigError(f"consistency_view must be one of {', '.join(CONSISTENCY_VIEWS)}, "
                              f"got {cfg.consistency_view!r}")
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        d = cfg.data
        self.ds, self.base_dir, self._data_id = None, None, None
        if load_data:  # (max_samples after the dataset's identity: a longer run resumes from a shorter one)
            self.ds, self.base_dir = load_pairs(d.train, split=d.split, layout=d.layout, seed=cfg.seed,
                                                synthetic_size=d.synthetic_size, revision=d.revision)
            self._data_id = dataset_identity(d, self.ds, cfg.seed)
            if d.max_samples is not None and len(self.ds) > d.max_samples:
                self.ds = self.ds.select(range(d.max_samples))
        self.template = load_template("parrot", cfg.template)
        self._teacher = teacher
        self._teacher_spec = cfg.teacher.judge if teacher is None else None  # (a teacher passed ready: its describe())
        self.progress = progress
        self.rationales = JsonlStore(self.out / "rationales.jsonl", lambda r: r["row"])
        self.filtered = JsonlStore(self.out / "filtered.jsonl", lambda r: r["row"])
        self.projected = JsonlStore(self.out / "projected.jsonl", lambda r: (r["row"], r["slot"]))
        self._provenance_checked: set[str] = set()

    @property
    def teacher(self) -> Any:
        if self._teacher is None:
            self._teacher = load_teacher(self.cfg.teacher, self.out)
        return self._teacher

    # ------------------------------------------------------------------ rows
    def _row(self, i: int) -> dict[str, Any]:
        from ..train.data import _to_image, normalize_label
        from ..train.losses import LABEL_A, LABEL_B

        r = self.ds[i]
        lab = normalize_label(r["label"])
        srcs = [_to_image(s, self.base_dir) for s in (r.get("sources") or [])]
        return {"row": i, "prompt": r["prompt"],
                "label": "A" if lab == LABEL_A else "B" if lab == LABEL_B else "tie",
                "image_a": _to_image(r["image_a"], self.base_dir), "image_b": _to_image(r["image_b"], self.base_dir),
                "sources": srcs}

    def _done(self, store: JsonlStore, k: Any) -> bool:
        rec = store.get(k)
        return rec is not None and not (self.cfg.retry_failed and rec.get("status") == "judge_failure")

    def _generate(self, convs: list, max_new_tokens: int) -> list[str | Exception]:
        """Batched generation; a failing batch is retried row by row (each row's own exception kept)."""
        t = self.cfg.teacher
        kw = dict(n=1, temperature=t.temperature, max_new_tokens=max_new_tokens, seed=self.cfg.seed)
        if not convs:
            return []
        try:
            return [o[0] for o in self.teacher.generate(convs, **kw)]
        except JUDGE_ERRORS:
            if len(convs) == 1:
                raise
        out: list[str | Exception] = []
        for c in convs:
            try:
                out.append(self.teacher.generate([c], **kw)[0][0])
            except JUDGE_ERRORS as exc:
                out.append(exc)
        return out

    def _generate_safe(self, convs: list, max_new_tokens: int) -> list[str | Exception]:
        try:
            return self._generate(convs, max_new_tokens)
        except JUDGE_ERRORS as exc:  # a single conversation failed
            return [exc]

    # ------------------------------------------------------------------ stage 1
    def rationalize(self, rows: Iterable[int] | None = None) -> int:
        """Anchored rationales for ``rows`` (default: all); returns how many records were written."""
        self.check_stage("rationalize")
        todo = [i for i in (range(len(self.ds)) if rows is None else rows) if not self._done(self.rationales, i)]
        n = 0
        for chunk in self._chunks(todo, "rationalize"):
            n += self._rationalize_chunk([self._row(i) for i in chunk])
        self.rationales.compact_if_needed()
        return n

    def _rationalize_chunk(self, rows: list[dict[str, Any]]) -> int:
        recs = self.rationale_records(rows)
        self.rationales.append(recs)
        return len(recs)

    def rationale_records(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Stage-1 records of ``rows`` (each ``{row, prompt, label: A|B|tie, image_a, image_b, sources}``, as
        :meth:`_row` builds them), in order, without storing them: the entry point for callers that bring
        their own rows (sharded Parquet sets, Ray actors)."""
        prov = self._prov("rationalize")
        return rationale_records(rows, prov=prov, template=self.template, generate=self._generate_safe,
                                 max_new_tokens=self.cfg.teacher.max_new_tokens)

    # ------------------------------------------------------------------ stage 2
    def filter(self, rows: Iterable[int] | None = None) -> int:
        """Consistency check for the rows that have a stage-1 record; returns how many records were written."""
        self.check_stage("filter")
        cand = range(len(self.ds)) if rows is None else rows
        todo = [i for i in cand if i in self.rationales and not self._done(self.filtered, i)]
        n = 0
        for chunk in self._chunks(todo, "filter"):
            n += self._filter_chunk(chunk)
        self.filtered.compact_if_needed()
        self.report()
        return n

    def _filter_chunk(self, rows: list[int]) -> int:
        prov = self._prov("filter")
        recs = filter_records(rows, rationales=self.rationales, prov=prov, template=self.template,
                              view=self.cfg.consistency_view, generate=self._generate_safe,
                              max_new_tokens=self.cfg.teacher.predict_max_new_tokens)
        self.filtered.append(recs)
        return len(recs)

    def report(self) -> dict[str, Any]:
        """The keep-rate report (also written to ``filter_report.json``)."""
        rep = filter_report(list(self.filtered.records.values()),
                            {k: v for k, v in self.rationales.records.items()})
        rep.update(template=self.template.id, data=self.cfg.data.train, rows=len(self.ds),
                   consistency_view=self.cfg.consistency_view)
        tmp = self.out / "filter_report.json.tmp"
        tmp.write_text(json.dumps(rep, indent=2), encoding="utf-8")
        os.replace(tmp, self.out / "filter_report.json")
        return rep

    # ------------------------------------------------------------------ stage 3
    def project(self, rows: Iterable[int] | None = None) -> int:
        """Pointwise critiques of both images of every kept pair; returns how many records were written."""
        self.check_stage("project")
        cand = range(len(self.ds)) if rows is None else rows
        todo = [i for i in cand if (f := self.filtered.get(i)) is not None and f["kept"]
                and not (self._done(self.projected, (i, "A")) and self._done(self.projected, (i, "B")))]
        n = 0
        for chunk in self._chunks(todo, "project"):
            n += self._project_chunk([self._row(i) for i in chunk])
        self.projected.compact_if_needed()
        return n

    def _project_chunk(self, rows: list[dict[str, Any]]) -> int:
        prov = self._prov("project")
        recs = project_records(rows, rationales=self.rationales, done=lambda k: self._done(self.projected, k),
                               prov=prov, template=self.template, generate=self._generate_safe,
                               max_new_tokens=self.cfg.teacher.max_new_tokens)
        self.projected.append(recs)
        return len(recs)

    # ------------------------------------------------------------------ all three, chunk by chunk
    def run_stages(self) -> dict[str, Any]:
        """Stages 1-3 chunk by chunk inside one judge session: a pair's images are encoded once for its
        rationale and its projection (and a transformers teacher reuses their prefix KV when the session
        keeps it)."""
        n = len(self.ds)
        for chunk in self._chunks(list(range(n)), "parrot"):
            with self.teacher.session():
                need1 = [i for i in chunk if not self._done(self.rationales, i)]
                if need1:
                    rows = [self._row(i) for i in need1]
                    self._rationalize_chunk(rows)
                need2 = [i for i in chunk if not self._done(self.filtered, i)]
                if need2:
                    self._filter_chunk(need2)
                need3 = [i for i in chunk if self.filtered.get(i)["kept"]
                         and not (self._done(self.projected, (i, "A")) and self._done(self.projected, (i, "B")))]
                if need3:
                    self._project_chunk([self._row(i) for i in need3])
        for store in (self.rationales, self.filtered, self.projected):
            store.compact_if_needed()
        return self.report()

    def _chunks(self, todo: list[int], desc: str):
        bs = max(1, int(self.cfg.batch_size))
        starts = range(0, len(todo), bs)
        if self.progress and len(starts) > 1:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=f"parrot {desc}", unit="batch")
        for s in starts:
            yield todo[s:s + bs]
