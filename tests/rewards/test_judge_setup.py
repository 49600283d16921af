"""The judge rewards' shared constructor set-up (rewardkit/rewards/_judge_setup.py), through the rewards that use
it: which backend spec and load_judge keywords a config gives, the error when there is no judge, EVR's separate
verifier, and a generative judge's token budget and answer scale from its template. Expected values are written
out by hand from the documented option rules (the config fields' comments in vqascore.py / evr.py / qwenvl.py)."""

from __future__ import annotations

import pytest

import rewardkit.judges as judges
from rewardkit.rewards.evr import EVR
from rewardkit.rewards.qwenvl import QwenVLAesthetic
from rewardkit.rewards.rational import RationalReward
from rewardkit.rewards.unifiedreward import UnifiedReward
from rewardkit.rewards.vqascore import VQAScore


@pytest.fixture
def loads(monkeypatch):
    """Every load_judge call as ``(spec, kwargs)``; each returns a fresh marker object instead of a backend."""
    calls = []

    def fake_load_judge(spec, **kwargs):
        calls.append((spec, kwargs))
        return object()

    monkeypatch.setattr(judges, "load_judge", fake_load_judge)
    return calls


@pytest.mark.parametrize("options, expected", [
    # a bare checkpoint is the transformers backend; device and dtype go to it
    ({"model": "org/ckpt", "device": "cpu", "dtype": "bfloat16"},
     ("transformers:org/ckpt", {"device": "cpu", "dtype": "bfloat16"})),
    # judge= wins over model=; vLLM takes dtype, not device
    ({"judge": "vllm:org/ckpt", "model": "org/other", "device": "cpu", "dtype": "bfloat16"},
     ("vllm:org/ckpt", {"dtype": "bfloat16"})),
    # an OpenAI-compatible server takes neither; judge_kwargs pass through
    ({"judge": "openai:http://127.0.0.1:9/v1", "judge_kwargs": {"model": "m"}, "device": "cpu", "dtype": "float16"},
     ("openai:http://127.0.0.1:9/v1", {"model": "m"})),
    # judge_kwargs win over the device / dtype shorthands
    ({"judge": "hf:org/ckpt", "judge_kwargs": {"device": "cuda:1"}, "device": "cpu", "dtype": None},
     ("hf:org/ckpt", {"device": "cuda:1"})),
])
@pytest.mark.parametrize("cls", [VQAScore, QwenVLAesthetic, UnifiedReward, EVR, RationalReward])
def test_judge_spec_and_keywords_from_the_config(loads, cls, options, expected):
    reward = cls(**options)
    assert loads == [expected]
    assert reward.judge is not None


@pytest.mark.parametrize("cls", [VQAScore, QwenVLAesthetic, UnifiedReward, EVR, RationalReward])
def test_a_spec_string_given_as_judge_is_the_config_option(loads, cls):
    reward = cls(judge="vllm:org/ckpt", dtype=None)  # (qwenvl's dtype defaults to bfloat16)
    assert reward.config.judge == "vllm:org/ckpt"
    assert loads == [("vllm:org/ckpt", {})]


@pytest.mark.parametrize("cls", [VQAScore, QwenVLAesthetic, UnifiedReward, EVR, RationalReward])
def test_a_backend_object_is_used_as_given(loads, cls):
    backend = object()
    reward = cls(judge=(backend, backend), model="org/ignored")
    assert loads == [((backend, backend), {})]  # the object, not the config's model
    assert reward.config.judge == ""


@pytest.mark.parametrize("cls, message", [
    (VQAScore, "vqascore needs a judge: load_reward('vqascore', judge="),
    (QwenVLAesthetic, "qwenvl needs a judge: load_reward('qwenvl', judge="),
    (UnifiedReward, "unifiedreward needs a judge: load_reward('unifiedreward', judge="),
    (EVR, "EVR needs a judge: load_reward('evr', judge="),
    (RationalReward, "rational needs a model: load_reward('rational', model='<distilled checkpoint>')"),
])
def test_no_judge_is_a_clear_error(loads, cls, message):
    with pytest.raises(ValueError) as err:
        cls(model="")  # (qwenvl's model defaults to flow_grpo's checkpoint)
    assert str(err.value).startswith(message)
    assert loads == []


def test_evr_verifier_is_the_judge_unless_given(loads):
    reward = EVR(judge="transformers:org/a", device="cpu")
    assert loads == [("transformers:org/a", {"device": "cpu"})]
    assert reward.verifier_backend is reward.judge
    loads.clear()
    reward = EVR(judge="transformers:org/a", verifier_judge="org/b", device="cpu", dtype="float16")
    # the verifier spec alone (never the model shorthand), with the same device / dtype rules
    assert loads == [("transformers:org/a", {"device": "cpu", "dtype": "float16"}),
                     ("transformers:org/b", {"device": "cpu", "dtype": "float16"})]
    assert reward.verifier_backend is not reward.judge
    assert reward.config.verifier_judge == "org/b"
    loads.clear()
    verifier = object()
    reward = EVR(judge="vllm:org/a", verifier_judge=verifier)
    assert loads == [("vllm:org/a", {}), (verifier, {})]


# (the default template's max_new_tokens: qwenvl/default.yaml 2048; unifiedreward/t2i.yaml states none, so
# the family default 512); a template without one: 2048 (qwenvl.py) / 512 (unifiedreward.py)
@pytest.mark.parametrize("cls, default_template_tokens, family_default",
                         [(QwenVLAesthetic, 2048, 2048), (UnifiedReward, 512, 512)])
def test_token_budget_and_scale_from_the_template(loads, tmp_path, cls, default_template_tokens, family_default):
    assert cls(judge="vllm:x").max_new_tokens == default_template_tokens
    assert cls(judge="vllm:x", max_new_tokens=7).max_new_tokens == 7
    for bad in ({"max_new_tokens": 0}, {"batch_size": 0}):
        with pytest.raises(ValueError, match="batch_size and max_new_tokens must be >= 1"):
            cls(judge="vllm:x", **bad)
    own = tmp_path / "own.yaml"
    own.write_text('version: "t"\npointwise: "Rate it."\nscore_min: 0\nscore_max: 10\n', encoding="utf-8")
    reward = cls(judge="vllm:x", template=str(own))
    assert reward.score_range == (0.0, 10.0)
    assert reward.max_new_tokens == family_default  # no template value: the family's default
    for lo, hi in ((5, 5), (1, ".inf")):
        own.write_text(f'version: "t"\npointwise: "x"\nscore_min: {lo}\nscore_max: {hi}\n', encoding="utf-8")
        with pytest.raises(ValueError, match="score_min < score_max required"):
            cls(judge="vllm:x", template=str(own))
