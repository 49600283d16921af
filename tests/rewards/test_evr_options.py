"""Documented options of the EVR reward (docs/judges.md, docs/zoo.md), each with a test that fails when the option
is ignored or mis-wired: defaults, sampling options, the binary verifier's threshold, ``eps``, the verifier judge
(object or spec string), a custom template, reference roles, one judge session per call, the model shorthand and
the command line against an OpenAI-compatible server."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("httpx")

from rewardkit import load_reward  # noqa: E402
from rewardkit.rewards.evr import EVR, EVRConfig  # noqa: E402
from rewardkit.testing import random_images  # noqa: E402
from tests.helpers.evr_judges import PAPER_CASE, ScriptedJudge, scripted  # noqa: E402
from tests.helpers.judge_servers import Server  # noqa: E402

INSTRUCTION = "put the cat from image 1 on the sofa of image 2"


@pytest.fixture(scope="module")
def imgs():
    return random_images(4, sizes=[(32, 32), (48, 40)], seed=11)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _texts(conv) -> str:
    return " ".join(c["text"] for c in conv[-1]["content"] if c.get("type") == "text")


class RecordingJudge(ScriptedJudge):
    """ScriptedJudge that keeps every conversation and the generate keyword arguments it was sent."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.gen_convs, self.prob_convs, self.gen_kwargs = [], [], []

    def generate(self, conversations, **kw):
        self.gen_convs += conversations
        self.gen_kwargs.append(kw)
        return super().generate(conversations, **kw)

    def choice_probs(self, conversations, choices):
        self.prob_convs += conversations
        return super().choice_probs(conversations, choices)


def recording(case=PAPER_CASE) -> RecordingJudge:
    base = scripted(case)
    return RecordingJudge(base.answers, base.verdicts)


# ============================================================================================== EVR options
def test_evr_defaults_are_the_documented_ones():
    cfg = EVRConfig()
    documented = {"k": 4, "temperature": 0.7, "max_new_tokens": 128, "seed": 0, "verifier": "binary",
                  "all_rejected": "invalid", "eps": 1e-6, "aggregate": "geometric", "use_dimensions": True,
                  "cot": True, "max_retries": 2, "unparsed": "invalid", "output": "normalized",
                  "verifier_judge": "", "on_judge_error": "auto", "compare_mode": "pairwise", "batch_size": 8,
                  "template": "default"}
    assert {k: getattr(cfg, k) for k in documented} == documented
    assert cfg.dimensions == ("reference_consistency", "scene_consistency", "harmony", "instruction_consistency",
                              "visual_quality")


def test_evr_sampling_options_reach_the_evaluator(imgs):
    judge = recording()
    EVR(judge=judge, k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert judge.gen_kwargs == [{"n": 3, "temperature": 0.7, "max_new_tokens": 128, "seed": 0}]
    judge = recording()
    EVR(judge=judge, k=3, temperature=0.2, max_new_tokens=33, seed=5)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert judge.gen_kwargs == [{"n": 3, "temperature": 0.2, "max_new_tokens": 33, "seed": 5}]


@pytest.mark.parametrize("p_yes,accepted", [(0.5, True), (0.49, False)])
def test_evr_binary_verifier_threshold_is_p_yes_at_least_half(imgs, p_yes, accepted):
    # RC: scores [4, 5, 2], verdicts: hypothesis 0 -> 1.0, hypothesis 1 -> p_yes, hypothesis 2 -> 0.0
    judge = scripted()
    judge.verdicts["evidence RC1 "] = p_yes
    out = EVR(judge=judge, k=3, eps=0.0)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    want = (4 + 5) / 2 if accepted else 4.0   # v = 1 iff P(Yes) >= 0.5
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(want, rel=1e-6)


def test_evr_eps_enters_the_formula(imgs):
    # RC: r = (4 + 5) / (2 + eps); with eps = 1 that is 9 / 3 = 3 (not 4.5)
    out = EVR(judge=scripted(), k=3, eps=1.0)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.dimensions["reference_consistency"][0].item() == pytest.approx(3.0, rel=1e-6)


def test_evr_verifier_judge_object_gets_every_yes_no_question(imgs):
    evaluator, verifier = recording(), recording()
    # the separate verifier accepts every hypothesis; the evaluator's own table would reject some
    verifier.verdicts = {}
    reward = EVR(judge=evaluator, verifier_judge=verifier, k=3)
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert evaluator.prob_calls == [] and verifier.gen_calls == []
    assert verifier.prob_calls == [(15, ("Yes", "No"))]
    # all verified: r_d = mean S = 11/3, 3, 7/3, 10/3, 14/3 (with the evaluator's verdicts R would be 1260^(1/5))
    means = [11 / 3, 3, 7 / 3, 10 / 3, 14 / 3]
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)
    assert out.info["verifier_judge"] == {"kind": "scripted"}
    # the verifier is asked about the evaluator's claims
    assert "evidence RC0" in _texts(verifier.prob_convs[0])
    same = EVR(judge=evaluator, k=3)
    assert same.verifier_backend is same.judge and same._info()["verifier_judge"] is None


