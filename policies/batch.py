"""The signals a policy may read (DESIGN §3), validated on construction, plus group helpers.

A batch holds N = P x n responses of at most L tokens. Derived signals:
`lengths` L_i = max(1, sum_t m_it), `token_counts` sum_t m_it, `group_index` (group ids made
contiguous 0..G-1, in order of first sorted id), `group_sizes`, and `abs_advantage` (per-response
mean |A_it| over valid tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """One step's rollouts. Shapes: group/domain/reward [N]; advantages/masks/log-probs [N, L]."""

    group: torch.Tensor
    domain: torch.Tensor
    reward: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        tensors = {k: getattr(self, k) for k in ("group", "domain", "reward", "advantages", "response_mask", "old_log_probs")}
        if self.rollout_is_weights is not None:
            tensors["rollout_is_weights"] = self.rollout_is_weights
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"RolloutBatch.{name} must be a torch.Tensor; got {type(t).__name__}")
        if self.advantages.dim() != 2:
            raise ValueError(f"RolloutBatch.advantages must be [N, L]; got shape {tuple(self.advantages.shape)}")
        n, length = self.advantages.shape
        if n == 0:
            raise ValueError("RolloutBatch must hold at least one response; got N=0")
        for name, t in tensors.items():
            want = (n,) if name in ("group", "domain", "reward") else (n, length)
            if tuple(t.shape) != want:
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(t.shape)}; expected {want} (N={n}, L={length})")
        for name in ("group", "domain"):
            if tensors[name].is_floating_point() or tensors[name].dtype == torch.bool:
                raise ValueError(f"RolloutBatch.{name} must be an integer tensor; got {tensors[name].dtype}")
        if (self.domain < 0).any():
            raise ValueError(f"RolloutBatch.domain must be >= 0; got {int((self.domain < 0).sum())} negative entries")
        m = self.response_mask
        if m.dtype != torch.bool:
            bad = int(m.numel() - torch.count_nonzero((m == 0) | (m == 1)))
            if bad:
                raise ValueError(f"RolloutBatch.response_mask must be 0/1; got {bad} other entries")
        for name in ("reward", "advantages", "rollout_is_weights"):
            t = tensors.get(name)
            if t is not None:
                bad = int(t.numel() - torch.count_nonzero(torch.isfinite(t)))
                if bad:
                    raise ValueError(f"RolloutBatch.{name} has {bad} NaN/inf entries")

    @property
    def num_responses(self) -> int:
        return self.advantages.shape[0]

    @cached_property
    def token_counts(self) -> torch.Tensor:
        """[N] float64: number of valid tokens per response."""
        return self.response_mask.sum(dim=1, dtype=torch.float64)

    @cached_property
    def lengths(self) -> torch.Tensor:
        """[N] float64: L_i = max(1, sum_t m_it)."""
        return self.token_counts.clamp(min=1.0)

    @cached_property
    def abs_advantage(self) -> torch.Tensor:
        """[N] float64: sum_t |A_it| m_it / L_i."""
        return masked_row_sum(self.advantages.abs(), self.response_mask) / self.lengths

    @cached_property
    def group_index(self) -> torch.Tensor:
        """[N] int64: contiguous group ids 0..G-1."""
        return torch.unique(self.group, return_inverse=True)[1]

    @cached_property
    def group_sizes(self) -> torch.Tensor:
        """[G] int64: responses per group."""
        return torch.bincount(self.group_index)

    @property
    def num_groups(self) -> int:
        return int(self.group_sizes.shape[0])

    def group_sum(self, values: torch.Tensor) -> torch.Tensor:
        """[G]: sum of a per-response [N] tensor within each group."""
        out = torch.zeros(self.num_groups, dtype=values.dtype)
        return out.index_add_(0, self.group_index, values)

    def group_mean(self, values: torch.Tensor) -> torch.Tensor:
        """[G]: mean of a per-response [N] tensor within each group."""
        return self.group_sum(values) / self.group_sizes.to(values.dtype)


def masked_row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N] float64: sum_t values_it * mask_it as one fused row dot product (no [N, L] temporary)."""
    rows = torch.linalg.vecdot(values, mask.to(values.dtype))
    return rows.to(torch.float64)


def rank_within_group(group_index: torch.Tensor, key: torch.Tensor, descending: bool) -> torch.Tensor:
    """[N] int64: 0-based rank of each response by `key` inside its group; ties keep index order."""
    by_key = torch.sort(key, descending=descending, stable=True).indices
    order = by_key[torch.sort(group_index[by_key], stable=True).indices]
    sizes = torch.bincount(group_index)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0]) - starts[group_index[order]]
    return rank
