"""Behaviours a planted bug used to survive (issue 16), each checked against an independently computed value.

Every expected value here comes from a hand computation or a small reference written in this file (never
from the code under test), on inputs chosen so that the plausible wrong code gives a different answer:
human ties inside EditReward-Bench groups, asymmetric images for EXIF orientation, a non-zero margin of
both signs for the uncertainty loss, distinct cached and metadata intents for the composite.
"""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.bench import metrics as M
from rewardkit.compose.composite import Composite
from rewardkit.reward import Reward, RewardBatch, RewardConfig, RewardOutput
from rewardkit.train import losses as L

NAN = float("nan")


# ------------------------------------------------------------------ EditReward-Bench group accuracy, human ties
def _dense_rank(x):
    """Dense ranking (equal values share a rank): the reference for "same weak ordering"."""
    levels = sorted(set(x), reverse=True)
    return [levels.index(v) for v in x]


def _rows(gid, human, model):
    """All C(K,2) rows of one group from per-candidate human and model scores."""
    out = []
    for i in range(len(human)):
        for j in range(i + 1, len(human)):
            out.append((gid, int(np.sign(human[i] - human[j])), float(model[i] - model[j])))
    return out


GROUPS = [  # (human scores, model scores, group correct by hand)
    ([2, 1, 1], [3, 2, 1], False),     # human tie B=C, model separates them: wrong
    ([1, 1, 0], [5, 5, 2], True),      # human tie A=B, model ties them exactly: right
    ([0, 1, 2], [0, 2, 1], False),     # decisive order wrong on B vs C
    ([3, 3, 3], [1, 1, 1], True),      # all tied, model all tied: right
    ([3, 3, 3], [1, 1, 2], False),     # all tied, model breaks one tie
    ([4, 2, 2, 1], [9, 4, 4, 0], True),  # K=4 with a tie in the middle, reproduced
    ([2, 1, 1], [3, 1 + 1e-4, 1], False),  # a near-tie is not a tie (exact rule)
]


def test_group_accuracy_with_human_ties_matches_ranking_reference():
    rows = [r for k, (hs, ms, _) in enumerate(GROUPS) for r in _rows(f"g{k}", hs, ms)]
    g, h, m = zip(*rows)
    res = M.group_accuracy(list(g), h, m)
    by_hand = [ok for _, _, ok in GROUPS]
    reference = [_dense_rank(hs) == _dense_rank(ms) for hs, ms, _ in GROUPS]
    assert by_hand == reference                       # the hand labels agree with the ranking definition
    assert res.n == len(GROUPS)
    assert res.value == pytest.approx(sum(by_hand) / len(GROUPS))  # 3/7
    # per-row: a human-tie row is right only for an exact model tie
    row_ok = [(hh == 0 and mm == 0) or (hh != 0 and np.sign(mm) == hh) for _, hh, mm in rows]
    assert res.extra["individual"] == pytest.approx(sum(row_ok) / len(rows))


def test_group_accuracy_human_tie_rows_are_not_skipped():
    # one group: decisive rows right, the tie row wrong -> 0 (skipping tie rows would give 1)
    rows = _rows("g", [2, 1, 1], [3, 2, 1])
    g, h, m = zip(*rows)
    assert M.group_accuracy(list(g), h, m).value == 0.0
    # the same group with the tie reproduced exactly -> 1
    g, h, m = zip(*_rows("g", [2, 1, 1], [3, 1, 1]))
    assert M.group_accuracy(list(g), h, m).value == 1.0


# ------------------------------------------------------------------ EXIF orientation
# PIL's Transpose semantics written out in numpy on an H x W x 3 array (EXIF 2.3 orientation tag 0x0112):
# the stored pixels must be transformed like this to display upright.
EXIF_TO_UPRIGHT = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],                     # mirror left-right
    3: lambda a: a[::-1, ::-1],                  # rotate 180
    4: lambda a: a[::-1, :],                     # mirror top-bottom
    5: lambda a: a.transpose(1, 0, 2),           # transpose (mirror about the main diagonal)
    6: lambda a: np.rot90(a, k=-1),              # rotate 90 clockwise
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # transverse (mirror about the anti-diagonal)
    8: lambda a: np.rot90(a, k=1),               # rotate 90 counter-clockwise
}


