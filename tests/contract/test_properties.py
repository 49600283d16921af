"""Property-based tests (Hypothesis) for the pure cores: bench metrics, composition functions, media, chunking.

Each property is checked against a reference written here (brute force or a definition), never against the
function itself. Example counts are small (``max_examples``) so the file runs in a few seconds.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from PIL import Image

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from rewardkit import media  # noqa: E402
from rewardkit.bench import metrics as M  # noqa: E402
from rewardkit.compose.functions import combine, group_zscore, intent_gate, veto, zscore  # noqa: E402
from rewardkit.reward import Reward, RewardBatch, RewardOutput  # noqa: E402

# REWARDKIT_PROPERTY_EXAMPLES caps the examples (scripts/mutation.sh runs these tests once per mutant)
# and, when set, fixes the examples (derandomize), so that a recorded mutation run gives the same verdicts again
_CAP = int(os.environ.get("REWARDKIT_PROPERTY_EXAMPLES", "0")) or None
FAST = settings(max_examples=min(60, _CAP or 60), deadline=None, database=None, derandomize=_CAP is not None)
SLOWER = settings(max_examples=min(25, _CAP or 25), deadline=None, database=None, derandomize=_CAP is not None)

labels = st.sampled_from([-1, 0, 1])
# margins on a coarse grid so exact ties and equal |m| occur often
margins = st.integers(-4, 4).map(lambda k: k / 2)


@st.composite
def comparisons(draw, min_size=1, max_size=14, nan=True):
    n = draw(st.integers(min_size, max_size))
    h = draw(st.lists(labels, min_size=n, max_size=n))
    m = draw(st.lists(margins if not nan else st.one_of(margins, margins, margins, st.just(math.nan)),
                      min_size=n, max_size=n))
    return np.array(h), np.array(m, dtype=np.float64)


def _ref_acc_at(h, m, eps):
    """Deutsch et al. accuracy with ties at threshold eps, straight from the definition (valid pairs only)."""
    good = total = 0
    for hi, mi in zip(h, m):
        if not math.isfinite(mi):
            continue
        total += 1
        pred = 0 if abs(mi) <= eps else (1 if mi > 0 else -1)
        good += pred == hi
    return good / total if total else math.nan


def _odd_monotone(m, kind):
    f = {"cube": lambda a: a ** 3, "exp": lambda a: np.expm1(a), "scale": lambda a: 7.5 * a}[kind]
    return np.sign(m) * f(np.abs(m))


# ------------------------------------------------------------------ bench metrics
@FAST
@given(comparisons())
def test_accuracy_without_ties_swap_symmetry_and_reference(hm):
    h, m = hm
    r = M.accuracy_without_ties(h, m)
    s = M.accuracy_without_ties(-h, -m)
    keep = [(hi, mi) for hi, mi in zip(h, m) if hi != 0 and math.isfinite(mi)]
    want = sum((mi > 0 and hi == 1) or (mi < 0 and hi == -1) for hi, mi in keep) / len(keep) if keep else math.nan
    assert r.n == s.n == len(keep)
    if keep:
        assert r.value == pytest.approx(want) and s.value == pytest.approx(want)
    else:
        assert math.isnan(r.value) and math.isnan(s.value)


@FAST
@given(comparisons())
def test_tie_calibrated_accuracy_is_the_brute_force_optimum(hm):
    h, m = hm
    r = M.accuracy_with_ties(h, m)
    finite = m[np.isfinite(m)]
    if finite.size == 0:
        assert math.isnan(r.value) and r.n == 0
        return
    cands = sorted({0.0, *np.abs(finite).tolist()})
    accs = [_ref_acc_at(h, m, e) for e in cands]
    best = max(accs)
    assert r.value == pytest.approx(best)
    assert r.extra["threshold"] == cands[accs.index(best)]      # the smallest optimal threshold
    assert M.accuracy_with_ties(-h, -m).value == pytest.approx(best)  # A/B swap


@FAST
@given(comparisons(), st.sampled_from(["cube", "exp", "scale"]))
def test_metrics_invariant_to_odd_monotone_margin_transforms(hm, kind):
    """Both accuracies use only sign(m) and the order of |m|: an odd, strictly increasing map keeps them."""
    h, m = hm
    t = _odd_monotone(m, kind)
    assert M.accuracy_without_ties(h, t).value == pytest.approx(M.accuracy_without_ties(h, m).value, nan_ok=True)
    assert M.accuracy_with_ties(h, t).value == pytest.approx(M.accuracy_with_ties(h, m).value, nan_ok=True)


@st.composite
def ranked_groups(draw):
    groups = []
    for g in range(draw(st.integers(1, 5))):
        k = draw(st.integers(2, 4))
        human = draw(st.lists(st.integers(0, 2), min_size=k, max_size=k))
        model = draw(st.lists(st.integers(0, 3), min_size=k, max_size=k))
        groups.append((f"g{g}", human, model))
    return groups


def _group_rows(groups, transform=lambda x: x):
    rows = []
    for gid, human, model in groups:
        s = [transform(float(v)) for v in model]
        for i in range(len(human)):
            for j in range(i + 1, len(human)):
                rows.append((gid, int(np.sign(human[i] - human[j])), s[i] - s[j]))
    return rows


@FAST
@given(ranked_groups())
def test_group_accuracy_equals_ranking_equality(groups):
    """A group is right iff the model's weak ordering (ties included) equals the human one; invariant to a
    strictly increasing transform of the candidate scores and to the A/B swap of every row."""
    def dense(x):
        lv = sorted(set(x))
        return [lv.index(v) for v in x]

    want = sum(dense(h) == dense(m) for _, h, m in groups) / len(groups)
    for tr in (lambda x: x, lambda x: math.exp(x) - 3.0):
        g, h, m = zip(*_group_rows(groups, tr))
        assert M.group_accuracy(list(g), h, m).value == pytest.approx(want)
        assert M.group_accuracy(list(g), [-x for x in h], [-x for x in m]).value == pytest.approx(want)


# ------------------------------------------------------------------ composition functions
finite_vec = st.lists(st.integers(-1000, 1000), min_size=1, max_size=12).map(lambda v: np.array(v, dtype=np.float64))


def _ref_z(x):
    s = x.std()
    return np.zeros_like(x) if s < 1e-6 else (x - x.mean()) / s


@FAST
@given(finite_vec, st.sampled_from([0.25, 0.5, 2.0, 3.0, -1.0, -4.0]), st.integers(-500, 500))
def test_zscore_shift_scale_invariance(x, a, b):
    z = zscore(torch.tensor(x)).double().numpy()
    np.testing.assert_allclose(z, _ref_z(x), atol=1e-4)
    za = zscore(torch.tensor(a * x + b)).double().numpy()
    np.testing.assert_allclose(za, np.sign(a) * z, atol=1e-4)   # affine: same up to the sign of a


@FAST
@given(st.floats(-1e6, 1e6, allow_nan=False), st.integers(1, 10))
def test_zscore_zero_variance_is_zero(c, n):
    z = zscore(torch.full((n,), c, dtype=torch.float64))
    assert torch.equal(z, torch.zeros(n))


@FAST
@given(finite_vec, st.data())
def test_zscore_mask_and_groups_equal_the_subset(x, data):
    n = len(x)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    z = zscore(torch.tensor(x), torch.tensor(mask)).double().numpy()
    assert np.isnan(z[~mask]).all()
    if mask.any():
        np.testing.assert_allclose(z[mask], _ref_z(x[mask]), atol=1e-4)
    keys = data.draw(st.lists(st.sampled_from("abc"), min_size=n, max_size=n))
    gz = group_zscore(torch.tensor(x), keys).double().numpy()
    for k in set(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k]
        np.testing.assert_allclose(gz[idx], _ref_z(x[idx]), atol=1e-4)


@FAST
@given(st.lists(st.tuples(st.floats(-5, 5, allow_nan=False), st.booleans()), min_size=1, max_size=10),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_veto_is_one_sided(rows, strength):
    z = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    fired = torch.tensor([float(r[1]) for r in rows])
    out = veto(z, fired, strength)
    for zi, fi, oi in zip(z.tolist(), fired.tolist(), out.tolist()):
        want = zi - strength * fi * max(zi, 0.0)
        assert oi == pytest.approx(want, abs=1e-6)
        assert oi <= zi + 1e-7                    # a detector never raises a score
        if zi <= 0 or fi == 0:
            assert oi == zi                       # negatives and unfired samples untouched


@FAST
@given(st.lists(st.sampled_from(["strict", "neutral", "open", None, "other"]), min_size=1, max_size=8),
       st.sets(st.sampled_from(["strict", "neutral", "open"])),
       st.lists(st.floats(-3, 3, allow_nan=False), min_size=8, max_size=8), st.floats(-2, 2, allow_nan=False))
def test_gate_and_combine(labels_, on, z_other, w):
    g = intent_gate(labels_, on=tuple(on))
    assert g.tolist() == [1.0 if lab in on else 0.0 for lab in labels_]
    n = len(labels_)
    zc = torch.tensor([math.nan if gi == 0 else 1.5 for gi in g.tolist()])   # NaN where gated off
    zo = torch.tensor(z_other[:n])
    out = combine([zo, zc], [1.0, w], [None, g])
    want = [a + (w * 1.5 if gi else 0.0) for a, gi in zip(z_other[:n], g.tolist())]
    np.testing.assert_allclose(out.numpy(), want, atol=1e-5)          # gated-off NaN contributes exactly 0


# ------------------------------------------------------------------ media normalisation
images = hnp.arrays(np.uint8, st.tuples(st.integers(1, 9), st.integers(1, 9), st.just(3)))


@SLOWER
@given(images)
def test_media_pil_uint8_float_tensor_agree(arr):
    want = np.asarray(media.load_image(Image.fromarray(arr, "RGB")))
    assert np.array_equal(want, arr)
    forms = [arr, arr.astype(np.float32) / 255, arr.astype(np.float64) / 255,
             torch.from_numpy(arr.copy()).permute(2, 0, 1), torch.from_numpy(arr.astype(np.float32) / 255).permute(2, 0, 1),
             (arr.astype(np.uint16) * 257)]
    for f in forms:
        assert np.array_equal(np.asarray(media.load_image(f)), want), type(f)


@SLOWER
@given(hnp.arrays(np.uint8, st.tuples(st.integers(1, 7), st.integers(1, 7))),
       hnp.arrays(np.uint8, st.tuples(st.integers(1, 7), st.integers(1, 7), st.just(4))))
def test_media_grey_and_alpha_modes_agree(grey, rgba):
    g = np.asarray(media.load_image(Image.fromarray(grey, "L")))
    assert np.array_equal(g, np.repeat(grey[..., None], 3, axis=2))
    for f in (grey, grey.astype(np.float64) / 255, torch.from_numpy(grey.copy()), grey[..., None]):
        assert np.array_equal(np.asarray(media.load_image(f)), g)
    # RGBA onto white: the PIL, uint8 and float forms agree, and the result is within rounding of a*c+(1-a)*255
    ref = np.asarray(media.load_image(Image.fromarray(rgba, "RGBA"))).astype(np.int64)
    a = rgba[..., 3:].astype(np.float64) / 255
    blend = a * rgba[..., :3] + (1 - a) * 255
    assert np.abs(ref - blend).max() <= 1.0
    for f in (rgba, rgba.astype(np.float32) / 255, torch.from_numpy(rgba.copy()).permute(2, 0, 1)):
        assert np.array_equal(np.asarray(media.load_image(f)), ref)


# ------------------------------------------------------------------ chunked == whole batch
class _Stats(Reward):
    """Per-image statistic with a per-sample dimension and the sample index in details."""

    name = "test-properties-stats"
    dimensions = ("red",)

    def _score(self, batch: RewardBatch) -> RewardOutput:
        arr = [np.asarray(im, dtype=np.float64) / 255 for im in batch.images]
        return RewardOutput(scores=[a.mean() + 0.01 * len(p) for a, p in zip(arr, batch.prompts)],
                            dimensions={"red": [a[..., 0].mean() for a in arr]},
                            details=[{"i": i} for i in batch.indices])


@SLOWER
@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 3)), min_size=1, max_size=9), st.integers(1, 10))
def test_chunked_equals_whole_batch(items, bs):
    imgs = [Image.new("RGB", (3, 2), (v, 255 - v, v // 2)) for v, _ in items]
    prompts = ["x" * (k + 1) for _, k in items]
    r = _Stats()
    whole = r(imgs, prompts)
    part = r(imgs, prompts, batch_size=bs)
    assert torch.equal(whole.scores, part.scores)
    assert torch.equal(whole.dimensions["red"], part.dimensions["red"])
    assert part.details == whole.details == [{"i": i} for i in range(len(items))]
