"""Selectors: scores -> a 0/1 keep mask per response (DESIGN §4), all vectorised over groups.

| name | keep rule |
|---|---|
| threshold_band | low < s_i < high (closed with inclusive=true); s = group solve rate |
| topk_fraction | the k = max(1, ceil(f*N)) largest s_i (scope=batch) or k_g = max(1, ceil(f*G)) per group |
| gfpo | per group the k best by efficiency R_i / L_i or by shortness -L_i (s = L_i) |
| max_variance | per group of size G, m = max(1, floor(f*G + 0.5)) responses: the a lowest and m-a highest rewards, a maximising their variance (first a on ties) |

Ties are broken by index (stable sorts). Counts like f*N are rounded to 9 decimals before
ceil/floor so that 0.3*10 counts as 3.

Each selector declares its canonical reduction (`reduce`) next to its rule: for groups of n
responses, the parameters of a configuration that acts identically, or None when the
configuration acts exactly as uniform GRPO (every response kept, or, with binary rewards and
`denominator=all`, only responses with advantage 0 dropped: they carry no policy gradient and
their tokens stay in the token-mean denominator).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tune_dfrl.config.constraints import BOOL, Bound, Context, Interval, Options

from .batch import RolloutBatch, rank_within_group
from .params import LessThan, Param, Reduce


@dataclass(frozen=True)
class Selector:
    """A named keep rule with its declared hyperparameters, default scorer and canonical reduction."""

    name: str
    scorer: str
    params: tuple[Param, ...]
    select: Callable[[RolloutBatch, torch.Tensor, dict[str, Any]], torch.Tensor]
    constraints: tuple[LessThan, ...] = ()
    reduce: Reduce | None = None


def _count(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x, decimals=9)


def threshold_band(batch: RolloutBatch | None, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    if p["inclusive"]:
        return (s >= p["low"]) & (s <= p["high"])
    return (s > p["low"]) & (s < p["high"])


def _band_reduce(p: dict[str, Any], ctx: Context, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """The solve-rate levels k/n the band keeps (by the rule itself) -> band [k_min - 1/2, k_max + 1/2] / n.

    With binary rewards any threshold in [0, 1) splits {0, 1} alike, and for n >= 2 a group at
    level 0 or n has equal rewards, hence GRPO advantage 0 (a lone response keeps advantage R in
    verl); with `denominator=all` keeping or dropping those levels changes nothing, so only
    levels 1..n-1 count.
    """
    n = ctx.rollout_n
    levels = torch.arange(n + 1, dtype=torch.float64) / n  # as group_solve_rate computes them: count / n
    kept = threshold_band(None, levels, p).nonzero().flatten().tolist()
    relevant = list(range(n + 1))
    if ctx.binary_rewards:
        p = {**p, "success_threshold": defaults["success_threshold"]}
        if p["denominator"] == "all" and n >= 2:
            relevant = relevant[1:-1]
    kept = [k for k in kept if k in relevant]
    if kept == relevant:
        return None
    if not kept:  # empty selection: threshold and denominator cannot matter
        none = {"low": 0.0, "high": 0.5 / n, "inclusive": False}
        return {**p, **none, **{k: defaults[k] for k in ("success_threshold", "denominator")}}
    return {**p, "low": max(0.0, (kept[0] - 0.5) / n), "high": min(1.0, (kept[-1] + 0.5) / n), "inclusive": True}


def _topk_count(f: float, size: torch.Tensor) -> torch.Tensor:
    """k = max(1, ceil(f * size))."""
    return torch.ceil(_count(f * size.to(torch.float64))).clamp(min=1)


def topk_fraction(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    f = p["f"]
    if p["scope"] == "group":
        k = _topk_count(f, batch.group_sizes)
        return rank_within_group(batch.group_index, s, descending=True) < k[batch.group_index]
    k = int(_topk_count(f, torch.tensor(s.shape[0])))
    keep = torch.zeros(s.shape[0], dtype=torch.bool)
    keep[torch.sort(s, descending=True, stable=True).indices[:k]] = True
    return keep


def _topk_reduce(p: dict[str, Any], ctx: Context, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """f = 1 keeps everything; per group, f -> k/n (k = n keeps everything). Batch scope: N varies, no reduction."""
    if p["f"] == 1.0:
        return None
    if p["scope"] == "group":
        k = int(_topk_count(p["f"], torch.tensor(ctx.rollout_n)))
        return None if k >= ctx.rollout_n else {**p, "f": k / ctx.rollout_n}
    return p


def gfpo(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    key = batch.reward.to(torch.float64) / s if p["metric"] == "efficiency" else -s
    return rank_within_group(batch.group_index, key, descending=True) < p["k"]


def max_variance(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Best a by a vectorised scan over a padded [groups, G_max] view of the sorted scores.

    With prefix sums C1, C2 of the ascending values, the kept set for a given a has
    S1 = C1[a] + (C1[G] - C1[G - (m - a)]) and likewise S2, and m^2 var = m S2 - S1^2.
    """
    gi, sizes = batch.group_index, batch.group_sizes
    m = _max_variance_count(p["f"], sizes)
    rank = rank_within_group(gi, s, descending=False)
    width = int(sizes.max())
    padded = torch.zeros(batch.num_groups, width, dtype=torch.float64)
    padded[gi, rank] = s
    zero = torch.zeros(batch.num_groups, 1, dtype=torch.float64)
    c1 = torch.cat([zero, padded.cumsum(1)], dim=1)
    c2 = torch.cat([zero, (padded * padded).cumsum(1)], dim=1)
    a = torch.arange(width + 1)
    high = m[:, None] - a[None, :]
    start = (sizes[:, None] - high).clamp(0, width)
    s1 = c1 + c1.gather(1, sizes[:, None]) - c1.gather(1, start)
    s2 = c2 + c2.gather(1, sizes[:, None]) - c2.gather(1, start)
    spread = (m[:, None] * s2 - s1 * s1).masked_fill(high < 0, -torch.inf)
    best_value = spread.amax(dim=1, keepdim=True)
    tolerance = 1e-9 * best_value.abs().clamp(min=1.0)
    best = (spread >= best_value - tolerance).to(torch.int8).argmax(dim=1)
    lowest, highest = best[gi], (m - best)[gi]
    return (rank < lowest) | (rank >= sizes[gi] - highest)


