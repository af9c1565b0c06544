"""Live progress of a search: one concise line per event.

Each line says how many (arm, seed) cells ended out of the planned total, which arms the
scheduler stopped, and the current leader by *paired lower bound*: over the seeds where an arm
and the control both finished, the lower end of the two-sided paired interval at `confidence`
(`PairedLedger.estimate`; the line names the level, unadjusted) of mean(score(arm, s) - score(control, s)).
An arm leads only when that lower bound is above 0 (above the control); otherwise the line says that the control
leads and names the arm closest to it. The point-best arm is never called the leader.

One line per event a user cares about: a seed that finished or failed, an arm the scheduler stopped at a rung (its
rule's words, the rung leader named, never "credibly": a stopping rule spends seeds, it is no verdict); the seeds of
an announced stopped arm end quietly.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from ray.tune import Callback

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.paired.ledger import PairedEstimate, PairedLedger
from tune_dfrl.paired.rungs import ArmDecision, RungBook, name_leader


class Cells(Protocol):
    """What the progress line reads: the searcher's record of the search's cells."""

    ledger: PairedLedger  # scores (first report of a milestone) and how each (arm, seed) cell ended
    arms: Mapping[str, ArmSpec]  # arm id -> arm (its label)


class Progress(Callback):
    """Prints cells done, stopped arms and the leader by paired lower bound after every event.

    A view: what ended and the scores are the searcher's (`cells`, read when a line is printed: Ray Tune tells its
    searcher of a trial's result or end before its callbacks, and `tune_dfrl.tune.trial_watch` does the same), the
    stopped arms are the paired scheduler's rung book (`book`; None for the other schedulers)."""

    def __init__(
        self,
        cells: Cells,
        book: RungBook | None,
        metric: str,
        total_cells: int,
        last_step: int,
        confidence: float = 0.95,
        stream: TextIO | None = None,
    ) -> None:
        self.cells = cells
        self.book = book
        self.metric = metric
        self.total_cells = total_cells
        self.last_step = last_step  # the final milestone, where the leader is judged
        self.confidence = confidence
        self.stream = stream  # None: sys.stdout at the time of printing (so the callback pickles, as Tune does)

    def label(self, arm_id: str) -> str:
        arm = self.cells.arms.get(arm_id)
        return arm.label if arm is not None else arm_id

    def stopped(self) -> dict[str, int]:
        """arm id -> the rung where the paired scheduler stopped it."""
        if self.book is None:
            return {}
        return {d.arm: d.rung for d in self.book.decisions.values() if not d.decision.keep}

    def leader(self) -> PairedEstimate | None:
        """The searched arm with the highest paired lower bound against the control (>= 2 common seeds)."""
        ledger = self.cells.ledger
        estimates = [
            ledger.estimate(arm_id, self.last_step, self.confidence)
            for arm_id in ledger.arms()
            if arm_id != ledger.control
        ]
        return max((e for e in estimates if len(e.seeds) >= 2), key=lambda e: e.low, default=None)

    def line(self, event: str) -> str:
        ledger = self.cells.ledger
        ended = sum(len(ledger.ends(arm_id)) for arm_id in ledger.arms())
        parts = [f"[{ended}/{self.total_cells} cells]", event]
        if stopped := self.stopped():
            parts.append(f"{len(stopped)} arm{'s' if len(stopped) > 1 else ''} stopped")
        lead = self.leader()
        if lead is not None:
            figures = (
                f"{self.label(lead.arm)} Δ={lead.mean:+.2f} [{lead.low:+.2f}, {lead.high:+.2f}] "
                f"({len(lead.seeds)} seeds, unadjusted)"
            )
            if lead.low > 0:
                parts.append(f"leader by {lead.confidence:.0%} paired lower bound above the control: {figures}")
            else:
                parts.append(
                    f"the control leads: no arm's {lead.confidence:.0%} paired lower bound is above the control yet "
                    f"(highest: {figures})"
                )
        return " | ".join(parts)

    def say(self, event: str) -> None:
        print(self.line(event), file=self.stream or sys.stdout, flush=True)

    def note_decision(self, decided: ArmDecision) -> None:
        if not decided.decision.keep:
            leader = decided.decision.leader
            reason = name_leader(decided.decision.reason, self.label(leader) if leader else None)
            self.say(f"stopped arm {self.label(decided.arm)} at step {decided.rung}: {reason}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed, result = trial.config["arm"], int(trial.config["seed"]), trial.last_result or {}
        if result.get("final"):
            how = "replayed from its record" if result.get("replayed") else "finished"
            self.say(f"{arm['label']} seed {seed} {how}: {self.metric}={result[self.metric]:.2f}")
        elif arm.get("arm_id") not in self.stopped():  # a stopped arm's seeds end quietly: its stop was announced
            self.say(f"{arm['label']} seed {seed} stopped at step {result.get('step', 0):g}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        self.say(f"{arm['label']} seed {seed} FAILED (see {trial.local_path})")
