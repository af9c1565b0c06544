"""Small batch builders shared by the tests/test_policies_*.py files."""

from __future__ import annotations

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from tune_dfrl.policies import RolloutBatch


def grpo_advantages(reward: torch.Tensor, group: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's own GRPO outcome advantages, [N, L]."""
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    scores[:, 0] = reward
    return compute_grpo_outcome_advantage(scores, mask.float(), np.asarray(group))[0]


def make_batch(
    rewards: list[list[float]],
    lengths: list[int] | None = None,
    max_len: int | None = None,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    domain: list[int] | None = None,
) -> RolloutBatch:
    """A batch with one group per inner list; GRPO advantages from verl unless given."""
    reward = torch.tensor([r for g in rewards for r in g], dtype=torch.float32)
    group = torch.tensor([i for i, g in enumerate(rewards) for _ in g])
    n = reward.shape[0]
    lengths = lengths or [4] * n
    max_len = max_len or max(lengths)
    mask = (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]).float()
    if advantages is None:
        advantages = grpo_advantages(reward, group, mask)
    if old_log_probs is None:
        old_log_probs = torch.full((n, max_len), -0.5)
    return RolloutBatch(
        group=group,
        domain=torch.tensor(domain) if domain is not None else torch.zeros(n, dtype=torch.long),
        reward=reward,
        advantages=advantages,
        response_mask=mask,
        old_log_probs=old_log_probs,
        rollout_is_weights=rollout_is_weights,
    )


def random_batch(prompts: int, n: int, max_len: int, seed: int, binary: bool = True) -> RolloutBatch:
    """A random GRPO batch with ragged lengths, seeded by a torch.Generator."""
    g = torch.Generator().manual_seed(seed)
    size = prompts * n
    reward = (torch.rand(size, generator=g) < 0.5).float() if binary else torch.rand(size, generator=g)
    group = torch.arange(prompts).repeat_interleave(n)
    lengths = torch.randint(1, max_len + 1, (size,), generator=g)
    mask = (torch.arange(max_len)[None, :] < lengths[:, None]).float()
    return RolloutBatch(
        group=group,
        domain=torch.randint(0, 3, (size,), generator=g),
        reward=reward,
        advantages=grpo_advantages(reward, group, mask),
        response_mask=mask,
        old_log_probs=-torch.rand(size, max_len, generator=g) * 2,
    )
