"""Trainer adapters driven exactly as each host calls its reward (argument names, layouts, dtypes, threads).

Every adapter's scores must equal a direct ``reward(...)`` call on the same inputs, and no adapter may hand a
NaN to its host under the default NaN policy.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from rewardkit.errors import ConfigError
from rewardkit.integrations import (NonFiniteRewardError, ddpo_reward_fn, flow_grpo_factory, flow_grpo_scorer,
                                   multi_score, trl_reward_func, verl_compute_score)
from rewardkit.integrations._common import LazyReward, as_device
from rewardkit.reward import Reward, RewardBatch, RewardOutput

PROMPTS = ("a photo of a cat", "a red car on a road", "two birds on a branch", "a bowl of soup",
           "a neon sign", "a dog in the snow")


@pytest.fixture(scope="module")
def pick(tiny_clip_dir):
    from rewardkit import load_reward

    return load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")


def float_batch(n=6, size=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g)


class DarkIsNaN(Reward):
    """Red-channel mean; NaN + reason for dark images (stands in for a reward that cannot score some samples)."""

    name = "test-dark-nan"
    tasks = frozenset({"t2i", "edit"})
    thread_safe = True

    def _score(self, batch: RewardBatch) -> RewardOutput:
        vals, errs = [], []
        for im, src in zip(batch.images, batch.sources or [[]] * len(batch)):
            v = float(np.asarray(im)[..., 0].mean()) / 255.0
            if src:
                v -= float(np.asarray(src[0])[..., 0].mean()) / 255.0
            dark = float(np.asarray(im).mean()) < 40
            vals.append(float("nan") if dark else v)
            errs.append("too dark to score" if dark else None)
        return RewardOutput(scores=torch.tensor(vals), errors=errs)


def with_dark(x: torch.Tensor, idx=(1, 4)) -> torch.Tensor:
    x = x.clone()
    for i in idx:
        x[i] = 0.01
    return x


# ---------------------------------------------------------------- flow_grpo / DiffusionNFT
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_flow_grpo_scorer_float_nchw_equals_direct(pick, dtype):
    imgs = float_batch().to(dtype)                         # VAE decode output, under autocast for fp16/bf16
    fn = flow_grpo_scorer(pick, torch.device("cpu"))
    scores, info = fn(imgs, PROMPTS, tuple({} for _ in PROMPTS))       # prompts / metadata are tuples
    direct = pick(imgs, list(PROMPTS)).scores
    assert isinstance(scores, np.ndarray) and scores.dtype == np.float32 and scores.shape == (6,)
    np.testing.assert_array_equal(scores, direct.numpy())
    assert info["valid_fraction"] == 1.0
    assert torch.as_tensor(scores).float().shape == (6,)                # what the host does with it


def test_flow_grpo_scorer_channels_last_and_requires_grad(pick):
    base = float_batch()
    direct = pick(base, list(PROMPTS)).scores.numpy()
    cl = base.contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(flow_grpo_scorer(pick)(cl, PROMPTS, None)[0], direct)
    g = base.clone().requires_grad_(True)
    np.testing.assert_array_equal(flow_grpo_scorer(pick)(g, PROMPTS, None)[0], direct)


@pytest.mark.slow
def test_adapters_import_light():
    """Building every adapter by name imports no model library (loading waits for the first call)."""
    import subprocess
    import sys

    code = ("from rewardkit.integrations import *\n"
            "from rewardkit.integrations import flow_grpo_scorer, multi_score, trl_reward_func, "
            "verl_compute_score, ddpo_reward_fn\n"
            "flow_grpo_scorer('pickscore'); multi_score(0, {'pickscore': 1.0}); trl_reward_func('clipscore')\n"
            "verl_compute_score('pickscore', micro_batch=8); ddpo_reward_fn('pickscore')\n"
            "import sys; print(' '.join(sys.modules))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not {"transformers", "trl", "diffusers", "peft", "datasets", "accelerate"} & mods


def test_flow_grpo_scorer_uint8_nhwc_numpy_equals_direct(pick):
    imgs = (float_batch() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()   # NHWC uint8
    scores, _ = flow_grpo_scorer(pick)(imgs, list(PROMPTS), {})      # flow_grpo's own example passes {}
    np.testing.assert_array_equal(scores, pick(imgs, list(PROMPTS)).scores.numpy())


def test_multi_score_is_flow_grpos_weighted_sum_with_ref_images(pick):
    imgs, refs = with_dark(float_batch(seed=1), idx=()), float_batch(seed=2)
    dark = DarkIsNaN()
    fn = multi_score(torch.device("cpu"), {"pick": 1.0, "dark": -0.5}, rewards={"pick": pick, "dark": dark})
    details, info = fn(imgs, PROMPTS, tuple({} for _ in PROMPTS), ref_images=refs, only_strict=True)
    assert set(details) == {"pick", "dark", "avg"}
    p = pick(imgs, list(PROMPTS)).scores.numpy()
    d = dark(imgs, list(PROMPTS), sources=[[r] for r in refs]).scores.numpy()     # ref_images -> sources
    np.testing.assert_array_equal(details["pick"], p)
    np.testing.assert_allclose(details["dark"], d, rtol=0, atol=0)
    np.testing.assert_allclose(details["avg"], 1.0 * p - 0.5 * d, atol=1e-6)      # a SUM, not a mean
    assert set(info) == {"pick", "dark"}
    # the host turns every value into a tensor and concatenates per key: all are [B] arrays
    assert all(torch.as_tensor(v).float().shape == (6,) for v in details.values())


@pytest.mark.parametrize("long_prompts", [False, True])  # long: over CLIP's text window (issue 9 item 5)
def test_multi_score_thread_pool_like_flow_grpo(pick, long_prompts):
    """flow_grpo submits the reward to ThreadPoolExecutor(max_workers=8) and reads the futures later."""
    fn = multi_score("cpu", {"pick": 1.0}, rewards={"pick": pick})
    batches = [float_batch(seed=s) for s in range(8)]
    long = tuple(p + " with a very long description that goes on and on " * 3 for p in PROMPTS) \
        if long_prompts else PROMPTS
    seq = [fn(b, long, tuple({} for _ in long))[0]["avg"] for b in batches]
    with ThreadPoolExecutor(max_workers=8) as ex:
        futs = [ex.submit(fn, b, long, tuple({} for _ in long), only_strict=True) for b in batches]
        par = [f.result()[0]["avg"] for f in futs]
    for a, b in zip(seq, par):
        np.testing.assert_array_equal(a, b)


def test_flow_grpo_nan_policy():
    imgs = with_dark(float_batch())
    with pytest.raises(NonFiniteRewardError) as ei:
        flow_grpo_scorer(DarkIsNaN())(imgs, PROMPTS, None)
    msg = str(ei.value)
    assert ei.value.indices == [1, 4] and "sample 1: too dark to score" in msg and "nan_policy='fill'" in msg
    scores, info = flow_grpo_scorer(DarkIsNaN(), nan_policy="fill", fill_value=-1.0)(imgs, PROMPTS, None)
    assert np.isfinite(scores).all() and scores[1] == scores[4] == -1.0
    assert info["valid_fraction"] == pytest.approx(4 / 6) and info["invalid"] == {1: "too dark to score",
                                                                                  4: "too dark to score"}
    with pytest.raises(NonFiniteRewardError):
        multi_score("cpu", {"d": 1.0}, rewards={"d": DarkIsNaN()})(imgs, PROMPTS, None)
    with pytest.raises(ValueError, match="cannot mask"):
        flow_grpo_scorer(DarkIsNaN(), nan_policy="mask")
    with pytest.raises(ValueError, match="finite fill_value"):
        flow_grpo_scorer(DarkIsNaN(), nan_policy="fill")
    with pytest.raises(ValueError, match="nan_policy must be one of"):
        flow_grpo_scorer(DarkIsNaN(), nan_policy="ignore")


def test_flow_grpo_factory_gets_device_like_multi_score():
    factory = flow_grpo_factory(DarkIsNaN())
    assert "device" in factory.__code__.co_varnames        # how flow_grpo decides to pass the device
    scores, _ = factory(torch.device("cpu"))(float_batch(), PROMPTS, None)
    assert scores.shape == (6,)


# ---------------------------------------------------------------- TRL GRPOTrainer
def _trl_call(fn, prompts, completions, **columns):
    """Exactly the keywords of TRL 1.16's GRPOTrainer._calculate_rewards."""
    logged = {}
    out = fn(prompts=prompts, completions=completions, completion_ids=[[1, 2]] * len(completions),
             trainer_state=object(), log_extra=lambda col, vals: None,
             log_metric=lambda name, value: logged.__setitem__(name, value), **columns)
    return out, logged


