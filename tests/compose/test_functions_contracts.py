"""Documented contracts of ``rewardkit.compose.functions`` that the formula tests leave open (found by mutation
testing): output dtype (float32 ``[B]`` whatever the input dtype), default arguments, error cases, exact
thresholds.

Expected values are hand-computed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rewardkit.compose import functions as F

NAN = float("nan")


# ------------------------------------------------------------------ compose/functions.py
@pytest.mark.parametrize("x", [[1, 2, 3], torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), np.array([1, 2, 3])])
def test_zscore_returns_float32_for_any_input_dtype(x):
    z = F.zscore(x)
    s = math.sqrt(2 / 3)
    assert z.dtype == torch.float32 and z.shape == (3,)
    assert torch.allclose(z, torch.tensor([-1 / s, 0.0, 1 / s]), atol=1e-6)
    g = F.group_zscore(x, ["a", "a", "a"])
    assert g.dtype == torch.float32 and torch.allclose(g, z)


def test_zscore_default_eps_boundary():
    # population std 5e-7 < 1e-6: zero-variance -> zeros; std 2e-6 > 1e-6 -> +-1
    assert torch.equal(F.zscore(torch.tensor([0.0, 1e-6])), torch.zeros(2))
    assert torch.allclose(F.zscore(torch.tensor([0.0, 4e-6])), torch.tensor([-1.0, 1.0]), atol=1e-3)
    # "below eps" is strict: std exactly equal to eps (here 1.0) still gives z-scores
    assert F.zscore(torch.tensor([0.0, 2.0]), eps=1.0).tolist() == [-1.0, 1.0]
    # explicit eps moves the boundary
    assert torch.equal(F.zscore(torch.tensor([0.0, 4e-6]), eps=1e-5), torch.zeros(2))
    assert torch.allclose(F.group_zscore(torch.tensor([0.0, 4e-6]), [1, 1]), torch.tensor([-1.0, 1.0]), atol=1e-3)
    assert torch.equal(F.group_zscore(torch.tensor([0.0, 4e-6]), [1, 1], eps=1e-5), torch.zeros(2))


def test_zscore_inf_is_excluded_and_all_masked_is_nan():
    z = F.zscore(torch.tensor([1.0, float("inf"), 3.0]))
    assert torch.allclose(z, torch.tensor([-1.0, NAN, 1.0]), equal_nan=True)
    assert torch.isnan(F.zscore(torch.tensor([1.0, 2.0]), mask=torch.tensor([False, False]))).all()
    assert F.zscore(torch.tensor([1.0, 2.0]), mask=[True, False]).tolist()[0] == 0.0   # one sample: 0
    # an integer 0/1 mask is a mask, not a list of indices: stats over x[0], x[2] = {1, 5}
    z = F.zscore(torch.tensor([1.0, 3.0, 5.0]), mask=torch.tensor([1, 0, 1]))
    assert torch.allclose(z, torch.tensor([-1.0, NAN, 1.0]), equal_nan=True)


def test_group_zscore_mask_and_bad_keys():
    z = F.group_zscore(torch.tensor([1.0, 3.0, 5.0, 100.0]), ["a", "a", "a", "a"], mask=[True, True, False, True])
    # stats over {1, 3, 100}
    x = np.array([1.0, 3.0, 100.0])
    want = (x - x.mean()) / x.std()
    assert torch.allclose(z, torch.tensor([want[0], want[1], NAN, want[2]], dtype=torch.float32), equal_nan=True)
    with pytest.raises(ValueError, match="^got 2 group keys for 4 values$"):
        F.group_zscore(torch.zeros(4), ["a", "b"])


def test_intent_gate_default_and_dtype():
    g = F.intent_gate(["strict", "neutral", "open", None])
    assert g.dtype == torch.float32 and g.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert F.intent_gate(["open", None], on=["open"]).tolist() == [1.0, 0.0]
    assert F.INTENT_LABELS == ("strict", "neutral", "open")


def test_veto_default_strength_and_dtype():
    z = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    out = F.veto(z, [1, 1, 0])                          # int "fired", default strength 1: clip at 0
    assert out.dtype == torch.float32 and out.tolist() == [0.0, -1.0, 0.5]
    assert F.veto([2, -1], [True, False], strength=0.25).tolist() == [1.5, -1.0]


def test_additive_penalty_default_and_dtype():
    z = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    out = F.additive_penalty(z, [1, 1, 0])              # default penalty 1
    assert out.dtype == torch.float32 and out.tolist() == [1.0, -2.0, 0.5]
    assert F.additive_penalty([2, -1], [True, False], penalty=0.5).tolist() == [1.5, -1.0]


def test_combine_dtypes_gates_and_errors():
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)
    b = [3, NAN]
    out = F.combine([a, b], [2.0, 0.5], [None, torch.tensor([1, 0])])
    assert out.dtype == torch.float32 and out.tolist() == [2.0 + 1.5, 4.0]     # gated-off NaN -> exactly 0
    # a gate value is a multiplier where open (documented 0/1, but a soft gate scales)
    assert F.combine([[2.0]], [1.0], [[0.5]]).tolist() == [1.0]
    # an open gate on a NaN z-score makes the sum NaN (the caller reports why)
    assert math.isnan(F.combine([[NAN]], [1.0], [[1.0]]).item())
    assert F.combine([[1, 2]], [3]).tolist() == [3.0, 6.0]                      # gates default to None
    with pytest.raises(ValueError, match="^2 terms but 1 weights$"):
        F.combine([a, a], [1.0])
    with pytest.raises(ValueError, match="^combine needs at least one term$"):
        F.combine([], [])