def test_evr_verifier_judge_spec_string_loads_its_own_backend(imgs, server):
    # evaluator: a scripted object; verifier: an OpenAI-compatible server given as a spec string
    # (judge_kwargs go to the spec-built backend). The server answers P(Yes) = 0.6 / (0.6 + 0.3) = 2/3.
    evaluator = recording()
    reward = load_reward("evr", judge=evaluator, verifier_judge=f"openai:{server.url}", k=3,
                         judge_kwargs={"model": "tiny-judge", "api_key": "sk-test", "backoff": 0.01})
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert evaluator.prob_calls == []
    questions = [r for r in server.requests if r["path"] == "/v1/chat/completions"]
    assert len(questions) == 15 and all(r["body"]["max_tokens"] == 1 for r in questions)
    assert out.info["verifier_judge"]["kind"] == "openai"
    means = [11 / 3, 3, 7 / 3, 10 / 3, 14 / 3]   # binary: 2/3 >= 0.5 accepts every hypothesis
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)
    soft = load_reward("evr", judge=recording(), verifier_judge=f"openai:{server.url}", k=3, verifier="soft",
                       judge_kwargs={"model": "tiny-judge", "api_key": "sk-test", "backoff": 0.01})
    # soft: every v = 2/3, so r_d = (2/3 sum S) / (3 * 2/3 + eps) = mean S again (eps 1e-6 aside)
    out = soft(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.dimensions["raw"][0].item() == pytest.approx(math.prod(means) ** 0.2, rel=1e-5)


def _custom_template(tmp_path: Path, **changes) -> Path:
    import yaml

    from rewardkit.judges import load_template

    data = yaml.safe_load(Path(load_template("evr").path).read_text(encoding="utf-8"))
    data.update(changes)
    path = tmp_path / "my_evr.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_evr_custom_template_file(imgs, tmp_path):
    path = _custom_template(
        tmp_path, version="7",
        context="CTX-MARK {n_refs} refs{ref_roles}; instruction <<{instruction}>>",
        verify="VERIFY-MARK Is this claim about the {title} true? Claim: {claim}. Ja oder Nein.",
        verify_choices=["Ja", "Nein"])
    judge = recording()
    judge_choices = []
    orig = judge.choice_probs

    def choice_probs(convs, choices):   # answer the custom labels with the scripted verdicts
        judge_choices.append(tuple(choices))
        return orig(convs, ["Yes", "No"])

    judge.choice_probs = choice_probs
    reward = load_reward("evr", judge=judge, template=str(path), k=3, eps=1e-6)
    out = reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])
    assert out.info["template"] == "evr/my_evr@7"
    ctx = f"CTX-MARK 2 refs; instruction <<{INSTRUCTION}>>"
    assert all(ctx in _texts(c) for c in judge.gen_convs + judge.prob_convs)
    assert all("VERIFY-MARK" in _texts(c) for c in judge.prob_convs) and len(judge.prob_convs) == 15
    assert not any("VERIFY-MARK" in _texts(c) for c in judge.gen_convs)
    assert judge_choices == [("Ja", "Nein")]
    assert out.dimensions["raw"][0].item() == pytest.approx(1260 ** 0.2, rel=1e-5)   # same answers, same R
    # a template without a version, or missing a placeholder field the reward renders, is refused clearly
    bad = tmp_path / "bad.yaml"
    bad.write_text("context: hi\n", encoding="utf-8")
    with pytest.raises(ValueError, match="version"):
        load_reward("evr", judge=recording(), template=str(bad))
    broken = _custom_template(tmp_path, context="{n_refs} {nonexistent} {instruction}")
    with pytest.raises(KeyError, match="nonexistent"):
        load_reward("evr", judge=recording(), template=str(broken), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]])


