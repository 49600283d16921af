"""PARROT stage records key on the teacher checkpoint's content (issue 36 item 3): new weights at the same path
are another teacher, so a rerun refuses to reuse the old rationales as its own."""

from __future__ import annotations

import json
import shutil

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


# ------------------------------------------------------------------ an equal teacher at another path (issue 36 item 3)
def _cfg(tmp_path, spec, **teacher_kw):
    from rewardkit.parrot.pipeline import DataCfg, ParrotConfig, TeacherCfg

    return ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train="synthetic:brightness", synthetic_size=4),
                        teacher=TeacherCfg(judge=spec, **teacher_kw), batch_size=4)


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def _asked(teacher):
    """How many conversations a teacher was asked, wrapping its ``generate``."""
    seen = []
    real = teacher.generate

    def generate(convs, **kw):
        seen.append(len(convs))
        return real(convs, **kw)

    teacher.generate = generate
    return seen


def test_the_tiny_teacher_copied_to_another_folder_resumes_and_retrained_in_place_is_refused(
        tmp_path, monkeypatch, tiny_qwen2_5_vl_dir):
    """Bug: the records' ``teacher_spec`` (the path) and ``teacher`` (``describe()``, whose ``model`` is the path)
    were compared even where both sides know the weights' content, so the same checkpoint copied to another folder
    was refused as another teacher. Real transformers teacher (tiny Qwen2.5-VL on CPU): its description names the
    folder, and only the folder differs. Then new weights at folder A's path are refused."""
    from safetensors.torch import load_file, save_file

    from rewardkit.errors import ConfigError
    from rewardkit.parrot.pipeline import Pipeline

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    a = shutil.copytree(tiny_qwen2_5_vl_dir, tmp_path / "a")
    b = shutil.copytree(a, tmp_path / "b")
    kw = {"judge_kwargs": {"device": "cpu"}, "max_new_tokens": 4, "predict_max_new_tokens": 2}
    first = Pipeline(_cfg(tmp_path, f"transformers:{a}", **kw), progress=False)
    assert first.rationalize(rows=[0, 1]) == 2
    assert first.filter() == 2
    assert first.teacher.describe()["model"] == str(a)  # the description names the folder
    rat, fil = tmp_path / "out" / "rationales.jsonl", tmp_path / "out" / "filtered.jsonl"
    old_rat, old_fil = _lines(rat), _lines(fil)

    again = Pipeline(_cfg(tmp_path, f"transformers:{b}", **kw), progress=False)
    asked = _asked(again.teacher)  # loaded before the stage check: the description is compared too
    assert again.rationalize() == 2 and sum(asked) == 2  # rows 2 and 3 only: rows 0 and 1 are not asked again
    assert _lines(rat)[:2] == old_rat                    # and their records kept as they were
    assert [json.loads(x)["teacher_spec"] for x in _lines(rat)] == [f"transformers:{a}"] * 2 + [f"transformers:{b}"] * 2
    assert again.filter() == 2 and _lines(fil)[:2] == old_fil
    again.check_stage("project")

    w = load_file(a / "model.safetensors")                 # retrained at folder A's path
    name = sorted(w)[0]
    w[name] = w[name] + 1
    save_file(w, a / "model.safetensors")
    with pytest.raises(ConfigError, match="rationales.jsonl holds records of another run .*teacher_weights"):
        Pipeline(_cfg(tmp_path, f"transformers:{a}", **kw), progress=False).rationalize()
    with pytest.raises(ConfigError, match="filtered.jsonl holds records of another run .*teacher_weights"):
        Pipeline(_cfg(tmp_path, f"transformers:{a}", **kw), progress=False).filter()
    assert Pipeline(_cfg(tmp_path, f"transformers:{b}", **kw), progress=False).rationalize() == 0  # B still equal


class _LocalScripted:
    """The scripted teacher's answers (stages 2 and 3 get parseable rationales to work on), described as the
    transformers backend describes a checkpoint it loaded (``TransformersJudge.describe``: kind, ``model`` = the
    path it was given, dtype)."""

    @staticmethod
    def install(monkeypatch, dtype="float32"):
        from rewardkit.parrot import pipeline
        from rewardkit.parrot.testing import ScriptedTeacher

        class Local(ScriptedTeacher):
            def __init__(self, path):
                super().__init__()
                self.path = path

            def describe(self):
                return {"kind": "transformers", "model": self.path, "dtype": dtype}

        made = []
        monkeypatch.setattr(pipeline, "load_teacher",
                            lambda cfg, workdir: made.append(Local(cfg.judge.partition(":")[2])) or made[-1])
        return made


def _ckpt(path, fill=b"A"):
    path.mkdir()
    (path / "model.safetensors").write_bytes(fill * 256)
    (path / "config.json").write_text('{"model_type": "stand-in"}')
    return path


