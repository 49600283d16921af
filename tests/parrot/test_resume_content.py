"""PARROT stage records key on the teacher checkpoint's content (issue 36 item 3): new weights at the same path
are another teacher, so a rerun refuses to reuse the old rationales as its own."""

from __future__ import annotations

import json

import pytest

from tests.helpers.data_files import parrot_cfg, write_pairs


def test_a_teacher_retrained_at_the_same_path_refuses_the_old_records(tmp_path, monkeypatch):
    """Bug: records carried the teacher spec string only (``transformers:/ckpt/latest``): a retrained teacher
    at that path resumed into the old rationales. Records now carry ``teacher_weights`` (the content digest)."""
    from rewardkit.errors import ConfigError
    from rewardkit.fingerprint import content_config
    from rewardkit.parrot.pipeline import Pipeline

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    write_pairs(tmp_path / "pairs", shards=1, rows=2)
    cfg = parrot_cfg(tmp_path)
    cfg.data.train = str(tmp_path / "pairs" / "part-0.parquet")
    ckpt = tmp_path / "teacher"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"A" * 256)
    cfg.teacher.judge = spec = f"transformers:{ckpt}"
    pipe = Pipeline(cfg, progress=False)  # no teacher loaded: the records are written as that teacher would
    store = tmp_path / "work" / "rationales.jsonl"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("".join(json.dumps({"row": i, "status": "kept", "teacher_spec": spec,
                                         "teacher_weights": content_config(spec), "template": pipe.template.id,
                                         "seed": cfg.seed, "data": cfg.data.train}) + "\n" for i in range(2)))
    Pipeline(cfg, progress=False).check_stage("rationalize")  # the same weights: resumes
    (ckpt / "model.safetensors").write_bytes(b"B" * 256)        # retrained in place: same name, same size
    with pytest.raises(ConfigError, match="teacher_weights"):
        Pipeline(cfg, progress=False).check_stage("rationalize")
