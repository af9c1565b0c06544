"""Live progress of a search: one concise line per event.

Each line says how many (arm, seed) cells ended out of the planned total, which arms the
scheduler stopped, and the current leader by *paired lower bound*: over the seeds where an arm
and the control both finished, the lower end of the two-sided paired interval at `confidence`
(`PairedLedger.estimate`; the line names the level) of mean(score(arm, s) - score(control, s)).
The point-best arm is never called the leader.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ray.tune import Callback

from tune_dfrl.backend import SCORE
from tune_dfrl.ledger import FAILED, FINISHED, STOPPED, PairedEstimate, PairedLedger
from tune_dfrl.rungs import ArmDecision


class Progress(Callback):
    """Prints cells done, stopped arms and the leader by paired lower bound after every event."""

    def __init__(
        self,
        control_id: str,
        metric: str,
        total_cells: int,
        last_step: int,
        confidence: float = 0.95,
        stream: TextIO | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.metric = metric
        self.total_cells = total_cells
        self.last_step = last_step  # the final milestone, where the leader is judged
        self.confidence = confidence
        self.stream = stream  # None: sys.stdout at the time of printing (so the callback pickles, as Tune does)
        self.labels: dict[str, str] = dict(labels or {})  # arm id -> label (a resumed search's, from results.jsonl)
        self.ledger = PairedLedger(control_id)  # final scores and how each cell ended
        self.stopped: dict[str, int] = {}  # arm id -> rung step where it stopped

    def carry_over(
        self, records: list[dict[str, Any]], ends: dict[tuple[str, int], str], stopped: dict[str, int]
    ) -> None:
        """Start from an interrupted search: its results lines, how its (arm id, seed) cells ended, the stopped arms."""
        for r in records:
            if r["final"]:
                self.ledger.record(r["arm_id"], r["seed"], r["step"], r["aggregates"][self.metric.removeprefix(SCORE)])
        for (arm_id, seed), how in ends.items():
            self.ledger.end(arm_id, seed, how)
        self.stopped.update(stopped)

    def leader(self) -> PairedEstimate | None:
        """The searched arm with the highest paired lower bound against the control (>= 2 common seeds)."""
        estimates = [
            self.ledger.estimate(arm_id, self.last_step, self.confidence)
            for arm_id in self.ledger.arms()
            if arm_id != self.ledger.control
        ]
        return max((e for e in estimates if len(e.seeds) >= 2), key=lambda e: e.low, default=None)

    def line(self, event: str) -> str:
        ended = sum(len(self.ledger.ends(arm_id)) for arm_id in self.ledger.arms())
        parts = [f"[{ended}/{self.total_cells} cells]", event]
        if self.stopped:
            parts.append(f"{len(self.stopped)} arm{'s' if len(self.stopped) > 1 else ''} stopped")
        lead = self.leader()
        if lead is not None:
            parts.append(
                f"leader by {lead.confidence:.0%} paired lower bound: {self.labels.get(lead.arm, lead.arm)} "
                f"Δ={lead.mean:+.2f} [{lead.low:+.2f}, {lead.high:+.2f}] ({len(lead.seeds)} seeds)"
            )
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
        if result.get("final"):
            self.ledger.record(arm["arm_id"], seed, result["step"], result[self.metric])
            self.ledger.end(arm["arm_id"], seed, FINISHED)
            how = "replayed from its record" if result.get("replayed") else "finished"
            self.say(f"{arm['label']} seed {seed} {how}: {self.metric}={result[self.metric]:.2f}")
        else:
            self.ledger.end(arm["arm_id"], seed, STOPPED)
            self.say(f"{arm['label']} seed {seed} stopped at step {result.get('step', 0):g}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        self.ledger.end(arm["arm_id"], seed, FAILED)
        self.say(f"{arm['label']} seed {seed} FAILED (see {trial.local_path})")
