"""The claims of docs/integrations.md that had no test that could fail: the NaN policies per host (``error`` raises a
ValueError naming indices and reasons, ``fill`` values, ``mask`` for TRL only), ``multi_score`` with
``reward_kwargs``, TRL's text callable / image index / metadata columns, verl's prompt lookup, AlignProp's checks
and composites without a process group. Expected values are written by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit.reward import Reward, RewardBatch, RewardOutput


PROMPTS6 = ("a photo of a cat", "a red car", "two birds", "a bowl of soup", "a neon sign", "a dog")


def _red(im) -> float:
    return float(np.asarray(im)[..., 0].astype(np.float64).mean()) / 255.0


class Probe(Reward):
    """Red-channel mean of the image minus that of its first source (NaN + reason for dark images); records
    what each call received (texts, metadata, sources, batch size)."""

    name = "test-probe"
    tasks = frozenset({"t2i", "edit"})
    thread_safe = True

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []

    def _score(self, batch: RewardBatch) -> RewardOutput:
        self.calls.append({"n": len(batch), "prompts": list(batch.prompts), "metadata": [dict(m) for m in batch.metadata],
                           "sources": batch.sources})
        vals, errs = [], []
        for i, im in enumerate(batch.images):
            dark = float(np.asarray(im).mean()) < 40
            v = _red(im) - (_red(batch.sources[i][0]) if batch.sources and batch.sources[i] else 0.0)
            vals.append(float("nan") if dark else v)
            errs.append("too dark to score" if dark else None)
        return RewardOutput(scores=torch.tensor(vals, dtype=torch.float64).float(), errors=errs)


def solid(red: int, size: int = 16) -> Image.Image:
    return Image.new("RGB", (size, size), (red, 120, 90))


def float_batch(n=6, size=24, dark=(1, 4)) -> torch.Tensor:
    x = torch.stack([torch.full((3, size, size), (60 + 25 * i) / 255) for i in range(n)])  # exact in 8 bits
    for i in dark:
        x[i] = 0.01
    return x


def _trl_call(fn, prompts, completions, **columns):
    """The keywords of TRL 1.16's GRPOTrainer._calculate_rewards."""
    logged = {}
    out = fn(prompts=prompts, completions=completions, completion_ids=[[1]] * len(completions), trainer_state=None,
             log_extra=lambda c, v: None, log_metric=lambda k, v: logged.__setitem__(k, v), **columns)
    return out, logged


def test_nan_error_is_a_value_error_with_indices_and_reasons():
    """integrations.md: NonFiniteRewardError (a ValueError) lists each invalid sample's index and reason."""
    from rewardkit.integrations import NonFiniteRewardError, multi_score

    with pytest.raises(NonFiniteRewardError) as ei:
        multi_score("cpu", {"p": 1.0}, rewards={"p": Probe()})(float_batch(), PROMPTS6, None)
    assert isinstance(ei.value, ValueError)
    assert ei.value.indices == [1, 4] and ei.value.reasons == ["too dark to score"] * 2
    assert "sample 1: too dark to score" in str(ei.value) and "sample 4" in str(ei.value)


def test_fill_policy_values_and_reports_per_host():
    """integrations.md: `fill` puts fill_value at each invalid sample; the report is
    {valid_fraction, n_invalid, invalid: {index: reason}} in flow_grpo's info[name] and DDPO's metadata; flow_grpo's
    "avg" sums the filled values."""
    from rewardkit.integrations import ddpo_reward_fn, multi_score

    x = float_batch()
    red = x[:, 0, 0, 0].double()
    expected = [-2.0 if i in (1, 4) else float(red[i]) for i in range(6)]
    report = {"valid_fraction": 4 / 6, "n_invalid": 2, "invalid": {1: "too dark to score", 4: "too dark to score"}}
    details, info = multi_score("cpu", {"p": 0.5, "q": 2.0}, rewards={"p": Probe(), "q": Probe()}, nan_policy="fill",
                                fill_value=-2.0)(x, PROMPTS6, None)
    np.testing.assert_allclose(details["p"], expected, atol=1e-6)
    np.testing.assert_allclose(details["avg"], [2.5 * v for v in expected], atol=1e-5)
    assert info == {"p": report, "q": report}
    rewards, meta = ddpo_reward_fn(Probe(), nan_policy="fill", fill_value=-2.0)(x, PROMPTS6, None)
    assert rewards.dtype == torch.float32
    np.testing.assert_allclose(rewards.numpy(), expected, atol=1e-6)
    assert meta == report


