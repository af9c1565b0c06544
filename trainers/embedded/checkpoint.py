"""Milestone checkpoints of one trial, so that a paused or retried trial resumes instead of restarting.

`<dir>/trial.pt` holds the trainer state (model, optimiser, RNG, sampler and mixer) and every
milestone reached so far; it is written to a temporary file and renamed into place. The trial
writes it *before* calling `report`, and after `report` returns records the number of
milestones acknowledged in `<dir>/reported.json`. A resumed trial first reports the stored
milestones that were never acknowledged (a crash between checkpoint and report loses nothing),
then continues with the next step; acknowledged milestones are never reported again.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tune_dfrl.backends.base import Milestone


@dataclass
class Saved:
    trainer: dict[str, Any]
    milestones: list[Milestone]
    reported: int


class TrialCheckpoint:
    """Atomic save / load of a trial's state in one directory."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.state_path = self.directory / "trial.pt"
        self.reported_path = self.directory / "reported.json"

    def load(self) -> Saved | None:
        if not self.state_path.exists():
            return None
        state = torch.load(self.state_path, weights_only=False)
        reported = json.loads(self.reported_path.read_text())["milestones"] if self.reported_path.exists() else 0
        return Saved(state["trainer"], [Milestone(**m) for m in state["milestones"]], reported)

    def save(self, trainer: dict[str, Any], milestones: list[Milestone]) -> None:
        state = {"trainer": trainer, "milestones": [dataclasses.asdict(m) for m in milestones]}
        self._atomic(self.state_path, lambda path: torch.save(state, path))

    def mark_reported(self, count: int) -> None:
        self._atomic(self.reported_path, lambda path: path.write_text(json.dumps({"milestones": count})))

    def _atomic(self, target: Path, write: Callable[[Path], None]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        write(tmp)
        os.replace(tmp, target)
