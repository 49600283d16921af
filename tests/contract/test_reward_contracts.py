"""Documented contracts of ``rewardkit.reward`` (the base class's plumbing) that the contract tests leave open
(found by mutation testing): output normalisation and serialisation, ``concat``, ``PairwiseOutput``'s checks,
``RewardBatch`` defaults and ``select``, the per-argument validation of a call (prompts, sources, metadata),
chunking, scattering invalid samples back, ``compare`` with a temperature, the tensor fast-path dispatch and
the discovery of image processors.

Every reward here scores each image by a value read off its pixels, so expected scores are hand-computed.
"""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.errors import ConfigError, RewardInputError
from rewardkit.reward import PairwiseOutput, Reward, RewardBatch, RewardConfig, RewardOutput, config_dict

NAN = float("nan")


def img(v: int, size: int = 4) -> np.ndarray:
    return np.full((size, size, 3), v, np.uint8)


class Red(Reward):
    """Score = red value / 255 of the top-left pixel; records every batch it is handed."""

    name = "red"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches: list[RewardBatch] = []

    def _score(self, batch):
        self.batches.append(batch)
        return RewardOutput(scores=[im.getpixel((0, 0))[0] / 255 for im in batch.images])


def _nan_eq(t, want):
    return torch.allclose(t, torch.tensor(want, dtype=torch.float32), equal_nan=True)


# ------------------------------------------------------------------ RewardOutput
def test_output_normalisation():
    out = RewardOutput(scores=[[1, 2], [3, 4]])
    assert out.scores.dtype == torch.float32 and out.scores.tolist() == [1.0, 2.0, 3.0, 4.0] and len(out) == 4
    assert out.errors == [None] * 4 and out.valid.tolist() == [True] * 4 and out.valid.dtype == torch.bool
    assert out.dimensions == {} and out.rationales is None and out.details is None and out.info == {}
    # a reward's valid mask AND finiteness; errors of valid samples are dropped, invalid ones get a reason
    out = RewardOutput(scores=[1.0, 2.0, NAN, 4.0], valid=[1, 0, 1, 1], errors=["stale", None, None, None])
    assert out.valid.tolist() == [True, False, False, True]
    assert out.errors == [None, "marked invalid by the reward", "non-finite score", None]
    out = RewardOutput(scores=[1.0], valid=[False], errors=["judge refused"])
    assert out.errors == ["judge refused"]
    d = RewardOutput(scores=[1.0, 2.0], dimensions={"a": torch.tensor([1, 2], dtype=torch.int64)}).dimensions["a"]
    assert d.dtype == torch.float32 and d.tolist() == [1.0, 2.0]
    for kw, msg in [({"errors": [None]}, "errors has 1 entries for 2 scores"),
                    ({"errors": [None] * 3}, "errors has 3 entries for 2 scores"),
                    ({"valid": [False]}, "valid has 1 entries for 2 values"),         # never broadcast
                    ({"rationales": ["a", "b", "c"]}, "rationales has 3 entries for 2 scores"),
                    ({"details": []}, "details has 0 entries for 2 scores"),
                    ({"dimensions": {"x": [1.0]}}, "dimension 'x' has 1 values for 2 scores")]:
        with pytest.raises(ValueError, match=msg):
            RewardOutput(scores=[1.0, 2.0], **kw)


def test_output_keeps_the_graph_of_scores_that_require_grad():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    out = RewardOutput(scores=x * 3)
    assert out.scores.requires_grad and out.scores.dtype == torch.float32
    out.scores.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    assert not RewardOutput(scores=torch.ones(2, requires_grad=False)).scores.requires_grad