def test_mask_policy_is_trl_only():
    from rewardkit.integrations import ddpo_reward_fn, flow_grpo_scorer, multi_score, verl_compute_score

    for make in (lambda: multi_score("cpu", {"p": 1.0}, rewards={"p": Probe()}, nan_policy="mask"),
                 lambda: flow_grpo_scorer(Probe(), nan_policy="mask"),
                 lambda: verl_compute_score(Probe(), nan_policy="mask"),
                 lambda: ddpo_reward_fn(Probe(), nan_policy="mask")):
        with pytest.raises(ValueError, match="cannot mask"):
            make()


def test_multi_score_builds_named_rewards_with_reward_kwargs(tiny_clip_dir):
    """integrations.md: multi_score(device, {name: weight}, reward_kwargs={name: {...}}) builds each reward by name
    with its options; "avg" = sum of w * s."""
    from rewardkit import load_reward
    from rewardkit.integrations import multi_score

    x = float_batch(dark=())
    fn = multi_score(torch.device("cpu"), {"pickscore": 1.0, "clipscore": 0.5},
                     reward_kwargs={"pickscore": {"model": str(tiny_clip_dir)},
                                    "clipscore": {"model": str(tiny_clip_dir), "convention": "cosine"}},
                     conventions="rewardkit")   # rewardkit's own scales (flow_grpo's: test_flow_grpo.py)
    details, _ = fn(x, PROMPTS6, tuple({} for _ in PROMPTS6), only_strict=True)
    p = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")(x, list(PROMPTS6)).scores.numpy()
    c = load_reward("clipscore", model=str(tiny_clip_dir), convention="cosine", device="cpu")(x, list(PROMPTS6)).scores.numpy()
    np.testing.assert_array_equal(details["pickscore"], p)
    np.testing.assert_array_equal(details["clipscore"], c)
    np.testing.assert_allclose(details["avg"], p + 0.5 * c, rtol=1e-6)
    with pytest.raises(ValueError, match="score_dict does not weight"):
        multi_score("cpu", {"pickscore": 1.0}, reward_kwargs={"clipscore": {}})
    with pytest.raises(ValueError, match="avg"):
        multi_score("cpu", {"avg": 1.0})


def test_trl_text_callable_image_index_and_metadata_columns():
    """integrations.md: text=callable(prompt, completion); the `images` column with image_index picks the image;
    metadata_columns pass the named columns (only those) as per-sample metadata."""
    from rewardkit.integrations import trl_reward_func

    probe = Probe()
    fn = trl_reward_func(probe, text=lambda p, c: f"{p}|{c}", image_index=1, metadata_columns=["intent"])
    images = [[solid(60 + 10 * i), solid(200 - 10 * i)] for i in range(3)]
    out, logged = _trl_call(fn, ["p0", "p1", "p2"], ["c0", "c1", "c2"], images=images,
                            intent=["a", "b", "c"], other=[1, 2, 3])
    assert out == pytest.approx([(200 - 10 * i) / 255 for i in range(3)], abs=1e-6)   # the second image of each row
    assert probe.calls[-1]["prompts"] == ["p0|c0", "p1|c1", "p2|c2"]
    assert probe.calls[-1]["metadata"] == [{"intent": "a"}, {"intent": "b"}, {"intent": "c"}]
    assert logged == {"rewardkit/test_probe/valid_fraction": 1.0}   # __name__: the registry name, a valid identifier
    with pytest.raises(ValueError, match="intent"):
        _trl_call(fn, ["p0"], ["c0"], images=[[solid(1), solid(2)]])
    first = trl_reward_func(Probe())          # image_index defaults to 0
    assert _trl_call(first, ["p"] * 3, ["c"] * 3, images=images)[0] == pytest.approx(
        [(60 + 10 * i) / 255 for i in range(3)], abs=1e-6)


