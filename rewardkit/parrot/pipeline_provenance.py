"""Resuming only from records of the same run: each record of a PARROT stage file names its provenance (the
teacher, its weights, the template, seed and dataset, and for stage 2 the consistency view), and a stage rerun in
the same ``output_dir`` with another one is refused (``ConfigError``, the CLI's exit 2) instead of reusing the old
records as its own. :class:`ProvenanceChecks` is the part of :class:`~rewardkit.parrot.pipeline.Pipeline` that
does it.

The teacher is compared by its weights' content when both the record and this run know it (``teacher_weights``,
:mod:`rewardkit.fingerprint`: the spec names a local checkpoint): then the spec string and the fields of the
teacher's description that say where the weights lie (the transformers and vLLM backends' ``model``, the spec's
path) are not compared, so an equal checkpoint at another path resumes and new weights at the same path are
refused. Without a content fingerprint on either side (a hosted model, a teacher passed ready, a record written
before fingerprints) the spec and the whole description must match."""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["ProvenanceChecks"]

#: the fields of a record's provenance that must match the current run's to resume from it
_PROVENANCE = ("teacher", "template", "seed", "data")


def _now() -> float:
    return round(time.time(), 3)


def _location(spec: Any) -> str | None:
    """Where a teacher spec's weights lie: its path part (``transformers:/ckpt`` -> ``/ckpt``; a bare path is
    the transformers backend's, as :func:`~rewardkit.parrot.pipeline.load_teacher` reads it)."""
    from ..judges import BACKENDS

    if not isinstance(spec, str):
        return None
    kind, sep, rest = spec.partition(":")
    return rest if sep and kind in BACKENDS else spec


def _weights_key(weights: str) -> str:
    """``teacher_weights`` with the backend prefix the spec implies (a bare checkpoint and ``hf:`` are the
    transformers backend's): ``content:<d>``, ``hf:content:<d>`` and ``transformers:content:<d>`` are one teacher."""
    from ..judges import BACKENDS

    kind, sep, rest = weights.partition(":")
    if not sep or kind not in BACKENDS:
        return f"transformers:{weights}"
    return f"transformers:{rest}" if kind == "hf" else weights


def _same_place(a: str, b: str) -> bool:
    return a == b or os.path.normpath(os.path.expanduser(a)) == os.path.normpath(os.path.expanduser(b))


def _where_aside(teacher: str, spec: Any) -> str:
    """A record's ``teacher`` (its backend's ``describe()`` JSON) without the fields naming where the weights lie:
    those whose value is the spec's path (the transformers / vLLM backends' ``model``). The rest (backend kind,
    dtype, logprobs...) still has to match."""
    loc = _location(spec)
    try:
        desc = json.loads(teacher)
    except (TypeError, ValueError):
        return teacher
    if loc is None or not isinstance(desc, dict):
        return teacher
    return json.dumps({k: v for k, v in desc.items() if not (isinstance(v, str) and _same_place(v, loc))},
                      sort_keys=True)


def _differences(rec: dict[str, Any], prov: dict[str, Any], fields: tuple[str, ...],
                 aside: dict[tuple, str]) -> list[str]:
    """What differs between a record's provenance and this run's, field by field (a field missing or None on
    either side is not compared). When both know the teacher's weights content, that is compared instead of the
    spec, and the description without where the weights lie (``aside`` memoises :func:`_where_aside`)."""
    by_content = (rec.get("teacher_weights") is not None and prov.get("teacher_weights") is not None
                  and "teacher_weights" in fields)
    out = []
    for k in fields:
        if k not in prov or rec.get(k) is None or prov[k] is None:
            continue
        old, new = rec[k], prov[k]
        if by_content and k == "teacher_spec":
            continue  # where the weights lie: their content is compared instead
        if by_content and k == "teacher_weights":
            if _weights_key(old) != _weights_key(new):
                out.append(f"{k}: {old!r} in the file, {new!r} now")
            continue
        if by_content and k == "teacher":
            for key in ((old, rec.get("teacher_spec")), (new, prov.get("teacher_spec"))):
                if key not in aside:
                    aside[key] = _where_aside(*key)
            old, new = aside[(old, rec.get("teacher_spec"))], aside[(new, prov.get("teacher_spec"))]
        if old != new:
            out.append(f"{k}: {old!r} in the file, {new!r} now")
    return out


class ProvenanceChecks:
    """The provenance of a :class:`~rewardkit.parrot.pipeline.Pipeline`'s records and the resume check. Uses the
    pipeline's ``cfg``, ``template``, ``teacher`` / ``_teacher``, ``_teacher_spec``, its three stores
    (``rationales``, ``filtered``, ``projected``) and ``_provenance_checked`` (the stages already checked)."""

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
        stage may use another teacher than an earlier one: each record names its own.) The teacher is its weights'
        content where both sides know it (the module docstring): an equal checkpoint at another path resumes."""
        from ..errors import ConfigError

        prov = prov or self._prov_fields()
        own = {"rationalize": self.rationales, "filter": self.filtered, "project": self.projected}.get(stage)
        aside: dict[tuple, str] = {}
        for store in (self.rationales, self.filtered, self.projected):
            fields = _PROVENANCE + ("teacher_spec", "teacher_weights") if store is own else ("data",)
            if store is own and own is self.filtered:  # stage 2's records depend on what it showed the teacher
                fields += ("consistency_view",)
            for rec in store.records.values():
                # (a field this check does not know, or a record without it, e.g. a teacher passed ready: skipped)
                diff = _differences(rec, prov, fields, aside)
                if diff:
                    raise ConfigError(
                        f"{store.path} holds records of another run (row {rec.get('row')!r}: {'; '.join(diff)}). "
                        f"Resuming would reuse them as this run's; use another output_dir, or delete "
                        f"{store.path.parent}/{{rationales,filtered,projected}}.jsonl to start over")

    def _prov_fields(self) -> dict[str, Any]:
        return {"teacher": json.dumps(self.teacher.describe(), sort_keys=True), "template": self.template.id,
                "seed": self.cfg.seed, "data": self.cfg.data.train}