def test_trl_string_and_conversational_completions(pick):
    from trl.trainer.utils import get_callable_name, is_async_callable

    imgs = [im for im in float_batch()]
    fn = trl_reward_func(pick)
    assert get_callable_name(fn) == "pickscore" and not is_async_callable(fn)
    direct = pick(imgs, list(PROMPTS)).scores.tolist()
    out, logged = _trl_call(fn, ["describe"] * 6, list(PROMPTS), image=imgs, other=[0] * 6)
    assert out == pytest.approx(direct, abs=0) and all(isinstance(x, float) for x in out)
    assert logged == {"rewardkit/pickscore/valid_fraction": 1.0}
    conv_prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]] * 6
    conv = [[{"role": "assistant", "content": p}] for p in PROMPTS]
    out2, _ = _trl_call(fn, conv_prompts, conv, images=[[im] for im in imgs])      # the "images" column
    assert out2 == out
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": p}]}] for p in PROMPTS]
    assert _trl_call(fn, conv_prompts, parts, image=imgs)[0] == out
    by_prompt = trl_reward_func(pick, text="prompt", name="pick_prompt")
    user = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": p}]}] for p in PROMPTS]
    assert _trl_call(by_prompt, user, ["ignored"] * 6, image=imgs)[0] == out
    with pytest.raises(ValueError, match="image column"):
        _trl_call(fn, ["d"] * 6, list(PROMPTS))


