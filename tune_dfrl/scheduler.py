"""Paired scheduler: whole arms continue or stop at milestone rungs, on paired deltas against the control.

`RungBook` is the pure bookkeeping (scores in, rung decisions and per-trial actions out) and can be
driven by a scripted run without Ray. `PairedScheduler` is the Ray Tune `TrialScheduler` glue.

Semantics. Rungs are the milestone steps before the last, at or after `grace_fraction` of the
last (`RungRule.rungs`). For a
searched arm A at rung r, the decision waits until A has a score at r for every seed of the
search and the control has a score at r for those same seeds (seeds whose trial failed, for A or
for the control, are left out). Then d[A][s] = score(A, s, r) - score(control, s, r) and
`rungs.decide(A, deltas_r, rule)` decides once, where deltas_r holds every arm decided at r
before A (asynchronous ASHA), A itself, and the control with d = 0 at each of its seeds, so an arm
credibly worse than uniform GRPO stops too. The control is never stopped and never waits. An arm
left with no seed to pair (its own trials, or the control's, all failed) is stopped at once, so no
trial waits for a decision that can never be made.

A trial that reports a rung whose decision is still open waits (Tune PAUSE; it restarts later
from the backend's own milestone checkpoint); when the decision is made, every trial of the arm
continues, or every trial of the arm stops.

A crashed trial that Tune retries (`FailureConfig.max_failures`) is not a failure yet: only its
last crash leaves the seed out. With a `state_path`, the book is rewritten there atomically after
every event, so a resumed search keeps the rung decisions already made.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from tune_dfrl.ledger import FAILED, PairedLedger
from tune_dfrl.resume import save_atomically
from tune_dfrl.rungs import RungDecision, RungRule, decide
from tune_dfrl.settings import PAIRED_SCHEDULERS, SchedulerSettings

if TYPE_CHECKING:
    from ray.tune.execution.tune_controller import TuneController

CONTINUE, WAIT, STOP = "continue", "wait", "stop"


@dataclass(frozen=True)
class ArmDecision:
    """One rung decision: arm `arm` at rung step `rung`, with the seeds it was decided on."""

    arm: str
    rung: int
    seeds: tuple[int, ...]
    decision: RungDecision


class RungBook:
    """Pure per-arm rung bookkeeping over a `PairedLedger` (see the module docstring for the rules)."""

    def __init__(self, rule: RungRule, rungs: Iterable[int], control: str, seeds: Iterable[int]) -> None:
        self.rule = rule
        self.rungs = tuple(sorted(rungs))
        self.control = control
        self.seeds = tuple(seeds)
        self.ledger = PairedLedger(control)  # scores (first of a milestone kept) and the failed cells
        self.decisions: dict[tuple[str, int], ArmDecision] = {}  # (arm, rung) -> decision
        self._decided_at: dict[int, list[str]] = {rung: [] for rung in self.rungs}  # rung -> arms, in order

    def observe(self, arm: str, seed: int, step: int, score: float) -> list[ArmDecision]:
        """Record score(arm, seed, step); return the rung decisions this made possible."""
        self.ledger.record(arm, seed, step, score)
        return self._decide_ready()

    def fail(self, arm: str, seed: int) -> list[ArmDecision]:
        """Leave (arm, seed) out from now on (its trial failed); return the decisions this made possible."""
        self.ledger.end(arm, seed, FAILED)
        return self._decide_ready()

    def action(self, arm: str, step: int) -> str:
        """What a trial of `arm` that has reached `step` does next: CONTINUE, WAIT or STOP."""
        if arm == self.control:
            return CONTINUE
        passed = [rung for rung in self.rungs if rung <= step]
        if any(not self.decisions[(arm, rung)].decision.keep for rung in passed if (arm, rung) in self.decisions):
            return STOP
        if any((arm, rung) not in self.decisions for rung in passed):
            return WAIT
        return CONTINUE

    def stopped(self, arm: str) -> ArmDecision | None:
        """The decision that stopped `arm`, or None while it runs."""
        return next((d for d in self.decisions.values() if d.arm == arm and not d.decision.keep), None)

    def _seeds_for(self, arm: str) -> tuple[int, ...]:
        left_out = self.ledger.seeds_ended(arm, FAILED) | self.ledger.seeds_ended(self.control, FAILED)
        return tuple(seed for seed in self.seeds if seed not in left_out)

    def _decide_ready(self) -> list[ArmDecision]:
        made: list[ArmDecision] = []
        for rung in self.rungs:
            for arm in self.ledger.arms():
                earlier_open = any((arm, earlier) not in self.decisions for earlier in self.rungs if earlier < rung)
                if arm == self.control or (arm, rung) in self.decisions or earlier_open or self.stopped(arm):
                    continue
                seeds = self._seeds_for(arm)
                if not seeds:
                    made.append(self._unpaired(arm, rung))
                elif len(self.ledger.paired_deltas(arm, rung, seeds)) == len(seeds):
                    made.append(self._decide(arm, rung, seeds))
        return made

    def _unpaired(self, arm: str, rung: int) -> ArmDecision:
        """Stop an arm that has no seed left to pair with the control (its or the control's trials all failed)."""
        failed = {
            who: sorted(self.ledger.seeds_ended(of, FAILED))
            for who, of in (("this arm", arm), ("the control", self.control))
        }
        which = "; ".join(f"{who} failed at seeds {seeds}" for who, seeds in failed.items() if seeds)
        decided = ArmDecision(
            arm, rung, (), RungDecision(False, f"no seed left to pair with the control ({which})", None)
        )
        self.decisions[(arm, rung)] = decided
        return decided

    def retry_failed(self) -> None:
        """Forget the failed seeds and the decisions that had no seed to pair (a resume runs those cells again)."""
        for arm in self.ledger.arms():
            for seed in self.ledger.seeds_ended(arm, FAILED):
                self.ledger.reopen(arm, seed)
        self.decisions = {key: d for key, d in self.decisions.items() if d.seeds}

    def _decide(self, arm: str, rung: int, seeds: tuple[int, ...]) -> ArmDecision:
        """decide() on the paired deltas at `rung` of the arms decided there before (on their own seeds), `arm`, and
        the control (0 at each of its seeds)."""
        table = {
            other: self.ledger.paired_deltas(other, rung, self.decisions[(other, rung)].seeds)
            for other in self._decided_at[rung]
        }
        table[arm] = self.ledger.paired_deltas(arm, rung, seeds)
        table[self.control] = dict.fromkeys(self.ledger.scores(self.control, rung), 0.0)
        decided = ArmDecision(arm, rung, seeds, decide(arm, table, self.rule))
        self.decisions[(arm, rung)] = decided
        self._decided_at[rung].append(arm)
        return decided


class PairedScheduler(TrialScheduler):
    """Ray Tune glue around `RungBook`: trial configs carry `arm.arm_id` and `seed`; `step` is in every result."""

    def __init__(
        self,
        book: RungBook,
        metric: str,
        on_decision: Callable[[ArmDecision], None] | None = None,
        state_path: Path | None = None,
    ) -> None:
        super().__init__()
        self.book = book
        self.state_path = state_path
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
        self._apply(tune_controller, self.book.observe(arm, seed, step, float(result[self._metric])), trial)
        self._persist()
        return {CONTINUE: self.CONTINUE, WAIT: self.PAUSE, STOP: self.STOP}[self.book.action(arm, step)]

    def on_trial_error(self, tune_controller: TuneController, trial: Trial) -> None:
        if trial.status == Trial.ERROR and trial.should_recover():
            return  # Tune requeues it for a retry (on a final failure the trial is still RUNNING or PENDING here)
        self.leave_out(trial, tune_controller)

    def leave_out(self, trial: Trial, tune_controller: TuneController | None = None) -> None:
        """The trial's cell failed for good: its seed is left out of the arm's decisions. Without a controller
        (a failure Tune told no one of, `tune_dfrl.trial_watch`) the trials of an arm this stops are stopped
        by `choose_trial_to_run`."""
        self._apply(tune_controller, self.book.fail(*_cell(trial)), trial)
        self._persist()

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

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"book": self.book, "reached": self._reached}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        self.book, self._reached = state["book"], state["reached"]

    def _persist(self) -> None:
        if self.state_path is not None:
            save_atomically(self.state_path, self.save)

    def _next(self, trial: Trial) -> str:
        return self.book.action(_cell(trial)[0], self._reached.get(trial.trial_id, 0))

    def _apply(self, tune_controller: TuneController | None, made: list[ArmDecision], current: Trial) -> None:
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
    state_path: Path | None = None,
) -> TrialScheduler:
    """`paired_asha` / `race` (paired, per arm, state kept at `state_path`), Ray's plain per-trial `asha`,
    or `fifo` (no stopping)."""
    if settings.name in PAIRED_SCHEDULERS:
        rule = RungRule.of(settings)
        return PairedScheduler(RungBook(rule, rule.rungs(milestones), control, seeds), metric, on_decision, state_path)
    if settings.name == "asha":
        first = asha_grace_step(settings, milestones)
        return ASHAScheduler(time_attr="step", max_t=max(milestones), grace_period=first, reduction_factor=settings.eta)
    return FIFOScheduler()
