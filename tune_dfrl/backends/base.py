"""The contract between the search service and a training backend.

A backend trains one *trial* = one arm at one seed, and reports evaluation milestones.
Scores are accuracies in percent (0-100), so paired deltas are in points. A milestone is reported flat to Ray
Tune and MLflow as `step` plus `PREFIX + name` per figure (`RESULT_PREFIXES`); the search metric is
`SCORE + aggregation` (`tune_dfrl.backends.benchmarks`). Light on purpose: the trainers import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tune_dfrl.backends.benchmarks import BenchmarkInfo

SCORE, ACCURACY, LENGTH, FORMAT_FAILURE, TRAIN = "score/", "acc/", "len/", "fmt_fail/", "train/"
RESULT_PREFIXES = {
    ACCURACY: "accuracy",
    LENGTH: "length_chars",
    FORMAT_FAILURE: "format_failure",
    SCORE: "aggregates",
    TRAIN: "train",
}  # flat key prefix -> field of a Milestone and of a results line


@dataclass(frozen=True)
class ArmSpec:
    """A fully specified data-policy configuration.

    `method` is a paper method name (difffilter, topk, gfpo, maxvar, softmax, diffband, ar, per,
    reward_gap, dump_ucb, tscl, static, baseline); `params` its validated, canonical
    hyperparameters; `arm_id` the hash of the canonical form together with the recipe.
    """

    method: str
    params: dict[str, Any]
    arm_id: str
    label: str


@dataclass
class Milestone:
    """What a trial reports at one evaluation milestone (`step` = training steps done)."""

    step: int
    accuracy: dict[str, float]  # benchmark -> accuracy in %
    length_chars: dict[str, float]  # benchmark -> mean response length (characters)
    format_failure: dict[str, float]  # benchmark -> fraction of unparseable answers
    aggregates: dict[str, float]  # db, macro, item (%), efficiency (correct per 1000 chars)
    train: dict[str, float] = field(default_factory=dict)  # training metrics since the last milestone

    def flat(self) -> dict[str, float]:
        """Flat metric dict as reported to Ray Tune / MLflow."""
        flat = {prefix + k: v for prefix, name in RESULT_PREFIXES.items() for k, v in getattr(self, name).items()}
        return {"step": float(self.step), **flat}


@dataclass(frozen=True)
class CalibrationResult:
    ok: bool
    failures: list[str]  # one line per failing benchmark / case


class Backend(Protocol):
    """A training backend (embedded CPU GRPO, or verl), constructed from its recipe: `Backend(recipe)`."""

    name: str
    recipe: dict[str, Any]  # the full recipe (defaults plus overrides), JSON-able; part of every arm id
    binary_rewards: bool  # every reward is 0 or 1 (exact-match verifiers): arms are canonicalised with it
    reuses_trial_actors: bool  # Ray Tune may hand a stopped or paused trial's actor to the next trial (reuse_actors)

    def benchmarks(self) -> list[BenchmarkInfo]: ...

    def calibrate(self) -> CalibrationResult:
        """Reference answers must score 1 and malformed ones 0 on every benchmark."""
        ...

    def prepare(self) -> None:
        """One-off work in the driver before any trial (e.g. building a cached base model)."""
        ...

    def validate(self, arm: ArmSpec) -> None:
        """Raise ValueError before any training if this arm cannot run under the recipe here."""
        ...

    def resources(self) -> dict[str, float]:
        """Resources one trial needs, e.g. {"cpu": 1, "gpu": 0}; a backend that trains in the trial's process uses
        that many threads."""
        ...

    def run_trial(self, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], checkpoint_dir: Path) -> None:
        """Train (arm, seed) for recipe['steps'] steps, evaluating every recipe['milestone_every'] steps.

        Calls `report` once per milestone (the last one at step == recipe['steps']). Saves a
        checkpoint in `checkpoint_dir` at every milestone and, when one exists there, resumes
        from it instead of restarting. Same arm + seed + recipe -> identical milestones.
        """
        ...