def test_trl_async_variant(pick):
    from trl.trainer.utils import is_async_callable

    imgs = [im for im in float_batch()]
    fn = trl_reward_func(pick, is_async=True, name="pick_async")
    assert is_async_callable(fn) and fn.__name__ == "pick_async"
    out = asyncio.run(fn(prompts=["d"] * 6, completions=list(PROMPTS), completion_ids=[[1]] * 6,
                         trainer_state=None, log_extra=None, log_metric=None, image=imgs))
    assert out == pick(imgs, list(PROMPTS)).scores.tolist()


def test_trl_nan_policies():
    imgs = [im for im in with_dark(float_batch())]
    with pytest.raises(NonFiniteRewardError, match="sample 4: too dark"):
        _trl_call(trl_reward_func(DarkIsNaN()), ["d"] * 6, list(PROMPTS), image=imgs)
    masked, logged = _trl_call(trl_reward_func(DarkIsNaN(), nan_policy="mask"), ["d"] * 6, list(PROMPTS), image=imgs)
    assert masked[1] is None and masked[4] is None and all(isinstance(masked[i], float) for i in (0, 2, 3, 5))
    assert logged["rewardkit/test_dark_nan/valid_fraction"] == pytest.approx(4 / 6)
    filled, _ = _trl_call(trl_reward_func(DarkIsNaN(), nan_policy="fill", fill_value=0.0), ["d"] * 6, list(PROMPTS),
                          image=imgs)
    assert filled[1] == 0.0 and all(np.isfinite(filled))


