"""The arm's data policy applied to a verl batch right after verl computes GRPO advantages.

Given a verl `DataProto` holding, per response i (N rows, L response tokens):
`uid` (prompt group), `token_level_scores` or `rm_scores` [N, L] (R_i = their row sum),
`advantages`, `response_mask`, `old_log_probs` [N, L], optionally verl's own
`rollout_is_weights` [N, L] and the prompt's domain column, `DataPolicy.apply`

- builds the `RolloutBatch` of DESIGN §3 (groups = uids, domains = index in `domains`);
- runs the selection / reweighting policy and writes
  `rollout_is_weights = w_policy * rollout_is_weights` (verl's weights are multiplied, never
  replaced) and the policy's advantages (recomputed on the kept subset when the arm says so);
- feeds a mixer arm's window statistics (`Mixer.observe`), which set the proportions the
  `MixtureBatchSampler` uses for the next draw;
- returns the diagnostics as metrics under `policy/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tune_dfrl.policies import Mixer, Policy, RolloutBatch, make_mixer, make_policy, resolve


def is_mixer(method: str) -> bool:
    return resolve(method).kind == "mixer"


def domain_ids(values: Sequence[Any], domains: Sequence[str]) -> np.ndarray:
    """[N] index of each value in the sorted `domains`; unknown values are an error naming them."""
    names = np.asarray(domains, dtype=str)
    found = np.asarray(values, dtype=str)
    index = np.clip(np.searchsorted(names, found), 0, len(names) - 1)
    unknown = np.unique(found[names[index] != found])
    if unknown.size:
        raise ValueError(f"unknown domain values {unknown.tolist()[:8]}; known domains: {', '.join(names)}")
    return index


@dataclass
class DataPolicy:
    """An arm as the verl trainer runs it: a selection/reweighting policy, or uniform + a mixer."""

    policy: Policy
    mixer: Mixer | None
    domains: tuple[str, ...]  # sorted domain names; id = position
    domain_column: str

    @classmethod
    def from_arm(cls, arm: dict[str, Any], rollout_n: int, domains: Sequence[str], domain_column: str) -> DataPolicy:
        """From `{"method", "params"}` (the `tune_dfrl.policy` JSON); mixers need `domains`."""
        method, params = arm["method"], arm.get("params") or {}
        domains = tuple(sorted(domains))
        if not is_mixer(method):
            return cls(make_policy(method, params, rollout_n), None, domains, domain_column)
        if not domains:
            raise ValueError(f"mixer arm '{method}' needs the training prompts' domain column '{domain_column}'")
        return cls(make_policy("baseline"), make_mixer(method, params, len(domains)), domains, domain_column)

    @classmethod
    def from_json(cls, text: str, rollout_n: int, domains: Sequence[str], domain_column: str) -> DataPolicy:
        return cls.from_arm(json.loads(text), rollout_n, domains, domain_column)

    def rollout_batch(self, data: Any) -> RolloutBatch:
        """The DESIGN §3 signals of a verl `DataProto`."""
        tensors, columns = data.batch, data.non_tensor_batch
        scores = tensors["token_level_scores"] if "token_level_scores" in tensors.keys() else tensors["rm_scores"]
        group = np.unique(np.asarray(columns["uid"], dtype=str), return_inverse=True)[1]
        if self.domains and self.domain_column in columns:
            domain = domain_ids(columns[self.domain_column], self.domains)
        else:
            domain = np.zeros(len(group), dtype=np.int64)
        return RolloutBatch(
            group=torch.from_numpy(group.astype(np.int64)),
            domain=torch.from_numpy(domain.astype(np.int64)),
            reward=scores.sum(dim=-1),
            advantages=tensors["advantages"],
            response_mask=tensors["response_mask"],
            old_log_probs=tensors["old_log_probs"],
            rollout_is_weights=tensors["rollout_is_weights"] if "rollout_is_weights" in tensors.keys() else None,
        )

    def apply(self, data: Any, step: int) -> dict[str, float]:
        """Write `rollout_is_weights` and `advantages` into `data.batch`; return `policy/` metrics.

        `step` is the 0-based training step (verl's `global_steps - 1`).
        """
        batch = self.rollout_batch(data)
        result = self.policy.apply(batch)
        data.batch["rollout_is_weights"] = result.token_weights.to(torch.float32)
        data.batch["advantages"] = result.advantages.to(data.batch["advantages"].dtype)
        metrics = {f"policy/{k}": v for k, v in result.diagnostics.items()}
        if self.mixer is not None:
            self.mixer.observe(step, batch)
            metrics.update({f"policy/{k}": v for k, v in self.mixer.diagnostics().items()})
        return metrics
