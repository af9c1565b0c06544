"""The GRPO objective, computed by verl's own `core_algos` on CPU.

For N = P x n responses with outcome rewards R_i (placed on the last valid token):

    A_i     = (R_i - mean_G(i) R) / (std_G(i) R + 1e-6)                   verl "grpo_vectorized"
    L_pg    = token-mean_{i,t} [ w_it * max(-A_it r_it, -A_it clip(r_it, 1-eps, 1+eps)) ]
              (dual-clip for A < 0; r = pi / pi_old; w = rollout_is_weights)     verl "vanilla"
    L_kl    = token-mean_{i,t} k3(log pi_it, log pi_ref_it)                      verl kl_penalty "low_var_kl"
    L       = L_pg + kl_coef * L_kl

token-mean divides by all valid tokens of the batch, so tokens a policy weights to 0 stay in
the denominator (DESIGN §4, `denominator=all`).
"""

from __future__ import annotations

import numpy as np
import torch
from verl.trainer.ppo.core_algos import agg_loss, get_adv_estimator_fn, get_policy_loss_fn, kl_penalty
from verl.workers.config import ActorConfig

LOSS_AGG_MODE = "token-mean"
KL_TYPE = "low_var_kl"


class GRPOObjective:
    """Advantages and loss of one GRPO update, with verl's estimator, policy loss and KL penalty."""

    def __init__(self, clip_ratio: float, kl_coef: float, rollout_n: int):
        self.kl_coef = kl_coef
        self.config = ActorConfig(
            strategy="fsdp",
            rollout_n=rollout_n,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=clip_ratio,
            clip_ratio_low=clip_ratio,
            clip_ratio_high=clip_ratio,
            loss_agg_mode=LOSS_AGG_MODE,
            use_kl_loss=True,
            kl_loss_coef=kl_coef,
            kl_loss_type=KL_TYPE,
        )
        self.estimator = get_adv_estimator_fn("grpo_vectorized")
        self.policy_loss = get_policy_loss_fn("vanilla")

    def advantages(self, rewards: torch.Tensor, mask: torch.Tensor, groups: np.ndarray) -> torch.Tensor:
        """[N, L] GRPO advantages (constant over each response's valid tokens)."""
        last = (mask.sum(dim=1).long() - 1).clamp(min=0)
        token_rewards = torch.zeros_like(mask).scatter_(1, last[:, None], rewards[:, None].to(mask.dtype))
        advantages, _ = self.estimator(token_level_rewards=token_rewards, response_mask=mask, index=groups)
        return advantages

    def loss(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        ref_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """L = L_pg + kl_coef * L_kl, and its parts as metrics."""
        pg_loss, pg_metrics = self.policy_loss(
            old_log_prob=old_log_probs,
            log_prob=log_probs,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=LOSS_AGG_MODE,
            config=self.config,
            rollout_is_weights=weights,
        )
        kl_matrix = kl_penalty(log_probs, ref_log_probs, KL_TYPE)
        kl = agg_loss(loss_mat=kl_matrix, loss_mask=mask, loss_agg_mode=LOSS_AGG_MODE)
        loss = pg_loss + self.kl_coef * kl
        metrics = {"loss": loss.item(), "pg_loss": pg_loss.item(), "kl": kl.item()}
        return loss, {**metrics, "pg_clipfrac": pg_metrics["actor/pg_clipfrac"]}
