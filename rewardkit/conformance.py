"""The conformance checks every reward must pass (rewardkit's own and third-party plugins).

    >>> from rewardkit.conformance import check_reward
    >>> check_reward(MyReward.tiny(tmpdir))        # raises AssertionError naming the failed property

Each check is a function taking a reward; :func:`check_reward` runs them all. The checks use small random
images of different sizes, distinct prompts and, for editing rewards, source images.
"""

from __future__ import annotations

import pickle
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch

from .reward import PairwiseOutput, Reward, RewardOutput

__all__ = ["check_reward", "CHECKS", "sample_inputs"]

ATOL = 1e-4
RTOL = 1e-4

_PROMPTS = ["a red apple on a table", "two birds on a branch", "a green bowl", "a city street at night",
            "a cat sleeping on a mat", "a blue car"]
# Longer than any text window (CLIP's 77 tokens; tiny test tokenizers' 32): exercises truncation paths.
_LONG_PROMPT = ("a very detailed photograph of a red apple on an old wooden table next to a tall window with soft "
                "morning light, a blue ceramic bowl, two birds on a branch outside, a cat sleeping on a striped mat, "
                "and a city street at night reflected in the glass, shot on film with a shallow depth of field")

#: ``check_thread_safety``: worker threads, and calls per thread (each call scores 2 samples) for rewards that
#: declare ``thread_safe`` (others are serialised by the base class: one round of one-sample calls checks the
#: plumbing around them). 8 x 16 calls caught the shared-tokenizer race of issue 9 (about 1 call in 20 failed) in
#: every one of 20 runs.
THREADS = 8
THREAD_ROUNDS = 16


def sample_inputs(reward: Reward, n: int = 4, seed: int = 0, long_prompts: bool = False) -> dict[str, Any]:
    """Deterministic (images, prompts, sources) suited to the reward's tasks.

    ``long_prompts=True`` makes every odd-indexed prompt longer than any text window (distinct per sample).
    """
    from .testing import random_images

    sizes = [(32, 32), (48, 40), (40, 56), (64, 64), (36, 30), (56, 48)]
    images = random_images(n, seed=seed, sizes=sizes)
    prompts = [_PROMPTS[i % len(_PROMPTS)] for i in range(n)]
    if long_prompts:
        prompts = [f"{_LONG_PROMPT}, variant {i}" if i % 2 else p for i, p in enumerate(prompts)]
    sources = None
    if reward.accepts_sources and (reward.requires_sources or "t2i" not in reward.tasks):
        k = 2 if "multi_ref" in reward.tasks and "edit" not in reward.tasks else 1
        srcs = random_images(n * k, seed=seed + 1, sizes=sizes)
        sources = [srcs[i * k:(i + 1) * k] for i in range(n)]
    return {"images": images, "prompt": prompts, "sources": sources}


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shapes differ {tuple(a.shape)} vs {tuple(b.shape)}"
    assert torch.allclose(a, b, atol=ATOL, rtol=RTOL, equal_nan=True), f"{what}: {a.tolist()} != {b.tolist()}"


def _same_output(a: RewardOutput, b: RewardOutput, what: str) -> None:
    _same(a.scores, b.scores, f"{what} (scores)")
    assert a.valid.tolist() == b.valid.tolist(), f"{what} (valid): {a.valid.tolist()} != {b.valid.tolist()}"
    for k in a.dimensions:
        _same(a.dimensions[k], b.dimensions[k], f"{what} (dimension {k})")


def check_output_contract(reward: Reward) -> RewardOutput:
    x = sample_inputs(reward)
    out = reward(x["images"], x["prompt"], sources=x["sources"])
    n = len(x["images"])
    assert isinstance(out, RewardOutput), f"expected RewardOutput, got {type(out).__name__}"
    assert out.scores.shape == (n,) and out.scores.dtype == torch.float32, "scores must be float32 [B]"
    assert out.valid.shape == (n,) and out.valid.dtype == torch.bool, "valid must be bool [B]"
    assert len(out.errors) == n, "errors must have B entries"
    for k, v in out.dimensions.items():
        assert v.shape == (n,) and v.dtype == torch.float32, f"dimension {k} must be float32 [B]"
    missing = [d for d in reward.dimensions if d not in out.dimensions]
    assert not missing, f"declared dimensions {missing} are missing from the output"
    if bool(out.valid.any()):  # a declared dimension the reward never fills is NaN everywhere: say so
        empty = [d for d in reward.dimensions if bool(torch.isnan(out.dimensions[d][out.valid]).all())]
        assert not empty, f"declared dimensions {empty} are NaN for every valid sample"
    for i in range(n):
        if out.valid[i]:
            assert torch.isfinite(out.scores[i]), f"sample {i} valid but score {out.scores[i]}"
            assert out.errors[i] is None
        else:
            assert torch.isnan(out.scores[i]), f"sample {i} invalid but score {out.scores[i]} is not NaN"
            assert isinstance(out.errors[i], str) and out.errors[i], f"sample {i} invalid without a reason"
    if reward.score_range is not None:
        lo, hi = reward.score_range
        v = out.scores[out.valid]
        assert bool(((v >= lo - 1e-5) & (v <= hi + 1e-5)).all()), f"scores {v.tolist()} outside {reward.score_range}"
    for d in out.dimensions:
        assert isinstance(d, str)
    import json

    json.dumps(out.to_dict())  # JSON-serialisable, NaN -> None
    json.dumps(out.records())
    return out


