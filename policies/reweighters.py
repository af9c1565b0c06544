"""Reweighters: scores -> continuous mean-1 weights (DESIGN §4).

norm1(w) = w / mean(w) over the normalisation scope: `batch` (all responses) or `informative`
(responses with non-zero mean |advantage|; the others carry no gradient and get weight 1).

| name | weight (before norm1) |
|---|---|
| softmax | exp((s_i - max s) / T), s = advantage magnitude (= softmax(s / T) up to the norm) |
| difficulty_band | focus if q_low-quantile <= s_i <= q_high-quantile else 1, s = reward; quantiles (linear interpolation) over the scope |
| advantage_reweight | token level alpha * p_it + (1 - alpha), p = exp(old_log_probs); mean over valid tokens of the scope |
| per_advantage | (|s_i| + 1e-8)^alpha, s = advantage magnitude |

Each reweighter declares its canonical reduction (`reduce`, see params.Reduce) next to its
rule: the settings under which its weights are all 1 act exactly as uniform GRPO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tune_dfrl.config.constraints import Context, Interval, Options

from .batch import RolloutBatch
from .params import TEMPERATURE, LessThan, Param, Reduce


@dataclass(frozen=True)
class Weights:
    """Policy weights, [N] per response or [N, L] per token, with per-row statistics over valid tokens.

    row_sum = sum_t w_it m_it, row_sq = sum_t w_it^2 m_it, row_max = max over valid t of w_it.
    """

    values: torch.Tensor
    row_sum: torch.Tensor
    row_sq: torch.Tensor
    row_max: torch.Tensor

    @classmethod
    def per_response(cls, w: torch.Tensor, token_counts: torch.Tensor) -> Weights:
        return cls(w, w * token_counts, w * w * token_counts, w)


@dataclass(frozen=True)
class Reweighter:
    """A named weight rule: returns normalised weights, a [N] tensor per response or `Weights`."""

    name: str
    scorer: str
    params: tuple[Param, ...]
    weigh: Callable[[RolloutBatch, torch.Tensor, dict[str, Any], torch.Tensor], torch.Tensor | Weights]
    constraints: tuple[LessThan, ...] = ()
    reduce: Reduce | None = None


def in_scope(batch: RolloutBatch, scope: str) -> torch.Tensor:
    """[N] bool: the responses the weights are normalised over."""
    if scope == "informative":
        return batch.abs_advantage > 0
    return torch.ones(batch.num_responses, dtype=torch.bool)


def norm1(w: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
    """w / mean(w over scope) inside the scope, 1 outside (all 1 when the scope is empty)."""
    if not scope.any():
        return torch.ones_like(w)
    return torch.where(scope, w / w[scope].mean(), torch.ones_like(w))


def softmax(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any], scope: torch.Tensor) -> torch.Tensor:
    top = s[scope].max() if scope.any() else s.max()
    return norm1(torch.exp((s - top) / p["temperature"]), scope)


def difficulty_band(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any], scope: torch.Tensor) -> torch.Tensor:
    if not scope.any():
        return torch.ones_like(s)
    q = torch.quantile(s[scope], torch.tensor([p["q_low"], p["q_high"]], dtype=s.dtype))
    inside = (s >= q[0]) & (s <= q[1])
    return norm1(torch.where(inside, p["focus"], 1.0).to(torch.float64), scope)


def _difficulty_band_reduce(p: dict[str, Any], ctx: Context, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """All weights 1 when focus = 1 or when the band [0, 1] holds every response."""
    return None if p["focus"] == 1.0 or (p["q_low"] == 0.0 and p["q_high"] == 1.0) else p


def advantage_reweight(batch: RolloutBatch, prob: torch.Tensor, p: dict[str, Any], scope: torch.Tensor) -> Weights:
    """w_it = a_i p_it + b_i, computed in place in the workspace holding p.

    In scope a_i = alpha / mu, b_i = (1 - alpha) / mu with mu = alpha * mean(p over valid scope
    tokens) + (1 - alpha); outside a_i = 0, b_i = 1. Row statistics follow from sum p, sum p^2
    and max p over valid tokens.
    """
    alpha = p["alpha"]
    valid = prob.masked_fill_(batch.padding, 0)  # p at valid tokens, 0 elsewhere
    p_sum = valid.sum(dim=1).to(torch.float64)
    p_sq = torch.linalg.vector_norm(valid, 2, dim=1).to(torch.float64) ** 2
    p_max = valid.amax(dim=1).to(torch.float64)
    counts = batch.token_counts
    tokens = counts[scope].sum()
    if tokens == 0:  # no valid token in scope: nothing to normalise
        a, b = torch.zeros_like(p_sum), torch.ones_like(p_sum)
    else:
        mu = alpha * p_sum[scope].sum() / tokens + (1 - alpha)
        a, b = torch.where(scope, alpha / mu, 0.0), torch.where(scope, (1 - alpha) / mu, 1.0)
    values = valid.mul_(a.to(valid.dtype)[:, None]).add_(b.to(valid.dtype)[:, None])
    return Weights(values, a * p_sum + b * counts, a * a * p_sq + 2 * a * b * p_sum + b * b * counts, a * p_max + b)


def per_advantage(batch: RolloutBatch, s: torch.Tensor, p: dict[str, Any], scope: torch.Tensor) -> torch.Tensor:
    return norm1((s.abs() + 1e-8) ** p["alpha"], scope)


def _uniform_at_alpha_0(p: dict[str, Any], ctx: Context, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """advantage_reweight and per_advantage: all weights 1 when alpha = 0."""
    return None if p["alpha"] == 0.0 else p


SCOPE = Param(
    "scope",
    "batch",
    Options(("batch", "informative")),
    doc="normalise to mean 1 over all responses, or over those with non-zero advantage",
)

REWEIGHTERS: dict[str, Reweighter] = {
    r.name: r
    for r in (
        Reweighter(
            "softmax",
            "advantage_magnitude",
            (
                TEMPERATURE,
                SCOPE,
            ),
            softmax,
        ),
        Reweighter(
            "difficulty_band",
            "reward",
            (
                Param("q_low", 0.25, Interval(float, 0.0, 1.0, "left"), doc="lower quantile of the band"),
                Param("q_high", 0.75, Interval(float, 0.0, 1.0, "right"), doc="upper quantile of the band"),
                Param(
                    "focus",
                    2.0,
                    Interval(float, 1.0, None),
                    search=(1.0, 8.0),
                    doc="weight inside the band before norm1",
                ),
                SCOPE,
            ),
            difficulty_band,
            (LessThan("q_low", "q_high"),),
            _difficulty_band_reduce,
        ),
        Reweighter(
            "advantage_reweight",
            "token_prob",
            (Param("alpha", 0.5, Interval(float, 0.0, 1.0), doc="mix between token probability and 1"), SCOPE),
            advantage_reweight,
            reduce=_uniform_at_alpha_0,
        ),
        Reweighter(
            "per_advantage",
            "advantage_magnitude",
            (Param("alpha", 1.0, Interval(float, 0.0, None), search=(0.0, 3.0), doc="priority exponent"), SCOPE),
            per_advantage,
            reduce=_uniform_at_alpha_0,
        ),
    )
}
