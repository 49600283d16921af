"""Hand-computed cases for the benchmark metrics (pure functions, no models)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from rewardkit.bench import metrics as M
from rewardkit.bench.data import parse_label

nan = float("nan")


# ------------------------------------------------------------------ accuracy without ties
def test_accuracy_without_ties_hand_computed():
    # rows: correct, correct, wrong, model tie (wrong), human tie (excluded), invalid (excluded)
    h = [1, -1, 1, -1, 0, 1]
    m = [0.5, -0.2, -0.1, 0.0, 0.3, nan]
    r = M.accuracy_without_ties(h, m)
    assert r.value == pytest.approx(2 / 4)
    assert r.n == 4
    assert r.extra["n_model_ties"] == 1
    assert r.extra["half_credit"] == pytest.approx(2.5 / 4)
    assert r.extra["n_human_ties"] == 1
    assert r.extra["n_invalid"] == 1


def test_accuracy_without_ties_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels"):
        M.accuracy_without_ties([2, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="length"):
        M.accuracy_without_ties([1, 1], [0.1])


def test_accuracy_without_ties_empty_is_nan_not_zero():
    r = M.accuracy_without_ties([0, 0], [0.1, -0.2])
    assert math.isnan(r.value) and r.n == 0
    d = r.to_dict()  # undefined values are null in the JSON record, never NaN
    assert d["value"] is None and d["half_credit"] is None
    json.dumps(d, allow_nan=False)


# ------------------------------------------------------------------ accuracy with ties (tie calibration)
def test_tie_calibration_reference_example():
    # benchmarks.md 5.2: the published incremental implementation gives 0.5 here, the right answer is 0.75
    h, m = [1, -1, 0, 1], [0.5, -0.5, 0.5, 0.5]
    r = M.accuracy_with_ties(h, m)
    assert r.value == pytest.approx(0.75)
    assert r.extra["threshold"] == 0.0
    assert M.accuracy_with_ties_at(h, m, 0.5) == pytest.approx(0.25)


def test_tie_calibration_equal_gaps_switch_together():
    # |m| = .1 for three pairs: eps=0 -> 3/5, eps=.1 -> 4/5, eps=.3 -> 3/5, eps=.5 -> 2/5.
    # A half-updated state (two of the three .1 pairs as ties) would claim 5/5.
    h = [0, 0, 1, -1, 1]
    m = [0.1, -0.1, 0.1, -0.3, 0.5]
    assert [M.accuracy_with_ties_at(h, m, e) for e in (0, 0.1, 0.3, 0.5)] == pytest.approx([0.6, 0.8, 0.6, 0.4])
    r = M.accuracy_with_ties(h, m)
    assert r.value == pytest.approx(0.8)
    assert r.extra["threshold"] == pytest.approx(0.1)
    assert r.extra["n_model_ties"] == 3
    assert r.extra["at_zero"] == pytest.approx(0.6)


def test_tie_calibration_no_ties_state_wins():
    # every threshold > 0 hurts: eps=0 3/4, .1 2/4, .2 1/4, .3 2/4, .4 1/4
    h, m = [1, 1, -1, 0], [0.2, 0.4, -0.1, 0.3]
    r = M.accuracy_with_ties(h, m)
    assert r.value == pytest.approx(0.75)
    assert r.extra["threshold"] == 0.0
    assert r.extra["n_model_ties"] == 0


def test_tie_calibration_exact_zero_margins_are_ties_at_eps_zero():
    h, m = [0, 1, -1], [0.0, 0.0, -1.0]
    r = M.accuracy_with_ties(h, m)
    assert r.value == pytest.approx(2 / 3)  # the zero-margin human tie is right, the zero-margin A>B wrong
    assert r.extra["threshold"] == 0.0


def test_tie_calibration_invalid_margins_excluded():
    r = M.accuracy_with_ties([1, -1, 0], [0.3, nan, 0.0])
    assert r.n == 2 and r.extra["n_invalid"] == 1
    assert r.value == pytest.approx(1.0)


def _exhaustive_tie_calibration(h, m):
    """Deutsch et al. (2023) tie calibration written out here in plain Python (independent of rewardkit's
    metrics module, whose own accuracy_with_ties_naive shares its helpers): for every eps in {0} U {|m_i|}, the
    model predicts a tie iff |m| <= eps, a pair is right when (tie and h == 0) or sign(m) == h; the best accuracy
    and the smallest eps reaching it."""
    best, best_eps = None, 0.0
    for eps in sorted({0.0, *(abs(float(v)) for v in m)}):
        right = sum((h_i == 0) if abs(float(m_i)) <= eps else ((m_i > 0) - (m_i < 0) == h_i) for h_i, m_i in zip(h, m))
        acc = right / len(h)
        if best is None or acc > best:
            best, best_eps = acc, eps
    return best, best_eps


def test_tie_calibration_fast_equals_exhaustive_on_discrete_scores():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 25))
        h = rng.integers(-1, 2, n)
        sa, sb = rng.integers(0, 5, n) / 2, rng.integers(0, 5, n) / 2  # many equal gaps
        m = sa - sb
        fast = M.accuracy_with_ties(h, m)
        best, eps = _exhaustive_tie_calibration(h.tolist(), m.tolist())
        assert fast.value == pytest.approx(best)
        assert fast.extra["threshold"] == pytest.approx(eps)
        assert M.accuracy_with_ties_naive(h, m) == pytest.approx((best, eps))  # the library's own cross-check


# ------------------------------------------------------------------ MMRB2 official
def test_mmrb2_official_hand_computed():
    chosen = ["A", "b", "A", "B"]  # case-insensitive, as the hub parquet may be lower case
    forward = ["A", "A", None, "tie"]
    reverse = ["B", "B", "A", ""]  # as answered on the swapped pair; flipped inside
    r = M.mmrb2_official(chosen, forward, reverse)
    # pair0: 2/2, pair1: 0/2, pair2: reverse only (A->B, wrong) 0/1, pair3: forward tie (wrong) 0/1
    assert r.n == 6
    assert r.value == pytest.approx(2 / 6)
    assert r.extra["n_missing"] == 2


def test_mmrb2_official_position_biased_judge_scores_half():
    chosen = ["A"] * 7 + ["B"] * 3
    r = M.mmrb2_official(chosen, ["A"] * 10, ["A"] * 10)  # always the first position
    assert r.value == pytest.approx(0.5)


def test_order_agreement():
    r = M.order_agreement(["A", "A", "B", None], ["B", "A", "A", "A"])
    assert r.n == 3 and r.value == pytest.approx(2 / 3)


# ------------------------------------------------------------------ GenAI-Bench 4-way
def test_genaibench_4way_hand_computed():
    votes = ["leftvote", "rightvote", "tievote", "bothbad_vote", "tievote", "leftvote"]
    verdicts = ["[[A>B]]", "B>>A", "[[A=B]]", "The answer: [[A=B]]", "[[A=B=Bad]]", None]
    r = M.genaibench_4way(votes, verdicts)
    assert r.value == pytest.approx(4 / 6)
    assert r.n == 6 and r.extra["n_unparsed"] == 1


def test_genaibench_4way_unknown_vote():
    with pytest.raises(ValueError, match="vote_type"):
        M.genaibench_4way(["leftvotes"], ["[[A>B]]"])


# ------------------------------------------------------------------ group accuracy
def _group_rows(k: int, scores: list[float], human_order: str, gid: str):
    """Rows of one K-candidate group: ``human_order`` like "BAC" (best first)."""
    letters = "ABCD"[:k]
    rows = []
    for a, b in itertools.combinations(range(k), 2):
        la, lb = letters[a], letters[b]
        win = la if human_order.index(la) < human_order.index(lb) else lb
        h, _ = parse_label("ranking", f"{win}>{lb if win == la else la}", f"{la}vs{lb}")
        rows.append((gid, h, scores[a] - scores[b]))
    return rows


def test_group_accuracy_k3_hand_computed():
    rows = (_group_rows(3, [3, 2, 1], "ABC", "g1")      # exact ranking: right
            + _group_rows(3, [1, 2, 3], "ABC", "g2")    # reversed: all rows wrong
            + _group_rows(3, [3, 1, 2], "ABC", "g3"))   # B vs C wrong: group wrong
    g, h, m = zip(*rows)
    r = M.group_accuracy(list(g), h, m)
    assert r.value == pytest.approx(1 / 3)
    assert r.n == 3
    assert r.extra["individual"] == pytest.approx(5 / 9)
    assert r.extra["rows_per_group"] == {"3": 3}


def test_group_accuracy_k4_tie_and_invalid():
    rows = (_group_rows(4, [4, 3, 2, 1], "ABCD", "g1")     # right
            + _group_rows(4, [1, 4, 3, 2], "BCDA", "g2")   # right
            + _group_rows(4, [4, 3, 3, 1], "ABCD", "g3")   # a model tie inside: wrong
            + _group_rows(4, [4, 3, 2, nan], "ABCD", "g4"))  # invalid: excluded
    g, h, m = zip(*rows)
    r = M.group_accuracy(list(g), h, m)
    assert r.n == 3 and r.extra["n_invalid_groups"] == 1
    assert r.value == pytest.approx(2 / 3)
    # per-row accuracy over every valid row: 17/18 in g1-g3 plus g4's three rows without D
    assert r.extra["individual"] == pytest.approx(20 / 21)


# ------------------------------------------------------------------ labels
@pytest.mark.parametrize("kind,raw,letters,want", [
    ("chosen_ab", "a", None, (1, None)),
    ("chosen_ab", "B", None, (-1, None)),
    ("vote_type", "leftvote", None, (1, None)),
    ("vote_type", "rightvote", None, (-1, None)),
    ("vote_type", "tievote", None, (0, "good")),
    ("vote_type", "bothbad_vote", None, (0, "bad")),
    ("ranking", "A>B", "AvsB", (1, None)),
    ("ranking", "B>A", "AvsB", (-1, None)),
    ("ranking", "C>A", "AvsC", (-1, None)),
    ("ranking", "C>A", "CvsA", (1, None)),
    ("ranking", "A=B", "AvsB", (0, None)),
    ("ranking", "A=B=Bad", "AvsB", (0, "bad")),
])
def test_parse_label(kind, raw, letters, want):
    assert parse_label(kind, raw, letters) == want


@pytest.mark.parametrize("kind,raw,letters", [
    ("chosen_ab", "tie", None), ("vote_type", "left", None), ("ranking", "D>A", "AvsB"),
    ("ranking", "A>B", None), ("ranking", "AB", "AvsB"), ("chosen_ab", None, None)])
def test_parse_label_refuses(kind, raw, letters):
    with pytest.raises(ValueError):
        parse_label(kind, raw, letters)


# ------------------------------------------------------------------ bootstrap
def test_bootstrap_vectorised_equals_loop():
    rng = np.random.default_rng(1)
    h = rng.integers(-1, 2, 60)
    m = rng.integers(-3, 4, 60) / 2
    m[3] = nan
    loop = M.bootstrap_ci(lambda idx: M.accuracy_with_ties(h[idx], m[idx]).value, 60, n_boot=300, seed=5)
    vec = M.bootstrap_ties_ci(h, m, n_boot=300, seed=5)
    assert vec == pytest.approx(loop)
    num, den = M.ratio_units("accuracy_without_ties", h=h, m=m)
    assert num.sum() / den.sum() == pytest.approx(M.accuracy_without_ties(h, m).value)
    loop2 = M.bootstrap_ci(lambda idx: M.accuracy_without_ties(h[idx], m[idx]).value, 60, n_boot=300, seed=5)
    assert M.bootstrap_ratio_ci(num, den, n_boot=300, seed=5) == pytest.approx(loop2)


def test_bootstrap_ci_contains_value_and_disables():
    num = np.array([1.0] * 30 + [0.0] * 10)
    lo, hi = M.bootstrap_ratio_ci(num, np.ones(40), n_boot=500, seed=0)
    assert lo < 0.75 < hi and 0.5 < lo and hi < 0.95
    assert M.bootstrap_ratio_ci(num, np.ones(40), n_boot=0) is None


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