def test_trl_empty_completion_policy(pick):
    """An empty caption: by default the reward's NaN + reason goes through the NaN policy (raise); with
    empty_completion="fill" it gets empty_value without a reward call and the rest is scored as usual."""
    imgs = [im for im in float_batch()]
    comps = ["a photo of a cat", "", "two birds on a branch", "   ", "a neon sign", "a dog in the snow"]
    # PickScore itself scores an empty prompt (as its package does): the adapter, not the reward, refuses it
    with pytest.raises(NonFiniteRewardError, match="sample 1: completion is empty"):
        _trl_call(trl_reward_func(pick), ["d"] * 6, comps, image=imgs)
    masked, _ = _trl_call(trl_reward_func(pick, nan_policy="mask"), ["d"] * 6, comps, image=imgs)
    assert masked[1] is None and masked[3] is None
    own, _ = _trl_call(trl_reward_func(pick, empty_completion="reward"), ["d"] * 6, comps, image=imgs)
    assert own == pytest.approx(pick(imgs, comps).scores.tolist(), abs=0)  # the reward's own rule: scored
    fn = trl_reward_func(pick, empty_completion="fill", empty_value=-5.0)
    out, logged = _trl_call(fn, ["d"] * 6, comps, image=imgs)
    keep = [0, 2, 4, 5]
    direct = pick([imgs[i] for i in keep], [comps[i] for i in keep]).scores.tolist()
    assert out[1] == out[3] == -5.0
    assert [out[i] for i in keep] == pytest.approx(direct, abs=0)
    assert logged == {"rewardkit/pickscore/valid_fraction": 1.0, "rewardkit/pickscore/empty_fraction": 2 / 6}
    all_empty, _ = _trl_call(fn, ["d"] * 2, ["", ""], image=imgs[:2])
    assert all_empty == [-5.0, -5.0]
    # an empty batch is an empty answer under every policy (before: UnboundLocalError under the default "nan")
    for policy in ({}, {"empty_completion": "reward"}, {"empty_completion": "fill", "empty_value": -5.0}):
        assert _trl_call(trl_reward_func(pick, **policy), [], [], image=[])[0] == []
    with pytest.raises(ValueError, match="finite empty_value"):
        trl_reward_func(pick, empty_completion="fill")
    with pytest.raises(ValueError, match="empty_completion must be one of"):
        trl_reward_func(pick, empty_completion="skip")
    with pytest.raises(ValueError, match="only used with"):
        trl_reward_func(pick, empty_value=0.0)


def test_public_adapter_classes_are_built_from_a_reward(pick):
    """TRLRewardFunction / AsyncTRLRewardFunction / VerlComputeScore are in __all__: a user can build them from a
    reward (or a registry name) with the same arguments as the factory functions."""
    # Bug caught: their __init__ took an internal LazyReward handle, so TRLRewardFunction(reward) raised TypeError.
    from rewardkit.integrations.trl import AsyncTRLRewardFunction, TRLRewardFunction
    from rewardkit.integrations.verl import VerlComputeScore

    imgs = [im for im in float_batch()]
    direct = pick(imgs, list(PROMPTS)).scores.tolist()
    fn = TRLRewardFunction(pick, name="pick")
    assert fn.__name__ == "pick" and _trl_call(fn, ["d"] * 6, list(PROMPTS), image=imgs)[0] == direct
    afn = AsyncTRLRewardFunction(pick)
    assert asyncio.run(afn(prompts=["d"] * 6, completions=list(PROMPTS), image=imgs)) == direct
    by_name = TRLRewardFunction("pickscore")                            # lazy, by registry name
    assert by_name.__name__ == "pickscore" and not by_name.handle.loaded
    u8 = (float_batch() * 255).round().to(torch.uint8)
    v = VerlComputeScore(pick, micro_batch=0)
    assert v(data_source="t2i", solution_image=u8[0], ground_truth=PROMPTS[0], extra_info={})["score"] == \
        float(pick(u8[0], PROMPTS[0]).scores[0])
    with pytest.raises(ValueError, match="finite fill_value"):
        VerlComputeScore(pick, nan_policy="fill")
    with pytest.raises(ValueError, match="cannot mask"):
        VerlComputeScore(pick, nan_policy="mask")


