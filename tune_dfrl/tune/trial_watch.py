"""TrialWatch: every way a Ray Tune trial ends reaches the search's bookkeeping, and Tune never waits for nothing.

Ray Tune tells the searcher, the scheduler and the callbacks when a trial crashes inside `run_cell`
(retried per `FailureConfig.max_failures`, then reported as failed). One way to end is told to no
one: when Tune hands a cached actor to a trial and the actor's reset is refused (its previous
trial's thread had not ended within `TUNE_FUNCTION_THREAD_TIMEOUT_S`), Tune sets the trial to
ERROR and goes on. The searcher then waits for a cell that no trial runs, and Tune waits for the
searcher, forever.

Rules, checked at the beginning of every Tune step (before Tune may block waiting for the searcher):

- A trial in ERROR that no one was told of is *lost*. Its cell runs again as a new trial (it replays
  its recorded milestones and trains on from its checkpoint, as any retry) while the cell has been
  lost at most `max_retries` times; after that it fails exactly as a crashed trial does after its
  last retry: the scheduler leaves the seed out, the searcher records the cell failed, and the
  callbacks (results log, MLflow, progress) record the failure.
- Trials lost with their cluster node are retried by Tune; `tune_dfrl.cluster.lost_nodes.LostNodes` (`lost_nodes`, a
  callback next to this one) notes each lost node once.
- If no trial is pending, running or paused, the searcher has nothing to give: Tune would wait for
  it (600 s at a time, forever). After `stall_s` of that, `SearchStalled` ends the search with an
  `error:` line; `resume=true` continues it. While Tune waits, the searcher calls `while_waiting`
  every second, which also ends the search at once on SIGINT / SIGTERM (`on_wait`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from tune_dfrl.cluster.lost_nodes import LostNodes
from tune_dfrl.errors import SearchFailed

STALL_S = 30.0  # the longest the search waits on a searcher that has nothing to give while no trial is live
LIVE = (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)


class SearchStalled(SearchFailed):
    """No trial is live and the searcher has nothing to give: the bookkeeping lost a cell (a bug)."""


class TrialWatch(Callback):
    """Retries or fails the trials Tune ended without telling anyone; ends a search that waits for nothing.

    `searcher` needs `retry(trial_id)`, `on_trial_complete(trial_id, error=True)` and `open_cells()`;
    on a final failure `leave_out(trial)` tells the scheduler and `notify` are the callbacks told
    `on_trial_error`; `on_wait` runs while Tune waits on the searcher (it raises to interrupt).
    """

    def __init__(
        self,
        searcher: Any,
        leave_out: Callable[[Trial], None],
        notify: Sequence[Callback],
        max_retries: int,
        on_wait: Callable[[], None] = lambda: None,
        stall_s: float = STALL_S,
    ) -> None:
        self.searcher = searcher
        self.leave_out = leave_out
        self.notify = tuple(notify)
        self.max_retries = max_retries
        self.on_wait = on_wait
        self.stall_s = stall_s
        self.told: set[str] = set()  # trial ids whose end Tune reported (error or completion)
        self.lost: Counter[tuple[str, int]] = Counter()  # (arm id, seed) -> trials of the cell lost so far
        self.idle_since: float | None = None  # when a step last began with no live trial (None: some trial live)
        self.lost_nodes = LostNodes()  # a callback of its own, next to this one: trials lost with their node

    # -- Tune callback ----------------------------------------------------------------------------

    def on_trial_complete(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        self.told.add(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        self.told.add(trial.trial_id)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        for trial in trials:
            if trial.status == Trial.ERROR and trial.trial_id not in self.told:
                self.told.add(trial.trial_id)
                self._lost(iteration, trials, trial)
        live = any(trial.status in LIVE for trial in trials)
        self.idle_since = None if live else (self.idle_since or time.monotonic())

    # -- called by the searcher when it has nothing to give ------------------------------------------

    def while_waiting(self) -> None:
        """Raise on a signal (`on_wait`); raise `SearchStalled` once no trial has been live for `stall_s`."""
        self.on_wait()
        if self.idle_since is not None and time.monotonic() - self.idle_since > self.stall_s:
            open_cells = ", ".join(f"{arm} seed {seed}" for arm, seed in self.searcher.open_cells()) or "none"
            raise SearchStalled(
                f"no trial has run for {self.stall_s:g} s and the searcher has nothing to give "
                f"(cells it still waits for: {open_cells}); this is a bug in tune_dfrl's bookkeeping. "
                "resume=true continues the search from its recorded milestones"
            )

    # -- internals --------------------------------------------------------------------------------

    def _lost(self, iteration: int, trials: list, trial: Trial) -> None:
        cell = (trial.config["arm"]["arm_id"], int(trial.config["seed"]))
        self.lost[cell] += 1
        label = f"{trial.config['arm']['label']} seed {cell[1]}"
        why = _last_error_line(trial)
        if self.lost[cell] <= self.max_retries:
            print(
                f"note: the trial of {label} ended outside its run ({why}); "
                f"running the cell again (retry {self.lost[cell]} of {self.max_retries})",
                file=sys.stderr,
                flush=True,
            )
            self.searcher.retry(trial.trial_id)
            return
        print(
            f"note: the trial of {label} ended outside its run ({why}); no retry left: the cell failed",
            file=sys.stderr,
            flush=True,
        )
        self.leave_out(trial)
        self.searcher.on_trial_complete(trial.trial_id, error=True)
        for callback in self.notify:  # `attempts`: the cell's trials, where Tune counts one trial's crashes
            callback.on_trial_error(iteration=iteration, trials=trials, trial=trial, attempts=self.lost[cell])


def _last_error_line(trial: Trial) -> str:
    try:
        with open(trial.error_file) as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except (OSError, TypeError):
        return "no error recorded"
    return lines[-1] if lines else "no error recorded"
