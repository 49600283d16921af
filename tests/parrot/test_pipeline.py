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
        assert ds[0]["template"] == "parrot/default@2"
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


# ------------------------------------------------------------------ stage 2 never sees the verdict
EVIDENCE = ("Text Faithfulness: Image A shows a red bicycle against a brick wall. Image B's bicycle is blue. {v1}\n"
            "Scores: A = 3.5, B = 2\n"
            "Image Faithfulness: not applicable.\nScores: A = N/A, B = N/A\n"
            "Physical and Visual Quality: {v2}\nThe spokes of Image B merge into the frame; Image A has clean spokes.\n"
            "Scores: A = 3, B = 2.5\n"
            "Text Rendering: no text requested.\nScores: A = N/A, B = N/A\n"
            "Summary: The wheel of Image B is distorted. {v3}\n"
            "Preferred: {L}\n")
#: verdict phrasings (with {L} the winner, {O} the other) that must not reach stage 2
VERDICTS = ["Image {L} is better.", "{L} wins.", "I prefer {L}.", "Overall I'd go with {L}.", "{L} is preferable.",
            "**Image {L}** is clearly superior to Image {O}.", "The winner is image {L}.", "Image {O} is worse.",
            "{L} outperforms {O} here.", "Choose {L}.", "Final answer: {L}", "Verdict: {L}", "Image {L} > Image {O}.",
            "Image {L} should be chosen over Image {O}.", "Human annotators preferred Image {L}.", "{L}.",
            "The second image is better." if "{L}" == "B" else "The better image is the one labelled {L}.",
            "Image {O} loses to Image {L}; {L} beats it on every count!", "Image {L} has the edge.",
            "I favour {L}.", "{L} is the stronger image.", "Image {O} is inferior.", "Answer: {L}"]


def _rationale(label: str, verdict: str) -> str:
    other = "B" if label == "A" else "A"
    v = verdict.format(L=label, O=other)
    return EVIDENCE.format(v1=v, v2=v, v3=v, L=label)


@pytest.mark.parametrize("verdict", VERDICTS)
def test_strip_verdict_removes_every_verdict_keeps_evidence_and_scores(verdict):
    from rewardkit.parrot.format import parse_pairwise, strip_verdict

    a, b = _rationale("A", verdict), _rationale("B", verdict)
    assert parse_pairwise(a).preferred == "A" and parse_pairwise(b).preferred == "B"
    sa, sb = strip_verdict(a), strip_verdict(b)
    # the same evidence with the opposite verdict gives the same stage-2 text: nothing about the label survives
    assert sa == sb
    assert "Preferred" not in sa and "annotators" not in sa
    for words in ("better", "wins", "prefer", "go with", "superior", "winner", "worse", "outperforms", "Choose",
                  "answer", "Verdict", ">", "chosen", "beats", "edge", "favour", "stronger", "inferior"):
        assert words.lower() not in sa.lower(), words
    # evidence and scores survive, in the canonical format
    assert "Image A shows a red bicycle against a brick wall. Image B's bicycle is blue." in sa
    assert "The spokes of Image B merge into the frame; Image A has clean spokes." in sa
    assert "Summary: The wheel of Image B is distorted." in sa
    assert "Scores: A = 3.5, B = 2\n" in sa and "Scores: A = 3, B = 2.5\n" in sa
    assert strip_verdict(sa) == sa  # idempotent: stripped text still parses (without a Preferred line)


#: phrasings a blacklist of verdict words misses: a candidate with nothing else, idioms, Unicode look-alikes and
#: invisible characters (an LLM teacher reads "Image \u0412", "Ｂ" or "bet\u200bter" as the verdict they spell)
VERDICTS_HARD = ["Overall, Image {L}.", "Image {L} overall.", "It is {L}.", "The label is {L}.", "Image {L}!",
                 "Image {L} it is.", "Go {L}.", "\u2192 {L}", "{L} \u2713", "The nod goes to Image {L}.",
                 "Image {L} comes out on top.", "Image {L} is the clear standout.", "I'd lean towards {L}.",
                 "{L} \u226b {O}.", "Image {L} is the more faithful and higher-quality result overall.",
                 "Image {L} is bet\u200bter.", "Image {L} is pre\u00adferable.",
                 "Image {L} is \U0001d41b\U0001d41e\U0001d42d\U0001d42d\U0001d41e\U0001d42b."]
LOOKALIKE = {"A": ("\u0410", "\uff21", "\U0001d400"), "B": ("\u0412", "\uff22", "\U0001d401")}


@pytest.mark.parametrize("verdict", VERDICTS_HARD)
def test_strip_verdict_hard_phrasings_and_unicode(verdict):
    from rewardkit.parrot.format import strip_verdict

    sa, sb = strip_verdict(_rationale("A", verdict)), strip_verdict(_rationale("B", verdict))
    assert sa == sb and strip_verdict(sa) == sa
    assert "The spokes of Image B merge into the frame; Image A has clean spokes." in sa


@pytest.mark.parametrize("i", range(3))
def test_strip_verdict_lookalike_letters(i):
    """Cyrillic / fullwidth / mathematical A and B in a verdict: the verdict goes (whichever letter it names)."""
    from rewardkit.parrot.format import is_verdict, strip_verdict

    for lab in "AB":
        v = f"Image {LOOKALIKE[lab][i]} is better."
        assert is_verdict(v)
        s = strip_verdict(_rationale(lab, v))
        assert "better" not in s and LOOKALIKE[lab][i] not in s