def test_fill_and_mask_reach_every_invalid_sample_of_a_large_batch():
    """130 samples, 120 of them invalid (more than the 10 reasons listed and the 100 reported): every invalid
    sample is filled / masked and every valid one keeps its score."""
    # Bug caught (issue 25 mutation survivor): a fill loop over bad[:10] (or bad[:100], the report's cap) passed
    # the NaN-policy tests, which never had more than 2 invalid samples of 6.
    from rewardkit.integrations._common import apply_nan_policy

    n, dark = 130, set(range(5, 125))
    g = torch.Generator().manual_seed(3)
    imgs = 0.3 + 0.7 * torch.rand(n, 3, 8, 8, generator=g)
    imgs[sorted(dark)] = 0.01
    u8 = (imgs * 255).round().to(torch.uint8)
    # expected, computed by hand from the pixels: red-channel mean / 255 for a valid sample, the fill otherwise
    red = [float(u8[i, 0].double().mean()) / 255.0 for i in range(n)]
    prompts = ["p"] * n
    out = DarkIsNaN()(imgs, prompts, on_error="nan")
    values, report = apply_nan_policy(out, host="flow_grpo", name="d", nan_policy="fill", fill_value=-7.0)
    assert [i for i, v in enumerate(values) if v == -7.0] == sorted(dark)
    assert [values[i] for i in range(n) if i not in dark] == pytest.approx([red[i] for i in range(n) if i not in dark])
    assert report["n_invalid"] == 120 and report["valid_fraction"] == pytest.approx(10 / 130)
    masked, _ = apply_nan_policy(out, host="TRL", name="d", nan_policy="mask", fill_value=None)
    assert [i for i, v in enumerate(masked) if v is None] == sorted(dark)
    scores, _ = flow_grpo_scorer(DarkIsNaN(), nan_policy="fill", fill_value=-7.0)(imgs, prompts, None)
    assert np.isfinite(scores).all() and (scores == -7.0).sum() == 120
    trl_out, _ = _trl_call(trl_reward_func(DarkIsNaN(), nan_policy="mask"), prompts, prompts,
                           image=[im for im in imgs])
    assert sum(v is None for v in trl_out) == 120


# ---------------------------------------------------------------- verl-omni
def test_verl_compute_score_uint8_chw_by_keyword(pick):
    u8 = (float_batch() * 255).round().to(torch.uint8)
    fn = verl_compute_score(pick)
    direct = [float(pick(u8[i], PROMPTS[i]).scores[0]) for i in range(6)]     # one sample per call, as verl
    got = [fn(data_source="t2i", solution_image=u8[i], ground_truth=PROMPTS[i], extra_info={"index": i})
           for i in range(6)]
    assert [g["score"] for g in got] == direct and all(g["valid"] == 1.0 for g in got)
    assert set(got[0]) == {"score", "valid"}
    # 1xCxHxW and the prompt from extra_info
    g = fn(data_source="t2i", solution_image=u8[:1], ground_truth=None, extra_info={"prompt": PROMPTS[0]})
    assert g["score"] == direct[0]
    with pytest.raises(ValueError, match="one sample per call"):
        fn(data_source="t2i", solution_image=u8, ground_truth="x", extra_info={})


def test_verl_micro_batching_under_run_in_executor(pick):
    """verl-omni runs sync scorers with loop.run_in_executor(None, ...): many threads at once."""
    u8 = (float_batch(n=6) * 255).round().to(torch.uint8)
    direct = pick(u8, list(PROMPTS)).scores.tolist()
    calls = []
    orig = pick.__class__.__call__

    fn = verl_compute_score(pick, micro_batch=6, max_wait_s=2.0)

    class Counting:
        def __getattr__(self, k):
            return getattr(pick, k)

        def __call__(self, images, *a, **k):
            calls.append(len(images))
            return orig(pick, images, *a, **k)

    fn.handle._reward = Counting()

    async def run():
        loop = asyncio.get_running_loop()
        from functools import partial

        return await asyncio.gather(*[loop.run_in_executor(None, partial(
            fn, data_source="t2i", solution_image=u8[i], ground_truth=PROMPTS[i], extra_info={})) for i in range(6)])

    got = asyncio.run(run())
    assert [g["score"] for g in got] == pytest.approx(direct, abs=1e-6)
    assert sum(calls) == 6 and len(calls) < 6          # batched model calls, not one per sample


