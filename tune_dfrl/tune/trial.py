"""The Ray Tune trial function: one (arm, seed) cell trained by a backend, milestones reported to Tune.

On-disk layout (stable, keyed by arm id, which hashes the canonical arm together with the recipe,
so a later search with the same recipe finds the same cells):

    CELLS/<arm_id>/seed<k>/checkpoint/        the backend's milestone checkpoints (resume point)
    CELLS/<arm_id>/seed<k>/milestones.jsonl   every milestone the cell reported (results.jsonl records)

A trial first replays the cell's recorded milestones to Tune (flagged `replayed`), then, unless
the last one is final, lets the backend continue from its checkpoint and records each new
milestone before reporting it. So a trial that Tune pauses (waiting at a rung), retries after a
crash, or that a resumed search starts again never trains a recorded milestone twice, and a
milestone the driver missed (killed between report and log) is reported again. A control cell
seeded from the control cache (`tune_dfrl.state.control_cache`) replays without training at all.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_dfrl.backends.base import ArmSpec, Backend, Milestone
from tune_dfrl.errors import PlantedFaultError
from tune_dfrl.state.folder import MILESTONES
from tune_dfrl.state.records import flat_result, milestone_record, read_records, write_records


def cell_dir(cells_root: Path, arm_id: str, seed: int) -> Path:
    """Where the (arm, seed) cell keeps its checkpoints and milestone records."""
    return cells_root / arm_id / f"seed{seed}"


def trial_dirname(trial: Any) -> str:
    """Ray Tune trial folder name: `<arm_id>-seed<k>-<trial id>`."""
    return f"{trial.config['arm']['arm_id']}-seed{trial.config['seed']}-{trial.trial_id}"


@dataclass(frozen=True)
class PlantedFault:
    """TEST ONLY (search config `fault_injection`): crash the trial of `arm` at `seed` when the backend
    reports milestone `step`, after its checkpoint is saved, on the cell's first `times` attempts
    (null: on every attempt). `arm` is `control`, `searched` (any other arm) or an arm id."""

    arm: str
    seed: int
    step: int
    times: int | None = None

    def strike(self, arm_id: str, control_id: str, seed: int, step: int, cell: Path) -> None:
        """Raise PlantedFaultError when this fault hits (arm, seed, step) and has attempts left; counts in the cell."""
        arm = "control" if arm_id == control_id else "searched"
        if self.arm not in (arm, arm_id) or (seed, step) != (self.seed, self.step):
            return
        counter = cell / "planted_faults"
        struck = int(counter.read_text()) if counter.exists() else 0
        if self.times is not None and struck >= self.times:
            return
        counter.write_text(str(struck + 1))
        raise PlantedFaultError(
            f"planted fault (fault_injection) in arm {arm_id} seed {seed} at step {step}, attempt {struck + 1}"
        )


@dataclass(frozen=True)
class CellJob:
    """Everything a trial needs besides its (arm, seed) config; picklable, sent once to the workers."""

    backend: Backend  # carries its recipe
    cells_root: str  # absolute
    cpus: int
    control_id: str
    faults: tuple[PlantedFault, ...] = ()  # TEST ONLY


def trial_threads(cpus: int) -> int:
    """The torch threads a trial trains with when its backend trains in this process with torch (the embedded
    backend sets them, `EmbeddedRecipe.threads`), else the `cpus` it was given (a backend that trains elsewhere, as
    verl's child process, or without torch): the trial's process imports torch only if its backend does."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else cpus


def run_cell(config: dict[str, Any], job: CellJob) -> None:
    """Replay the cell's recorded milestones, then train the rest (the backend trains with `job.cpus` threads)."""
    from ray import tune

    arm = ArmSpec(**config["arm"])
    seed = int(config["seed"])
    final = int(job.backend.recipe["steps"])
    cell = cell_dir(Path(job.cells_root), arm.arm_id, seed)
    log = cell / MILESTONES
    records = read_records(log)
    for record in records:
        tune.report({**flat_result(record), "replayed": True})
    if records and records[-1]["final"]:
        return
    recorded = {r["step"] for r in records}

    def report(milestone: Milestone) -> None:
        if milestone.step in recorded:
            return  # re-reported by a backend resuming from its checkpoint; replayed above
        for fault in job.faults:
            fault.strike(arm.arm_id, job.control_id, seed, milestone.step, cell)
        result = {**milestone.flat(), "final": milestone.step >= final, "threads": trial_threads(job.cpus)}
        records.append(milestone_record(config["arm"], seed, result))
        recorded.add(milestone.step)
        write_records(log, records)
        tune.report(result)

    ckpt = cell / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    job.backend.run_trial(arm, seed, report, ckpt)
