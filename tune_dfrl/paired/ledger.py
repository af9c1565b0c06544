"""PairedLedger: a fold of a search's paired scores, and the one paired-delta computation.

Cells are (arm, seed). A ledger holds score(arm, seed, step) for every reported milestone and
how each cell ended: finished (reached the last milestone), stopped (by the scheduler) or failed
(after its last retry). Pure bookkeeping, no Ray. The searcher (what Optuna is told, the sequential looks, the
progress line) and the rung book each fold the search's events into one, in the order Ray Tune hands each of them
the events; the report folds a score table into one for its learning curves.

Duplicate rule (the only one): the first score of a milestone (arm, seed, step) (`milestone`) is kept. A milestone
comes again only when a paused, retried or resumed trial re-reports it from its checkpoint or record; the record
files and MLflow keep the first report of each milestone by the same rule.

Paired deltas of arm A at step t over the seeds S where A and the control c both have a score:
d_s = score(A, s, t) - score(c, s, t). Their interval is `stats.paired_interval` (the t-interval,
or the inverted exact sign-flip test when the deltas have no spread).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tune_dfrl.paired.stats import paired_interval

FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"
ENDS = (FINISHED, STOPPED, FAILED)


def milestone(arm: str, seed: int, step: int) -> tuple[str, int, int]:
    """The key of the duplicate rule: one milestone of one cell. Raises ValueError/TypeError on a seed or step that
    is no integer."""
    return str(arm), int(seed), int(step)


@dataclass(frozen=True)
class PairedEstimate:
    """mean(d) over `seeds` with its two-sided interval at `confidence` (NaN bounds below 2 seeds)."""

    arm: str
    step: int
    seeds: tuple[int, ...]
    mean: float
    low: float
    high: float
    confidence: float


class PairedLedger:
    """(arm, seed, step) -> score, and (arm, seed) -> how the cell ended; paired against `control`
    (a ledger without a control holds scores and ends only: it has no paired deltas)."""

    def __init__(self, control: str | None = None) -> None:
        self.control = control
        self._scores: dict[str, dict[int, dict[int, float]]] = {}  # arm -> seed -> step -> score
        self._ends: dict[str, dict[int, str]] = {}  # arm -> seed -> finished | stopped | failed

    # -- writing ------------------------------------------------------------------------------

    def record(self, arm: str, seed: int, step: int, score: float) -> bool:
        """Keep score(arm, seed, step) unless that milestone is already recorded; True when it was new."""
        arm, seed, step = milestone(arm, seed, step)
        by_step = self._scores.setdefault(arm, {}).setdefault(seed, {})
        if step in by_step:
            return False
        by_step[step] = float(score)
        return True

    def end(self, arm: str, seed: int, how: str) -> None:
        """The cell (arm, seed) ended `how` (finished | stopped | failed)."""
        if how not in ENDS:
            raise ValueError(f"a cell ends {' | '.join(ENDS)}; got {how!r}")
        self._scores.setdefault(arm, {})  # the arm's place in `arms()`
        self._ends.setdefault(arm, {})[int(seed)] = how

    def reopen(self, arm: str, seed: int) -> None:
        """Forget how (arm, seed) ended (a resume runs it again); its scores stay."""
        self._ends.get(arm, {}).pop(int(seed), None)

    # -- reading ------------------------------------------------------------------------------

    def arms(self) -> list[str]:
        """Arms with a score or an end, in order of first appearance."""
        return list(self._scores)

    def scores(self, arm: str, step: int) -> dict[int, float]:
        """seed -> score(arm, seed, step), for the seeds that reached `step`."""
        return {s: by_step[step] for s, by_step in self._scores.get(arm, {}).items() if step in by_step}

    def reached(self, arm: str, seed: int) -> int:
        """The last milestone step (arm, seed) reported (0 if none)."""
        return max(self._scores.get(arm, {}).get(int(seed), {0: 0.0}))

    def ends(self, arm: str) -> dict[int, str]:
        """seed -> how (arm, seed) ended, for the cells of `arm` that ended."""
        return dict(self._ends.get(arm, {}))

    def seeds_ended(self, arm: str, how: str) -> set[int]:
        return {s for s, end in self._ends.get(arm, {}).items() if end == how}

    def paired_deltas(self, arm: str, step: int, seeds: Iterable[int] | None = None) -> dict[int, float]:
        """seed -> score(arm, seed, step) - score(control, seed, step), over the seeds both have (within `seeds`)."""
        mine, control = self.scores(arm, step), self.scores(self.control, step)
        common = sorted(set(mine) & set(control) & (set(seeds) if seeds is not None else set(mine)))
        return {s: mine[s] - control[s] for s in common}

    def estimate(self, arm: str, step: int, confidence: float, seeds: Iterable[int] | None = None) -> PairedEstimate:
        """The mean paired delta of `arm` at `step` and its interval at `confidence`."""
        deltas = self.paired_deltas(arm, step, seeds)
        return estimate_of(arm, step, deltas, confidence)


def estimate_of(arm: str, step: int, deltas: dict[int, float], confidence: float) -> PairedEstimate:
    """PairedEstimate of the paired deltas `deltas` (seed -> d)."""
    d = np.array(list(deltas.values()), dtype=np.float64)
    if d.size == 0:
        return PairedEstimate(arm, step, (), float("nan"), float("nan"), float("nan"), confidence)
    if d.size < 2:
        return PairedEstimate(arm, step, tuple(deltas), float(d[0]), float("nan"), float("nan"), confidence)
    low, high = paired_interval(d.mean(), d.std(ddof=1), d.size, confidence)
    return PairedEstimate(arm, step, tuple(deltas), float(d.mean()), float(low), float(high), confidence)