def test_verl_nan_policy_per_sample():
    u8 = (with_dark(float_batch()) * 255).round().to(torch.uint8)
    fn = verl_compute_score(DarkIsNaN(), micro_batch=3, max_wait_s=0.5)
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(fn, data_source="x", solution_image=u8[i], ground_truth=PROMPTS[i], extra_info={})
                for i in range(6)]
        errors = [f.exception() for f in futs]
    assert [isinstance(e, NonFiniteRewardError) for e in errors] == [False, True, False, False, True, False]
    filled = verl_compute_score(DarkIsNaN(), nan_policy="fill", fill_value=-1.0)
    g = filled(data_source="x", solution_image=u8[1], ground_truth="p", extra_info=None)
    assert g == {"score": -1.0, "valid": 0.0}


# ---------------------------------------------------------------- DDPO / AlignProp
def test_ddpo_shape_and_nan(pick):
    imgs = float_batch()
    rewards, meta = ddpo_reward_fn(pick, device=torch.device("cpu"))(imgs, PROMPTS, tuple({} for _ in PROMPTS))
    assert isinstance(rewards, torch.Tensor) and rewards.dtype == torch.float32
    assert torch.equal(rewards, pick(imgs, list(PROMPTS)).scores) and meta["valid_fraction"] == 1.0
    with pytest.raises(NonFiniteRewardError):
        ddpo_reward_fn(DarkIsNaN())(with_dark(imgs), PROMPTS, tuple({} for _ in PROMPTS))
    with pytest.raises(TypeError, match="not differentiable"):
        ddpo_reward_fn(DarkIsNaN(), alignprop=True)(imgs, PROMPTS, ())


def test_alignprop_backpropagates_the_reward_into_the_pixels(pick):
    """AlignProp's loss is 10 - rewards.mean(): the rewards must carry the graph back to the images."""
    imgs = float_batch(n=3).requires_grad_(True)
    rewards, meta = ddpo_reward_fn(pick, alignprop=True)(imgs, PROMPTS[:3], ({}, {}, {}))
    assert rewards.requires_grad and meta["valid_fraction"] == 1.0
    torch.testing.assert_close(rewards.detach(), pick.score_tensor(imgs.detach(), list(PROMPTS[:3])).detach())
    (10 - rewards.mean()).backward()
    assert imgs.grad is not None and torch.isfinite(imgs.grad).all() and imgs.grad.abs().sum() > 0
    assert all(p.grad is None for p in pick.backbone.model.parameters())  # the reward's weights stay frozen


# ---------------------------------------------------------------- shared behaviour
def test_lazy_loading_by_name_once_behind_a_lock(tiny_clip_dir, monkeypatch):
    from rewardkit.rewards.pickscore import PickScore

    built = []
    real_init = PickScore.__init__

    def counting(self, *a, **k):
        built.append(k.get("device"))
        real_init(self, *a, **k)

    monkeypatch.setattr(PickScore, "__init__", counting)
    fn = flow_grpo_scorer("pick-score", torch.device("cpu"), model=str(tiny_clip_dir))
    assert not fn.handle.loaded and built == []                    # nothing loads at construction
    imgs = float_batch()
    barrier = threading.Barrier(4)

    def go():
        barrier.wait()
        return fn(imgs, PROMPTS, None)[0]

    with ThreadPoolExecutor(4) as ex:
        outs = [f.result() for f in [ex.submit(go) for _ in range(4)]]
    assert built == ["cpu"] and all(np.array_equal(o, outs[0]) for o in outs)   # once, on the given device
    pickle.loads(pickle.dumps(fn.handle))                          # picklable (lock dropped and rebuilt)
    with pytest.raises(Exception, match="unknown reward"):
        flow_grpo_scorer("pikscore")                               # a typo fails at build time


def test_devices():
    assert as_device(None) is None
    assert as_device(0) == torch.device("cuda", 0) and as_device(3) == torch.device("cuda", 3)
    assert as_device(torch.device("cpu")) == torch.device("cpu") and as_device("cpu") == torch.device("cpu")
    for bad in (True, -1, 1.5):
        with pytest.raises((TypeError, ValueError)):
            as_device(bad)
    with pytest.raises(TypeError, match="with a reward instance"):
        LazyReward(DarkIsNaN(), None, {"model": "x"})