def test_invalid_tolist_records_to_dict():
    inv = RewardOutput.invalid(3, "no answer", dimensions=("a", "b"))
    assert inv.valid.tolist() == [False] * 3 and inv.errors == ["no answer"] * 3 and len(inv) == 3
    assert set(inv.dimensions) == {"a", "b"} and all(torch.isnan(v).all() for v in inv.dimensions.values())
    inv.dimensions["a"][0] = 1.0
    assert torch.isnan(inv.dimensions["b"][0]) and torch.isnan(inv.scores[0])   # no shared storage
    assert RewardOutput.invalid(2, "x").dimensions == {}
    out = RewardOutput(scores=[0.5, 2.0, float("inf")], valid=[True, False, True])
    assert out.tolist() == [0.5, None, None]
    assert out.records() == [{"score": 0.5, "valid": True, "error": None},
                             {"score": 2.0, "valid": False, "error": "marked invalid by the reward"},
                             {"score": None, "valid": False, "error": "non-finite score"}]
    out = RewardOutput(scores=[0.5, NAN], dimensions={"a": [1.0, NAN]}, rationales=["why", None],
                       details=[None, {"k": 1}], info={"model": "m"})
    assert out.records() == [{"score": 0.5, "valid": True, "error": None, "dimensions": {"a": 1.0}, "rationale": "why"},
                             {"score": None, "valid": False, "error": "non-finite score", "dimensions": {"a": None},
                              "rationale": None, "details": {"k": 1}}]
    assert out.to_dict() == {"scores": [0.5, None], "valid": [True, False], "errors": [None, "non-finite score"],
                             "dimensions": {"a": [1.0, None]}, "rationales": ["why", None], "info": {"model": "m"},
                             "details": [None, {"k": 1}]}
    d = RewardOutput(scores=[1.0]).to_dict()
    assert d["rationales"] is None and d["details"] is None and d["dimensions"] == {}
    assert RewardOutput(scores=[-float("inf")]).to_dict()["scores"] == [None]


def test_concat():
    empty = RewardOutput.concat([])
    assert len(empty) == 0 and empty.scores.dtype == torch.float32
    a = RewardOutput(scores=[1.0], dimensions={"x": [10.0]}, info={"k": 1, "a": 1})
    b = RewardOutput(scores=[2.0, NAN], dimensions={"y": [20.0, 21.0]}, rationales=["r", None],
                     details=[{"d": 1}, None], info={"k": 2})
    c = RewardOutput.concat([a, b])
    assert _nan_eq(c.scores, [1.0, 2.0, NAN]) and c.valid.tolist() == [True, True, False]
    assert c.errors == [None, None, "non-finite score"]
    assert list(c.dimensions) == ["x", "y"]          # first-seen order
    assert _nan_eq(c.dimensions["x"], [10.0, NAN, NAN]) and _nan_eq(c.dimensions["y"], [NAN, 20.0, 21.0])
    assert c.rationales == [None, "r", None] and c.details == [None, {"d": 1}, None]
    assert c.info == {"k": 2, "a": 1}                # later chunks win
    plain = RewardOutput.concat([a, a])
    assert plain.rationales is None and plain.details is None and plain.scores.tolist() == [1.0, 1.0]


# ------------------------------------------------------------------ PairwiseOutput
def test_pairwise_output():
    p = PairwiseOutput(prob_a=[[0.0], [1.0], [NAN]], errors=None)
    assert p.prob_a.dtype == torch.float32 and len(p) == 3 and p.valid.tolist() == [True, True, False]
    assert p.errors == [None, None, "non-finite probability"] and p.tolist() == [0.0, 1.0, None]
    p = PairwiseOutput(prob_a=[0.2, 0.3], valid=[False, True], errors=["a: bad", "stale"])
    assert p.errors == ["a: bad", None] and p.tolist() == [None, pytest.approx(0.3)]
    assert p.to_dict() == {"prob_a": [pytest.approx(0.2), pytest.approx(0.3)], "valid": [False, True],
                           "errors": ["a: bad", None], "rationales": None, "info": {}}
    p = PairwiseOutput(prob_a=[0.5], valid=[False])
    assert p.errors == ["non-finite probability"]
    for kw, msg in [({"errors": [None]}, "errors has 1 entries for 2 probabilities"),
                    ({"rationales": ["a", "b", "c"]}, "rationales has 3 entries for 2 probabilities"),
                    ({"valid": [True]}, "valid has 1 entries for 2 values")]:
        with pytest.raises(ValueError, match=msg):
            PairwiseOutput(prob_a=[0.5, 0.5], **kw)
    for bad in (-1e-6, 1.000001, 2.0):
        with pytest.raises(ValueError, match=r"prob_a must lie in \[0, 1\]"):
            PairwiseOutput(prob_a=[0.5, bad])
    d = PairwiseOutput(prob_a=[0.5], scores_a=torch.tensor([1.0]), scores_b=torch.tensor([NAN])).to_dict()
    assert d["scores_a"] == [1.0] and d["scores_b"] == [None]


