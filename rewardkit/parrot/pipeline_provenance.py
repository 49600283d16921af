"""Resuming only from records of the same run: each record of a PARROT stage file names its provenance (the
teacher, its weights, the template, seed and dataset, and for stage 2 the consistency view), and a stage rerun in
the same ``output_dir`` with another one is refused (``ConfigError``, the CLI's exit 2) instead of reusing the old
records as its own. :class:`ProvenanceChecks` is the part of :class:`~rewardkit.parrot.pipeline.Pipeline` that
does it."""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["ProvenanceChecks"]

#: the fields of a record's provenance that must match the current run's to resume from it
_PROVENANCE = ("teacher", "template", "seed", "data")


def _now() -> float:
    return round(time.time(), 3)


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
