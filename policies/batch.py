"""The signals a policy may read (DESIGN §3), validated on construction, plus group helpers.

A batch holds N = P x n responses of at most L tokens. Derived signals (computed once, cached):
`token_counts` sum_t m_it, `lengths` L_i = max(1, sum_t m_it), `abs_advantage` (per-response
mean |A_it| over valid tokens; its sum and max too), `group_index` (group ids made contiguous
0..G-1) and `group_sizes`. Non-finite values are rejected, in `old_log_probs` at valid tokens
only (padded positions may hold anything).

Cost matters: a policy runs on every training step next to verl's loss, so [N, L] work is kept to
single passes. Validation checks sums before counting bad entries, and [N, L] intermediates go to
one `workspace` buffer per batch, which the policy result finally takes over as its token weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch

PER_RESPONSE = ("group", "domain", "reward")
PER_TOKEN = ("advantages", "response_mask", "old_log_probs", "rollout_is_weights")


@dataclass(eq=False)
class RolloutBatch:
    """One step's rollouts. Shapes: group/domain/reward [N]; advantages/masks/log-probs [N, L]."""

    group: torch.Tensor
    domain: torch.Tensor
    reward: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    old_log_probs: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None
    _workspace: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        tensors = {k: getattr(self, k) for k in PER_RESPONSE + PER_TOKEN if getattr(self, k) is not None}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"RolloutBatch.{name} must be a torch.Tensor; got {type(t).__name__}")
        if self.advantages.dim() != 2:
            raise ValueError(f"RolloutBatch.advantages must be [N, L]; got shape {tuple(self.advantages.shape)}")
        n, length = self.advantages.shape
        if n == 0:
            raise ValueError("RolloutBatch must hold at least one response; got N=0")
        for name, t in tensors.items():
            want = (n,) if name in PER_RESPONSE else (n, length)
            if tuple(t.shape) != want:
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(t.shape)}; expected {want} (N={n}, L={length})")
        for name in ("group", "domain"):
            if tensors[name].is_floating_point() or tensors[name].dtype == torch.bool:
                raise ValueError(f"RolloutBatch.{name} must be an integer tensor; got {tensors[name].dtype}")
        if (self.domain < 0).any():
            raise ValueError(f"RolloutBatch.domain must be >= 0; got {int((self.domain < 0).sum())} negative entries")
        bad = _non_binary(self.response_mask)
        if bad:
            raise ValueError(f"RolloutBatch.response_mask must be 0/1; got {bad} other entries")
        for name in ("reward", "advantages", "rollout_is_weights"):
            bad = _non_finite(tensors[name]) if name in tensors else 0
            if bad:
                raise ValueError(f"RolloutBatch.{name} has {bad} NaN/inf entries")
        bad = _non_finite(self.old_log_probs, valid=self.response_mask)
        if bad:
            raise ValueError(f"RolloutBatch.old_log_probs has {bad} NaN/inf entries at valid tokens")

    @property
    def num_responses(self) -> int:
        return self.advantages.shape[0]

    @property
    def weight_dtype(self) -> torch.dtype:
        """dtype of [N, L] weights: the advantages' dtype, at least float32."""
        return torch.promote_types(self.advantages.dtype, torch.float32)

    def workspace(self) -> torch.Tensor:
        """A [N, L] scratch buffer, allocated once; holds only the latest intermediate written to it."""
        if self._workspace is None:
            self._workspace = torch.empty(self.advantages.shape, dtype=self.weight_dtype)
        return self._workspace

    def into_workspace(self, op: Callable[..., torch.Tensor], source: torch.Tensor) -> torch.Tensor:
        """op(source) written into the workspace (op is an elementwise torch function taking out=)."""
        buffer = self.workspace()
        return op(source if source.dtype == buffer.dtype else buffer.copy_(source), out=buffer)

    def take_workspace(self) -> torch.Tensor:
        """Hand the buffer over (to a policy result); the batch allocates a new one if asked again."""
        buffer, self._workspace = self.workspace(), None
        return buffer

    @cached_property
    def token_counts(self) -> torch.Tensor:
        """[N] float64: number of valid tokens per response."""
        return self.response_mask.sum(dim=1).to(torch.float64)

    @cached_property
    def lengths(self) -> torch.Tensor:
        """[N] float64: L_i = max(1, sum_t m_it)."""
        return self.token_counts.clamp(min=1.0)

    @cached_property
    def padding(self) -> torch.Tensor:
        """[N, L] bool: m_it == 0 (logical_not of the validated 0/1 mask: faster than `== 0` on
        int64). Masking by `masked_fill_(padding, 0)` is much cheaper than multiplying by an
        int64 mask (verl's dtype)."""
        return torch.logical_not(self.response_mask)

    def masked_abs_advantages(self) -> torch.Tensor:
        """|A_it| m_it written into the workspace."""
        return self.into_workspace(torch.abs, self.advantages).masked_fill_(self.padding, 0)

    @cached_property
    def abs_advantage_sum(self) -> torch.Tensor:
        """[N] float64: sum_t |A_it| m_it."""
        return self.masked_abs_advantages().sum(dim=1).to(torch.float64)

    @cached_property
    def abs_advantage_max(self) -> torch.Tensor:
        """[N] float64: max_t |A_it| m_it."""
        return self.masked_abs_advantages().amax(dim=1).to(torch.float64)

    @cached_property
    def abs_advantage(self) -> torch.Tensor:
        """[N] float64: sum_t |A_it| m_it / L_i, as r_i + sum_t (|A_it| - r_i) m_it / L_i.

        r_i is |A| at the response's first valid token. The sum is 0 exactly when all of a
        response's |A_it| are equal, so equal |A| score equal whatever the lengths or dtype, and
        ties are then broken by index, not by rounding.
        """
        first_valid = torch.zeros(self.num_responses, dtype=torch.long)
        late = self.padding[:, 0].nonzero().flatten()  # rows whose token 0 is padding (few: verl pads on the right)
        first_valid[late] = self.padding[late].view(torch.uint8).argmin(dim=1)
        deviation = self.into_workspace(torch.abs, self.advantages)
        r = deviation.gather(1, first_valid[:, None])
        deviation.sub_(r).masked_fill_(self.padding, 0)
        r = r.squeeze(1).to(torch.float64).masked_fill_(self.token_counts == 0, 0)
        return r + deviation.sum(dim=1).to(torch.float64) / self.lengths

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