def test_verl_prompt_lookup_sources_layouts_and_no_micro_batching():
    """integrations.md (verl): prompt from extra_info["prompt"], then ["raw_prompt"], then a string ground_truth;
    prompt_key= names another key or "ground_truth"; source_key= gives editing rewards their source; uint8 CHW,
    1xCxHxW, HxWxC arrays and PIL are one sample; micro_batch 0 or 1 scores every call alone."""
    from rewardkit.integrations import verl_compute_score

    probe = Probe()
    fn = verl_compute_score(probe)

    def prompt_of(**kw):
        fn(data_source="x", solution_image=solid(150), **kw)
        return probe.calls[-1]["prompts"][0]

    assert prompt_of(ground_truth="C", extra_info={"prompt": "A", "raw_prompt": "B"}) == "A"
    assert prompt_of(ground_truth="C", extra_info={"raw_prompt": "B"}) == "B"
    assert prompt_of(ground_truth="C", extra_info={}) == "C"
    assert prompt_of(ground_truth="C", extra_info=None) == "C"
    with pytest.raises(ValueError, match="no prompt"):
        fn(data_source="x", solution_image=solid(150), ground_truth={"answer": 1}, extra_info={})
    by_key = verl_compute_score(probe, prompt_key="caption")
    by_key(solution_image=solid(150), ground_truth="C", extra_info={"caption": "D", "prompt": "A"})
    assert probe.calls[-1]["prompts"] == ["D"]
    by_gt = verl_compute_score(probe, prompt_key="ground_truth")
    by_gt(solution_image=solid(150), ground_truth="C", extra_info={"prompt": "A"})
    assert probe.calls[-1]["prompts"] == ["C"]
    # editing: the source image from extra_info[source_key]
    edit = verl_compute_score(probe, source_key="src")
    g = edit(solution_image=solid(200), ground_truth="make it red", extra_info={"src": solid(50)})
    assert g == {"score": pytest.approx((200 - 50) / 255, abs=1e-6), "valid": 1.0}
    assert len(probe.calls[-1]["sources"][0]) == 1
    with pytest.raises(ValueError, match="src"):
        edit(solution_image=solid(200), ground_truth="p", extra_info={})
    # layouts: one sample each, the same score
    pil = solid(170)
    hwc = np.array(pil)
    chw = torch.from_numpy(hwc).permute(2, 0, 1).contiguous()
    scores = [fn(solution_image=im, ground_truth="p", extra_info={})["score"] for im in (pil, hwc, chw, chw[None])]
    assert scores == [pytest.approx(170 / 255, abs=1e-6)] * 4
    # micro_batch 0 / 1: every call scored alone, even from many threads
    from concurrent.futures import ThreadPoolExecutor

    for mb in (0, 1):
        p = Probe()
        f = verl_compute_score(p, micro_batch=mb)
        with ThreadPoolExecutor(4) as ex:
            res = list(ex.map(lambda i: f(solution_image=solid(100 + i), ground_truth="p", extra_info={}), range(8)))
        assert [c["n"] for c in p.calls] == [1] * 8 and all(set(r) == {"score", "valid"} for r in res)
    for bad in ({"micro_batch": -1}, {"max_wait_s": -0.1}, {"max_wait_s": 11.0}, {"max_wait_s": float("nan")}):
        with pytest.raises(ValueError, match="micro_batch|max_wait_s"):
            verl_compute_score(Probe(), **bad)


