"""`EmbeddedBackend`: trains one trial (arm, seed) by GRPO on CPU; the search's `Backend` for laptops and CI."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tune_dfrl.backends.base import ArmSpec, CalibrationResult, Milestone
from tune_dfrl.backends.benchmarks import BenchmarkInfo
from tune_dfrl.policies import RolloutBatch

from .base import ensure_base_model
from .benchmarks import BENCHMARKS, get_benchmarks
from .checkpoint import TrialCheckpoint
from .evaluate import Evaluator
from .recipe import EmbeddedRecipe
from .tasks import DOMAINS
from .trainer import ArmPolicy, GRPOTrainer

SIGNALS = ("group", "domain", "reward", "advantages", "response_mask", "old_log_probs")


class EmbeddedBackend:
    """CPU GRPO on a tiny Qwen2 and generated verifiable tasks (see docs/readme_embedded.md).

    `recipe` holds the EmbeddedRecipe keys to change (None: the defaults); `self.recipe` is the full recipe.
    """

    name = "embedded"
    binary_rewards = True  # exact-match verifiers
    reuses_trial_actors = True  # a stopped or paused trial's thread ends at its next report: the actor is free at once

    def __init__(self, recipe: Mapping[str, Any] | None = None):
        self.config = EmbeddedRecipe.from_dict(dict(recipe or {}))
        self.recipe = asdict(self.config)

    def benchmarks(self) -> list[BenchmarkInfo]:
        return [b.info() for b in BENCHMARKS]

    def calibrate(self) -> CalibrationResult:
        from .checks import calibrate

        return calibrate()

    def prepare(self) -> None:
        """Build (or find) the cached base model once in the driver, so trials do not queue on its lock.

        It trains with a trial's thread count: on a busy 2-core machine a 2-thread build of the tiny
        model took over 16 minutes where a 1-thread build took under 4.
        """
        with _threads(self.config.threads):
            ensure_base_model(self.config.base, _cache_dir(self.config))

    def resources(self) -> dict[str, float]:
        return {"cpu": self.config.cpus_per_trial, "gpu": 0}

    def validate(self, arm: ArmSpec) -> None:
        """Arm parameters, and a dry run of the arm on the signals this backend provides."""
        try:
            built = ArmPolicy.build(arm, self.config.rollout_n)
        except ValueError as e:
            raise ValueError(f"arm '{arm.label}' ({arm.method}): {e}") from e
        try:
            batch = _probe_batch(self.config.rollout_n)
            built.policy.apply(batch)
            built.mixer.observe(0, batch)
            built.mixer.proportions(1)
        except Exception as e:  # noqa: BLE001 - any failure here means the arm cannot run on these signals
            raise ValueError(
                f"arm '{arm.label}' ({arm.method}) cannot run on the embedded backend, which provides the signals "
                f"{', '.join(SIGNALS)} (no rollout_is_weights): {type(e).__name__}: {e}"
            ) from e

    def run_trial(self, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], checkpoint_dir: Path) -> None:
        """Train, evaluate at milestones, checkpoint, report (see checkpoint.py for resume semantics)."""
        self.validate(arm)
        with _threads(self.config.threads):
            _train(self.config, arm, seed, report, TrialCheckpoint(checkpoint_dir))


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch runs the block on `count` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cache_dir(r: EmbeddedRecipe) -> Path | None:
    return Path(r.cache_dir) if r.cache_dir else None


def _train(
    r: EmbeddedRecipe, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], ckpt: TrialCheckpoint
) -> None:
    trainer = GRPOTrainer(r, arm, seed, ensure_base_model(r.base, _cache_dir(r)))
    evaluator = Evaluator(get_benchmarks(r.eval_benchmarks), trainer.tokenizer, r.max_new_tokens)
    milestones: list[Milestone] = []
    saved = ckpt.load()
    if saved is not None:
        trainer.load_state_dict(saved.trainer)
        milestones = saved.milestones
        for count in range(saved.reported, len(milestones)):
            report(milestones[count])
            ckpt.mark_reported(count + 1)
    window: list[dict[str, float]] = []
    while trainer.steps_done < r.steps:
        window.append(trainer.step())
        if trainer.steps_done % r.milestone_every and trainer.steps_done != r.steps:
            continue
        result = evaluator(trainer.model)
        milestone = Milestone(
            trainer.steps_done,
            result.accuracy,
            result.length_chars,
            result.format_failure,
            result.aggregates,
            _mean(window),
        )
        milestones.append(milestone)
        ckpt.save(trainer.state_dict(), milestones)
        report(milestone)
        ckpt.mark_reported(len(milestones))
        window = []


def _mean(window: list[dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the steps that logged it."""
    keys = dict.fromkeys(k for metrics in window for k in metrics)
    return {k: float(np.mean([m[k] for m in window if k in m])) for k in keys}


def _probe_batch(rollout_n: int) -> RolloutBatch:
    """A small batch with exactly the embedded backend's signals: 3 groups (one per domain) of n rollouts."""
    groups = torch.arange(len(DOMAINS)).repeat_interleave(rollout_n)
    reward = (torch.arange(len(groups)) % 2).float()
    mask = torch.ones(len(groups), 4)
    mask[::3, 2:] = 0
    advantages = (reward - reward.mean())[:, None] * mask
    return RolloutBatch(groups, groups.clone(), reward, advantages, mask, torch.full_like(mask, math.log(0.5)) * mask)
