"""Paired scheduler: the Ray Tune `TrialScheduler` glue around `tune_dfrl.paired.rungs.RungBook` (the pure bookkeeping:
scores in, rung decisions and per-trial actions out; its docstring states the semantics).

A trial that reports a rung whose decision is still open waits (Tune PAUSE; it restarts later
from the backend's own milestone checkpoint); when the decision is made, every trial of the arm
continues, or every trial of the arm stops.

A crashed trial that Tune retries (`FailureConfig.max_failures`) is not a failure yet: only its
last crash leaves the seed out. With a `log_path`, every event that changes the book (a new score, a
cell's final failure, a resume's `retry_failed`) is appended there as a JSON line before the book
applies it (`RungBook.apply`); `replay` folds the log's book events into the book again, so a resumed search
makes the rung decisions already made, in the same order, without announcing them again. The log may be shared
with the searcher's events (OUT/state/events.jsonl): each replays its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from tune_dfrl.config.settings import PAIRED_SCHEDULERS, SchedulerSettings
from tune_dfrl.paired.ledger import FAILED
from tune_dfrl.paired.rungs import (
    BOOK_EVENTS,
    CONTINUE,
    RETRY_FAILED,
    SCORE,
    STOP,
    WAIT,
    ArmDecision,
    RungBook,
    RungRule,
)
from tune_dfrl.state.records import append_record, read_records

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController


class PairedScheduler(TrialScheduler):
    """Ray Tune glue around `RungBook`: trial configs carry `arm.arm_id` and `seed`; `step` is in every result."""

    def __init__(
        self,
        book: RungBook,
        metric: str,
        on_decision: Callable[[ArmDecision], None] | None = None,
        log_path: Path | None = None,
    ) -> None:
        super().__init__()
        self.book = book
        self.log_path = log_path
        self._metric = metric
        self._on_decision = on_decision
        self._reached: dict[str, int] = {}  # trial id -> last step reported

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return metric in (None, self._metric) and mode in (None, "max")

    def on_trial_add(self, tune_controller: TuneController, trial: Trial) -> None:
        pass

    def on_trial_result(self, tune_controller: TuneController, trial: Trial, result: dict) -> str:
        arm, seed = _cell(trial)
        step = int(result["step"])
        self._reached[trial.trial_id] = step
        if seed not in self.book.ledger.scores(arm, step):  # a replayed milestone changes nothing
            event = {"event": SCORE, "arm": arm, "seed": seed, "step": step, "score": float(result[self._metric])}
            self._apply(tune_controller, self._record(event), trial)
        return {CONTINUE: self.CONTINUE, WAIT: self.PAUSE, STOP: self.STOP}[self.book.action(arm, step)]

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        if trial.status == Trial.ERROR and trial.should_recover():
            return  # Tune requeues it for a retry (on a final failure the trial is still RUNNING or PENDING here)
        self.leave_out(trial, tune_controller)

    def leave_out(self, trial: Trial, tune_controller: TuneController | None = None) -> None:
        """The trial's cell failed for good: its seed is left out of the arm's decisions. Without a controller
        (a failure Tune told no one of, `tune_dfrl.tune.trial_watch`) the trials of an arm this stops are stopped
        by `choose_trial_to_run`."""
        arm, seed = _cell(trial)
        self._apply(tune_controller, self._record({"event": FAILED, "arm": arm, "seed": seed}), trial)

    def replay(self) -> None:
        """Fold the book's events of `log_path` into the book (a resumed search; its decisions are not announced
        again)."""
        for event in read_records(self.log_path):
            if event["event"] in BOOK_EVENTS:
                self.book.apply(event)

    def retry_failed(self) -> None:
        """A resume with retry_failed: the failed seeds and the decisions that had no seed to pair are forgotten;
        decisions this makes possible are announced."""
        self._apply(None, self._record({"event": RETRY_FAILED}), None)

    def on_trial_complete(self, tune_controller: TuneController, trial: Trial, result: dict) -> None:
        pass

    def on_trial_remove(self, tune_controller: TuneController, trial: Trial) -> None:
        pass

    def choose_trial_to_run(self, tune_controller: TuneController) -> Trial | None:
        """Resume a waiting trial whose rung is now decided (oldest first), else the oldest pending trial.

        A trial that finished pausing after its arm was stopped, or a pending one of a stopped arm, is stopped here.
        """
        trials = tune_controller.get_trials()
        for trial in trials:
            if (trial.status == Trial.PAUSED and self._next(trial) == STOP) or (
                trial.status == Trial.PENDING and self.book.stopped(_cell(trial)[0]) is not None
            ):
                tune_controller.stop_trial(trial)
        for trial in trials:
            if trial.status == Trial.PAUSED and self._next(trial) == CONTINUE:
                return trial
        return next((trial for trial in trials if trial.status == Trial.PENDING), None)

    def debug_string(self) -> str:
        stopped = {d.arm for d in self.book.decisions.values() if not d.decision.keep}
        return f"PairedScheduler({self.book.rule.mode}): {len(self.book.decisions)} rung decisions, {len(stopped)} arms stopped"

    def _record(self, event: dict[str, Any]) -> list[ArmDecision]:
        """Log the event, then apply it to the book; the decisions it made possible."""
        if self.log_path is not None:
            append_record(self.log_path, event)
        return self.book.apply(event)

    def _next(self, trial: Trial) -> str:
        return self.book.action(_cell(trial)[0], self._reached.get(trial.trial_id, 0))

    def _apply(self, tune_controller: TuneController | None, made: list[ArmDecision], current: Trial | None) -> None:
        """Report new decisions; stop every waiting or not-yet-started trial of a stopped arm."""
        for decided in made:
            if self._on_decision is not None:
                self._on_decision(decided)
            if decided.decision.keep or tune_controller is None:
                continue
            for trial in tune_controller.get_trials():
                if (
                    trial is not current
                    and trial.status in (Trial.PAUSED, Trial.PENDING)
                    and _cell(trial)[0] == decided.arm
                ):
                    tune_controller.stop_trial(trial)


def _cell(trial: Trial) -> tuple[str, int]:
    return trial.config["arm"]["arm_id"], int(trial.config["seed"])


def asha_grace_step(settings: SchedulerSettings, milestones: Sequence[int]) -> int:
    """Ray's plain ASHA (`asha`) decides from the first milestone at or after `grace_fraction` of the last."""
    return min(step for step in milestones if step >= settings.grace_fraction * max(milestones))


def make_scheduler(
    settings: SchedulerSettings,
    *,
    metric: str,
    control: str,
    seeds: Sequence[int],
    milestones: Sequence[int],
    on_decision: Callable[[ArmDecision], None] | None = None,
    log_path: Path | None = None,
) -> TrialScheduler:
    """`paired_asha` / `race` (paired, per arm, its events logged at `log_path`), Ray's plain per-trial `asha`,
    or `fifo` (no stopping)."""
    if settings.name in PAIRED_SCHEDULERS:
        rule = RungRule.of(settings)
        return PairedScheduler(RungBook(rule, rule.rungs(milestones), control, seeds), metric, on_decision, log_path)
    if settings.name == "asha":
        first = asha_grace_step(settings, milestones)
        return ASHAScheduler(time_attr="step", max_t=max(milestones), grace_period=first, reduction_factor=settings.eta)
    return FIFOScheduler()