# ------------------------------------------------------------------ RewardBatch
def test_reward_batch_defaults_and_select():
    ims = [Image.new("RGB", (1, 1), (i, 0, 0)) for i in range(3)]
    b = RewardBatch(images=ims, prompts=["a", "b", "c"])
    assert b.metadata == [{}, {}, {}] and b.indices == [0, 1, 2] and b.sources is None and b.chunk_size is None
    b.metadata[0]["x"] = 1
    assert b.metadata[1] == {}                        # one dict per sample, not one shared
    b = RewardBatch(images=ims, prompts=["a", "b", "c"], sources=[[], [ims[0]], []],
                    metadata=[{"m": 0}, {"m": 1}, {"m": 2}], indices=[5, 6, 7], chunk_size=2)
    s = b.select([2, 0])
    assert s.images == [ims[2], ims[0]] and s.prompts == ["c", "a"] and s.sources == [[], []]
    assert s.metadata == [{"m": 2}, {"m": 0}] and s.indices == [7, 5] and s.chunk_size == 2
    t = RewardBatch(images=torch.arange(3.0).reshape(3, 1, 1, 1), prompts=["a", "b", "c"]).select([1, 2])
    assert t.images.flatten().tolist() == [1.0, 2.0] and t.sources is None and t.indices == [1, 2]


# ------------------------------------------------------------------ the base class
def test_class_defaults_and_helpers():
    r = Red()
    assert Reward.tasks == frozenset({"t2i"}) and Reward.higher_is_better is True and Reward.differentiable is False
    assert Reward.score_range is None and Reward.dimensions == () and Reward.extras == ()
    assert Reward.uses_prompt is True and Reward.default_batch_size is None and Reward.compare_temperature == 1.0
    assert Reward.compare_is_symmetric is False and Reward.thread_safe is False and Reward.batch_relative is False
    assert Reward.Config is RewardConfig
    assert r.device == torch.device("cpu") and repr(r) == "Red(name='red', config=RewardConfig())"
    assert not r.accepts_sources and not r.requires_sources and not r.supports_tensor_input
    with pytest.raises(NotImplementedError, match="Red has no tiny test instance"):
        Red.tiny("/tmp")
    state = r.__getstate__()
    assert "_lock" not in state and "_lock" in vars(r)
    assert config_dict(r) == {}

    class Edit(Red):
        tasks = frozenset({"edit"})

    class Both(Red):
        tasks = frozenset({"t2i", "multi_ref"})

    assert Edit().accepts_sources and Edit().requires_sources
    assert Both().accepts_sources and not Both().requires_sources


@dataclasses.dataclass
class DevCfg(RewardConfig):
    device: str | None = None
    k: int = 1


class WithDevice(Red):
    Config = DevCfg


def test_device_arguments_are_stored_as_strings():
    assert WithDevice(device=torch.device("cuda", 2)).config.device == "cuda:2"
    assert WithDevice(device=3).config.device == "cuda:3"
    assert WithDevice({"device": torch.device("cpu"), "k": 4}).config == DevCfg(device="cpu", k=4)
    assert WithDevice({"k": 5}).config == DevCfg(device=None, k=5)
    with pytest.raises(ConfigError, match="device index must be >= 0"):
        WithDevice(device=-1)
    with pytest.raises(ConfigError, match="device index must be >= 0"):
        WithDevice({"device": -2})
    assert config_dict(WithDevice(k=7)) == {"device": None, "k": 7}
    r = WithDevice()
    r.config = {"plain": 1}
    assert config_dict(r) == {"plain": 1}


def test_to_moves_modules_and_subclass_to_gets_a_resolved_device():
    class M(Red):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

    r = M()
    assert r.to("cpu") is r and r.device == torch.device("cpu") and isinstance(r.device, torch.device)
    r.to("meta")   # a device every torch has, other than the cpu: the modules really move
    assert r.lin.weight.device.type == "meta" and r.device == torch.device("meta")
    seen = []

    class Own(Red):
        def to(self, device):
            seen.append(device)
            return self

    Own().to("cpu")
    Own().to(torch.device("cpu"))
    assert seen == [torch.device("cpu")] * 2 and all(isinstance(d, torch.device) for d in seen)
    assert getattr(Own.to, "_rk_resolves_device", False) is True

    class Sub(Own):   # inherits the already-wrapped to: not wrapped twice
        pass

    class Again(Own):  # assigns the already-wrapped to: not wrapped twice either
        to = Own.to

    assert Sub.to is Own.to and Again.to is Own.to