def _asymmetric(h=5, w=7):
    """Every pixel distinct, no symmetry: any wrong rotation or flip changes the array."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 30 + 5, y * 40 + 3, (x * 7 + y * 11) % 256], -1).astype(np.uint8)


def _png_with_orientation(arr, orientation):
    im = Image.fromarray(arr, "RGB")
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="PNG", exif=exif)   # PNG: lossless, so the comparison is exact
    return buf.getvalue()


def test_exif_reference_table_is_pil_transpose():
    """The written-out table agrees with PIL's own Transpose operations (so it is not a tautology)."""
    a = _asymmetric()
    im = Image.fromarray(a)
    T = Image.Transpose
    pil = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE, 6: T.ROTATE_270,
           7: T.TRANSVERSE, 8: T.ROTATE_90}
    for o, op in pil.items():
        assert np.array_equal(np.asarray(im.transpose(op)), EXIF_TO_UPRIGHT[o](a)), o
    # and the explicit corner moves for the three rotations
    h, w = a.shape[:2]
    assert np.array_equal(EXIF_TO_UPRIGHT[6](a)[0, -1], a[0, 0])        # top-left goes to top-right
    assert np.array_equal(EXIF_TO_UPRIGHT[8](a)[-1, 0], a[0, 0])        # top-left goes to bottom-left
    assert np.array_equal(EXIF_TO_UPRIGHT[3](a)[-1, -1], a[0, 0])       # top-left goes to bottom-right
    assert EXIF_TO_UPRIGHT[6](a).shape == (w, h, 3)


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_exact_pixels(orientation, tmp_path):
    a = _asymmetric()
    data = _png_with_orientation(a, orientation)
    want = EXIF_TO_UPRIGHT[orientation](a)
    for src in (data, _write(tmp_path / "x.png", data), Image.open(io.BytesIO(data))):
        got = np.asarray(media.load_image(src))
        assert got.shape == want.shape and np.array_equal(got, want), (orientation, type(src))


def _write(path, data):
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------ uncertainty loss: sign of the margin
def _phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@pytest.mark.parametrize("margin", [0.5, -0.7, 2.0])
def test_uncertainty_loss_margin_is_subtracted(margin):
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    mu_w, mu_l, ls_w, ls_l = 1.0, 0.2, math.log(0.5), math.log(1.5)
    scale = math.sqrt(0.5 ** 2 + 1.5 ** 2)
    want = -math.log(_phi((mu_w - mu_l - margin) / scale))
    got = L.uncertainty_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l), margin=t(margin), form="probit")
    assert float(got) == pytest.approx(want, rel=1e-9)
    # a larger required gap makes the loss larger (monotone in the margin)
    more = L.uncertainty_loss(t(mu_w), t(ls_w), t(mu_l), t(ls_l), margin=t(margin + 0.3), form="probit")
    assert float(more) > float(got)


def test_uncertainty_loss_weighted_margin_per_pair():
    t = lambda *v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    mu_w, mu_l, m, w = [1.0, 0.0], [0.0, 0.5], [0.25, -0.25], [1.0, 3.0]
    per = [-math.log(_phi((a - b - mm) / math.sqrt(2))) for a, b, mm in zip(mu_w, mu_l, m)]
    want = (per[0] * w[0] + per[1] * w[1]) / sum(w)
    got = L.uncertainty_loss(t(*mu_w), t(0, 0), t(*mu_l), t(0, 0), margin=t(*m), weight=t(*w), form="probit")
    assert float(got) == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------ the trainer passes the data's margin
@pytest.mark.parametrize("kind", ["bt", "uncertainty"])
def test_trainer_loss_uses_the_batch_margin_and_weight(kind):
    from rewardkit.train.trainer import PreferenceTrainer

    fake = SimpleNamespace(cfg=SimpleNamespace(loss=SimpleNamespace(kind=kind, center_coef=0.0, theta=2.0, nu=1.0,
                                                                    uncertainty_form="probit",
                                                                    uncertainty_samples=32)))
    r = torch.tensor([1.0, 0.0, 0.3, 0.4], dtype=torch.float64)      # [a0, a1, b0, b1]
    ls = torch.tensor([0.0, math.log(2.0), math.log(0.5), 0.0], dtype=torch.float64)
    labels = torch.tensor([L.LABEL_A, L.LABEL_B])                       # pair 0: a wins; pair 1: b wins
    margin = torch.tensor([0.5, -0.2], dtype=torch.float64)
    weight = torch.tensor([1.0, 2.0], dtype=torch.float64)
    loss, r_a, r_b = PreferenceTrainer._loss(fake, r, ls, {"labels": labels, "margin": margin, "weight": weight})
    # winner / loser by hand: pair 0 (a0=1.0 vs b0=0.3), pair 1 (b1=0.4 vs a1=0.0)
    d = [1.0 - 0.3 - 0.5, 0.4 - 0.0 + 0.2]
    if kind == "bt":
        per = [math.log1p(math.exp(-x)) for x in d]
    else:
        sig = [math.sqrt(1.0 + 0.25), math.sqrt(1.0 + 4.0)]            # (sigma_w, sigma_l): (1, .5), (1, 2)
        per = [-math.log(_phi(x / s)) for x, s in zip(d, sig)]
    want = (per[0] * 1.0 + per[1] * 2.0) / 3.0
    assert float(loss) == pytest.approx(want, rel=1e-9)
    assert r_a.tolist() == [1.0, 0.0] and r_b.tolist() == [0.3, 0.4]


