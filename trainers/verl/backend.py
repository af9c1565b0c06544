"""`VerlBackend`: the `Backend` contract (tune_dfrl/backends/base.py) on real verl GRPO runs.

A trial is a verl run in a child process group with its own Ray instance (launcher.py); Ray
Tune accounts its GPUs on `device: cuda` (`resources` = {"cpu": cpus_per_trial, "gpu": gpus_per_trial}:
the child inherits the trial's `CUDA_VISIBLE_DEVICES`) and only CPUs on `device: cpu`, where the
child also gets `tune_dfrl.trainers.verl.cpu.cpu_env`. Files of a trial, all in its `checkpoint_dir`:

    verl.log              the child's stdout and stderr
    verl_metrics.jsonl    verl's file logger (VERL_FILE_LOGGER_PATH)
    milestones.jsonl      the milestones the search received (one flat JSON per line, written when `report` returned)
    verl_timeline.jsonl   the start-up timeline of every start (timeline.py)
    verl_runs.jsonl       per start of the child: {"first_step", "startup_s"}, the seconds from starting it
                          to its first metrics record less that step's `timing_s/step` and `timing_s/testing`
                          (process start, private Ray, workers, model and checkpoint loading; for a
                          start that validates first, that validation too)
    verl/                 verl's checkpoints (trainer.default_local_dir; resumed automatically)

A rerun of the same trial reports only milestones after the last one in `milestones.jsonl` (none
at all when the trial already reached `steps`): first those the previous start's
`verl_metrics.jsonl` holds (verl logged them, the trial process died before the search got them),
then verl's, resuming from its last checkpoint, step c. verl saves a milestone's checkpoint before
it validates and logs that step (`PPOTrainer.fit`: save, validate, log), so c can be a milestone
the search never got; that start then validates before training (`trainer.val_before_train=true`),
which logs milestone c from the checkpoint at step c. No step is trained twice. Where
`recipe.ends_at_final_milestone` allows (device cpu, no override asking verl for output written after its last log
line), the child's process group is killed once the final milestone is delivered; verl's own shutdown would only
close what the trial no longer needs. The
private Ray's temporary folder (`recipe.ray_temp_dir`) is removed whenever `run_trial` ends, on every device,
so also the one a killed start left.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tune_dfrl.backends.base import ArmSpec, CalibrationResult, Milestone
from tune_dfrl.backends.benchmarks import BenchmarkInfo

from . import timeline
from .launcher import JsonlTail, MilestoneReader, VerlRunError, child_env, run_child
from .recipe import VerlRecipe, build_overrides, ends_at_final_milestone, ray_temp_dir

VERL_MAIN = (sys.executable, "-m", timeline.DRIVER_MODULE)  # verl's main_ppo, its Ray started beside its imports


class VerlBackend:
    """Trains (arm, seed) with verl 0.9.1 and the arm's data policy, under `recipe` (the `backend/verl.yaml` node)."""

    name = "verl"
    binary_rewards = False  # a recipe's reward function may give partial credit
    # A paused trial's thread ends only once its verl process group has ended (seconds), longer than Tune waits
    # before refusing to reuse the actor; the actor only runs the child, so a fresh one costs nothing that counts.
    reuses_trial_actors = False

    def __init__(self, recipe: Mapping[str, Any]):
        self.recipe = dict(recipe)
        self.config = VerlRecipe.from_dict(self.recipe)

    def benchmarks(self) -> list[BenchmarkInfo]:
        return list(self.config.benchmark_set().benchmarks)

    # The checks run in the driver only (`checks` imports the data policies, hence torch, which a trial's process,
    # a launcher of verl's child, does without).

    def calibrate(self) -> CalibrationResult:
        from . import checks

        return checks.calibrate(self.config)

    def prepare(self) -> None:
        """Nothing to build: the model and parquet files are the recipe's."""

    def validate(self, arm: ArmSpec) -> None:
        """The recipe and the arm (`checks.check_trial`); on cpu also the CPU rollout. What this machine lacks for
        cuda trials is listed by `machine_problems`."""
        from . import checks

        checks.check_trial(arm, self.config)
        if self.config.device == "cpu":
            checks.check_rollout_engine(self.config)

    def machine_problems(self) -> list[str]:
        """What this machine lacks for the recipe's cuda trials (`checks.machine_problems`): the search refuses to
        start on the first; a dry run prints them as warnings."""
        from . import checks

        return checks.machine_problems(self.config)

    def trial_command(self, arm: ArmSpec, seed: int, checkpoint_dir: Path, validate_first: bool = False) -> list[str]:
        """The child's command line of the trial (arm, seed) working in `checkpoint_dir`."""
        overrides = build_overrides(self.config, arm, seed, Path(checkpoint_dir).resolve(), validate_first)
        return [*(self.config.command or VERL_MAIN), *overrides]

    def resources(self) -> dict[str, float]:
        """Tune's share of a trial: `cpus_per_trial` CPUs, and `gpus_per_trial` GPUs on cuda (none on cpu)."""
        return {
            "cpu": self.config.cpus_per_trial,
            "gpu": self.config.gpus_per_trial if self.config.device == "cuda" else 0,
        }

    def run_trial(self, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], checkpoint_dir: Path) -> None:
        checkpoint_dir = Path(checkpoint_dir).resolve()
        try:
            self._train(arm, seed, report, checkpoint_dir)
        finally:  # also the folder of a start killed before it could remove it
            shutil.rmtree(ray_temp_dir(checkpoint_dir), ignore_errors=True)

    def _train(self, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], checkpoint_dir: Path) -> None:
        recipe = self.config
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        received = checkpoint_dir / "milestones.jsonl"
        metrics_path = checkpoint_dir / "verl_metrics.jsonl"
        timeline_path = checkpoint_dir / timeline.FILE_NAME
        last = last_received_step(received)

        def deliver(milestone: Milestone) -> None:
            nonlocal last
            if milestone.step <= last:
                return
            report(milestone)
            timeline.record("milestone", path=timeline_path, step=milestone.step)
            with received.open("a") as handle:  # after `report` returned: the search has it
                handle.write(json.dumps(milestone.flat()) + "\n")
            last = milestone.step

        for milestone in read_milestones(recipe, metrics_path):  # the previous start's, never delivered
            deliver(milestone)
        if last >= recipe.steps:
            return
        validate_first = verl_checkpoint_step(checkpoint_dir / "verl") > last
        reader = MilestoneReader(recipe.benchmark_sources(), recipe.benchmark_set())
        started, first_seen = time.monotonic(), False

        def on_record(record: dict[str, Any]) -> None:
            nonlocal first_seen
            if not first_seen:
                first_seen = True
                timeline.record("first_record", path=timeline_path, step=int(record["step"]))
                step_s = sum(float(record["data"].get(f"timing_s/{t}", 0.0)) for t in ("step", "testing"))
                with (checkpoint_dir / "verl_runs.jsonl").open("a") as handle:
                    handle.write(
                        json.dumps(
                            {"first_step": int(record["step"]), "startup_s": time.monotonic() - started - step_s}
                        )
                        + "\n"
                    )
            milestone = reader.read(record)
            if milestone is not None:
                deliver(milestone)

        metrics_path.unlink(missing_ok=True)  # verl rewrites it from the start
        env = child_env(metrics_path) | {timeline.TIMELINE_ENV: str(timeline_path)}
        if recipe.device == "cpu":
            from tune_dfrl.trainers.verl.cpu import cpu_env

            env.update(cpu_env(checkpoint_dir))
        ends_early = ends_at_final_milestone(recipe)
        timeline.record("spawn", path=timeline_path)
        run_child(
            self.trial_command(arm, seed, checkpoint_dir, validate_first),
            env,
            work_dir=checkpoint_dir,
            metrics_path=metrics_path,
            log_path=checkpoint_dir / "verl.log",
            on_record=on_record,
            done=lambda: ends_early and last >= recipe.steps,
        )
        if last != recipe.steps:
            raise VerlRunError(
                f"verl finished without the final milestone at step {recipe.steps} (last: {last}); "
                f"see {checkpoint_dir / 'verl.log'}"
            )


def last_received_step(path: Path) -> int:
    """The step of the last milestone in `milestones.jsonl` (0 when there is none)."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return int(json.loads(lines[-1])["step"]) if lines else 0


def read_milestones(recipe: VerlRecipe, metrics_path: Path) -> list[Milestone]:
    """The milestones in a verl metrics file (complete lines only)."""
    reader = MilestoneReader(recipe.benchmark_sources(), recipe.benchmark_set())
    return [m for record in JsonlTail(metrics_path).records() if (m := reader.read(record)) is not None]


def verl_checkpoint_step(verl_dir: Path) -> int:
    """The step verl resumes from in `verl_dir` (0: none), as verl's `find_latest_ckpt_path` finds it:
    `latest_checkpointed_iteration.txt`, when its `global_step_<n>` folder exists."""
    tracker = verl_dir / "latest_checkpointed_iteration.txt"
    if not tracker.exists():
        return 0
    step = int(tracker.read_text())
    return step if (verl_dir / f"global_step_{step}").is_dir() else 0
