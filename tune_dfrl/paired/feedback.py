"""What the searcher tells Optuna about an arm, decided from the paired ledger (pure: no Ray, no Optuna).

One Optuna trial is one searched arm, judged on the search's starting seeds S (later sequential
seeds never reach Optuna). With control c, metric m and the seeds S_both where both have a value:

- Intermediate(t): at a milestone t before the last, once the arm has m at t on every seed of S
  that did not fail and the control has m at t on those seeds, the value
  mean_{s in S_both} [m(arm, s, t) - m(c, s, t)], told once per step;
- Outcome when every seed of S ended (and the control ended at the arm's finished seeds):
  PRUNED when the scheduler stopped a seed (after the paired delta at its stopping step was told,
  or once it never can be), else COMPLETE with the mean paired delta at the final step, else
  (no seed paired at the final step) FAIL.

Raw means of truncated runs never reach Optuna. `OptunaFeedback` returns these as `Told` events;
`tune_dfrl.tune.searcher.PairedRepeater` passes them on to Optuna.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tune_dfrl.paired.ledger import FAILED, FINISHED, STOPPED, PairedLedger

INTERMEDIATE, COMPLETE, PRUNED, FAIL = "INTERMEDIATE", "COMPLETE", "PRUNED", "FAIL"  # Optuna's state names


@dataclass(frozen=True)
class Told:
    """One thing Optuna is told about `arm`: an intermediate value at `step`, or its outcome (value None unless COMPLETE)."""

    arm: str
    state: str  # INTERMEDIATE | COMPLETE | PRUNED | FAIL
    value: float | None
    step: int | None = None


class OptunaFeedback:
    """Pure: cell events in (scores and ends, into `ledger`), what Optuna is told out (see the module docstring)."""

    def __init__(self, ledger: PairedLedger, seeds: Iterable[int], final_step: int) -> None:
        self.ledger = ledger
        self.seeds = tuple(int(s) for s in seeds)
        self.final_step = final_step
        self.searched: list[str] = []  # arms Optuna has a trial for, in order
        self.intermediate: dict[str, dict[int, float]] = {}  # arm -> step -> value told
        self.outcome: dict[str, Told] = {}  # arm -> its outcome, once told

    def add(self, arm: str) -> None:
        """`arm` is a searched arm: from now on Optuna is told about it."""
        if arm not in self.searched:
            self.searched.append(arm)

    def result(self, arm: str, seed: int, step: int, score: float) -> list[Told]:
        """score(arm, seed, step) arrived; a control value may complete other arms' pairs."""
        self.ledger.record(arm, seed, step, score)
        told = self._intermediate(arm, step)
        if arm == self.ledger.control:
            for other in self.searched:
                if other != arm:
                    told += self._intermediate(other, step) + self.settle(other)
        return told

    def end(self, arm: str, seed: int, error: bool, last: tuple[int, float] | None = None) -> list[Told]:
        """The cell (arm, seed) ended, with its `last` (step, score) when the end came with a result: failed on
        an `error`, else finished when it reached the final step, else stopped (by the scheduler)."""
        told = []
        if last is not None:
            self.ledger.record(arm, seed, *last)
            told += self._intermediate(arm, last[0])
        how = FAILED if error else FINISHED if self.ledger.reached(arm, seed) >= self.final_step else STOPPED
        self.ledger.end(arm, seed, how)
        for other in self.searched:
            told += self.settle(other)
        return told

    def _ends(self, arm: str) -> dict[int, str]:
        return {s: how for s, how in self.ledger.ends(arm).items() if s in self.seeds}

    def _intermediate(self, arm: str, step: int) -> list[Told]:
        told = self.intermediate.setdefault(arm, {})
        if step >= self.final_step or step in told or arm in self.outcome or arm not in self.searched:
            return []
        ended = self._ends(arm)
        live = [s for s in self.seeds if ended.get(s) != FAILED]
        deltas = self.ledger.paired_deltas(arm, step, self.seeds)
        if not live or set(deltas) != set(live):
            return []
        told[step] = float(np.mean(list(deltas.values())))
        return [Told(arm, INTERMEDIATE, told[step], step)]

    def settle(self, arm: str) -> list[Told]:
        """The arm's outcome (with the intermediate value that must precede it), once it can be told; else []."""
        if arm in self.outcome:
            return []
        ends, control_ends = self._ends(arm), self._ends(self.ledger.control)
        finished = [s for s, how in ends.items() if how == FINISHED]
        if len(ends) < len(self.seeds) or any(s not in control_ends for s in finished):
            return []  # the arm, or the control at one of its finished seeds, is still running
        told: list[Told] = []
        if STOPPED in ends.values():
            stopped_at = [self.ledger.reached(arm, s) for s, how in ends.items() if how == STOPPED]
            step = min([reached for reached in stopped_at if reached > 0], default=None)
            if step is not None:  # the paired delta at the stopping step is told first, unless it never can be
                told += self._intermediate(arm, step)
                if step not in self.intermediate[arm] and not all(s in control_ends for s in ends):
                    return told  # the control has not reached the stopping rung at every seed yet
            self.outcome[arm] = Told(arm, PRUNED, None)
        elif deltas := self.ledger.paired_deltas(arm, self.final_step, self.seeds):
            self.outcome[arm] = Told(arm, COMPLETE, float(np.mean(list(deltas.values()))))
        else:
            self.outcome[arm] = Told(arm, FAIL, None)
        return told + [self.outcome[arm]]
