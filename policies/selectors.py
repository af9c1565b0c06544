"""Selectors: scores -> a 0/1 keep mask per response (DESIGN §4), all vectorised over groups.

| name | keep rule |
|---|---|
| threshold_band | low < s_i < high (closed with inclusive=true); s = group solve rate |
| topk_fraction | the k = max(1, ceil(f*N)) largest s_i (scope=batch) or k_g = max(1, ceil(f*G)) per group |
| gfpo | per group the k best by efficiency R_i / L_i or by shortness -L_i (s = L_i) |
| max_variance | per group of size G, m = max(1, floor(f*G + 0.5)) responses: the a lowest and m-a highest rewards, a maximising their variance (first a on ties) |

Ties are broken by index (stable sorts). Counts like f*N are rounded to 9 decimals before
ceil/floor so that 0.3*10 counts as 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .batch import RolloutBatch, rank_within_group
from .params import LessThan, Param


@dataclass(frozen=True)
class Selector:
    """A named keep rule with its declared hyperparameters and its default scorer."""

    name: str
    scorer: str
    params: tuple[Param, ...]
    select: Callable[[RolloutBatch, torch.Tensor, dict[str, Any]], torch.Tensor]
    constraints: tuple[LessThan, ...] = ()


def _count(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x, decimals=9)


def threshold_band(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    if p["inclusive"]:
        return (s >= p["low"]) & (s <= p["high"])
    return (s > p["low"]) & (s < p["high"])


def topk_fraction(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    f = p["f"]
    if p["scope"] == "group":
        k = torch.ceil(_count(f * batch.group_sizes.to(torch.float64))).clamp(min=1)
        return rank_within_group(batch.group_index, s, descending=True) < k[batch.group_index]
    k = max(1, int(torch.ceil(_count(torch.tensor(f * s.shape[0], dtype=torch.float64)))))
    keep = torch.zeros(s.shape[0], dtype=torch.bool)
    keep[torch.sort(s, descending=True, stable=True).indices[:k]] = True
    return keep


def gfpo(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    key = batch.reward.to(torch.float64) / s if p["metric"] == "efficiency" else -s
    return rank_within_group(batch.group_index, key, descending=True) < p["k"]


def max_variance(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Best a by a vectorised scan over a padded [groups, G_max] view of the sorted scores.

    With prefix sums C1, C2 of the ascending values, the kept set for a given a has
    S1 = C1[a] + (C1[G] - C1[G - (m - a)]) and likewise S2, and m^2 var = m S2 - S1^2.
    """
    gi, sizes = batch.group_index, batch.group_sizes
    m = torch.floor(_count(p["f"] * sizes.to(torch.float64)) + 0.5).long().clamp(min=1)
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


def kept_group_advantages(batch: RolloutBatch, keep: torch.Tensor) -> torch.Tensor:
    """[N] float64 GRPO advantages on the kept subset of each group, 0 for dropped responses.

    As verl's compute_grpo_outcome_advantage: (R_i - mean) / (std + 1e-6) with the unbiased std
    over the kept members; a group with a single kept member uses mean 0, std 1.
    """
    k = keep.to(torch.float64)
    r = batch.reward.to(torch.float64)
    count = batch.group_sum(k)
    mean = batch.group_sum(r * k) / count.clamp(min=1)
    deviation = (r - mean[batch.group_index]) * k
    std = (batch.group_sum(deviation * deviation) / (count - 1).clamp(min=1)).sqrt()
    single = count <= 1
    mean = mean.masked_fill(single, 0.0)
    std = std.masked_fill(single, 1.0)
    gi = batch.group_index
    return (r - mean[gi]) / (std[gi] + 1e-6) * k


DENOMINATOR = Param(
    "denominator", "choice", "all", choices=("all", "kept"),
    doc="all: dropped tokens stay in verl's token-mean denominator; kept: rescale by all/kept tokens",
)
RECOMPUTE = Param(
    "recompute_advantages", "bool", False, doc="recompute GRPO advantages on the kept subset of each group"
)
FRACTION = dict(low=0.0, high=1.0, low_open=True)

SELECTORS: dict[str, Selector] = {
    s.name: s
    for s in (
        Selector(
            "threshold_band",
            "group_solve_rate",
            (
                Param("low", "float", 0.0, low=0.0, high=1.0, high_open=True, doc="lower band edge on the solve rate"),
                Param("high", "float", 1.0, low=0.0, high=1.0, low_open=True, doc="upper band edge on the solve rate"),
                Param("inclusive", "bool", False, searchable=False, doc="closed band [low, high] instead of open"),
            ),
            threshold_band,
            (LessThan("low", "high"),),
        ),
        Selector(
            "topk_fraction",
            "advantage_magnitude",
            (
                Param("f", "float", 0.5, **FRACTION, doc="fraction kept"),
                Param("scope", "choice", "batch", choices=("batch", "group"), doc="rank over the batch or per group"),
            ),
            topk_fraction,
        ),
        Selector(
            "gfpo",
            "response_length",
            (
                Param("k", "int", 2, low=1, search=(1, 7), high_from_n=-1, doc="responses kept per group"),
                Param("metric", "choice", "efficiency", choices=("efficiency", "short"), doc="R_i / L_i or -L_i"),
                RECOMPUTE,
            ),
            gfpo,
        ),
        Selector(
            "max_variance",
            "reward",
            (Param("f", "float", 0.5, **FRACTION, doc="fraction of each group kept"), RECOMPUTE),
            max_variance,
        ),
    )
}
