"""Scorers: signals -> one score per response ([N] float64) or per token ([N, L]).

| name | score |
|---|---|
| reward | s_i = R_i |
| advantage_magnitude | s_i = sum_t |A_it| m_it / L_i (agg=mean), the sum, or max_t |A_it| m_it |
| group_solve_rate | s_i = mean_{j in G(i)} 1[R_j > success_threshold] |
| token_prob | s_it = exp(old_log_probs_it) |
| response_length | s_i = L_i |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tune_dfrl.config.constraints import Interval, Options

from .batch import RolloutBatch
from .params import Param


@dataclass(frozen=True)
class Scorer:
    """A named score function with its declared options."""

    name: str
    params: tuple[Param, ...]
    score: Callable[[RolloutBatch, dict[str, Any]], torch.Tensor]
    token_level: bool = False


def reward(batch: RolloutBatch, p: dict[str, Any]) -> torch.Tensor:
    return batch.reward.to(torch.float64)


def advantage_magnitude(batch: RolloutBatch, p: dict[str, Any]) -> torch.Tensor:
    if p["agg"] == "mean":
        return batch.abs_advantage
    if p["agg"] == "sum":
        return batch.abs_advantage_sum
    return batch.abs_advantage_max


def group_solve_rate(batch: RolloutBatch, p: dict[str, Any]) -> torch.Tensor:
    solved = (batch.reward > p["success_threshold"]).to(torch.float64)
    return batch.group_mean(solved)[batch.group_index]


def token_prob(batch: RolloutBatch, p: dict[str, Any]) -> torch.Tensor:
    """exp(old_log_probs), written into the batch workspace."""
    return batch.into_workspace(torch.exp, batch.old_log_probs)


def response_length(batch: RolloutBatch, p: dict[str, Any]) -> torch.Tensor:
    return batch.lengths


SCORERS: dict[str, Scorer] = {
    s.name: s
    for s in (
        Scorer("reward", (), reward),
        Scorer(
            "advantage_magnitude",
            (
                Param(
                    "agg",
                    "mean",
                    Options(("mean", "sum", "max")),
                    searchable=False,
                    doc="how |A_it| is aggregated over the response's valid tokens",
                ),
            ),
            advantage_magnitude,
        ),
        Scorer(
            "group_solve_rate",
            (
                Param(
                    "success_threshold",
                    0.5,
                    Interval(float, 0.0, 1.0, "left"),
                    searchable=False,
                    doc="a response counts as solved iff R_i > this (verifier rewards lie in [0, 1])",
                ),
            ),
            group_solve_rate,
        ),
        Scorer("token_prob", (), token_prob, token_level=True),
        Scorer("response_length", (), response_length),
    )
}
