"""One trial's GRPO training loop on the tiny model, with the data-policy hook.

Per step t:
 1. proportions p_t (the arm's mixer, or static uniform) -> DomainSampler draws P prompts;
 2. n sampled rollouts per prompt (the prompt encoded once, its KV cache repeated); reward 1 iff
    the response is exactly answer + eos (the verifier, vectorised: parsers accept canonical answers only);
 3. log-probs of the policy (with grad) and of the frozen base model (reference);
    old log-probs = current ones detached (one update per rollout batch);
 4. verl GRPO advantages -> RolloutBatch -> policy.apply -> its token weights enter verl's
    loss as rollout_is_weights, with its advantages; Adam step (no weight decay, so a step whose
    loss is zero leaves the parameters exactly where they are) with grad-norm clip 1;
 5. the mixer observes the batch.
The seed fixes data order (sampler) and rollout sampling (torch generator); the base model
is shared by all seeds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.policies import DomainSampler, Mixer, Policy, RolloutBatch, SamplerDraw, make_mixer, make_policy, resolve

from .benchmarks import training_pools
from .model import EncodedItems, encode_items, load_model
from .recipe import EmbeddedRecipe
from .rollout import generate, response_log_probs
from .tasks import DOMAINS

GRAD_CLIP = 1.0


@dataclass(frozen=True)
class ArmPolicy:
    """What an arm changes: token weights (`policy`) and/or the next batch's domain mix (`mixer`)."""

    policy: Policy
    mixer: Mixer

    @classmethod
    def build(cls, arm: ArmSpec, rollout_n: int) -> ArmPolicy:
        """Mixer arms weight uniformly; other arms draw domains with static uniform proportions."""
        if resolve(arm.method).kind == "mixer":
            return cls(make_policy("baseline"), make_mixer(arm.method, arm.params, len(DOMAINS)))
        return cls(make_policy(arm.method, arm.params, rollout_n=rollout_n), make_mixer("static", {}, len(DOMAINS)))


class GRPOTrainer:
    """Holds the policy model, its reference, optimiser, sampler and the arm; `step()` does one update."""

    def __init__(self, recipe: EmbeddedRecipe, arm: ArmSpec, seed: int, base_dir: Path):
        self.recipe = recipe
        self.model, self.tokenizer = load_model(base_dir)
        self.reference, _ = load_model(base_dir)
        self.reference.requires_grad_(False)
        self.arm = ArmPolicy.build(arm, recipe.rollout_n)
        pools = training_pools()
        self.pools: list[EncodedItems] = [
            encode_items(self.tokenizer, [i.prompt for i in pools[d]], [i.answer for i in pools[d]]) for d in DOMAINS
        ]
        self.sampler = DomainSampler([len(pools[d]) for d in DOMAINS], seed)
        self.generator = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=recipe.lr)
        from .grpo import GRPOObjective  # verl's loss functions: seconds of imports the search driver never needs

        self.objective = GRPOObjective(recipe.clip_ratio, recipe.kl_coef, recipe.rollout_n)
        self.steps_done = 0

    def step(self) -> dict[str, float]:
        """One GRPO update; returns this step's metrics."""
        r, n, t = self.recipe, self.recipe.rollout_n, self.steps_done
        proportions = self.arm.mixer.proportions(t)
        draw = self.sampler.draw(proportions, r.prompts_per_step)
        prompts = self.prompt_batch(draw)
        ids, prompt_mask = prompts.prompt_ids, prompts.prompt_mask

        self.model.eval()
        responses, mask = generate(self.model, ids, prompt_mask, r.max_new_tokens, r.temperature, self.generator, n)
        rewards = exact_match(responses, prompts.targets.repeat_interleave(n, dim=0))

        self.model.train()
        log_probs = response_log_probs(self.model, ids, prompt_mask, responses, mask, r.temperature, n)
        with torch.no_grad():
            ref_log_probs = response_log_probs(self.reference, ids, prompt_mask, responses, mask, r.temperature, n)
        groups = np.arange(len(draw.domain)).repeat(n) + t * r.prompts_per_step
        domain = torch.from_numpy(draw.domain).repeat_interleave(n)
        advantages = self.objective.advantages(rewards, mask, groups)
        batch = RolloutBatch(torch.from_numpy(groups), domain, rewards, advantages, mask, log_probs.detach())
        result = self.arm.policy.apply(batch)
        loss, metrics = self.objective.loss(
            log_probs, batch.old_log_probs, ref_log_probs, result.advantages, mask, result.token_weights
        )

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.arm.mixer.observe(t, batch)
        self.steps_done += 1
        return {**metrics, **self._step_metrics(batch, result.diagnostics, proportions, draw.counts)}

    def prompt_batch(self, draw: SamplerDraw) -> EncodedItems:
        """The drawn prompts as one left-padded batch, in the draw's (domain-sorted) order."""
        parts = [self.pools[d].select(torch.from_numpy(draw.index[draw.domain == d])) for d in np.unique(draw.domain)]
        width = max(p.prompt_ids.shape[1] for p in parts)
        answer_width = max(p.targets.shape[1] for p in parts)
        return EncodedItems(
            torch.cat([_left_pad(p.prompt_ids, width) for p in parts]),
            torch.cat([_left_pad(p.prompt_mask, width) for p in parts]),
            torch.cat([torch.nn.functional.pad(p.targets, (0, answer_width - p.targets.shape[1])) for p in parts]),
        )

    @staticmethod
    def _step_metrics(
        batch: RolloutBatch, diagnostics: dict[str, float], proportions: np.ndarray, counts: np.ndarray
    ) -> dict[str, float]:
        reward_sum = torch.zeros(len(DOMAINS), dtype=torch.float64).index_add_(0, batch.domain, batch.reward.double())
        drawn = torch.bincount(batch.domain, minlength=len(DOMAINS))
        out = {
            "reward/mean": float(batch.reward.mean()),
            "policy/kept_fraction": diagnostics["kept_fraction"],
            "policy/kept_token_fraction": diagnostics["kept_token_fraction"],
            "policy/weight_std": diagnostics["weight_std"],
            "policy/empty_selection": diagnostics["empty_selection"],
        }
        for d, name in enumerate(DOMAINS):
            if drawn[d] > 0:
                out[f"reward/{name}"] = float(reward_sum[d] / drawn[d])
            out[f"mix/p_{name}"] = float(proportions[d])
            out[f"mix/count_{name}"] = float(counts[d])
        return out

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (deep copy) of everything that determines the rest of the trial."""
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(),
                "sampler": self.sampler.state_dict(),
                "mixer": self.arm.mixer.state_dict(),
                "steps_done": self.steps_done,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # torch keeps the given tensors
        self.generator.set_state(state["generator"])
        self.sampler.load_state_dict(state["sampler"])
        self.arm.mixer.load_state_dict(state["mixer"])
        self.steps_done = state["steps_done"]


def exact_match(responses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[N] float: 1 where the response equals its target (answer, eos, then pad) position by position."""
    width = max(responses.shape[1], targets.shape[1])
    padded = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (responses, targets)]
    return (padded[0] == padded[1]).all(dim=1).float()


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (width - t.shape[1], 0))