def _non_finite(t: torch.Tensor, valid: torch.Tensor | None = None) -> int:
    """Number of NaN/inf entries (where the 0/1 `valid` mask is 1); one summing pass when there are none."""
    if not t.is_floating_point() or torch.isfinite(t.sum()):
        return 0
    bad = ~torch.isfinite(t)
    if valid is not None:
        bad &= valid.bool()
    return int(torch.count_nonzero(bad))


def _non_binary(m: torch.Tensor) -> int:
    """Number of entries that are neither 0 nor 1 (range first, then fractions for float masks)."""
    if m.dtype == torch.bool or m.numel() == 0:
        return 0
    low, high = torch.aminmax(m)
    if low < 0 or high > 1:
        return int(m.numel() - torch.count_nonzero((m == 0) | (m == 1)))
    return int(torch.count_nonzero(m.frac())) if m.is_floating_point() else 0


def rank_within_group(group_index: torch.Tensor, key: torch.Tensor, descending: bool) -> torch.Tensor:
    """[N] int64: 0-based rank of each response by `key` inside its group; ties keep index order."""
    by_key = torch.sort(key, descending=descending, stable=True).indices
    order = by_key[torch.sort(group_index[by_key], stable=True).indices]
    sizes = torch.bincount(group_index)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0]) - starts[group_index[order]]
    return rank
