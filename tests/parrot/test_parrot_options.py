"""Documented options of docs/parrot.md that had no test of their own: what each PARROT stage sees, a custom
template used and recorded, and RationalRewards with a custom template."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rewardkit import load_reward  # noqa: E402


# ============================================================================================== parrot
def _grey(v: int):
    from PIL import Image

    return Image.fromarray(np.full((32, 32, 3), v, dtype=np.uint8), "RGB")


@pytest.fixture
def parrot_pairs(tmp_path) -> Path:
    """Three t2i pairs (label A, B, A), one single-source edit, one two-source edit (skipped)."""
    d = tmp_path / "pairs"
    d.mkdir()
    for name, v in (("bright", 255), ("dark", 0), ("src", 128), ("src2", 64)):
        _grey(v).save(d / f"{name}.png")
    rows = [("a cat", "bright", "dark", "A", []), ("a dog", "dark", "bright", "B", []),
            ("a car", "bright", "dark", "A", []), ("add a hat", "bright", "dark", "A", ["src.png"]),
            ("merge them", "bright", "dark", "A", ["src.png", "src2.png"])]
    with open(d / "metadata.jsonl", "w") as f:
        for p, a, b, lab, src in rows:
            f.write(json.dumps({"prompt": p, "image_a": f"{a}.png", "image_b": f"{b}.png", "label": lab,
                                "sources": src}) + "\n")
    return d


class RecordingTeacher:
    """Wraps the scripted teacher: records each stage's conversations (by the template's markers) and sessions."""

    def __new__(cls):
        from rewardkit.parrot.testing import ScriptedTeacher, _parts

        class _T(ScriptedTeacher):
            def __init__(self):
                super().__init__()
                self.seen: dict[str, list[tuple[int, str]]] = {"rationale": [], "filter": [], "project": []}
                self.sessions = 0

            def session(self):
                self.sessions += 1
                return super().session()

            def generate(self, conversations, **kw):
                for c in conversations:
                    imgs, text = _parts(c)
                    stage = ("filter" if "--- evaluation ---" in text else "project"
                             if "--- reference comparison ---" in text else "rationale")
                    self.seen[stage].append((len(imgs), text))
                return super().generate(conversations, **kw)

        return _T()


def test_parrot_stages_see_what_the_doc_says(tmp_path, parrot_pairs):
    """Stage 1 sees the pair, the request (+ source) and the human label; stage 2 neither the label nor any
    image, only the rationale; stage 3 one image of the pair (+ source) with the rationale as a hint.
    Multi-reference edits are skipped."""
    from rewardkit.parrot.pipeline import DataCfg, ParrotConfig, Pipeline

    teacher = RecordingTeacher()
    cfg = ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train=str(parrot_pairs)), batch_size=2)
    pipe = Pipeline(cfg, teacher=teacher, progress=False)
    rep = pipe.run_stages()
    rats = {r["row"]: r for r in pipe.rationales.records.values()}
    assert rats[4]["status"] == "skipped" and "multi-reference" in rats[4]["reason"]
    assert rep["counts"]["skipped"] == 1 and rep["kept"] == 4
    seen = teacher.seen
    # stage 1: 2 images (t2i) or 3 (source + pair), the label stated
    assert sorted(n for n, _ in seen["rationale"]) == [2, 2, 2, 3]
    labels = [t.split("Human annotators preferred Image", 1)[1].strip()[0] for _, t in seen["rationale"]]
    assert sorted(labels) == ["A", "A", "A", "B"]
    # stage 2: no image, no label line, the rationale in full (the default view; recorded as `evidence`)
    from rewardkit.parrot.format import consistency_view

    assert len(seen["filter"]) == 4 and all(n == 0 for n, _ in seen["filter"])
    assert not any("Human annotators preferred" in t or "Preferred:" in t for _, t in seen["filter"])
    evidence = {r["row"]: r["evidence"] for r in pipe.filtered.records.values() if r["evidence"]}
    for _, t in seen["filter"]:
        assert any(consistency_view(r["rationale"]) == evidence[i] and evidence[i] in t
                   for i, r in rats.items() if r["rationale"])
    # stage 3: each image of a kept pair alone (+ the source for the edit), the verified rationale as a hint
    assert len(seen["project"]) == 8 and sorted(n for n, _ in seen["project"]) == [1] * 6 + [2] * 2
    for _, t in seen["project"]:
        assert any(r["rationale"] and r["rationale"] in t for r in rats.values())
    # `parrot run` keeps one judge session per batch of pairs across stages 1-3 (5 pairs, batch_size 2)
    assert teacher.sessions == 3


def test_parrot_custom_template_is_used_and_recorded(tmp_path, parrot_pairs):
    import yaml

    from rewardkit.judges import load_template
    from rewardkit.parrot.pipeline import DataCfg, ParrotConfig, Pipeline

    data = yaml.safe_load(Path(load_template("parrot").path).read_text(encoding="utf-8"))
    data["version"] = "9"
    path = tmp_path / "my_parrot.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    cfg = ParrotConfig(output_dir=str(tmp_path / "out"), data=DataCfg(train=str(parrot_pairs)),
                       template=str(path), batch_size=8)
    pipe = Pipeline(cfg, teacher=RecordingTeacher(), progress=False)
    pipe.run_stages()
    for name in ("rationales", "filtered", "projected"):
        rows = [json.loads(x) for x in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
        assert rows and all(r["template"] == "parrot/my_parrot@9" for r in rows), name


def test_rational_reward_custom_template(tmp_path):
    import yaml

    from rewardkit.judges import load_template
    from rewardkit.parrot.testing import ScriptedTeacher

    data = yaml.safe_load(Path(load_template("parrot").path).read_text(encoding="utf-8"))
    data["version"] = "5"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    r = load_reward("rational", judge=ScriptedTeacher(), template=str(path))
    out = r([_grey(255)], "a cat")
    # scripted: text faithfulness = physical quality = 4 (bright), others N/A -> mean 4 -> (4 - 1) / 3 = 1
    assert out.valid.all() and out.scores[0].item() == pytest.approx(1.0)
    assert out.info["template"] == "parrot/mine@5"