class _GradProbe(Reward):
    """Differentiable stand-in: score_tensor = mean pixel value, NaN for dark images (a model that returns a
    non-finite score on valid input)."""

    name = "test-grad-probe"
    differentiable = True

    def _score(self, batch):
        return RewardOutput(scores=torch.zeros(len(batch)))

    def score_tensor(self, images, prompt=None, *, batch_size=None):
        m = images.float().mean(dim=(1, 2, 3))
        return torch.where(m < 0.05, torch.full_like(m, float("nan")), m)


def test_alignprop_refuses_bad_pixels_and_applies_the_nan_policy_to_scores(tiny_clip_dir):
    """integrations.md (AlignProp): an input the reward cannot score raises (RewardInputError); a non-finite score
    follows the NaN policy (raise, or fill keeping the other samples' graph)."""
    from rewardkit import load_reward
    from rewardkit.errors import RewardInputError
    from rewardkit.integrations import NonFiniteRewardError, ddpo_reward_fn

    pick = load_reward("pickscore", model=str(tiny_clip_dir), device="cpu")
    bad = float_batch(n=2, dark=())
    bad[1, 0, 0, 0] = float("nan")
    with pytest.raises(RewardInputError):
        ddpo_reward_fn(pick, alignprop=True)(bad, PROMPTS6[:2], None)
    x = float_batch(n=3, dark=(1,)).requires_grad_(True)
    with pytest.raises(NonFiniteRewardError):
        ddpo_reward_fn(_GradProbe(), alignprop=True)(x, PROMPTS6[:3], None)
    rewards, meta = ddpo_reward_fn(_GradProbe(), alignprop=True, nan_policy="fill", fill_value=-1.0)(x, PROMPTS6[:3], None)
    assert rewards[1].item() == -1.0 and meta["n_invalid"] == 1 and meta["invalid"] == {1: "non-finite score"}
    rewards.sum().backward()
    assert x.grad[0].abs().sum() > 0 and x.grad[1].abs().sum() == 0 and torch.isfinite(x.grad).all()


def test_composites_none_normalisation_and_gather_combine_without_a_process_group():
    """integrations.md: normalize="none" composites are accepted by every adapter; without a process group
    gather_combine(comp, axes) is comp.combine(axes), equal to one call over the batch (and group_keys groups)."""
    from rewardkit import distributed
    from rewardkit.compose import Composite
    from rewardkit.integrations import flow_grpo_scorer

    imgs = [solid(60 + 20 * i) for i in range(6)]
    raw = Composite(axes=[{"name": "a", "weight": 2.0}], rewards={"a": Probe()}, normalize="none")
    scores, _ = flow_grpo_scorer(raw)(imgs, PROMPTS6, None)
    np.testing.assert_allclose(scores, [2 * (60 + 20 * i) / 255 for i in range(6)], rtol=1e-5)

    comp = Composite(axes=[{"name": "a"}], rewards={"a": Probe()}, normalize="batch")
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    axes = comp.axis_scores(imgs, list(PROMPTS6))
    whole = comp(imgs, list(PROMPTS6)).scores
    for out in (distributed.gather_combine(comp, axes), distributed.gather_combine(comp, axes, local=True),
                comp.combine(axes)):
        torch.testing.assert_close(out.scores, whole)
    v = torch.tensor([(60 + 20 * i) / 255 for i in range(6)], dtype=torch.float64)
    torch.testing.assert_close(whole.double(), (v - v.mean()) / (v.std(unbiased=False) + 1e-4), atol=1e-5, rtol=0)
    grp = Composite(axes=[{"name": "a"}], rewards={"a": Probe()}, normalize="group")
    ids = [0, 0, 0, 1, 1, 1]
    g = distributed.gather_combine(grp, grp.axis_scores(imgs, list(PROMPTS6)), group_keys=ids).scores.double()
    for k in (0, 1):
        part = v[3 * k:3 * k + 3]
        torch.testing.assert_close(g[3 * k:3 * k + 3], (part - part.mean()) / (part.std(unbiased=False) + 1e-4),
                                   atol=1e-5, rtol=0)