# ------------------------------------------------------------------ composite: intent fallback, group_by metadata
@pytest.fixture
def chan_reward():
    from dataclasses import dataclass

    @dataclass
    class Cfg(RewardConfig):
        channel: int = 0

    class Chan(Reward):
        name = "test-killers-chan"
        Config = Cfg

        def _score(self, batch: RewardBatch) -> RewardOutput:
            return RewardOutput(scores=torch.tensor(
                [float(np.asarray(im)[..., self.config.channel].mean()) / 255.0 for im in batch.images]))

    class CachedIntent(Chan):
        """Stands in for the constraint reward: it knows intents from its cache, by prompt."""

        name = "test-killers-cached"
        uses_prompt = True
        cache = {"p0": "open", "p1": "strict", "p2": None, "p3": "strict", "p4": "neutral"}

        def intent_for(self, prompts):
            return [self.cache.get(p) for p in prompts]

    return Chan, CachedIntent


def _z(x):
    """The composite's default z-score (``zscore="rl"``): (x - mean) / (std + 1e-4), flow_grpo's advantage."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / (x.std() + 1e-4)


IMGS = [Image.new("RGB", (4, 4), c) for c in [(200, 10, 0), (100, 200, 40), (50, 10, 90), (150, 220, 255),
                                                  (10, 90, 120)]]
R = np.array([200, 100, 50, 150, 10]) / 255.0
B = np.array([0, 40, 90, 255, 120]) / 255.0


def test_composite_intent_fallback_from_the_constraint_cache(chan_reward):
    Chan, CachedIntent = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "constraint", "gate": "intent"}],
                     rewards={"preference": Chan(channel=0), "constraint": CachedIntent(channel=2)})
    prompts = ["p0", "p1", "p2", "p3", "p4"]
    meta = [{"intent": "strict"}, {}, {}, {"intent": "open"}, {}]
    out = comp(IMGS, prompts, metadata=meta)
    # metadata wins where given (p0 strict, p3 open); the cache fills the rest (p1 strict, p2 None, p4 neutral)
    intents = ["strict", "strict", None, "open", "neutral"]
    assert [d["intent"] for d in out.details] == intents
    gate = np.array([1.0, 1.0, 0.0, 0.0, 0.0])
    zc = np.zeros(5)
    zc[[0, 1]] = _z(B[[0, 1]])                     # constraint statistics over the open gates only
    want = _z(R) + gate * zc
    np.testing.assert_allclose(out.scores.numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(out.dimensions["constraint/gate"].numpy(), gate)


def test_composite_custom_intent_key_and_gate_on(chan_reward):
    Chan, _ = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "constraint", "gate": "intent", "weight": 2.0}],
                     rewards={"preference": Chan(channel=0), "constraint": Chan(channel=2)},
                     intent_key="kind", gate_on=["strict", "neutral"])
    meta = [{"kind": "neutral", "intent": "open"}, {"kind": "open", "intent": "strict"}, {"kind": "strict"},
            {"intent": "strict"}, {"kind": "neutral"}]
    out = comp(IMGS, "p", metadata=meta)
    gate = np.array([1.0, 0.0, 1.0, 0.0, 1.0])      # read from "kind"; "intent" is ignored
    zc = np.zeros(5)
    zc[[0, 2, 4]] = _z(B[[0, 2, 4]])
    np.testing.assert_allclose(out.scores.numpy(), _z(R) + 2.0 * gate * zc, atol=1e-5)


def test_composite_group_by_metadata_key(chan_reward):
    Chan, _ = chan_reward
    comp = Composite(axes=[{"name": "preference"}, {"name": "alignment", "weight": 0.5}],
                     rewards={"preference": Chan(channel=0), "alignment": Chan(channel=2)},
                     normalize="group", group_by="scene")
    prompts = ["a", "b", "c", "d", "e"]           # every prompt distinct: grouping by prompt would give all zeros
    meta = [{"scene": 1}, {"scene": 2}, {"scene": 1}, {"scene": 2}, {"scene": 1}]
    out = comp(IMGS, prompts, metadata=meta)
    want = np.zeros(5)
    for idx in ([0, 2, 4], [1, 3]):
        want[idx] = _z(R[idx]) + 0.5 * _z(B[idx])
    np.testing.assert_allclose(out.scores.numpy(), want, atol=1e-5)
    assert np.abs(want).max() > 0.5                 # the grouping is visible in the answer
