"""PARROT pipeline: filter arithmetic, N/A, keep-rate report and resume with the scripted teacher (outcomes
computed by hand), and stages 1-3 end to end on a tiny Qwen teacher (garbage answers dropped with reasons)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from rewardkit.parrot.pipeline import DataCfg, JsonlStore, ParrotConfig, Pipeline, TeacherCfg
from rewardkit.parrot.testing import ScriptedTeacher

BRIGHT, DARK = 255, 0
ROWS = [  # (prompt, brightness a, brightness b, label, source?)
    ("a cat", BRIGHT, DARK, "A", False),                 # 0 kept
    ("a dog [contrary]", BRIGHT, DARK, "B", False),      # 1 rationale ignores the label -> wrong prediction
    ("a car [garbage]", BRIGHT, DARK, "A", False),       # 2 unparseable rationale
    ("a bird [vague]", BRIGHT, DARK, "A", False),        # 3 unparseable prediction
    ("a tree [fail]", BRIGHT, DARK, "A", False),         # 4 judge failure
    ("a boat", BRIGHT, BRIGHT, "tie", False),            # 5 skipped (tie)
    ('a sign saying "OPEN"', DARK, BRIGHT, "B", False),  # 6 kept (text rendering applies)
    ("add a hat", BRIGHT, DARK, "A", True),              # 7 kept (edit: image faithfulness applies)
    ("a lamp [badproj]", BRIGHT, DARK, "A", False),      # 8 kept, projection unparseable
]


def grey(v):
    return Image.fromarray(np.full((32, 32, 3), v, dtype=np.uint8), "RGB")


@pytest.fixture()
def pairs(tmp_path):
    d = tmp_path / "pairs"
    d.mkdir()
    grey(BRIGHT).save(d / "bright.png")
    grey(DARK).save(d / "dark.png")
    grey(128).save(d / "src.png")
    name = {BRIGHT: "bright.png", DARK: "dark.png"}
    with open(d / "metadata.jsonl", "w") as f:
        for p, a, b, lab, src in ROWS:
            f.write(json.dumps({"prompt": p, "image_a": name[a], "image_b": name[b], "label": lab,
                                "sources": ["src.png"] if src else []}) + "\n")
    return d


def cfg_for(tmp_path, pairs, **kw):
    return ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train=str(pairs)),
                        teacher=TeacherCfg(judge="scripted"), batch_size=kw.pop("batch_size", 4), **kw)


def test_filter_arithmetic_and_report(tmp_path, pairs):
    pipe = Pipeline(cfg_for(tmp_path, pairs), progress=False)
    rep = pipe.run_stages()
    assert rep["counts"] == {"kept": 4, "wrong_prediction": 1, "unparseable_prediction": 1,
                             "unparseable_rationale": 1, "judge_failure": 1, "skipped": 1}
    assert rep["keep_rate"] == 4 / 8 and rep["keep_rate_parsed"] == 4 / 6
    assert rep["rejections"]["unparseable"] == 2
    assert rep["unparseable_rationale_by_dimension"] == {"text_faithfulness": 1}
    tf = rep["dimensions"]["text_faithfulness"]
    assert tf["kept"] == {"label": 4, "other": 0, "equal": 0, "n/a": 0}
    assert tf["rejected"] == {"label": 1, "other": 1, "equal": 0, "n/a": 0}
    # N/A: image faithfulness applies to the edit only; text rendering to the quoted request only
    assert rep["dimensions"]["image_faithfulness"]["kept"] == {"label": 0, "other": 0, "equal": 1, "n/a": 3}
    assert rep["dimensions"]["text_rendering"]["kept"] == {"label": 0, "other": 0, "equal": 1, "n/a": 3}
    f = {r["row"]: r for r in pipe.filtered.records.values()}
    assert f[1]["prediction"] == "A" and f[1]["reason"] == "wrong_prediction"
    assert f[4]["status"] == "judge_failure" and "scripted judge failure" in f[4]["detail"]
    assert [i for i in f if f[i]["kept"]] == [0, 6, 7, 8]
    # projection: both images of each kept pair; the [badproj] pair's critiques are dropped with the reason
    proj = pipe.projected.records
    assert len(proj) == 8 and sum(r["status"] == "ok" for r in proj.values()) == 6
    assert proj[(0, "A")]["scores"] == {"text_faithfulness": 4.0, "image_faithfulness": None,
                                        "physical_quality": 4.0, "text_rendering": None}
    assert proj[(0, "B")]["mean"] == 1.0 and proj[(7, "A")]["scores"]["image_faithfulness"] == 3.0
    assert proj[(6, "B")]["mean"] == pytest.approx((4 + 4 + 2) / 3)
    assert proj[(8, "A")]["status"] == "unparseable" and proj[(8, "A")]["critique"] is None
    # provenance + datasets-readable
    import datasets

    for name in ("rationales", "filtered", "projected"):
        ds = datasets.load_dataset("json", data_files=str(tmp_path / "out" / f"{name}.jsonl"), split="train")
        assert {"row", "teacher", "template", "seed", "data", "stage"} <= set(ds.column_names)
        assert ds[0]["template"] == "parrot/default@3"
    assert json.loads((tmp_path / "out" / "filter_report.json").read_text())["kept"] == 4


class Crash(BaseException):
    pass


class CrashingTeacher(ScriptedTeacher):
    def __init__(self, after):
        super().__init__()
        self.after = after

    def generate(self, conversations, **kw):
        if len(self.calls) >= self.after:
            raise Crash()
        return super().generate(conversations, **kw)


def _strip(recs):
    # (teacher_spec: how the teacher was given, a spec or an object passed ready as the crashing run's)
    return {k: {kk: vv for kk, vv in v.items() if kk not in ("time", "teacher_spec")} for k, v in recs.items()}


@pytest.mark.parametrize("after", [1, 3, 5])
def test_resume_after_crash_no_duplicates_no_gaps(tmp_path, pairs, after):
    ref = Pipeline(cfg_for(tmp_path / "ref", pairs, batch_size=2), progress=False)
    ref.run_stages()
    cfg = cfg_for(tmp_path, pairs, batch_size=2)
    with pytest.raises(Crash):
        Pipeline(cfg, teacher=CrashingTeacher(after), progress=False).run_stages()
    out = tmp_path / "out" / "rationales.jsonl"
    with open(out, "a") as f:  # a crash mid-write leaves half a line
        f.write('{"row": 99, "stat')
    again = Pipeline(cfg, progress=False)
    rep = again.run_stages()
    assert rep["counts"]["kept"] == 4
    for name, store in (("rationales", again.rationales), ("filtered", again.filtered), ("projected", again.projected)):
        lines = [json.loads(x) for x in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
        keys = [store.key(r) for r in lines]
        assert len(keys) == len(set(keys)), f"duplicates in {name}"
        assert _strip(store.records) == _strip(getattr(ref, name).records)


def test_stage_commands_resume_and_retry_failed(tmp_path, pairs):
    cfg = cfg_for(tmp_path, pairs)
    p = Pipeline(cfg, progress=False)
    assert p.rationalize() == 9 and p.rationalize() == 1  # only the judge failure is retried
    assert p.filter() == 9 and p.project() == 8
    assert p.project() == 0
    cfg.retry_failed = False
    p2 = Pipeline(cfg, progress=False)
    assert p2.rationalize() == 0 and p2.filter() == 0


def test_jsonl_store_rejects_corrupt_middle_line(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"row": 1}\nnot json\n{"row": 2}\n')
    with pytest.raises(ValueError, match=":2: not JSON"):
        JsonlStore(f, lambda r: r["row"])


def test_tiny_qwen_teacher_garbage_dropped_with_reasons(tmp_path, tiny_qwen2_5_vl_dir):
    cfg = ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train="synthetic:brightness", synthetic_size=4),
                       teacher=TeacherCfg(judge=f"transformers:{tiny_qwen2_5_vl_dir}", judge_kwargs={"device": "cpu"},
                                          max_new_tokens=24),
                       batch_size=4)
    pipe = Pipeline(cfg, progress=False)
    rep = pipe.run_stages()
    assert rep["kept"] == 0 and rep["counts"]["unparseable_rationale"] == 4
    for r in pipe.rationales.records.values():
        assert r["status"] == "unparseable" and r["rationale"] is None and r["raw"] is not None and r["reason"]
    assert len(pipe.projected) == 0


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_sft_tiny_student_trains_and_loads_as_rational(tmp_path, lora):
    """Stages 1-4 with the scripted teacher; the tiny student's weights change after a few TRL steps and the
    saved model loads as ``rational`` and scores (NaN + reason: a tiny model's critique does not parse)."""
    import torch

    import rewardkit
    from rewardkit.parrot.pipeline import SFTCfg
    from rewardkit.parrot.sft import load_student, train_sft

    cfg = ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train="synthetic:brightness", synthetic_size=3),
                       teacher=TeacherCfg(judge="scripted"), batch_size=4,
                       sft=SFTCfg(student="tiny:qwen2_5_vl", dtype="float32", use_cpu=True, max_steps=2,
                                  per_device_train_batch_size=2, gradient_accumulation_steps=1, learning_rate=5e-3,
                                  logging_steps=1, save_steps=100, lora=lora, lora_r=4, lora_alpha=8,
                                  gradient_checkpointing=not lora))
    pipe = Pipeline(cfg, progress=False)
    pipe.run_stages()
    summary = train_sft(pipe)
    assert summary["examples"] == 9 and summary["pairwise"] == 3 and summary["steps"] == 2
    again = train_sft(Pipeline(cfg, progress=False))  # rerun: resumes from the final checkpoint, no extra step
    assert again["already_trained"] and again["steps"] == 2
    # a kill while checkpoint-5 was written: no trainer_state.json, half a weights file. Before, every rerun
    # resumed from it and failed; now it is removed and the run resumes from the last complete checkpoint.
    half = tmp_path / "out" / "student-trainer" / "checkpoint-5"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        again = train_sft(Pipeline(cfg, progress=False))
    assert again["already_trained"] and again["resumed_from"].endswith("checkpoint-2") and not half.exists()
    # the documented outputs: the examples trained on, the merged student with its provenance, the checkpoints
    out_dir = tmp_path / "out"
    examples = [json.loads(x) for x in (out_dir / "sft_examples.jsonl").read_text().splitlines()]
    assert len(examples) == summary["examples"]
    assert (out_dir / "student" / "parrot_provenance.json").is_file()
    assert any(p.name.startswith("checkpoint-") for p in (out_dir / "student-trainer").iterdir())
    base = load_student("tiny:qwen2_5_vl")[0].state_dict()
    new = load_student(str(tmp_path / "out" / "student"))[0].state_dict()  # the loader users go through
    assert set(new) == set(base)
    changed = [k for k, v in base.items() if k in new and not torch.equal(v, new[k])]
    assert changed, "no parameter changed"
    if lora:  # merged LoRA deltas touch only the language model's projections
        assert all("language_model" in k and "proj" in k for k in changed)
        assert not any("lora" in k for k in new)
    r = rewardkit.load_reward("rational", model=str(tmp_path / "out" / "student"), device="cpu", max_new_tokens=8)
    out = r([Image.new("RGB", (32, 32), "red")], "a cat")
    assert len(out) == 1 and not out.valid[0] and out.errors[0]