def test_adapters_refuse_batch_normalised_composites(tmp_path):
    from rewardkit.compose import Composite

    comp = Composite(axes=[{"name": "a"}, {"name": "b"}], rewards={"a": DarkIsNaN(), "b": DarkIsNaN()})
    imgs = float_batch()
    makers = [lambda **k: flow_grpo_scorer(comp, **k)(imgs, PROMPTS, None),
              lambda **k: multi_score("cpu", {"c": 1.0}, rewards={"c": comp}, **k)(imgs, PROMPTS, None),
              lambda **k: _trl_call(trl_reward_func(comp, **k), ["d"] * 6, list(PROMPTS), image=list(imgs)),
              lambda **k: verl_compute_score(comp, **k)(solution_image=imgs[0], ground_truth="p", extra_info={}),
              lambda **k: ddpo_reward_fn(comp, **k)(imgs, PROMPTS, None)]
    for make in makers:
        with pytest.raises(ConfigError, match="axis_scores.*gather_combine"):
            make()
        make(allow_batch_relative=True)          # the explicit opt-in for whole groups on one process
    fixed = Composite(axes=[{"name": "a", "mean": 0.5, "std": 0.2}], rewards={"a": DarkIsNaN()}, normalize="fixed")
    assert flow_grpo_scorer(fixed)(imgs, PROMPTS, None)[0].shape == (6,)   # per-sample: accepted


def test_no_adapter_hands_nan_to_the_host_by_default():
    """The issue's 'done when': with a reward that returns NaN for some samples, every adapter under its
    default policy raises before the host sees anything."""
    imgs = with_dark(float_batch())
    u8 = (imgs * 255).round().to(torch.uint8)
    r = DarkIsNaN()
    calls = [lambda: flow_grpo_scorer(r)(imgs, PROMPTS, None)[0],
             lambda: multi_score("cpu", {"d": 1.0}, rewards={"d": r})(imgs, PROMPTS, None)[0]["avg"],
             lambda: _trl_call(trl_reward_func(r), ["d"] * 6, list(PROMPTS), image=list(imgs))[0],
             lambda: [verl_compute_score(r)(solution_image=u8[i], ground_truth="p", extra_info={})["score"]
                      for i in range(6)],
             lambda: ddpo_reward_fn(r)(imgs, PROMPTS, None)[0]]
    for call in calls:
        with pytest.raises(NonFiniteRewardError):
            call()


def test_nan_policy_error_counts_and_mask_overrides_the_fill():
    from rewardkit.integrations._common import apply_nan_policy

    out = RewardOutput(scores=torch.tensor([0.5, float("nan"), 0.25]), errors=[None, "too dark to score", None])
    # catches the batch size dropped from the message ("1 of None samples"): 1 invalid sample of 3
    with pytest.raises(NonFiniteRewardError, match=r"could not score 1 of 3 samples") as exc:
        apply_nan_policy(out, host="TRL", name="d", nan_policy="raise", fill_value=None)
    assert exc.value.indices == [1] and exc.value.reasons == ["too dark to score"]
    # catches "mask" not recognised in the fill loop: a masked sample is None even when a fill value is passed
    values, report = apply_nan_policy(out, host="TRL", name="d", nan_policy="mask", fill_value=0.0)
    assert values == [0.5, None, 0.25] and report["invalid"] == {1: "too dark to score"}


def test_batch_relative_refusal_for_duck_typed_rewards():
    from types import SimpleNamespace

    from rewardkit.integrations._common import refuse_batch_relative

    # catches getattr(reward, "batch_relative") without its default: an object without the flag is accepted
    assert refuse_batch_relative(SimpleNamespace(), "TRL", False) is None

    class ZScored:        # no `name`: the message names the class
        batch_relative = True
        config = SimpleNamespace(normalize="batch")

    # catches the class-name fallback replaced (None / 'NoneType'): the error names 'ZScored'
    with pytest.raises(ConfigError, match=r"reward 'ZScored' normalises over the call \(normalize='batch'\)"):
        refuse_batch_relative(ZScored(), "TRL", False)