# ------------------------------------------------------------------ call-level validation
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"on_error": "ignore"}, ValueError, r"on_error must be one of \('raise', 'nan'\), got 'ignore'"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive int, got 0"),
    ({"batch_size": True}, ValueError, "batch_size must be a positive int, got True"),
    ({"batch_size": 2.0}, ValueError, "batch_size must be a positive int, got 2.0"),
])
def test_call_argument_checks(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Red()([img(1)], "p", **kwargs)


def test_prompt_rules():
    r = Red()
    r([img(10), img(20)], "one")
    assert r.batches[-1].prompts == ["one", "one"]
    r([img(10), img(20)], ("a", "b"))
    assert r.batches[-1].prompts == ["a", "b"]
    for prompt, match in [(None, "reward 'red' needs a prompt"), (b"x", "must be str, got bytes"),
                          ({"a": 1}, "got dict"), (5, "must be a string or a list of strings, got int"),
                          (["a"], "got 2 images but 1 prompts")]:
        with pytest.raises(RewardInputError, match=match):
            r([img(10), img(20)], prompt)
    out = r([img(10), img(20), img(30)], ["a", "   ", 7], on_error="nan")
    assert out.valid.tolist() == [True, False, False]
    assert out.errors[1:] == ["prompt is empty", "prompt must be a string, got int"]

    class NoPrompt(Red):
        uses_prompt = False

    np_r = NoPrompt()
    out = np_r([img(10), img(20)], None)
    assert out.valid.all() and np_r.batches[-1].prompts == [None, None]
    assert np_r([img(10)], [""]).valid.all()          # the prompt is not used: an empty one is fine
    assert np_r([img(10)], [3], on_error="nan").errors == ["prompt must be a string, got int"]


class Edit(Red):
    tasks = frozenset({"edit"})

    def _score(self, batch):
        self.batches.append(batch)
        return RewardOutput(scores=[im.getpixel((0, 0))[0] / 255 - src[0].getpixel((0, 0))[0] / 255
                                    for im, src in zip(batch.images, batch.sources)])


class Multi(Red):
    tasks = frozenset({"t2i", "multi_ref"})


def test_source_rules():
    e = Edit()
    out = e([img(200), img(100)], "p", sources=[[img(50)], (img(100),)])
    assert torch.allclose(out.scores, torch.tensor([150 / 255, 0.0]))
    assert e([img(200)], "p", sources=[img(50)]).scores.tolist() == pytest.approx([150 / 255])   # bare image
    four = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    assert e([img(51)], "p", sources=[four]).scores.tolist() == pytest.approx([0.2])            # 1x3xHxW: a list
    assert len(e([], "p")) == 0                                                                  # nothing to edit
    for sources, match in [(None, "reward 'red' scores edits and needs sources="),
                           ("a.png", r"^sources must be a list with one entry \(a list of images\) per sample$"),
                           ({"a": 1}, "sources must be a list with one entry"),
                           ([[img(1)], [img(1)]], "got 1 images but 2 source entries")]:
        with pytest.raises(RewardInputError, match=match):
            e([img(1)], "p", sources=sources)
    out = e([img(1)] * 5, "p", sources=[None, [], [img(1), img(2)], [b"junk"], [np.zeros((0, 3, 3), np.uint8)]],
            on_error="nan")
    assert out.valid.tolist() == [False] * 5
    assert out.errors[:3] == ["this reward needs at least one source image"] * 2 + [
        "2 source images given but reward 'red' takes one (no multi_ref task)"]
    assert out.errors[3] == "source 0: bytes is not a recognised image format"
    assert out.errors[4].startswith("source 0: image has a zero-size side")
    with pytest.raises(RewardInputError, match=r"^reward 'red' does not take sources \(tasks: t2i, video\); drop "
                                               r"sources= or use an editing reward$"):
        type("Video", (Red,), {"tasks": frozenset({"video", "t2i"})})()([img(1)], "p", sources=[[img(1)]])
    m = Multi()
    assert m([img(1)], "p", sources=[[img(2), img(3)]]).valid.all() and len(m.batches[-1].sources[0]) == 2
    assert m([img(1)], "p").valid.all() and m.batches[-1].sources is None
    m([img(1)], "p", sources=[None])
    assert m.batches[-1].sources == [[]]


def test_metadata_rules():
    r = Red()
    meta = [{"a": 1}, None]
    r([img(1), img(2)], "p", metadata=meta)
    assert r.batches[-1].metadata == [{"a": 1}, {}]
    r.batches[-1].metadata[0]["a"] = 99
    assert meta[0] == {"a": 1}                                     # the caller's dicts are copied
    r([img(1)], "p", metadata=(types.MappingProxyType({"b": 2}),))
    assert r.batches[-1].metadata == [{"b": 2}] and type(r.batches[-1].metadata[0]) is dict
    for metadata, match in [({"a": 1}, "got one dict"), ("ab", "got str"), ({1, 2}, "got set"),
                            (3, "per-sample dicts \\(or None\\), got int 3"), ([{}], "got 2 images but 1 metadata")]:
        with pytest.raises(RewardInputError, match=match):
            r([img(1), img(2)], "p", metadata=metadata)
    out = r([img(1), img(2)], "p", metadata=[{"a": 1}, "oops"], on_error="nan")
    assert out.valid.tolist() == [True, False] and out.errors[1] == "metadata entries must be dicts (or None), got str"
    with pytest.raises(RewardInputError, match="got str") as ei:
        r([img(1), img(2)], "p", metadata=[{"a": 1}, "oops"])
    assert ei.value.index == 1
    assert r._metadata(None, 2) == [{}, {}] and r._metadata(iter([{}, None]), 2) == [{}, {}]
    with pytest.raises(RewardInputError,
                       match="^sample 1: metadata entries must be dicts \\(or None\\), got int") as ei:
        r._metadata([{}, 5], 2)
    assert ei.value.index == 1


# ------------------------------------------------------------------ chunking and scattering
def test_chunks_default_batch_size_and_raise_names_the_sample():
    r = Red()
    ims = [img(v) for v in (0, 51, 102, 153, 204)]
    out = r(ims, "p", batch_size=2)
    assert [len(b) for b in r.batches] == [2, 2, 1] and [b.indices for b in r.batches] == [[0, 1], [2, 3], [4]]
    assert torch.allclose(out.scores, torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8]))

    class Three(Red):
        default_batch_size = 3

    t = Three()
    t(ims, "p")
    assert [len(b) for b in t.batches] == [3, 2]
    t.batches.clear()
    t(ims, "p", batch_size=4)
    assert [len(b) for b in t.batches] == [4, 1]
    r.batches.clear()
    r(ims, "p")
    assert [len(b) for b in r.batches] == [5]                       # no batch size: the whole call at once
    bad = ims[:2] + [b"junk"] + ims[3:]
    with pytest.raises(RewardInputError, match="not a recognised image") as ei:
        r(bad, "p")
    assert ei.value.index == 2
    # a decode failure (not caught by the header checks) with on_error="raise" also names the sample
    import io

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    data = buf.getvalue()[: len(buf.getvalue()) // 2]   # header intact: passes the header checks
    with pytest.raises(RewardInputError, match="corrupt or truncated") as ei:
        r([img(1), data], "p")
    assert ei.value.index == 1
    out = r([img(1), data, img(51)], "p", on_error="nan", batch_size=1)
    assert out.valid.tolist() == [True, False, True] and out.errors[1].startswith("corrupt or truncated image")


def test_batch_relative_gets_the_whole_call():
    class Rel(Red):
        batch_relative = True
        default_batch_size = 2

    r = Rel()
    r([img(v) for v in range(5)], "p", batch_size=3)
    assert [len(b) for b in r.batches] == [5] and r.batches[0].chunk_size == 3
    r([img(v) for v in range(5)], "p")
    assert r.batches[-1].chunk_size == 2 and len(r.batches[-1]) == 5
    out = r([img(1), b"junk", img(2)], "p", on_error="nan")
    assert len(r.batches[-1]) == 2 and out.valid.tolist() == [True, False, True]


def test_scatter_fills_invalid_samples():
    class Rich(Red):
        dimensions = ("d", "declared")

        def _score(self, batch):
            n = len(batch)
            return RewardOutput(scores=torch.arange(n, dtype=torch.float32) + 1, valid=[True] * (n - 1) + [False],
                                dimensions={"d": [10.0 * (i + 1) for i in range(n)]},
                                rationales=[f"r{i}" for i in batch.indices],
                                details=[{"i": i} for i in batch.indices], info={"n": n})

    out = Rich()([img(1), b"junk", img(2), img(3)], "p", on_error="nan")
    assert _nan_eq(out.scores, [1.0, NAN, 2.0, 3.0]) and out.valid.tolist() == [True, False, True, False]
    assert out.errors[1] == "bytes is not a recognised image format" and out.errors[3] == "marked invalid by the reward"
    assert _nan_eq(out.dimensions["d"], [10.0, NAN, 20.0, 30.0]) and torch.isnan(out.dimensions["declared"]).all()
    assert out.rationales == ["r0", None, "r2", "r3"] and out.details == [{"i": 0}, None, {"i": 2}, {"i": 3}]
    assert out.info == {"n": 3}
    none = Rich()([b"x", b"y"], "p", on_error="nan")
    assert torch.isnan(none.scores).all() and none.valid.tolist() == [False, False] and none.rationales is None
    assert set(none.dimensions) == {"d", "declared"} and none.details is None
    assert len(Rich()([], "p")) == 0


def test_a_declared_dimension_the_reward_does_not_return_is_nan_when_every_sample_is_valid():
    # The bug this catches: the all-valid path returned the reward's output untouched, so a declared dimension the
    # reward left out was absent (a KeyError for the caller) while one failed sample made it NaN for all.
    class Partial(Red):
        dimensions = ("d", "declared")

        def _score(self, batch):
            n = len(batch)
            return RewardOutput(scores=[1.0] * n, dimensions={"d": [2.0] * n}, info={"n": n})

    ok = Partial()([img(1), img(2)], "p")
    one_bad = Partial()([img(1), b"junk"], "p", on_error="nan")
    for out in (ok, one_bad):
        assert list(out.dimensions) == ["d", "declared"]
        assert torch.isnan(out.dimensions["declared"]).all() and out.dimensions["declared"].dtype == torch.float32
    assert ok.valid.tolist() == [True, True] and _nan_eq(ok.dimensions["d"], [2.0, 2.0]) and ok.info == {"n": 2}
    assert ok.records()[0]["dimensions"] == {"d": 2.0, "declared": None}


def test_run_checks_what_score_returns():
    class Wrong(Red):
        def _score(self, batch):
            return [0.0] * len(batch)

    with pytest.raises(TypeError, match="Wrong._score must return RewardOutput, got list"):
        Wrong()([img(1)], "p")

    class Short(Red):
        def _score(self, batch):
            return RewardOutput(scores=[0.0] * (len(batch) + 1))

    with pytest.raises(RuntimeError, match="Short._score returned 3 scores for 2 samples"):
        Short()([img(1), img(2)], "p")


def test_thread_safe_rewards_are_not_serialised():
    import threading

    barrier = threading.Barrier(2, timeout=30)

    class Parallel(Red):
        thread_safe = True

        def _score(self, batch):
            barrier.wait()       # both calls must be inside _score at once, else BrokenBarrierError
            return super()._score(batch)

    r = Parallel()
    errs = []

    def call():
        try:
            r([img(1)], "p")
        except Exception as exc:  # noqa: BLE001
            errs.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert errs == []


def test_call_scope_wraps_all_chunks():
    events = []

    class Scoped(Red):
        def _call_scope(self):
            import contextlib

            @contextlib.contextmanager
            def scope():
                events.append("enter")
                yield
                events.append("exit")
            return scope()

        def _score(self, batch):
            events.append(len(batch))
            return super()._score(batch)

    Scoped()([img(1)] * 3, "p", batch_size=2)
    assert events == ["enter", 2, 1, "exit"]


def test_progress_bar_only_over_several_chunks(monkeypatch):
    import tqdm.auto

    made = []
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda **kw: made.append(kw) or types.SimpleNamespace(
        update=lambda n: made.append(n), close=lambda: made.append("closed")))
    Red()([img(1)] * 3, "p", batch_size=3, progress=True)
    Red()([img(1)] * 3, "p", batch_size=1)                  # progress is off by default
    assert made == []
    Red()([img(1)] * 3, "p", batch_size=2, progress=True)
    assert made == [{"total": 3, "desc": "red", "unit": "img", "delay": 1.0}, 2, 1, "closed"]


