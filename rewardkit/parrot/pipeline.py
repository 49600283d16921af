"""PARROT stages 1-3 over any preference-pair dataset :func:`rewardkit.train.data.load_pairs` reads.

Files in ``output_dir`` (JSON Lines, readable with ``datasets.load_dataset("json", data_files=...)``; one
record per source row (per row and image for the projection), each with its provenance: ``teacher``,
``template`` (``parrot/<name>@<version>``), ``seed``, ``data`` (the dataset) and ``row`` (its index there)):

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
``output_dir`` with another teacher, template, seed or dataset than its file's records is refused
(``ConfigError``, exit 2), never mixed with the old rationales; a stage never reads another dataset's records.

The teacher is any judge backend (``transformers:<ckpt>``, ``vllm:<ckpt>``, ``openai:<url>``), ``tiny:qwen2_5_vl``
/ ``tiny:qwen3_vl`` (a tiny random model: its answers are garbage and are dropped with reasons) or
``scripted`` (:class:`rewardkit.parrot.testing.ScriptedTeacher`, rule-based, for smoke runs). A batch whose
judge call fails is retried row by row, so one bad row does not take its neighbours with it.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .format import (CONSISTENCY_VIEWS, DIMENSIONS, ParseError, consistency_view, mean_score, parse_pairwise,
                     parse_pointwise, parse_prediction)

__all__ = ["ParrotConfig", "DataCfg", "TeacherCfg", "SFTCfg", "JsonlStore", "Pipeline", "load_teacher",
           "filter_report", "REASONS"]

#: the fields of a record's provenance that must match the current run's to resume from it
_PROVENANCE = ("teacher", "template", "seed", "data")
REASONS = ("kept", "wrong_prediction", "unparseable_prediction", "unparseable_rationale", "judge_failure", "skipped")
#: exceptions a judge call may raise that count as a judge failure (a server down after its retries, a
#: timeout, CUDA OOM); anything else is a bug and propagates
JUDGE_ERRORS = (RuntimeError, OSError, TimeoutError)


# ---------------------------------------------------------------------------------------------- config
@dataclass
class DataCfg:
    train: str = "synthetic:brightness"  # hub id, .parquet/.jsonl/.json/.csv, folder, synthetic:brightness
    split: str = "train"
    layout: str = "auto"
    max_samples: int | None = None
    synthetic_size: int = 64
    revision: str | None = None


@dataclass
class TeacherCfg:
    #: judge spec: transformers:<ckpt> | vllm:<ckpt> | openai:<url> | tiny:qwen2_5_vl | tiny:qwen3_vl | scripted
    judge: str = "vllm:Qwen/Qwen3-VL-32B-Instruct"
    judge_kwargs: dict[str, Any] = field(default_factory=dict)
    temperature: float = 0.0
    max_new_tokens: int = 1024  # rationale / projection
    predict_max_new_tokens: int = 8  # the consistency check's one-letter answer


@dataclass
class SFTCfg:
    #: student checkpoint: hub id, local dir or tiny:qwen2_5_vl / tiny:qwen3_vl
    student: str = "Qwen/Qwen3-VL-8B-Instruct"
    output: str = "student"  # under output_dir
    include_pairwise: bool = True
    include_pointwise: bool = True
    max_steps: int = -1
    num_train_epochs: float = 2.0
    learning_rate: float = 1e-5
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 8
    gradient_checkpointing: bool = False
    dtype: str = "bfloat16"  # student weights: float32 | bfloat16 | float16
    bf16: bool = False  # mixed precision (autocast) on top of float32 weights
    use_cpu: bool = False
    lora: bool = False
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | str | None = None
    logging_steps: int = 10
    save_steps: int = 500
    seed: int = 0
    report_to: str = "none"


@dataclass
class ParrotConfig:
    output_dir: str = "runs/parrot"
    data: DataCfg = field(default_factory=DataCfg)
    teacher: TeacherCfg = field(default_factory=TeacherCfg)
    sft: SFTCfg = field(default_factory=SFTCfg)
    template: str = "default"
    seed: int = 0
    batch_size: int = 16  # pairs per judge call
    retry_failed: bool = True  # rerun rows whose record says judge_failure
    #: what stage 2 is shown of a rationale (rewardkit.parrot.format.consistency_view): full (the paper's:
    #: arguments, scores, summary) | evidence_only (the per-dimension arguments alone); never the Preferred line
    consistency_view: str = "full"


# ---------------------------------------------------------------------------------------------- storage
class JsonlStore:
    """An append-only JSONL file keyed by ``key(record)``: the last record of a key wins.

    Opening repairs the end of the file so that appends start on a line boundary: a last line without its
    newline is kept (the newline added) when it is a whole record (a JSON object: a valid record written by
    another tool, or a crash between the record and its newline), and cut off only when it does not parse (a
    crash mid-write).
    """

    def __init__(self, path: str | Path, key: Callable[[dict[str, Any]], Any]) -> None:
        self.path = Path(path)
        self.key = key
        self.records: dict[Any, dict[str, Any]] = {}
        if self.path.is_file():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # a last line without its newline
                try:
                    whole = isinstance(json.loads(data[end:].decode("utf-8")), dict)
                except (ValueError, UnicodeDecodeError):
                    whole = False
                with open(self.path, "r+b") as f:
                    if whole:  # a complete record: keep it, end the line
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                        data += b"\n"
                    else:  # half a record from a crash mid-write: drop it
                        f.truncate(end)
                        data = data[:end]
                    f.flush()
                    os.fsync(f.fileno())
            for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{n}: not JSON ({exc}); fix or delete the file") from None
                self.records[self.key(rec)] = rec

    def __contains__(self, k: Any) -> bool:
        return k in self.records

    def get(self, k: Any) -> dict[str, Any] | None:
        return self.records.get(k)

    def __len__(self) -> int:
        return len(self.records)

    def append(self, recs: Sequence[dict[str, Any]]) -> None:
        if not recs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in recs)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        for r in recs:
            self.records[self.key(r)] = r

    def compact(self) -> None:
        """Rewrite the file with one line per key (after retried records superseded older ones); atomic."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for r in self.records.values():
                f.write(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def compact_if_needed(self) -> None:
        if self.path.is_file():
            with open(self.path, "rb") as f:
                n = sum(1 for line in f if line.strip())
            if n != len(self.records):
                self.compact()


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
def _now() -> float:
    return round(time.time(), 3)


class Pipeline:
    """Stages 1-3 over one dataset with one teacher. ``teacher`` may be passed ready (tests, notebooks)."""

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
        self.ds, self.base_dir = load_pairs(d.train, split=d.split, layout=d.layout, max_samples=d.max_samples,
                                            synthetic_size=d.synthetic_size, seed=cfg.seed,
                                            revision=d.revision) if load_data else (None, None)
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

    def _prov(self, stage: str) -> dict[str, Any]:
        prov = {"stage": stage, "teacher": json.dumps(self.teacher.describe(), sort_keys=True),
                "teacher_spec": self._teacher_spec, "teacher_weights": self._teacher_weights(),
                "template": self.template.id, "seed": self.cfg.seed, "data": self.cfg.data.train, "time": _now()}
        if stage == "filter":
            prov["consistency_view"] = self.cfg.consistency_view
        if stage not in self._provenance_checked:
            self.check_provenance(stage, prov)
            self._provenance_checked.add(stage)
        return prov

    def _teacher_weights(self) -> str | None:
        """The content of the local checkpoint the teacher spec names (:mod:`rewardkit.fingerprint`): new
        weights at the same path are another teacher. None when the spec names no local path."""
        if not isinstance(self._teacher_spec, str):
            return None
        if getattr(self, "_weights_memo", None) is None:  # once per run (the teacher is loaded once per run)
            from ..fingerprint import content_config, default_memo_dir

            c = content_config(self._teacher_spec, default_memo_dir())
            self._weights_memo = (c if c != self._teacher_spec else None,)
        return self._weights_memo[0]

    def check_stage(self, stage: str) -> None:
        """:meth:`check_provenance` at the start of ``stage`` ("rationalize", "filter", "project", or "sft": the
        dataset of every stage file), also when it has nothing left to write (a rerun of a finished run with
        another seed or teacher used to reuse every record silently: the check only ran with the first new
        record). Without loading a teacher: the configured teacher spec stands for it (records name theirs),
        or the teacher itself when it is already there."""
        if stage in self._provenance_checked:
            return
        prov: dict[str, Any] = {"template": self.template.id, "seed": self.cfg.seed, "data": self.cfg.data.train,
                                "teacher_spec": self._teacher_spec, "teacher_weights": self._teacher_weights()}
        if stage == "filter":
            prov["consistency_view"] = self.cfg.consistency_view
        if self._teacher is not None:
            prov["teacher"] = json.dumps(self._teacher.describe(), sort_keys=True)
        self.check_provenance(stage, prov)
        if stage != "sft" and "teacher" in prov:
            self._provenance_checked.add(stage)

    def check_provenance(self, stage: str, prov: dict[str, Any] | None = None) -> None:
        """Refuse to resume from records of another run: every record the stage's own file already holds (the
        rows it would skip) must have this run's teacher, template, seed and dataset, and the records of the
        stages it reads must be of this dataset; else :class:`~rewardkit.errors.ConfigError` (the CLI's exit 2)
        naming what differs. A rerun would otherwise silently keep the old rationales as its own and mix two
        runs in one file. Use another ``output_dir`` (or delete the stage files) to start a new run. (A later
        stage may use another teacher than an earlier one: each record names its own.)"""
        from ..errors import ConfigError

        prov = prov or self._prov_fields()
        own = {"rationalize": self.rationales, "filter": self.filtered, "project": self.projected}.get(stage)
        for store in (self.rationales, self.filtered, self.projected):
            fields = _PROVENANCE + ("teacher_spec", "teacher_weights") if store is own else ("data",)
            if store is own and own is self.filtered:  # stage 2's records depend on what it showed the teacher
                fields += ("consistency_view",)
            for rec in store.records.values():
                # (a field this check does not know, or a record without it, e.g. a teacher passed ready: skipped)
                diff = [f"{k}: {rec.get(k)!r} in the file, {prov[k]!r} now" for k in fields
                        if k in prov and rec.get(k) is not None and prov[k] is not None and rec.get(k) != prov[k]]
                if diff:
                    raise ConfigError(
                        f"{store.path} holds records of another run (row {rec.get('row')!r}: {'; '.join(diff)}). "
                        f"Resuming would reuse them as this run's; use another output_dir, or delete "
                        f"{store.path.parent}/{{rationales,filtered,projected}}.jsonl to start over")

    def _prov_fields(self) -> dict[str, Any]:
        return {"teacher": json.dumps(self.teacher.describe(), sort_keys=True), "template": self.template.id,
                "seed": self.cfg.seed, "data": self.cfg.data.train}

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
        from .prompts import rationalize_conv

        prov = self._prov("rationalize")
        recs: list[dict[str, Any] | None] = [None] * len(rows)
        ask = []
        for j, r in enumerate(rows):
            prompt = r["prompt"] if isinstance(r["prompt"], str) else None
            base = {"row": r["row"], "prompt": prompt, "label": r["label"],
                    "task": "edit" if r["sources"] else "t2i", "rationale": None, "raw": None, "reason": None,
                    "dimension": None, "rationale_preferred": None, **prov}
            if r["label"] == "tie":
                recs[j] = {**base, "status": "skipped", "reason": "tie label: nothing to rationalize"}
            elif prompt is None or not prompt.strip():  # never a rationale for the request "None"
                what = "edit instruction" if r["sources"] else "text-to-image prompt"
                recs[j] = {**base, "status": "skipped",
                           "reason": f"no {what} (got {r['prompt']!r:.40}): nothing to judge the images against"}
            elif len(r["sources"]) > 1:
                recs[j] = {**base, "status": "skipped", "reason": "multi-reference edit: PARROT takes one source"}
            else:
                recs[j] = base
                ask.append(j)
        convs = [rationalize_conv(self.template, rows[j]["prompt"], rows[j]["image_a"], rows[j]["image_b"],
                                  rows[j]["label"], rows[j]["sources"]) for j in ask]
        for j, ans in zip(ask, self._generate_safe(convs, self.cfg.teacher.max_new_tokens) if convs else []):
            rec = recs[j]
            if isinstance(ans, Exception):
                rec.update(status="judge_failure", reason=f"{type(ans).__name__}: {ans}")
                continue
            rec["raw"] = ans
            try:
                p = parse_pairwise(ans, t2i=rec["task"] == "t2i")
            except ParseError as exc:
                rec.update(status="unparseable", reason=str(exc), dimension=exc.dimension)
                continue
            rec.update(status="ok", rationale=ans.strip(), rationale_preferred=p.preferred)
        return recs  # type: ignore[return-value]

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
        from .prompts import consistency_conv

        prov = self._prov("filter")
        recs, ask = [], []
        for i in rows:
            src = self.rationales.get(i)
            base = {"row": i, "prompt": src["prompt"], "label": src["label"], "task": src["task"], "kept": False,
                    "prediction": None, "answer": None, "dimension": src.get("dimension"), "status": "ok", **prov}
            if src["status"] == "ok":
                recs.append({**base, "reason": None})
                ask.append(len(recs) - 1)
            elif src["status"] == "judge_failure":
                recs.append({**base, "status": "judge_failure", "reason": "judge_failure",
                             "detail": f"stage 1: {src['reason']}"})
            elif src["status"] == "unparseable":
                recs.append({**base, "reason": "unparseable_rationale", "detail": src["reason"]})
            else:
                recs.append({**base, "reason": "skipped", "detail": src["reason"]})
        view = self.cfg.consistency_view
        for j in ask:  # what stage 2 is shown (recorded for audit): never the Preferred line
            recs[j]["evidence"] = consistency_view(self.rationales.get(recs[j]["row"])["rationale"], view)
        convs = [consistency_conv(self.template, recs[j]["prompt"], self.rationales.get(recs[j]["row"])["rationale"],
                                  recs[j]["task"] == "edit", view) for j in ask]
        for j, ans in zip(ask, self._generate_safe(convs, self.cfg.teacher.predict_max_new_tokens) if convs else []):
            rec = recs[j]
            if isinstance(ans, Exception):
                rec.update(status="judge_failure", reason="judge_failure", detail=f"stage 2: {type(ans).__name__}: {ans}")
                continue
            rec["answer"] = ans
            pred = parse_prediction(ans)
            rec["prediction"] = pred
            if pred is None:
                rec.update(reason="unparseable_prediction", detail=f"answer {ans[:120]!r} is not A or B")
            elif pred != rec["label"]:
                rec.update(reason="wrong_prediction", detail=f"predicted {pred}, label {rec['label']}")
            else:
                rec.update(kept=True, reason="kept", detail=None)
        for rec in recs:
            rec.setdefault("detail", None)
            rec.setdefault("evidence", None)
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
        from .prompts import project_conv

        prov = self._prov("project")
        recs, convs = [], []
        for r in rows:
            rat = self.rationales.get(r["row"])["rationale"]
            for slot in ("A", "B"):
                if self._done(self.projected, (r["row"], slot)):
                    continue
                im = r["image_a"] if slot == "A" else r["image_b"]
                convs.append(project_conv(self.template, r["prompt"], im, slot, rat, r["sources"]))
                recs.append({"row": r["row"], "slot": slot, "prompt": r["prompt"],
                             "task": "edit" if r["sources"] else "t2i", "critique": None, "raw": None,
                             "scores": None, "mean": None, "reason": None, "dimension": None, **prov})
        for rec, ans in zip(recs, self._generate_safe(convs, self.cfg.teacher.max_new_tokens) if convs else []):
            if isinstance(ans, Exception):
                rec.update(status="judge_failure", reason=f"{type(ans).__name__}: {ans}")
                continue
            rec["raw"] = ans
            try:
                c = parse_pointwise(ans, t2i=rec["task"] == "t2i")
            except ParseError as exc:
                rec.update(status="unparseable", reason=str(exc), dimension=exc.dimension)
                continue
            m = mean_score(c.scores)
            if math.isnan(m):
                rec.update(status="unparseable", reason="every dimension is N/A")
                continue
            if c.notes:  # the t2i image-faithfulness number was ignored: train on the corrected text? no: drop
                rec.update(status="unparseable", reason="; ".join(c.notes), dimension="image_faithfulness")
                continue
            rec.update(status="ok", critique=ans.strip(), scores=c.scores, mean=m)
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


# ---------------------------------------------------------------------------------------------- report
def filter_report(filtered: Sequence[dict[str, Any]], rationales: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """Keep rate and rejection reasons from stage-2 records (and their stage-1 rationales).

    ``keep_rate`` = kept / rows with a rationale attempt (skipped rows excluded); ``keep_rate_parsed`` = kept /
    rows whose rationale parsed and got a prediction-stage verdict. Per dimension: which section failed to parse
    (unparseable rationales), and over the parsed rationales whether the dimension's scores favoured the label,
    the other image, neither (equal), or did not apply (N/A).
    """
    counts = {r: 0 for r in REASONS}
    unparse_dim: dict[str, int] = {}
    per_dim = {d: {"kept": {"label": 0, "other": 0, "equal": 0, "n/a": 0},
                   "rejected": {"label": 0, "other": 0, "equal": 0, "n/a": 0}} for d in DIMENSIONS}
    for rec in filtered:
        reason = rec["reason"]
        counts[reason] += 1
        if reason == "unparseable_rationale":
            key = rec.get("dimension") or "(format)"
            unparse_dim[key] = unparse_dim.get(key, 0) + 1
        src = rationales.get(rec["row"])
        if reason in ("kept", "wrong_prediction", "unparseable_prediction") and src and src.get("rationale"):
            try:
                p = parse_pairwise(src["rationale"], t2i=src["task"] == "t2i")
            except ParseError:
                continue
            side = "kept" if rec["kept"] else "rejected"
            for d, (a, b) in p.scores.items():
                if a is None:
                    k = "n/a"
                elif a == b:
                    k = "equal"
                else:
                    k = "label" if (a > b) == (rec["label"] == "A") else "other"
                per_dim[d][side][k] += 1
    eligible = len(filtered) - counts["skipped"]
    parsed = counts["kept"] + counts["wrong_prediction"] + counts["unparseable_prediction"]
    return {"records": len(filtered), "counts": counts, "kept": counts["kept"],
            "keep_rate": counts["kept"] / eligible if eligible else None,
            "keep_rate_parsed": counts["kept"] / parsed if parsed else None,
            "rejections": {"wrong_prediction": counts["wrong_prediction"],
                           "unparseable": counts["unparseable_prediction"] + counts["unparseable_rationale"],
                           "unparseable_rationale": counts["unparseable_rationale"],
                           "unparseable_prediction": counts["unparseable_prediction"],
                           "judge_failure": counts["judge_failure"]},
            "unparseable_rationale_by_dimension": unparse_dim, "dimensions": per_dim}