def test_tiny_qwen_filter_and_project_stages(tmp_path, tiny_qwen2_5_vl_dir):
    """Stages 2 (text-only consistency question) and 3 (projection) on the real tiny model, fed well-formed
    rationales by the scripted teacher: garbage predictions / critiques are dropped with reasons."""
    from rewardkit.judges import load_judge

    tiny = load_judge(f"transformers:{tiny_qwen2_5_vl_dir}", device="cpu")
    cfg = ParrotConfig(output_dir=str(tmp_path / "a"), data=DataCfg(train="synthetic:brightness", synthetic_size=3),
                       teacher=TeacherCfg(judge="scripted", max_new_tokens=16, predict_max_new_tokens=4), batch_size=4)
    Pipeline(cfg, progress=False).rationalize()
    p = Pipeline(cfg, teacher=tiny, progress=False)
    p.filter()
    recs = list(p.filtered.records.values())
    assert [r["reason"] for r in recs] == ["unparseable_prediction"] * 3 and all(r["answer"] is not None for r in recs)
    assert all("transformers" in r["teacher"] for r in recs)
    cfg.output_dir = str(tmp_path / "b")
    s = Pipeline(cfg, progress=False)
    s.rationalize()
    s.filter()
    p = Pipeline(cfg, teacher=tiny, progress=False)
    assert p.project() == 6
    assert all(r["status"] == "unparseable" and r["critique"] is None and r["scores"] is None and r["reason"]
               for r in p.projected.records.values())