# ------------------------------------------------------------------ image processors and header checks
def test_image_processor_discovery_and_resize_check():
    ip1 = types.SimpleNamespace(size={"height": 100, "width": 100}, do_resize=True)
    ip2 = types.SimpleNamespace(size={"shortest_edge": 10}, do_resize=True)
    ip3 = types.SimpleNamespace(size={"longest_edge": 10}, do_resize=True)
    no_size = types.SimpleNamespace(do_resize=True)

    class WithProcs(Red):
        def __init__(self):
            super().__init__()
            self.a = types.SimpleNamespace(image_processor=ip1)
            self.b = types.SimpleNamespace(processor=types.SimpleNamespace(image_processor=ip2))
            proc3 = types.SimpleNamespace(image_processor=ip3)
            self.c = types.SimpleNamespace(backbone=types.SimpleNamespace(processor=proc3))
            self.c2 = types.SimpleNamespace(backbone=types.SimpleNamespace(image_processor=ip1))   # seen already
            self.d = types.SimpleNamespace(image_processor=no_size)
            self.e = "image_processor"

    r = WithProcs()
    found = r._image_processors()
    assert found == [ip1, ip2, ip3] and r._image_processors() is found      # cached
    media.set_max_pixels(5_000)
    try:
        # 100x100 after ip1's resize: 10,000 pixels, over the limit although the image is 4x4
        out = r([img(1)], "p", on_error="nan")
        assert out.errors == ["image is 4x4; the model's processor would resize it to 100x100 = 10,000 pixels, over "
                              "the limit of 5,000 (aspect-ratio bomb guard)"]
        e = Edit()
        e.proc = types.SimpleNamespace(image_processor=ip1)
        out = e([np.zeros((4, 4, 3), np.uint8)], "p", sources=[[img(1)]], on_error="nan")
        assert out.errors[0].startswith("image is 4x4; the model's processor")
    finally:
        media.set_max_pixels(None)
    # a source is checked against the size after the model's resize too, before anything is decoded
    media.set_max_pixels(5_000)
    try:
        e = Edit()
        e.proc = types.SimpleNamespace(image_processor=types.SimpleNamespace(size={"shortest_edge": 50}, do_resize=True))
        tall = np.zeros((12, 4, 3), np.uint8)   # 4x12 -> 50x150 = 7,500 pixels; the 4x4 image -> 50x50
        out = e([img(1), img(1)], "p", sources=[[img(1)], [tall]], on_error="nan")
        assert out.valid.tolist() == [True, False]
        assert out.errors[1] == ("source 0: image is 4x12; the model's processor would resize it to 50x150 = 7,500 "
                                 "pixels, over the limit of 5,000 (aspect-ratio bomb guard)")
    finally:
        media.set_max_pixels(None)
    media.set_max_pixels(20)
    try:
        out = Edit()([img(1, 4)], "p", sources=[[img(1, 5)]], on_error="nan")
        assert out.errors == ["source 0: image is 5x5 = 25 pixels, over the limit of 20 (decompression-bomb guard; "
                              "raise it with rewardkit.media.set_max_pixels or REWARDKIT_MAX_PIXELS)"]
    finally:
        media.set_max_pixels(None)


