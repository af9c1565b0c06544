"""`VerlBackend`: the `Backend` contract (tune_dfrl/backend.py) on real verl GRPO runs.

A trial is a verl run in a child process group with its own Ray instance (launcher.py); Ray
Tune accounts its GPUs (`resources` = {"cpu": 1, "gpu": gpus_per_trial}: the child inherits the
trial's `CUDA_VISIBLE_DEVICES`). Files of a trial, all in its `checkpoint_dir`:

    verl.log              the child's stdout and stderr
    verl_metrics.jsonl    verl's file logger (VERL_FILE_LOGGER_PATH)
    milestones.jsonl      the milestones reported so far (one flat JSON per line)
    verl/                 verl's checkpoints (trainer.default_local_dir; resumed automatically)

A rerun of the same trial resumes from verl's last checkpoint and reports only milestones after
the last one in `milestones.jsonl` (none at all when the trial already reached `steps`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tune_dfrl.backend import ArmSpec, BenchmarkInfo, CalibrationResult, Milestone

from . import checks
from .launcher import MilestoneReader, VerlRunError, child_env, run_child
from .recipe import VerlRecipe, build_overrides

VERL_MAIN = (sys.executable, "-m", "verl.trainer.main_ppo")


class VerlBackend:
    """Trains (arm, seed) with verl 0.9.1 and the arm's data policy.

    `recipe` (the `backend/verl.yaml` node) gives `benchmarks()` and `calibrate()` their
    benchmarks; `child_command` is the verl entry point the overrides are appended to.
    """

    name = "verl"

    def __init__(self, recipe: Mapping[str, Any] | None = None, child_command: Sequence[str] = VERL_MAIN):
        self.recipe = dict(recipe) if recipe is not None else None
        self.child_command = tuple(child_command)

    def _own_recipe(self) -> VerlRecipe:
        if self.recipe is None:
            raise ValueError("the verl backend's benchmarks come from its recipe: construct VerlBackend(recipe)")
        return VerlRecipe.from_dict(self.recipe)

    def benchmarks(self) -> list[BenchmarkInfo]:
        return list(self._own_recipe().benchmark_set().benchmarks)

    def calibrate(self) -> CalibrationResult:
        return checks.calibrate(self._own_recipe())

    def validate(self, arm: ArmSpec, recipe: dict[str, Any]) -> None:
        parsed = VerlRecipe.from_dict(recipe)
        checks.check_trial(arm, parsed)
        checks.check_rollout_engine(parsed)

    def resources(self, recipe: dict[str, Any]) -> dict[str, float]:
        return {"cpu": 1, "gpu": VerlRecipe.from_dict(recipe).gpus_per_trial}

    def run_trial(
        self,
        arm: ArmSpec,
        seed: int,
        recipe: dict[str, Any],
        report: Callable[[Milestone], None],
        checkpoint_dir: Path,
    ) -> None:
        parsed = VerlRecipe.from_dict(recipe)
        checkpoint_dir = Path(checkpoint_dir).resolve()
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        reported = checkpoint_dir / "milestones.jsonl"
        done = last_reported_step(reported)
        if done >= parsed.steps:
            return
        reader = MilestoneReader(parsed.benchmark_sources(), parsed.benchmark_set())
        last = done

        def on_record(record: dict[str, Any]) -> None:
            nonlocal last
            milestone = reader.read(record)
            if milestone is None or milestone.step <= last:
                return
            with reported.open("a") as handle:
                handle.write(json.dumps(milestone.flat()) + "\n")
            last = milestone.step
            report(milestone)

        metrics_path = checkpoint_dir / "verl_metrics.jsonl"
        metrics_path.unlink(missing_ok=True)  # verl rewrites it from the start; never read a previous run's
        run_child(
            [*self.child_command, *build_overrides(parsed, arm, seed, checkpoint_dir)],
            child_env(metrics_path),
            work_dir=checkpoint_dir,
            metrics_path=metrics_path,
            log_path=checkpoint_dir / "verl.log",
            on_record=on_record,
        )
        if last != parsed.steps:
            raise VerlRunError(f"verl finished without the final milestone at step {parsed.steps} (last: {last}); "
                               f"see {checkpoint_dir / 'verl.log'}")


def last_reported_step(path: Path) -> int:
    """The step of the last milestone in `milestones.jsonl` (0 when there is none)."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return int(json.loads(lines[-1])["step"]) if lines else 0
