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
before fingerprints) the spec and the whole description must match.

The dataset is compared by what it is, not by how ``data.train`` spells it (records are keyed by row index, so
another dataset's records would be paired with this one's rows): ``data`` is where it lies (a local file or
folder resolved to its absolute path, else the source as given) and ``data_content`` its identity
(:func:`dataset_identity`): the content digest of the files the rows are read from (:mod:`rewardkit.fingerprint`;
the same file under another spelling, a copy or a symlink resumes, rows edited, reordered or appended are
refused), the ``datasets`` fingerprint of a hub dataset (name, configuration, revision commit, split) or the
synthetic set's parameters. Records written before ``data_content`` (only the path string) resume when
``data`` names the same place (compared resolved), with a warning that their content could not be verified."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["ProvenanceChecks", "dataset_identity"]

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


def dataset_identity(data: Any, ds: Any, seed: int) -> tuple[str, str | None]:
    """``(data, data_content)`` of a :class:`~rewardkit.parrot.pipeline_config.DataCfg` whose rows ``ds`` are
    (as loaded, before ``max_samples``): for local files the absolute path and ``content:<digest>`` of the
    files the rows are read from, their bytes in order (:func:`rewardkit.train.data._pair_files`; one file: its
    :func:`~rewardkit.fingerprint.file_digest`, so a folder and its ``metadata.jsonl`` are one dataset; the
    image files the rows name are not part of it); for a hub dataset its id and
    ``datasets:<split>:<fingerprint>`` (the ``datasets`` cache key: id, configuration, revision commit, split;
    None when it has none); for ``synthetic:...`` the parameters that make its rows."""
    from ..train.data import _pair_files

    src = data.train
    files = _pair_files(src)
    if files is not None:
        from ..fingerprint import default_memo_dir, file_digests

        digests = file_digests(files, default_memo_dir())
        root = str(Path(src).expanduser().resolve())
        if len(files) == 1:
            return root, f"content:{digests[0]}"
        h = hashlib.blake2b(digest_size=16)  # the rows in order: the files' contents in order, not their names
        for d in digests:
            h.update(f"{d}\x1e".encode())
        return root, f"content:{h.hexdigest()}"
    if src.startswith("synthetic:"):
        return src, f"{src}?size={data.synthetic_size}&split={data.split}&seed={seed}"
    fp = getattr(ds, "_fingerprint", None)
    return src, (f"datasets:{data.split}:{fp}" if fp else None)


def _data_difference(rec: dict[str, Any], prov: dict[str, Any]) -> tuple[str | None, bool, bool]:
    """``(what differs, unverified, edited)`` between a record's dataset and this run's: their ``data_content``
    when both have one (the spelling of the path is not compared), else ``data`` as a place (resolved paths).
    ``unverified``: accepted by place alone, the record has no content to compare (written before
    ``data_content``) while this run has one. ``edited``: the same local path with other content."""
    old, new = rec.get("data"), prov.get("data")
    oc, nc = rec.get("data_content"), prov.get("data_content")
    if oc is not None and nc is not None:
        if oc == nc:
            return None, False, False
        edited = (str(oc).startswith("content:") and str(nc).startswith("content:")
                  and _resolved(str(old)) == _resolved(str(new)))
        what = "the same path, other content: the file was changed since" if edited else "another dataset"
        return f"data: {old!r} ({oc}) in the file, {new!r} ({nc}) now ({what})", False, edited
    if old is None or new is None:
        return None, False, False
    if old == new or _same_place(str(old), str(new)) or _resolved(str(old)) == _resolved(str(new)):
        return None, oc is None and nc is not None, False
    return f"data: {old!r} in the file, {new!r} now", False, False


@functools.lru_cache(maxsize=64)
def _resolved(s: str) -> str:
    """``s`` as an absolute path, links resolved (memoised within one check: every old record of a stage file
    names the same place)."""
    try:
        return str(Path(s).expanduser().resolve())
    except (OSError, RuntimeError, ValueError):
        return s


def _differences(rec: dict[str, Any], prov: dict[str, Any], fields: tuple[str, ...],
                 aside: dict[tuple, str]) -> list[str]:
    """What differs between a record's provenance and this run's, field by field (a field missing or None on
    either side is not compared). When both know the teacher's weights content, that is compared instead of the
    spec, and the description without where the weights lie (``aside`` memoises :func:`_where_aside`)."""
    by_content = (rec.get("teacher_weights") is not None and prov.get("teacher_weights") is not None
                  and "teacher_weights" in fields)
    out = []
    for k in fields:
        if k == "data":  # with data_content (:func:`_data_difference`)
            d = _data_difference(rec, prov)[0]
            if d:
                out.append(d)
            continue
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
                "template": self.template.id, "seed": self.cfg.seed, **self._data_fields(), "time": _now()}
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

    def _data_fields(self) -> dict[str, Any]:
        """``data`` and ``data_content`` (:func:`dataset_identity`, taken when the rows were loaded); without
        rows of its own (``load_data=False``) ``data`` is the source as given and there is no content."""
        ident = getattr(self, "_data_id", None)
        if ident is None:
            return {"data": self.cfg.data.train}
        return {"data": ident[0], "data_content": ident[1]}

    def check_stage(self, stage: str) -> None:
        """:meth:`check_provenance` at the start of ``stage`` ("rationalize", "filter", "project", or "sft": the
        dataset of every stage file), also when it has nothing left to write (a rerun of a finished run with
        another seed or teacher used to reuse every record silently: the check only ran with the first new
        record). Without loading a teacher: the configured teacher spec stands for it (records name theirs),
        or the teacher itself when it is already there."""
        if stage in self._provenance_checked:
            return
        prov: dict[str, Any] = {"template": self.template.id, "seed": self.cfg.seed, **self._data_fields(),
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
        _resolved.cache_clear()  # (a link may have moved since the last check)
        own = {"rationalize": self.rationales, "filter": self.filtered, "project": self.projected}.get(stage)
        aside: dict[tuple, str] = {}
        for store in (self.rationales, self.filtered, self.projected):
            fields = _PROVENANCE + ("teacher_spec", "teacher_weights") if store is own else ("data",)
            if store is own and own is self.filtered:  # stage 2's records depend on what it showed the teacher
                fields += ("consistency_view",)
            unverified = 0
            for rec in store.records.values():
                # (a field this check does not know, or a record without it, e.g. a teacher passed ready: skipped)
                diff = _differences(rec, prov, fields, aside)
                _, unverified_rec, changed = _data_difference(rec, prov)
                if diff:
                    raise ConfigError(
                        f"{store.path} holds records of another run (row {rec.get('row')!r}: {'; '.join(diff)}). "
                        f"Resuming would reuse them as this run's"
                        + (" (they are keyed by row index: rows edited, reordered or appended would be paired "
                           "with other rows' records)" if changed else "")
                        + f"; use another output_dir, or delete {store.path.parent}/"
                        f"{{rationales,filtered,projected}}.jsonl to start over"
                        + (", or restore the dataset these records were made from" if changed else ""))
                unverified += unverified_rec
            if unverified:
                warnings.warn(f"{store.path}: {unverified} record(s) written before dataset fingerprints (they "
                              f"name their dataset {prov.get('data')!r} only): resumed, but their dataset's "
                              f"content could not be verified (if the data changed since, delete the file to "
                              f"start over); new records carry data_content", stacklevel=2)

    def _prov_fields(self) -> dict[str, Any]:
        return {"teacher": json.dumps(self.teacher.describe(), sort_keys=True), "template": self.template.id,
                "seed": self.cfg.seed, **self._data_fields()}