def test_precheck_and_decode_turn_any_exception_into_the_samples_error(monkeypatch):
    r = Red()

    def boom(x):
        raise KeyError("probe")

    monkeypatch.setattr(media, "_probe", boom)
    out = r([img(1)], "p", on_error="nan")
    assert out.errors == ["cannot read this sample (KeyError: 'probe')"]
    monkeypatch.undo()
    monkeypatch.setattr(media, "_to_pil", lambda x, *a: (_ for _ in ()).throw(KeyError("dec")))
    assert r([img(1)], "p", on_error="nan").errors == ["cannot read this sample (KeyError: 'dec')"]


# ------------------------------------------------------------------ compare
def test_compare_temperature_sources_and_errors():
    class Warm(Red):
        compare_temperature = 0.5

    cmp = Warm().compare([img(255), img(0)], [img(0), img(51)], "p")
    want = [1 / (1 + math.exp(-1.0 / 0.5)), 1 / (1 + math.exp(0.2 / 0.5))]
    assert torch.allclose(cmp.prob_a, torch.tensor(want)) and cmp.errors == [None, None]
    assert torch.allclose(cmp.scores_a, torch.tensor([1.0, 0.0]))
    assert torch.allclose(cmp.scores_b, torch.tensor([0.0, 0.2]))

    class Lower(Red):
        higher_is_better = False
        compare_temperature = 2.0

    cmp = Lower().compare([img(255)], [img(0)], "p")
    assert cmp.prob_a.tolist() == pytest.approx([1 / (1 + math.exp(1.0 / 2.0))])

    e = Edit()
    cmp = e.compare([img(200)], [img(100)], "p", sources=[[img(50)]], metadata=[{"k": 1}], batch_size=1)
    assert [len(b) for b in e.batches] == [1, 1] and [b.metadata for b in e.batches] == [[{"k": 1}], [{"k": 1}]]
    assert cmp.prob_a.tolist() == pytest.approx([1 / (1 + math.exp(-100 / 255))])
    cmp = Red().compare([b"junk", img(1), b"x"], [img(1), img(1), b"y"], ["p1", "p2", "p3"], on_error="nan")
    assert cmp.valid.tolist() == [False, True, False] and torch.isnan(cmp.prob_a[[0, 2]]).all()
    assert cmp.errors == ["a: bytes is not a recognised image format", None,
                          "a: bytes is not a recognised image format; b: bytes is not a recognised image format"]
    cmp = Red().compare([img(1)], [b"junk"], "p", on_error="nan")
    assert cmp.errors == ["b: bytes is not a recognised image format"]
    empty = Red().compare([], [], "p")
    assert len(empty) == 0

    class Raw(Red):
        def _compare_values(self, out):
            return out.scores * 10

    assert Raw().compare([img(51)], [img(0)], "p").prob_a.tolist() == pytest.approx([1 / (1 + math.exp(-2.0))])


