"""Pure functions of group rewards: win rates from pairwise preferences, normalised ranks, group z-scores.

Every function works on one call's samples with a group key each and has no state; NaN marks "no value" (an
invalid member), which is left out of every other member's statistic and stays NaN itself. The class that runs a
reward and feeds these is :class:`rewardkit.compose.group.GroupReward`; the definitions are in docs/rl.md, "Group
rewards" (tests: ``tests/compose/test_group.py``).
"""

from __future__ import annotations

import math
import random
from typing import Hashable, Sequence

import torch

__all__ = ["group_index", "all_pairs", "sample_pairs", "winrates", "bt_probs", "normalised_rank", "group_rank",
           "group_zscore_host", "ZSCORE_CONVENTIONS"]

#: ``(ddof, eps)`` of the hosts' group normalisation ``(x - mean_g) / (std_g + eps)``:
#: flow_grpo / DiffusionNFT ``PerPromptStatTracker.update`` (``flow_grpo/stat_tracking.py``:25-31 at
#: yifan123/flow_grpo@ac4c86e8, the same lines in NVlabs/DiffusionNFT@24af5554): ``np.std`` (ddof 0) + 1e-4;
#: TRL 1.16 ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``:2765-2787, ``nanstd`` in ``trl/trainer/utils.py``:
#: 1037-1043): Bessel-corrected std (ddof 1) + 1e-4.
ZSCORE_CONVENTIONS = {"flow_grpo": (0, 1e-4), "trl": (1, 1e-4)}


def group_index(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """``{key: [positions]}`` in order of first appearance (positions ascending)."""
    index: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    return index


def all_pairs(members: Sequence[int]) -> list[tuple[int, int]]:
    """Every unordered pair ``(a, b)`` of ``members`` with ``a`` before ``b``: ``G (G - 1) / 2`` of them."""
    m = list(members)
    return [(m[x], m[y]) for x in range(len(m)) for y in range(x + 1, len(m))]


def sample_pairs(members: Sequence[int], max_pairs: int | None, seed: int = 0) -> list[tuple[int, int]]:
    """The pairs of a group to judge: :func:`all_pairs` when there are at most ``max_pairs`` of them, else a
    balanced random design of ``D * G`` pairs, ``D = max(1, max_pairs // G)`` (G = group size): a random
    permutation ``pi`` of the members (``random.Random(seed)``) and the pairs ``(pi[k], pi[(k + d) mod G])`` for
    ``d = 1..D``. Every member meets exactly ``2 D`` opponents, each opponent equally likely, so its win rate over
    them is an unbiased estimate of its full-group win rate (variance growing as ``D`` shrinks)."""
    pairs = all_pairs(members)
    if max_pairs is None or len(pairs) <= max_pairs:
        return pairs
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
    g = len(members)
    d_max = min(max(1, max_pairs // g), (g - 1) // 2)
    if d_max * g >= len(pairs):
        return pairs
    perm = list(members)
    random.Random(seed).shuffle(perm)
    return [(perm[k], perm[(k + d) % g]) for d in range(1, d_max + 1) for k in range(g)]


def winrates(n: int, pairs: Sequence[tuple[int, int]], prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's win rate: the mean of ``P(i > j)`` over the pairs it is in.

    Args:
        n: number of samples (positions 0..n-1).
        pairs: K pairs ``(i, j)``.
        prob: ``[K]`` P(first of the pair preferred); a NaN pair is left out of both members' means.

    Returns:
        ``(winrate [n] float64, count [n] int64)``: NaN where a sample is in no judged pair.
    """
    prob = torch.as_tensor(prob, dtype=torch.float64).reshape(-1)
    if prob.shape[0] != len(pairs):
        raise ValueError(f"got {prob.shape[0]} probabilities for {len(pairs)} pairs")
    total = torch.zeros(n, dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.int64)
    for (i, j), p in zip(pairs, prob.tolist()):
        if not math.isfinite(p):
            continue
        total[i] += p
        total[j] += 1.0 - p
        count[i] += 1
        count[j] += 1
    rate = torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))
    return rate, count


def bt_probs(values: torch.Tensor, pairs: Sequence[tuple[int, int]], temperature: float = 1.0,
             higher_is_better: bool = True) -> torch.Tensor:
    """Bradley-Terry preference from pointwise values: ``P(i > j) = sigmoid((v_i - v_j) / T)`` (sign flipped
    when lower is better), exactly :meth:`rewardkit.Reward.compare`'s default. Returns float64 ``[K]``."""
    v = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if not pairs:
        return torch.zeros(0, dtype=torch.float64)
    a = v[torch.tensor([p[0] for p in pairs])]
    b = v[torch.tensor([p[1] for p in pairs])]
    diff = (a - b) if higher_is_better else (b - a)
    return torch.sigmoid(diff / float(temperature))


def normalised_rank(x: torch.Tensor) -> torch.Tensor:
    """``(rank - 1) / (n - 1)`` of each finite entry, ranks ascending from 1 with ties given their average rank
    (``scipy.stats.rankdata(method="average")``): the lowest is 0, the highest 1, ties share a value. NaN entries
    are left out and stay NaN; with fewer than two finite entries every entry is NaN. Returns float64."""
    x = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
    out = torch.full_like(x, float("nan"))
    keep = torch.isfinite(x).nonzero().flatten().tolist()
    n = len(keep)
    if n < 2:
        return out
    vals = sorted((float(x[i]), i) for i in keep)
    pos = 0
    while pos < n:
        end = pos
        while end + 1 < n and vals[end + 1][0] == vals[pos][0]:
            end += 1
        avg = (pos + end) / 2.0 + 1.0  # 1-based average rank of the tie block
        for k in range(pos, end + 1):
            out[vals[k][1]] = (avg - 1.0) / (n - 1)
        pos = end + 1
    return out


def group_rank(x: torch.Tensor, keys: Sequence[Hashable]) -> torch.Tensor:
    """:func:`normalised_rank` inside each group of equal key."""
    x = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
    out = torch.full_like(x, float("nan"))
    for idx in group_index(keys).values():
        t = torch.tensor(idx)
        out[t] = normalised_rank(x[t])
    return out


def group_zscore_host(x: torch.Tensor, keys: Sequence[Hashable], *, ddof: int = 0, eps: float = 1e-4,
                      global_std: bool = False) -> torch.Tensor:
    """The hosts' group advantage ``(x_i - mean_g) / (std + eps)`` in float64 over the finite entries.

    ``mean_g`` is the mean of the sample's group; ``std`` the group's std (``global_std=False``: flow_grpo's
    default) or the std of every finite entry of the call (``global_std=True``: DiffusionNFT's setting), with
    ``ddof`` 0 (flow_grpo: ``np.std``) or 1 (TRL: Bessel). ``eps`` is added outside the square root. A group whose
    std is undefined (one member with ddof 1) gives NaN; non-finite entries stay NaN and are left out."""
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    x = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
    out = torch.full_like(x, float("nan"))
    fin = torch.isfinite(x)

    def std(v: torch.Tensor) -> float:
        if v.numel() - ddof <= 0:
            return float("nan")
        return float(v.std(correction=ddof)) if v.numel() > 1 else 0.0

    glob = std(x[fin]) if global_std else None
    for idx in group_index(keys).values():
        t = torch.tensor(idx)
        t = t[fin[t]]
        if t.numel() == 0:
            continue
        v = x[t]
        s = glob if global_std else std(v)
        out[t] = (v - v.mean()) / (s + eps)
    return out