def check_deterministic(reward: Reward) -> None:
    x = sample_inputs(reward)
    a = reward(x["images"], x["prompt"], sources=x["sources"])
    b = reward(x["images"], x["prompt"], sources=x["sources"])
    _same_output(a, b, "two identical calls")


def check_chunking(reward: Reward) -> None:
    x = sample_inputs(reward, n=5)
    whole = reward(x["images"], x["prompt"], sources=x["sources"], batch_size=5)
    ones = reward(x["images"], x["prompt"], sources=x["sources"], batch_size=1)
    twos = reward(x["images"], x["prompt"], sources=x["sources"], batch_size=2)
    _same_output(whole, ones, "batch_size=5 vs batch_size=1")
    _same_output(whole, twos, "batch_size=5 vs batch_size=2")


def check_input_kinds(reward: Reward) -> None:
    x = sample_inputs(reward, n=3)
    pil = reward(x["images"], x["prompt"], sources=x["sources"])
    u8 = [np.asarray(im) for im in x["images"]]
    fl = [torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 255.0 for im in x["images"]]
    t8 = [torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1) for im in x["images"]]
    _same_output(pil, reward(u8, x["prompt"], sources=x["sources"]), "PIL vs numpy uint8 HWC")
    _same_output(pil, reward(fl, x["prompt"], sources=x["sources"]), "PIL vs torch float CHW")
    _same_output(pil, reward(t8, x["prompt"], sources=x["sources"]), "PIL vs torch uint8 CHW")


def check_tensor_batch(reward: Reward) -> None:
    """Rewards with ``supports_tensor_input`` (torch pre-processing of float ``[B, 3, H, W]`` tensors on their
    device) agree with their processor path on the same pixels: same validity, scores within 1% of the larger
    of 1 and the largest score (resampling kernels differ slightly; see docs/tensors-and-gradients.md), and
    the tensor path follows the reward's ``batch_size`` chunking exactly."""
    if not reward.supports_tensor_input or reward.requires_sources:
        return
    from .testing import random_images

    imgs = random_images(3, seed=5, sizes=[(48, 40)])
    x = torch.stack([torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1) for im in imgs]).float() / 255.0
    prompts = _PROMPTS[:3]
    tensor = reward(x, prompts)
    ref = reward(imgs, prompts)
    assert tensor.valid.tolist() == ref.valid.tolist(), "tensor path and processor path disagree on validity"
    tol = 0.01 * max(1.0, float(ref.scores[ref.valid].abs().max()) if bool(ref.valid.any()) else 1.0)
    diff = (tensor.scores - ref.scores)[ref.valid].abs()
    assert bool((diff <= tol).all()), f"tensor path {tensor.scores.tolist()} vs processor path {ref.scores.tolist()}"
    _same_output(tensor, reward(x, prompts, batch_size=1), "tensor path: whole batch vs batch_size=1")