# ------------------------------------------------------------------ the tensor fast path (issue 12)
def test_float_batches_take_the_tensor_path_only_when_supported(monkeypatch):
    from rewardkit import preprocess

    calls = []
    monkeypatch.setattr(preprocess, "tensor_call",
                        lambda reward, images, prompt, **kw: calls.append({"prompt": prompt, **kw}) or "tensor")

    class Fast(Red):
        supports_tensor_input = True

    x = torch.rand(2, 3, 4, 4)
    assert Fast()(x, "p", batch_size=1, on_error="nan", progress=True) == "tensor"
    assert calls == [{"prompt": "p", "metadata": None, "batch_size": 1, "on_error": "nan", "progress": True}]
    assert isinstance(Red()(x, "p"), RewardOutput)                        # not supported: the PIL path
    assert isinstance(Fast()(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "p"), RewardOutput)   # not float
    e = type("FastEdit", (Edit,), {"supports_tensor_input": True})()
    assert isinstance(e(x, "p", sources=[[img(1)], [img(1)]]), RewardOutput)   # sources: the PIL path
    assert len(calls) == 1


def test_score_tensor_hands_over_to_preprocess(monkeypatch):
    from rewardkit import preprocess

    seen = []
    monkeypatch.setattr(preprocess, "score_tensor", lambda reward, images, prompt, **kw: seen.append(
        (reward, images, prompt, kw)) or "scores")
    r, x = Red(), torch.rand(1, 3, 2, 2)
    assert r.score_tensor(x, ["p"], batch_size=4) == "scores"
    assert seen == [(r, x, ["p"], {"batch_size": 4})]


def test_compare_keeps_the_calls_info():
    class Noted(Red):
        def _score(self, batch):
            out = super()._score(batch)
            return RewardOutput(scores=out.scores, info={"judge": "v1", "seen": len(batch)})

    r = Noted()
    # catches compare dropping `info`: the pairwise output carries what the underlying call reported
    pair = r.compare([img(200)], [img(100)], "p")
    assert pair.info == r([img(200), img(100)], ["p", "p"]).info
    assert pair.info["judge"] == "v1" and pair.info["seen"] == 2
