"""bench/metrics.py contracts the formula tests left open (found by mutation testing): ``ratio_units`` per metric,
the bootstrap helpers' edge cases and agreement with a plain loop, extra fields, verdict helpers.

Expected values are hand-computed or come from a loop over resamples written here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rewardkit.bench import metrics as M

NAN = float("nan")


def test_verdict_helpers():
    assert [M.verdict_from_margin(x) for x in (0.5, -0.5, 0.0, NAN, None)] == ["A", "B", "tie", None, None]
    assert [M.flip_verdict(v) for v in ("A", "B", "tie", None, "")] == ["B", "A", "tie", None, ""]


def test_accuracy_without_ties_extras_by_hand():
    r = M.accuracy_without_ties([1, 1, -1, 1, 0, 1], [1.0, 0.0, 0.0, -1.0, 2.0, NAN])
    # kept: rows 0-3 (row 4 human tie, row 5 invalid); correct 1; model ties 2
    assert (r.value, r.n) == (0.25, 4)
    assert r.extra == {"n_model_ties": 2, "half_credit": 0.5, "n_human_ties": 1, "n_invalid": 1}


def test_accuracy_with_ties_empty_extras():
    r = M.accuracy_with_ties([1, 0], [NAN, NAN])
    assert math.isnan(r.value) and r.n == 0
    assert r.extra == {"n_human_ties": 0, "n_invalid": 2, "threshold": None, "n_model_ties": 0}
    d = r.to_dict()
    assert d["value"] is None and d["threshold"] is None and d["n"] == 0


def test_genaibench_verdict_forms_and_length_error():
    votes = ["leftvote", "rightvote", "tievote", "bothbad_vote", "leftvote", "leftvote"]
    verdicts = ["[[A>>B]]", "B>>A", "[[A=B=Good]]", "A=B", "A > B", "garbage"]
    r = M.genaibench_4way(votes, verdicts)
    assert (r.value, r.n, r.extra["n_unparsed"]) == (pytest.approx(5 / 6), 6, 1)
    with pytest.raises(ValueError, match="^votes and verdicts must have the same length$"):
        M.genaibench_4way(["leftvote"], [])


CHOSEN = ["A", "B", "a", "B"]
FWD = ["A", "A", None, "tie"]
REV = ["B", "A", "B", ""]          # as answered in the swapped order: flipped back to A, B, A, (missing)


def test_ratio_units_match_each_metric_row_by_row():
    num, den = M.ratio_units("mmrb2_official", chosen=CHOSEN, forward=FWD, reverse=REV)
    # pair 0: A, A vs A -> 2/2; pair 1: A, B vs B -> 1/2; pair 2: missing, A vs a -> 1/1; pair 3: tie, missing -> 0/1
    assert num.tolist() == [2, 1, 1, 0] and den.tolist() == [2, 2, 1, 1]
    assert num.dtype == den.dtype == np.float64
    assert num.sum() / den.sum() == pytest.approx(M.mmrb2_official(CHOSEN, FWD, REV).value)

    f, r = ["A", "B", "A", None, "tie"], ["B", "B", "A", "A", "A"]
    num, den = M.ratio_units("order_agreement", forward=f, reverse=r)
    assert num.tolist() == [1, 0, 0, 0, 0] and den.tolist() == [1, 1, 1, 0, 0]
    assert num.dtype == den.dtype == np.float64
    assert num.sum() / den.sum() == pytest.approx(M.order_agreement(f, r).value)

    votes, verd = ["leftvote", "tievote", "rightvote"], ["A>B", "[[A=B]]", "A>B"]
    num, den = M.ratio_units("genaibench_4way", votes=votes, verdicts=verd)
    assert num.tolist() == [1, 1, 0] and den.tolist() == [1, 1, 1]

    h, m = [1, -1, 0, 1, 1], [0.5, 0.5, 1.0, NAN, 0.0]
    num, den = M.ratio_units("accuracy_without_ties", h=h, m=m)
    assert num.tolist() == [1, 0, 0, 0, 0] and den.tolist() == [1, 1, 0, 0, 1]
    with pytest.raises(ValueError, match="not a ratio of per-row counts"):
        M.ratio_units("accuracy_with_ties", h=h, m=m)


def test_bootstrap_edges():
    assert M.bootstrap_ci(lambda idx: 1.0, 5, n_boot=0) is None
    assert M.bootstrap_ci(lambda idx: 1.0, 0, n_boot=10) is None
    assert M.bootstrap_ci(lambda idx: 0.25, 3, n_boot=1) == (0.25, 0.25)           # one resample is enough
    assert M.bootstrap_ci(lambda idx: NAN, 3, n_boot=5) is None                     # all undefined
    assert M.bootstrap_ratio_ci([1.0], [2.0], n_boot=7) == (0.5, 0.5)               # a single unit
    assert M.bootstrap_ratio_ci([], [], n_boot=7) is None
    assert M.bootstrap_ratio_ci([1.0], [0.0], n_boot=7) is None                     # nothing judged
    assert M.bootstrap_ties_ci([1], [0.5], n_boot=9) == (1.0, 1.0)                  # one valid pair
    assert M.bootstrap_ties_ci([0], [0.5], n_boot=9) == (1.0, 1.0)                  # a human tie: eps = 0.5 wins
    assert M.bootstrap_ties_ci([1, -1], [NAN, NAN], n_boot=9) is None
    w = M.bootstrap_weights(4, 3, seed=1)
    assert w.shape == (3, 4) and (w.sum(1) == 4).all()


def test_bootstrap_vectorised_helpers_equal_a_loop_over_the_same_draws():
    rng = np.random.default_rng(3)
    h = rng.integers(-1, 2, 40)
    m = rng.integers(-3, 4, 40) / 2.0
    m[[5, 17]] = NAN
    loop = M.bootstrap_ci(lambda idx: M.accuracy_with_ties(h[idx], m[idx]).value, 40, n_boot=200, seed=4)
    fast = M.bootstrap_ties_ci(h, m, n_boot=200, seed=4)
    assert fast == pytest.approx(loop)
    num, den = M.ratio_units("accuracy_without_ties", h=h, m=m)
    loop = M.bootstrap_ci(lambda idx: M.accuracy_without_ties(h[idx], m[idx]).value, 40, n_boot=200, seed=4)
    assert M.bootstrap_ratio_ci(num, den, n_boot=200, seed=4) == pytest.approx(loop)


def test_bootstrap_ties_ci_equals_loop_when_a_middle_threshold_wins():
    """Human ties with small margins, decisive pairs with large ones: the best threshold is in the middle, so
    the tie prefix counts (not only the no-tie state) decide every resample."""
    rng = np.random.default_rng(5)
    h = np.array([0] * 20 + [1] * 10 + [-1] * 10)
    m = np.r_[rng.uniform(-0.3, 0.3, 20), rng.uniform(0.5, 2.0, 10), -rng.uniform(0.5, 2.0, 10)]
    m[[0, 25]] = -m[[0, 25]]       # one decisive pair wrong, to keep the optimum below 1
    assert M.accuracy_with_ties(h, m).extra["threshold"] > 0.2
    loop = M.bootstrap_ci(lambda idx: M.accuracy_with_ties(h[idx], m[idx]).value, 40, n_boot=100, seed=2)
    assert M.bootstrap_ties_ci(h, m, n_boot=100, seed=2) == pytest.approx(loop)


def test_metric_value_to_dict_rounding_ci_and_nan():
    d = M.MetricValue(1 / 3, 3, {"threshold": 2 / 3, "nested": {"x": NAN, "y": 0.125}, "k": "s"},
                      ci=(0.1234567890123, NAN)).to_dict()
    assert d == {"value": 0.3333333333, "n": 3, "ci95": [0.123456789, None], "threshold": 2 / 3,  # exact
                 "nested": {"x": None, "y": 0.125}, "k": "s"}


def test_inputs_of_any_shape_are_flattened():
    r = M.accuracy_without_ties([[1, -1], [1, 1]], np.array([[0.5, -0.5], [2.0, -1.0]]))
    assert (r.value, r.n) == (0.75, 4)
    with pytest.raises(ValueError, match="^labels and margins differ in length: 2 vs 3$"):
        M.accuracy_without_ties([1, 1], [1.0, 2.0, 3.0])


def test_genaibench_single_arrow_verdicts_and_unparsed_count():
    r = M.genaibench_4way(["rightvote", "leftvote", "leftvote", "tievote"], ["B>A", "x", None, "[[A=B=Bad]]"])
    assert r.value == pytest.approx(1 / 4) and r.extra["n_unparsed"] == 2


def test_mmrb2_length_error_message():
    with pytest.raises(ValueError, match="^chosen, forward and reverse must have the same length$"):
        M.mmrb2_official(["A"], ["A"], [])


def test_group_accuracy_refuses_group_ids_of_the_wrong_length():
    """The exact message (a mutation survivor of the 300-mutant sample changed only its wording)."""
    import numpy as np
    import pytest

    from rewardkit.bench.metrics import group_accuracy

    with pytest.raises(ValueError, match=r"^group_ids must have one entry per row$"):
        group_accuracy([0, 0], np.array([1, -1, 1]), np.array([0.5, -0.5, 1.0]))