def test_strip_verdict_parses_the_rationale_as_stage_1_did():
    """Cleaning (NFKC, no zero-width characters) applies to the texts, never before the parse: a rationale that
    stage 1 accepted, with a zero-width space that hid a second header, still strips (it raised ParseError,
    which would stop the whole filter stage)."""
    from rewardkit.parrot.format import parse_pairwise, strip_verdict

    hidden = "bicycle is blue.\nText\u200b Faithfulness: noted"  # a header only once the zero-width space goes
    r = _rationale("B", "Image B is better.").replace("bicycle is blue.", hidden)
    assert parse_pairwise(r).preferred == "B"
    s = strip_verdict(r)
    assert "\u200b" not in s and "better" not in s and strip_verdict(s) == s


def test_strip_verdict_drops_text_outside_the_sections():
    from rewardkit.parrot.format import strip_verdict

    r = "Clearly B.\n" + _rationale("B", "") + "I would pick B any day.\n"
    s = strip_verdict(r)
    assert "B." not in s.split("\n")[0] and "pick" not in s and s.startswith("Text Faithfulness:")


def test_stage2_prompts_are_label_blind_and_unsupported_verdicts_are_rejected(tmp_path):
    """The same pair with label A and with label B: stage 1 (anchored) writes opposite verdicts over the same
    evidence; stage 2 gets byte-identical prompts with no verdict, and keeps only the rationale whose evidence
    supports its label (the label-B one, contradicted by its own scores, is rejected). Before the fix the
    prompt carried "Preferred: <label>" and both were kept."""
    from rewardkit.parrot.testing import _parts

    d = tmp_path / "pairs"
    d.mkdir()
    grey(BRIGHT).save(d / "bright.png")
    grey(DARK).save(d / "dark.png")
    with open(d / "metadata.jsonl", "w") as f:
        for lab in ("A", "B"):
            f.write(json.dumps({"prompt": "a cat", "image_a": "bright.png", "image_b": "dark.png", "label": lab}) + "\n")

    class Recording(ScriptedTeacher):
        stage2: list[str] = []

        def generate(self, conversations, **kw):
            for c in conversations:
                _, text = _parts(c)
                if "--- evaluation ---" in text:
                    self.stage2.append(text)
            return super().generate(conversations, **kw)

    teacher = Recording()
    pipe = Pipeline(cfg_for(tmp_path, d), teacher=teacher, progress=False)
    rep = pipe.run_stages()
    rats = {r["row"]: r["rationale"] for r in pipe.rationales.records.values()}
    assert "Preferred: A" in rats[0] and "Preferred: B" in rats[1] and "Image B is better" in rats[1]
    assert len(teacher.stage2) == 2 and teacher.stage2[0] == teacher.stage2[1]
    for t in teacher.stage2:
        shown = t.split("--- evaluation ---", 1)[1].split("--- end ---", 1)[0]
        for leak in ("Preferred", "better", "Human annotators"):
            assert leak not in shown
    f = {r["row"]: r for r in pipe.filtered.records.values()}
    assert f[0]["reason"] == "kept" and f[1]["reason"] == "wrong_prediction" and f[1]["prediction"] == "A"
    assert f[0]["evidence"] in teacher.stage2[0] and rep["keep_rate"] == 0.5


def test_tiny_recipe_keep_rate_from_evidence():
    """The tiny recipe's data (synthetic:brightness, 16 pairs, seed 0) through stages 1-2 with the scripted
    teacher: the brighter image always wins, so every verdict agrees with the content, but 2 pairs' qualities
    round to the same value (scores equal in every dimension): their evidence separates nothing and they are
    dropped as non-predictive. Keep rate 14/16 = 0.875 (it was 1.0 when stage 2 could read "Preferred:")."""
    import tempfile
    from pathlib import Path

    import yaml

    from rewardkit.parrot.testing import _parts, quality
    from rewardkit.train.data import load_pairs

    recipe = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / "parrot" / "tiny.yaml").read_text())
    assert recipe["data"] == {"train": "synthetic:brightness", "synthetic_size": 16} and recipe["seed"] == 0
    assert recipe["teacher"]["judge"] == "scripted"
    shown = []

    class Recording(ScriptedTeacher):
        def generate(self, conversations, **kw):
            shown.extend(t.split("--- evaluation ---", 1)[1].split("--- end ---", 1)[0]
                         for _, t in map(_parts, conversations) if "--- evaluation ---" in t)
            return super().generate(conversations, **kw)

    cfg = ParrotConfig(output_dir=tempfile.mkdtemp(), data=DataCfg(train="synthetic:brightness", synthetic_size=16),
                       teacher=TeacherCfg(judge="scripted"), batch_size=recipe["batch_size"], seed=recipe["seed"])
    pipe = Pipeline(cfg, teacher=Recording(), progress=False)
    pipe.rationalize()
    pipe.filter()
    rep = pipe.report()
    assert len(shown) == 16 and not any("Preferred" in t or "better" in t for t in shown)
    ds, _ = load_pairs("synthetic:brightness", synthetic_size=16, seed=0)
    ties = sum(quality(r["image_a"]) == quality(r["image_b"]) for r in ds)  # computed from the images alone
    assert ties == 2 and rep["counts"]["unparseable_prediction"] == ties
    assert rep["kept"] == 16 - ties and rep["keep_rate"] == 0.875


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