def test_cli_stages_print_reports(tmp_path, pairs, capsys):
    from rewardkit.cli import main

    out = tmp_path / "cli"
    args = ["--config", "recipes/parrot/tiny.yaml", f"data.train={pairs}", f"output_dir={out}", "--no-progress"]
    from pathlib import Path

    args[1] = str(Path(__file__).resolve().parents[2] / "recipes" / "parrot" / "tiny.yaml")
    assert main(["parrot", "rationalize", *args]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == {"ok": 6, "unparseable": 1, "judge_failure": 1, "skipped": 1}
    assert main(["parrot", "filter", *args]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["kept"] == 4 and rep["keep_rate"] == 0.5
    assert main(["parrot", "project", *args]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == {"ok": 6, "unparseable": 2}
    assert (out / "parrot_config.yaml").is_file()
    assert main(["parrot"]) == 2


# ------------------------------------------------------------------ storage: provenance, last records, checkpoints
@pytest.mark.slow
def test_rerun_with_another_seed_teacher_or_template_is_refused(tmp_path, pairs):
    """Bug: a rerun in the same output folder with another seed or teacher silently reused every old rationale
    as its own. Records carry their provenance; a mismatch is a ConfigError (exit 2) naming what differs."""
    from rewardkit.errors import ConfigError

    cfg = cfg_for(tmp_path, pairs)
    assert Pipeline(cfg, progress=False).rationalize() == 9
    assert Pipeline(cfg, progress=False).rationalize() == 1      # same run: resumed (only the failure retried)

    class OtherTeacher(ScriptedTeacher):
        def describe(self):
            return {"kind": "scripted", "model": "another-teacher"}

    cfg.seed = 7
    with pytest.raises(ConfigError, match="seed: 0 in the file, 7 now"):
        Pipeline(cfg, progress=False).rationalize()
    cfg.seed = 0
    with pytest.raises(ConfigError, match="another-teacher"):
        Pipeline(cfg, teacher=OtherTeacher(), progress=False).rationalize()
    Pipeline(cfg, progress=False).filter()
    with pytest.raises(ConfigError, match="filtered.jsonl holds records of another run"):
        Pipeline(cfg, teacher=OtherTeacher(), progress=False).filter()
    assert Pipeline(cfg, teacher=OtherTeacher(), progress=False).project() == 8  # a later stage, another teacher
    cfg.data.synthetic_size = 5
    cfg.data.train = "synthetic:brightness"                        # another dataset: no stage reads the old rows
    with pytest.raises(ConfigError, match="data: "):
        Pipeline(cfg, progress=False).filter()
    cfg.output_dir = str(tmp_path / "fresh")                       # another folder: a new run
    assert Pipeline(cfg, teacher=OtherTeacher(), progress=False).rationalize() == 5  # the 5 synthetic pairs


def test_rerun_of_a_finished_stage_with_another_seed_or_teacher_is_refused(tmp_path, pairs):
    """Bug: the provenance check ran only with the first new record, so a rerun of a stage with nothing left to
    write (a finished run: every row done) with another seed or teacher spec silently reused every record, and
    `sft` trained on another dataset's records. Now each stage checks at its start, without loading a teacher."""
    from rewardkit.errors import ConfigError

    cfg = cfg_for(tmp_path, pairs)
    pipe = Pipeline(cfg, progress=False)
    pipe.rationalize()
    pipe.filter()
    done = [r["row"] for r in pipe.rationales.records.values() if r["status"] != "judge_failure"]
    kept = [r["row"] for r in pipe.filtered.records.values() if r["kept"]]
    assert Pipeline(cfg, progress=False).rationalize(rows=done) == 0      # the same run: nothing to do
    cfg.seed = 7
    with pytest.raises(ConfigError, match="seed: 0 in the file, 7 now"):
        Pipeline(cfg, progress=False).rationalize(rows=done)
    with pytest.raises(ConfigError, match="filtered.jsonl holds records of another run"):
        Pipeline(cfg, progress=False).filter(rows=kept)
    cfg.seed = 0
    cfg.teacher.judge = "openai:http://127.0.0.1:9/v1"                   # never contacted: refused before
    with pytest.raises(ConfigError, match="teacher_spec: 'scripted' in the file"):
        Pipeline(cfg, progress=False).rationalize(rows=done)
    cfg.teacher.judge = "scripted"
    cfg.data.synthetic_size = 5
    cfg.data.train = "synthetic:brightness"                              # the stage files index another dataset
    with pytest.raises(ConfigError, match="data: "):
        Pipeline(cfg, progress=False).check_stage("sft")


@pytest.mark.slow
def test_sft_on_another_datasets_stage_files_is_refused(tmp_path, pairs):
    """``train_sft`` checks the stage files' dataset before any model loads (it paired another dataset's
    rationales with this dataset's images by row index). Slow: importing trl."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rewardkit.errors import ConfigError
    from rewardkit.parrot.sft import train_sft

    cfg = cfg_for(tmp_path, pairs)
    pipe = Pipeline(cfg, progress=False)
    pipe.rationalize()
    pipe.filter()
    cfg.data.synthetic_size = 5
    cfg.data.train = "synthetic:brightness"
    with pytest.raises(ConfigError, match="data: "):
        train_sft(Pipeline(cfg, progress=False))


def test_parrot_cli_refuses_a_mismatched_rerun_with_exit_2(tmp_path, pairs, capsys):
    from rewardkit.cli import main

    args = ["--config", "recipes/parrot/tiny.yaml", f"data.train={pairs}", f"output_dir={tmp_path / 'o'}",
            "teacher.judge=scripted", "--no-progress"]
    assert main(["parrot", "rationalize", *args]) == 0
    assert main(["parrot", "rationalize", *args[:-1], "seed=3", "--no-progress"]) == 2
    assert "another run" in capsys.readouterr().err


def test_jsonl_store_keeps_a_last_record_without_newline(tmp_path):
    """Bug: a valid last record without its trailing newline was deleted on reopening."""
    f = tmp_path / "x.jsonl"
    f.write_text('{"row": 0, "v": 1}\n{"row": 1, "v": 2}')
    s = JsonlStore(f, lambda r: r["row"])
    assert sorted(s.records) == [0, 1] and f.read_text().endswith('"v": 2}\n')
    s.append([{"row": 2, "v": 3}])
    assert [json.loads(x)["row"] for x in f.read_text().splitlines()] == [0, 1, 2]
    f.write_text(f.read_text() + '{"row": 3, "v"')                  # half a record (a crash mid-write): cut
    assert sorted(JsonlStore(f, lambda r: r["row"]).records) == [0, 1, 2]
    assert f.read_text().endswith('"v": 3}\n')


def test_last_complete_checkpoint_skips_a_half_written_one(tmp_path):
    import warnings

    from rewardkit.parrot.sft import last_complete_checkpoint

    run = tmp_path / "student-trainer"
    assert last_complete_checkpoint(run) is None
    for step, state in ((2, {"global_step": 2}), (4, {"global_step": 4}), (6, None), (8, "{\"global_st")):
        d = run / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x")
        if isinstance(state, dict):
            (d / "trainer_state.json").write_text(json.dumps(state))
        elif state is not None:
            (d / "trainer_state.json").write_text(state)            # cut mid-write
    with pytest.warns(UserWarning, match="incomplete checkpoint"):
        assert last_complete_checkpoint(run) == str(run / "checkpoint-4")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert last_complete_checkpoint(run) == str(run / "checkpoint-4")


# ------------------------------------------------------------------ what stage 2 is shown (appendix C.2)
RATIONALE = ("Clearly B.\n"
             "Text Faithfulness: Image A shows a red bicycle; Image B's bicycle is blue. Image B is better here.\n"
             "Scores: A = 2, B = 3.5\n"
             "Image Faithfulness: not applicable.\nScores: A = N/A, B = N/A\n"
             "Physical and Visual Quality: The spokes of Image A merge into the frame.\nI'd give it to B.\n"
             "Scores: A = 2.5, B = 3\n"
             "Text Rendering: no text requested.\nScores: N/A\n"
             "Summary: Das rechte Bild ist schöner; B wins.\n"
             "Preferred: B\n"
             "Human annotators preferred Image B.\n")


def test_consistency_view_full_is_the_paper_reading_without_the_label_line():
    """Appendix C.2: the rationale "in full (per-dimension arguments, scores and summary)", without the label.
    Expected text written by hand: every argument and the summary verbatim (the verdict sentences too: the paper
    shows them), the scores in canonical form, no `Preferred:` line, nothing outside the sections.
    Bugs caught: the old keyword stripper (dropped "Image B is better here." and "B wins" but let "I'd give it
    to B." and the German sentence through), a `Preferred:` line or the text after it reaching stage 2."""
    from rewardkit.parrot.format import consistency_view

    expected = ("Text Faithfulness: Image A shows a red bicycle; Image B's bicycle is blue. Image B is better here.\n"
                "Scores: A = 2, B = 3.5\n"
                "Image Faithfulness: not applicable.\n"
                "Scores: A = N/A, B = N/A\n"
                "Physical and Visual Quality: The spokes of Image A merge into the frame.\nI'd give it to B.\n"
                "Scores: A = 2.5, B = 3\n"
                "Text Rendering: no text requested.\n"
                "Scores: A = N/A, B = N/A\n"
                "Summary: Das rechte Bild ist schöner; B wins.")
    assert consistency_view(RATIONALE) == expected
    assert consistency_view(RATIONALE, "full") == expected
    assert consistency_view(expected) == expected  # a view is a rationale without its label line: same view
    no_summary = RATIONALE.replace("Summary: Das rechte Bild ist schöner; B wins.\n", "")
    assert consistency_view(no_summary) == expected.rsplit("\nSummary:", 1)[0]  # no empty "Summary:" line


def test_consistency_view_evidence_only_is_the_arguments_alone():
    """`evidence_only`: per dimension its header and reasoning, verbatim; no score line, no summary, no label line
    (written by hand). Structural, not a word filter: a verdict inside an argument stays (documented).
    Bugs caught: a score line or the summary left in, an argument cut at its first line."""
    from rewardkit.parrot.format import CONSISTENCY_VIEWS, consistency_view

    assert CONSISTENCY_VIEWS == ("full", "evidence_only")
    assert consistency_view(RATIONALE, "evidence_only") == (
        "Text Faithfulness: Image A shows a red bicycle; Image B's bicycle is blue. Image B is better here.\n"
        "Image Faithfulness: not applicable.\n"
        "Physical and Visual Quality: The spokes of Image A merge into the frame.\nI'd give it to B.\n"
        "Text Rendering: no text requested.")
    with pytest.raises(ValueError, match="consistency view must be one of"):
        consistency_view(RATIONALE, "blind")


def _two_labels(tmp_path):
    d = tmp_path / "pairs"
    d.mkdir()
    grey(BRIGHT).save(d / "bright.png")
    grey(DARK).save(d / "dark.png")
    with open(d / "metadata.jsonl", "w") as f:
        for lab in ("A", "B"):
            f.write(json.dumps({"prompt": "a cat", "image_a": "bright.png", "image_b": "dark.png", "label": lab}) + "\n")
    return d


@pytest.mark.parametrize("view", ["full", "evidence_only"])
def test_stage2_is_shown_the_view_never_the_label_line(tmp_path, view):
    """The same pair with label A and with label B: stage 1 (anchored) argues for each label over the same
    images; stage 2 is shown exactly `consistency_view(rationale, view)` (recorded as `evidence`), no image and
    never the `Preferred:` line, and keeps only the rationale whose content supports its label (the scripted
    teacher reads the scores, or without them the stated brightness figures: A's 255 against B's 0)."""
    from rewardkit.parrot.format import consistency_view
    from rewardkit.parrot.testing import _parts

    seen = []

    class Recording(ScriptedTeacher):
        def generate(self, conversations, **kw):
            seen.extend(_parts(c) for c in conversations if "--- evaluation ---" in _parts(c)[1])
            return super().generate(conversations, **kw)

    pipe = Pipeline(cfg_for(tmp_path, _two_labels(tmp_path), consistency_view=view), teacher=Recording(),
                    progress=False)
    rep = pipe.run_stages()
    rats = {r["row"]: r["rationale"] for r in pipe.rationales.records.values()}
    assert "Preferred: A" in rats[0] and "Preferred: B" in rats[1]
    f = {r["row"]: r for r in pipe.filtered.records.values()}
    assert len(seen) == 2 and all(imgs == [] for imgs, _ in seen)
    for i, (_, text) in enumerate(seen):
        shown = text.split("--- evaluation ---\n", 1)[1].split("\n--- end ---", 1)[0]
        assert shown == consistency_view(rats[i], view) == f[i]["evidence"]
        assert "Preferred" not in shown and "Human annotators" not in text
        assert ("Scores:" in shown) == (view == "full") and ("Summary:" in shown) == (view == "full")
    assert f[0]["reason"] == "kept" and f[1]["reason"] == "wrong_prediction" and f[1]["prediction"] == "A"
    assert rep["keep_rate"] == 0.5 and rep["consistency_view"] == view
    assert {r["consistency_view"] for r in f.values()} == {view}


def test_a_filter_rerun_with_another_view_is_refused(tmp_path):
    """Stage-2 records depend on what the teacher was shown: resuming them under another view would mix two
    filters in one file (ConfigError, exit 2, naming the difference). An unknown view is refused at start."""
    from rewardkit.errors import ConfigError

    d = _two_labels(tmp_path)
    Pipeline(cfg_for(tmp_path, d), teacher=ScriptedTeacher(), progress=False).run_stages()
    again = Pipeline(cfg_for(tmp_path, d, consistency_view="evidence_only"), teacher=ScriptedTeacher(), progress=False)
    with pytest.raises(ConfigError, match="consistency_view: 'full' in the file, 'evidence_only' now"):
        again.filter()
    with pytest.raises(ConfigError, match="consistency_view must be one of full, evidence_only"):
        Pipeline(cfg_for(tmp_path, d, consistency_view="strip"), teacher=ScriptedTeacher(), progress=False)


def test_pairs_without_a_prompt_are_skipped(tmp_path):
    """A null (or blank) prompt is a bad row, skipped with the reason like a tie or a multi-reference edit, for
    text-to-image pairs and edits alike. Bug caught: the prompt became the string "None" and the teacher was
    asked to explain a preference for the request "None" (a made-up request, rationalized and kept)."""
    d = _two_labels(tmp_path)
    grey(128).save(d / "src.png")
    with open(d / "metadata.jsonl", "a") as f:
        for p, src in ((None, []), ("   ", []), (None, ["src.png"])):
            f.write(json.dumps({"prompt": p, "image_a": "bright.png", "image_b": "dark.png", "label": "A",
                                "sources": src}) + "\n")
    teacher = ScriptedTeacher()
    pipe = Pipeline(cfg_for(tmp_path, d), teacher=teacher, progress=False)
    rep = pipe.run_stages()
    rats = {r["row"]: r for r in pipe.rationales.records.values()}
    assert [rats[i]["status"] for i in range(5)] == ["ok", "ok", "skipped", "skipped", "skipped"]
    assert "no text-to-image prompt (got None)" in rats[2]["reason"] and "no edit instruction" in rats[4]["reason"]
    assert rats[2]["prompt"] is None and rats[3]["prompt"] == "   "
    assert rep["counts"]["skipped"] == 3 and rep["kept"] == 1
    assert sum(n for _, n in teacher.calls) == 2 + 2 + 2  # rationales, checks, projections of the two real rows


@pytest.mark.parametrize("view,kept", [("full", 14), ("evidence_only", 16)])
def test_tiny_recipe_keep_rate_per_view(view, kept):
    """The tiny recipe's data (synthetic:brightness, 16 pairs, seed 0) through stages 1-2 with the scripted teacher,
    the figures docs/parrot.md states. The brighter image always wins, so every rationale's content supports its
    label; what differs is what the view lets the teacher read. `full`: the scores (brightness rounded to 0.5
    steps of the 1-4 scale): 2 pairs round to equal scores in every dimension and separate nothing (14/16).
    `evidence_only`: the arguments' brightness figures (whole numbers), which tie for no pair (16/16). The expected
    counts are computed from the images alone."""
    import tempfile
    from pathlib import Path

    import yaml

    from rewardkit.parrot.testing import quality
    from rewardkit.train.data import load_pairs

    recipe = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "parrot" / "tiny.yaml").read_text())
    assert recipe["data"] == {"train": "synthetic:brightness", "synthetic_size": 16} and recipe["seed"] == 0
    assert recipe["teacher"]["judge"] == "scripted" and recipe.get("consistency_view", "full") == "full"
    cfg = ParrotConfig(output_dir=tempfile.mkdtemp(), data=DataCfg(train="synthetic:brightness", synthetic_size=16),
                       teacher=TeacherCfg(judge="scripted"), batch_size=recipe["batch_size"], seed=recipe["seed"],
                       consistency_view=view)
    pipe = Pipeline(cfg, teacher=ScriptedTeacher(), progress=False)
    pipe.rationalize()
    pipe.filter()
    rep = pipe.report()
    ds, _ = load_pairs("synthetic:brightness", synthetic_size=16, seed=0)

    def figure(im):
        return round(float(np.asarray(im.convert("L"), dtype=np.float64).mean()))

    same = (lambda r: quality(r["image_a"]) == quality(r["image_b"])) if view == "full" else \
        (lambda r: figure(r["image_a"]) == figure(r["image_b"]))
    ties = sum(same(r) for r in ds)
    assert ties == 16 - kept and rep["counts"]["unparseable_prediction"] == ties
    assert rep["kept"] == kept and rep["keep_rate"] == kept / 16 and rep["counts"]["wrong_prediction"] == 0


@pytest.mark.slow
def test_run_no_progress_shows_no_bar_at_all(tmp_path, capfd, monkeypatch):
    """`parrot run --no-progress`: no progress bar from the pipeline, datasets (Arrow cache writes) or the Trainer."""
    from pathlib import Path

    from rewardkit.cli import main

    for var in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(var, raising=False)  # restored afterwards (the command sets them)
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "parrot" / "tiny.yaml")
    rc = main(["parrot", "run", "--config", recipe, f"output_dir={tmp_path / 'out'}", "data.synthetic_size=3",
               "sft.max_steps=1", "sft.save_steps=100", "--no-progress"])
    assert rc == 0
    err = capfd.readouterr().err
    assert "%|" not in err and "it/s]" not in err, err[-2000:]