def test_evr_reference_roles_reach_every_question(imgs):
    judge = recording()
    reward = EVR(judge=judge, k=3)
    reward(imgs[:1], INSTRUCTION, sources=[imgs[1:3]], metadata=[{"reference_roles": ["object", "scene"]}])
    roles = "(image 1: object; image 2: scene)"
    assert judge.gen_convs and judge.prob_convs
    assert all(roles in _texts(c) for c in judge.gen_convs + judge.prob_convs)
    # the pairwise question carries them too
    judge.prob_convs.clear()
    reward.compare(imgs[:1], imgs[3:4], INSTRUCTION, sources=[imgs[1:3]],
                   metadata=[{"reference_roles": ["object", "scene"]}])
    assert len(judge.prob_convs) == 2 and all(roles in _texts(c) for c in judge.prob_convs)
    # roles that do not match the references are that sample's input error (never silently dropped), and the
    # judge is not asked about it; the other samples are scored
    judge2 = recording()
    out = EVR(judge=judge2, k=3)(imgs[:2], INSTRUCTION, sources=[imgs[1:3], imgs[1:3]],
                                 metadata=[{"reference_roles": ["object"]}, {}], on_error="nan")
    assert out.valid.tolist() == [False, True]
    assert "1 role(s) for 2 reference image(s)" in out.errors[0]
    assert not any("image 1:" in _texts(c) for c in judge2.gen_convs) and judge2.gen_convs
    from rewardkit.errors import RewardInputError
    with pytest.raises(RewardInputError, match="reference_roles"):
        EVR(judge=recording(), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]],
                                    metadata=[{"reference_roles": ["object", 3]}])
    with pytest.raises(RewardInputError, match="1 role"):        # compare() counts the references alone
        EVR(judge=recording(), k=3).compare(imgs[:1], imgs[3:4], INSTRUCTION, sources=[imgs[1:3]],
                                            metadata=[{"reference_roles": ["object"]}])
    empty = EVR(judge=recording(), k=3)(imgs[:1], INSTRUCTION, sources=[imgs[1:3]], metadata=[{"reference_roles": []}])
    assert empty.valid.all()                                   # [] = no roles


def test_evr_one_judge_session_per_call_across_chunks(imgs):
    """docs/judges.md: a reward call is one judge session whatever `batch_size` chunks it into (the tiny-Qwen
    test in test_evr.py counts the encoded images; this counts the sessions and the chunked calls)."""
    judge = scripted()
    out = EVR(judge=judge, k=3)(imgs[:3], INSTRUCTION, sources=[imgs[1:3]] * 3, batch_size=1)
    assert out.valid.all() and judge.sessions == 1
    assert [c[0] for c in judge.gen_calls] == [5, 5, 5]   # three chunks of one candidate x five dimensions
    assert EVR(judge=scripted(), k=3).default_batch_size == 8


def test_evr_model_shorthand_and_judge_kwargs(tiny_qwen2_5_vl_dir, server):
    # --model / model= is shorthand for a transformers judge; a spec with a backend prefix is used as is
    evr = EVR(model=str(tiny_qwen2_5_vl_dir), device="cpu", k=1, max_retries=0, max_new_tokens=2)
    assert evr.judge.describe()["kind"] == "transformers"
    evr = EVR(model=f"openai:{server.url}", judge_kwargs={"model": "served-name", "api_key": "sk"})
    assert evr.judge.describe()["kind"] == "openai" and evr.judge.model == "served-name"


def test_evr_command_line_against_an_openai_server(server, tmp_path, imgs):
    """The documented `rewardkit score -r evr --set judge=openai:... judge_kwargs.model=... k=4 verifier=binary`."""
    from rewardkit.cli import main

    paths = []
    for i, im in enumerate(imgs[:3]):
        p = tmp_path / f"{i}.png"
        im.save(p)
        paths.append(str(p))
    out = tmp_path / "evr.jsonl"
    rc = main(["score", "-r", "evr", "--set", f"judge=openai:{server.url}", "judge_kwargs.model=tiny-judge",
               "judge_kwargs.api_key=sk", "k=4", "verifier=binary", "--prompt", "Put the mug from image 1 on the table",
               paths[0], "--sources", paths[1], paths[2], "-o", str(out), "--no-progress"])
    assert rc == 0
    row = json.loads(out.read_text().splitlines()[0])
    # the server's k = 4 answers score 4, 3, 4, 3; P(Yes) = 2/3 accepts all: r_d = 3.5 for all five, R = 3.5
    assert row["score"] == pytest.approx((3.5 - 1) / 4, rel=1e-6)
    gens = [r for r in server.requests if r["body"].get("n") == 4]
    assert len(gens) == 5 and all(r["body"]["model"] == "tiny-judge" for r in gens)