def test_non_finite_reward_error_message_in_full():
    # catches any change to the refusal's text: the count of unlisted samples ("... and 2 more" for 12 invalid,
    # 10 listed), the fix it suggests, and the mask hint that only TRL gets
    head = ("reward 'd' could not score 12 of 20 samples, so the {} adapter refuses to hand NaN rewards to the "
            "trainer (they would make every advantage of the step non-finite):\n")
    listed = "".join(f"  sample {i}: non-finite score\n" for i in range(10)) + "  ... and 2 more\n"
    fix = "Fix the inputs, or choose nan_policy='fill' (a fixed value, the valid fraction is reported)"
    trl = NonFiniteRewardError("TRL", "d", list(range(12)), [None] * 12, 20)
    assert str(trl) == (head.format("TRL") + listed + fix
                        + " or nan_policy='mask' (None: TRL leaves the sample out of its NaN-aware sums).")
    verl = NonFiniteRewardError("verl", "d", list(range(12)), [None] * 12, 20)
    assert str(verl) == head.format("verl") + listed + fix + "."
    assert trl.reasons == ["non-finite score"] * 12
    # exactly 10 invalid: every one listed, no "... and 0 more" line
    ten = NonFiniteRewardError("verl", "d", list(range(10)), ["dark"] * 10, 10)
    assert "more" not in str(ten) and str(ten).count("  sample ") == 10


def test_batch_relative_refusal_without_a_normalize_field():
    from types import SimpleNamespace

    from rewardkit.integrations._common import refuse_batch_relative

    # catches the '?' placeholder replaced: a config without `normalize` is named as normalize='?'
    bare = SimpleNamespace(name="z", batch_relative=True, config=SimpleNamespace())
    with pytest.raises(ConfigError, match=r"reward 'z' normalises over the call \(normalize='\?'\), but TRL calls"):
        refuse_batch_relative(bare, "TRL", False)
    refuse_batch_relative(bare, "TRL", True)   # allow_batch_relative: accepted


def test_lazy_loading_turns_only_hub_failures_into_the_hub_error(tmp_path, monkeypatch):
    from rewardkit.models.zoo import HubModelUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # catches the hub check inverted (`err is not None`): a hub id that cannot be fetched is the error naming it
    with pytest.raises(HubModelUnavailableError, match=r"could not load 'someorg/not-downloaded' from the Hugging"):
        LazyReward("clipscore", kwargs={"model": "someorg/not-downloaded"}).get()
    # ... and a local folder without a checkpoint is transformers' own OSError, re-raised unchanged
    bad = tmp_path / "ckpt"
    bad.mkdir()
    with pytest.raises(OSError) as info:
        LazyReward("clipscore", kwargs={"model": str(bad)}).get()
    assert not isinstance(info.value, HubModelUnavailableError) and "HF_HUB_OFFLINE" not in str(info.value)


def test_adapter_argument_errors_in_full():
    from types import SimpleNamespace

    from rewardkit.integrations._common import refuse_batch_relative

    # catches any change to the batch-relative refusal's text (its three ways out)
    comp = SimpleNamespace(name="c", batch_relative=True, config=SimpleNamespace(normalize="group"))
    with pytest.raises(ConfigError) as info:
        refuse_batch_relative(comp, "verl", False)
    assert str(info.value) == (
        "reward 'c' normalises over the call (normalize='group'), but verl calls its reward on one process's slice "
        "of the batch (and partial prompt groups), so the z-scores would differ from those over the whole batch. "
        "Either\n"
        "  - score per rank with comp.axis_scores(images, prompts, metadata=...) and combine after gathering every "
        "rank: rewardkit.distributed.gather_combine(comp, axes) (see docs/integrations.md, 'Composites across "
        "ranks'), or\n"
        "  - use a per-sample normalisation (normalize='fixed' with calibrated mean/std, or 'none'), or\n"
        "  - pass allow_batch_relative=True if every call really holds whole groups on a single process.")
    # catches the bool-device and reward-type errors losing their text
    with pytest.raises(TypeError, match=r"^device must be an int, a string or a torch.device, got True$"):
        as_device(True)
    with pytest.raises(TypeError, match=r"^reward must be a rewardkit Reward or a registry name, got int$"):
        LazyReward(3)
