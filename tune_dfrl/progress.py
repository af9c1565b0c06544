"""Live progress of a search: one concise line per event.

Each line says how many (arm, seed) cells ended out of the planned total, which arms the
scheduler stopped, and the current leader by *paired lower bound*: over the seeds where an arm
and the control both finished, the lower end of the two-sided `confidence` paired t-interval of
mean(score(arm, s) - score(control, s)). The point-best arm is never called the leader.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
from ray.tune import Callback

from tune_dfrl.rungs import paired_interval
from tune_dfrl.scheduler import ArmDecision
from tune_dfrl.schema import SCORE


@dataclass(frozen=True)
class Leader:
    arm_id: str
    mean: float
    low: float
    high: float
    seeds: int


class Progress(Callback):
    """Prints cells done, stopped arms and the leader by paired lower bound after every event."""

    def __init__(self, control_id: str, metric: str, total_cells: int, confidence: float = 0.95, stream: TextIO | None = None) -> None:
        self.control_id = control_id
        self.metric = metric
        self.total_cells = total_cells
        self.confidence = confidence
        self.stream = stream  # None: sys.stdout at the time of printing (so the callback pickles, as Tune does)
        self.labels: dict[str, str] = {}
        self.finals: dict[str, dict[int, float]] = {}  # arm id -> seed -> final score
        self.ended: set[tuple[str, int]] = set()
        self.stopped: dict[str, int] = {}  # arm id -> rung step where it stopped

    def carry_over(self, records: list[dict[str, Any]], ended: set[tuple[str, int]], stopped: dict[str, int]) -> None:
        """Start from an interrupted search: its results lines, the (arm id, seed) cells that ended, the stopped arms."""
        for r in records:
            self.labels.setdefault(r["arm_id"], r["label"])
            if r["final"]:
                self.finals.setdefault(r["arm_id"], {})[r["seed"]] = float(r["aggregates"][self.metric.removeprefix(SCORE)])
        self.ended |= ended
        self.stopped.update(stopped)

    def leader(self) -> Leader | None:
        """The searched arm with the highest paired lower bound against the control (>= 2 common seeds)."""
        control = self.finals.get(self.control_id, {})
        best: Leader | None = None
        for arm_id, scores in self.finals.items():
            common = sorted(set(scores) & set(control))
            if arm_id == self.control_id or len(common) < 2:
                continue
            diffs = np.array([scores[s] - control[s] for s in common])
            low, high = paired_interval(diffs, self.confidence)
            if best is None or low > best.low:
                best = Leader(arm_id, float(diffs.mean()), low, high, len(common))
        return best

    def line(self, event: str) -> str:
        parts = [f"[{len(self.ended)}/{self.total_cells} cells]", event]
        if self.stopped:
            parts.append(f"{len(self.stopped)} arm{'s' if len(self.stopped) > 1 else ''} stopped")
        lead = self.leader()
        if lead is not None:
            parts.append(f"leader by paired lower bound: {self.labels.get(lead.arm_id, lead.arm_id)} "
                         f"Δ={lead.mean:+.2f} [{lead.low:+.2f}, {lead.high:+.2f}] ({lead.seeds} seeds)")
        return " | ".join(parts)

    def say(self, event: str) -> None:
        print(self.line(event), file=self.stream or sys.stdout, flush=True)

    def note_decision(self, decided: ArmDecision) -> None:
        if not decided.decision.keep:
            self.stopped[decided.arm] = decided.rung
            reason = decided.decision.reason
            for arm_id, label in self.labels.items():
                reason = reason.replace(repr(arm_id), label)
            self.say(f"stopped arm {self.labels.get(decided.arm, decided.arm)} at step {decided.rung}: {reason}")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm = trial.config["arm"]
        self.labels.setdefault(arm["arm_id"], arm["label"])

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed, result = trial.config["arm"], int(trial.config["seed"]), trial.last_result or {}
        self.labels.setdefault(arm["arm_id"], arm["label"])
        self.ended.add((arm["arm_id"], seed))
        if result.get("final"):
            self.finals.setdefault(arm["arm_id"], {})[seed] = float(result[self.metric])
            how = "replayed from its record" if result.get("replayed") else "finished"
            self.say(f"{arm['label']} seed {seed} {how}: {self.metric}={result[self.metric]:.2f}")
        else:
            self.say(f"{arm['label']} seed {seed} stopped at step {result.get('step', 0):g}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        self.ended.add((arm["arm_id"], seed))
        self.say(f"{arm['label']} seed {seed} FAILED (see {trial.local_path})")