def check_thread_safety(reward: Reward, threads: int = THREADS, rounds: int | None = None) -> None:
    """Concurrent calls give the serial results.

    ``threads`` workers make ``threads * rounds`` calls of 2 samples each, one prompt short and one longer
    than any text window, so a tokenizer's truncation path runs beside its plain path (shared tokenizer
    state is the usual culprit). The interpreter's thread switch interval is shortened for the duration, so
    threads interleave often enough to expose such races in a few dozen calls.

    A reward that is not ``thread_safe`` (nor ``batch_relative``) is scored one sample per call, short and long
    prompts alternating: the base class serialises its ``_score``, so what runs concurrently is the plumbing
    around it (decoding, the per-call scope such as a judge session), and shorter scoring leaves more calls
    inside each other's plumbing. A judge session made shared across threads (its lock taken out) was caught
    in 54 of 180 runs this way, against 4 of 180 with two-sample calls, for less than half the CPU (the tiny
    QwenVL, VQAScore, UnifiedReward, EVR and RationalRewards judges).
    """
    n = threads
    rounds = rounds if rounds is not None else (THREAD_ROUNDS if reward.thread_safe else 1)
    x = sample_inputs(reward, n=n, long_prompts=True)
    per_call = 2 if reward.thread_safe or reward.batch_relative else 1
    calls = [[i, (i + 1) % n][:per_call] for i in range(n)]  # one short and one long prompt (or alternating)

    def call(j: int) -> RewardOutput:
        idx = calls[j]
        return reward([x["images"][i] for i in idx], [x["prompt"][i] for i in idx],
                      sources=None if x["sources"] is None else [x["sources"][i] for i in idx])

    ref = [call(j) for j in range(n)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futs = [(j, pool.submit(call, j)) for _ in range(rounds) for j in range(n)]
            got = []
            for j, f in futs:
                try:
                    got.append((j, f.result()))
                except Exception as exc:  # noqa: BLE001 -- a raised call is a failure to report, with the others
                    got.append((j, exc))
    finally:
        sys.setswitchinterval(old)
    failures = []
    for j, out in got:
        if isinstance(out, Exception):
            failures.append(f"call {j} raised {type(out).__name__}: {out}")
            continue
        try:
            _same_output(ref[j], out, f"threaded call {j}")
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, (f"{len(failures)} of {len(got)} concurrent calls ({threads} threads) differ from serial "
                          f"calls; first: {failures[0]}")


def check_config_pickle(reward: Reward) -> None:
    cfg = reward.config
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg, "config does not survive pickling"
    assert isinstance(cfg, type(reward).Config)


def check_bad_sample_isolated(reward: Reward) -> None:
    x = sample_inputs(reward, n=3)
    good = reward(x["images"], x["prompt"], sources=x["sources"])
    images = list(x["images"])
    images[1] = b"not an image"
    mixed = reward(images, x["prompt"], sources=x["sources"], on_error="nan")
    assert not mixed.valid[1] and "not a recognised image" in mixed.errors[1]
    keep = torch.tensor([0, 2])
    if reward.batch_relative:  # the bad sample leaves the statistics: only validity is comparable
        assert mixed.valid[keep].tolist() == good.valid[keep].tolist()
        return
    _same(good.scores[keep], mixed.scores[keep], "good samples beside a bad one")


def check_empty_batch(reward: Reward) -> None:
    x = sample_inputs(reward, n=1)
    out = reward([], [], sources=[] if x["sources"] is not None else None)
    assert len(out) == 0 and out.scores.shape == (0,)


def check_compare(reward: Reward) -> None:
    x = sample_inputs(reward, n=4)
    a, b = x["images"][:2], x["images"][2:]
    prompts = x["prompt"][:2]
    srcs = None if x["sources"] is None else x["sources"][:2]
    cmp = reward.compare(a, b, prompts, sources=srcs)
    assert isinstance(cmp, PairwiseOutput) and cmp.prob_a.shape == (2,)
    p = cmp.prob_a[cmp.valid]
    assert bool(((p >= 0) & (p <= 1)).all())
    if type(reward).compare is Reward.compare:  # default derived from scores
        if reward.batch_relative:  # compare scores a and b in one call, so compare against that call
            both = reward(a + b, prompts + prompts, sources=None if srcs is None else srcs + srcs).scores
            sa, sb = both[:2], both[2:]
        else:
            sa = reward(a, prompts, sources=srcs).scores
            sb = reward(b, prompts, sources=srcs).scores
        for i in range(2):
            if not (torch.isfinite(sa[i]) and torch.isfinite(sb[i])):
                assert not cmp.valid[i]
                continue
            better_a = bool(sa[i] > sb[i]) if reward.higher_is_better else bool(sa[i] < sb[i])
            if abs(float(sa[i] - sb[i])) > 1e-6:
                assert (float(cmp.prob_a[i]) > 0.5) == better_a, f"compare disagrees with scores at {i}"
            else:
                assert abs(float(cmp.prob_a[i]) - 0.5) < 1e-4


CHECKS: dict[str, Callable[[Reward], Any]] = {
    "output_contract": check_output_contract,
    "deterministic": check_deterministic,
    "chunking": check_chunking,
    "input_kinds": check_input_kinds,
    "tensor_batch": check_tensor_batch,
    "thread_safety": check_thread_safety,
    "config_pickle": check_config_pickle,
    "bad_sample_isolated": check_bad_sample_isolated,
    "empty_batch": check_empty_batch,
    "compare": check_compare,
}


def check_reward(reward: Reward, checks: list[str] | None = None) -> None:
    """Run the conformance checks (all by default); raises AssertionError on the first failure."""
    for name in checks or list(CHECKS):
        try:
            CHECKS[name](reward)
        except AssertionError as exc:
            raise AssertionError(f"{type(reward).__name__} fails conformance check {name!r}: {exc}") from None
