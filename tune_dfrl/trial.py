"""The Ray Tune trial function: one (arm, seed) cell trained by a backend, milestones reported to Tune.

On-disk layout (stable, keyed by arm id, which hashes the canonical arm together with the recipe,
so a later search with the same recipe finds the same cells):

    CELLS/<arm_id>/seed<k>/checkpoint/   the backend's milestone checkpoints (resume point)

A trial that Tune pauses (waiting at a rung) or restarts resumes from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_dfrl.backend import ArmSpec, Backend, Milestone


def cell_dir(cells_root: Path, arm_id: str, seed: int) -> Path:
    """Where the (arm, seed) cell keeps its checkpoints."""
    return cells_root / arm_id / f"seed{seed}"


def trial_dirname(trial: Any) -> str:
    """Ray Tune trial folder name: `<arm_id>-seed<k>-<trial id>`."""
    return f"{trial.config['arm']['arm_id']}-seed{trial.config['seed']}-{trial.trial_id}"


@dataclass(frozen=True)
class CellJob:
    """Everything a trial needs besides its (arm, seed) config; picklable, sent once to the workers."""

    backend: Backend
    recipe: dict[str, Any]
    cells_root: str  # absolute
    cpus: int


def run_cell(config: dict[str, Any], job: CellJob) -> None:
    """Train config['arm'] at config['seed'] with exactly `job.cpus` torch threads; report every milestone."""
    import torch
    from ray import tune

    torch.set_num_threads(job.cpus)
    arm = ArmSpec(**config["arm"])
    seed = int(config["seed"])
    final = int(job.recipe["steps"])

    def report(milestone: Milestone) -> None:
        tune.report({**milestone.flat(), "final": milestone.step >= final, "threads": torch.get_num_threads()})

    ckpt = cell_dir(Path(job.cells_root), arm.arm_id, seed) / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    job.backend.run_trial(arm, seed, job.recipe, report, ckpt)