def test_every_stage_resumes_with_an_equal_teacher_at_another_path_without_asking_it_again(tmp_path, monkeypatch):
    """Stages 1-3 begun with folder A, continued with an equal copy at folder B: each stage asks the teacher for
    the rows it had not done only, and A's records stay; the same copy loaded in another dtype is refused (the
    description's other fields are still compared)."""
    from rewardkit.errors import ConfigError
    from rewardkit.parrot.pipeline import Pipeline

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    made = _LocalScripted.install(monkeypatch)
    a = _ckpt(tmp_path / "a")
    b = shutil.copytree(a, tmp_path / "b")
    first = Pipeline(_cfg(tmp_path, f"transformers:{a}"), progress=False)
    assert (first.rationalize(rows=[0, 1]), first.filter(rows=[0, 1])) == (2, 2)
    kept_a = [i for i in (0, 1) if first.filtered.get(i)["kept"]]
    assert kept_a and first.project(rows=[0, 1]) == 2 * len(kept_a)
    out = tmp_path / "out"
    old = {f: _lines(out / f) for f in ("rationales.jsonl", "filtered.jsonl", "projected.jsonl")}

    dtype = _LocalScripted.install(monkeypatch, dtype="bfloat16")  # the copy loaded otherwise: another teacher
    with pytest.raises(ConfigError, match="teacher: .*float32.* in the file, .*bfloat16.* now"):
        Pipeline(_cfg(tmp_path, f"transformers:{b}"), progress=False).rationalize()
    assert len(dtype) == 1 and dtype[0].calls == []  # refused before it was asked anything
    made = _LocalScripted.install(monkeypatch)
    again = Pipeline(_cfg(tmp_path, f"transformers:{b}"), progress=False)
    assert again.rationalize() == 2 and made[-1].calls == [("generate", 2)]   # rows 2 and 3
    assert again.filter() == 2 and made[-1].calls[1:] == [("generate", 2)]
    kept_b = [i for i in (2, 3) if again.filtered.get(i)["kept"]]
    assert again.project() == 2 * len(kept_b) and made[-1].calls[2:] == [("generate", 2 * len(kept_b))]
    for f, lines in old.items():
        assert _lines(out / f)[:len(lines)] == lines, f
    assert {again.rationales.get(i)["teacher_spec"] for i in (0, 1)} == {f"transformers:{a}"}



def _records(tmp_path, spec, weights, teacher, stage="rationales"):
    """Stage records as a run with ``spec`` wrote them (no model loaded)."""
    from rewardkit.parrot.pipeline import Pipeline

    pipe = Pipeline(_cfg(tmp_path, "scripted"), progress=False)
    store = tmp_path / "out" / f"{stage}.jsonl"
    extra = {"slot": "A"} if stage == "projected" else {"consistency_view": "full"} if stage == "filtered" else {}
    store.write_text("".join(json.dumps({"row": i, "status": "ok", "kept": True, "teacher_spec": spec,
                                         "teacher_weights": weights, "teacher": teacher,
                                         "template": pipe.template.id, "seed": 0, "data": "synthetic:brightness",
                                         **extra}) + "\n" for i in range(4)))


@pytest.mark.parametrize("stage,file", [("rationalize", "rationales"), ("filter", "filtered"),
                                        ("project", "projected")])
def test_a_copy_resumes_at_each_stage_check_and_without_content_the_spec_must_match(tmp_path, monkeypatch,
                                                                                    stage, file):
    """The rule at each stage's start check: both sides know the content -> the content (a bare path and
    ``hf:`` are the transformers backend, as ``load_teacher`` reads them; ``vllm:`` is another backend). Either
    side without it (a hosted model's name, a record written before fingerprints) -> the spec must match."""
    from rewardkit.errors import ConfigError
    from rewardkit.fingerprint import content_config
    from rewardkit.parrot.pipeline import Pipeline

    monkeypatch.setenv("REWARDKIT_CACHE", str(tmp_path / "rk-cache"))
    a = _ckpt(tmp_path / "a")
    b = shutil.copytree(a, tmp_path / "b")
    c = _ckpt(tmp_path / "c", fill=b"C")

    def check(spec):
        Pipeline(_cfg(tmp_path, spec), progress=False).check_stage(stage)

    _records(tmp_path, str(a), content_config(str(a)), None, file)            # a bare path: transformers
    for same in (f"transformers:{b}", f"hf:{b}", str(b)):
        check(same)
    for other, what in ((f"vllm:{b}", "teacher_weights: 'content:"), (f"transformers:{c}", "teacher_weights"),
                        ("openai:http://127.0.0.1:9/v1", "teacher_spec")):
        with pytest.raises(ConfigError, match=what):
            check(other)
    _records(tmp_path, f"transformers:{a}", None, None, file)                  # before fingerprints: strict
    with pytest.raises(ConfigError, match=f"teacher_spec: 'transformers:{a}' in the file"):
        check(f"transformers:{b}")
    api = "openai:http://127.0.0.1:9/v1"                                      # a hosted model: strict
    _records(tmp_path, api, None, json.dumps({"kind": "openai", "model": "fake-model"}), file)
    check(api)
    with pytest.raises(ConfigError, match="teacher_spec: 'openai:http://127.0.0.1:9/v1' in the file"):
        check("openai:http://127.0.0.1:10/v1")