def _max_variance_count(f: float, size: torch.Tensor) -> torch.Tensor:
    """m = max(1, floor(f * size + 1/2)), int64."""
    return torch.floor(_count(f * size.to(torch.float64)) + 0.5).long().clamp(min=1)


def _max_variance_reduce(p: dict[str, Any], ctx: Context, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """f -> m/n; m = n keeps every response (whatever the flags: a group kept whole keeps its advantages)."""
    m = int(_max_variance_count(p["f"], torch.tensor(ctx.rollout_n)))
    return None if m >= ctx.rollout_n else {**p, "f": m / ctx.rollout_n}


def kept_group_advantages(batch: RolloutBatch, keep: torch.Tensor) -> torch.Tensor:
    """[N, L] GRPO advantages on the kept subset of each group; 0 for dropped responses.

    As verl's compute_grpo_outcome_advantage: (R_i - mean) / (std + 1e-6) with the unbiased std
    over the kept members; a group with a single kept member uses mean 0, std 1. A group kept
    whole keeps the batch's own advantages (its estimator's, bit for bit); padded tokens are 0
    elsewhere.
    """
    k = keep.to(torch.float64)
    r = batch.reward.to(torch.float64)
    gi = batch.group_index
    count = batch.group_sum(k)
    mean = batch.group_sum(r * k) / count.clamp(min=1)
    deviation = (r - mean[gi]) * k
    std = (batch.group_sum(deviation * deviation) / (count - 1).clamp(min=1)).sqrt()
    single = count <= 1
    mean = mean.masked_fill(single, 0.0)
    std = std.masked_fill(single, 1.0)
    recomputed = ((r - mean[gi]) / (std[gi] + 1e-6) * k).to(batch.advantages.dtype)
    out = recomputed[:, None].expand_as(batch.advantages).masked_fill(batch.padding, 0)
    whole = (count == batch.group_sizes)[gi]
    if whole.any():
        out[whole] = batch.advantages[whole]
    return out


DENOMINATOR = Param(
    "denominator",
    "all",
    Options(("all", "kept")),
    doc="all: dropped tokens stay in verl's token-mean denominator; kept: rescale by all/kept tokens",
)
RECOMPUTE = Param("recompute_advantages", False, BOOL, doc="recompute GRPO advantages on the kept subset of each group")
FRACTION = Interval(float, 0.0, 1.0, "right")

SELECTORS: dict[str, Selector] = {
    s.name: s
    for s in (
        Selector(
            "threshold_band",
            "group_solve_rate",
            (
                Param("low", 0.0, Interval(float, 0.0, 1.0, "left"), doc="lower band edge on the solve rate"),
                Param("high", 1.0, Interval(float, 0.0, 1.0, "right"), doc="upper band edge on the solve rate"),
                Param("inclusive", False, BOOL, searchable=False, doc="closed band [low, high] instead of open"),
            ),
            threshold_band,
            (LessThan("low", "high"),),
            _band_reduce,
        ),
        Selector(
            "topk_fraction",
            "advantage_magnitude",
            (
                Param("f", 0.5, FRACTION, doc="fraction kept"),
                Param("scope", "batch", Options(("batch", "group")), doc="rank over the batch or per group"),
            ),
            topk_fraction,
            reduce=_topk_reduce,
        ),
        Selector(
            "gfpo",
            "response_length",
            (
                Param("k", 2, Interval(int, 1, Bound("rollout_n", -1)), search=(1, 7), doc="responses kept per group"),
                Param("metric", "efficiency", Options(("efficiency", "short")), doc="R_i / L_i or -L_i"),
                RECOMPUTE,
            ),
            gfpo,
        ),
        Selector(
            "max_variance",
            "reward",
            (Param("f", 0.5, FRACTION, doc="fraction of each group kept"), RECOMPUTE),
            max_variance,
            reduce=_max_variance_reduce,
        ),
    )
}
