"""The paired scheduler's rules, pure and Ray-free: `decide` (paired deltas in, keep or stop one arm out) and
`RungBook` (the per-arm bookkeeping that gathers the deltas, asks `decide` and says what each trial does next).
`tune_dfrl.tune.scheduler` is the Ray Tune glue around them.

A rung is an evaluation milestone before the last, at or after `grace_fraction` of training
(`RungRule.rungs`). When an arm reaches a rung, the scheduler
collects, for every arm recorded at that rung so far (asynchronous ASHA: arms that got there
earlier), the paired deltas d[arm][seed] = score(arm, seed) - score(control, seed) at that
milestone, and asks `decide` whether the arm goes on. The control arm is never passed to a
stop decision by the scheduler (it is never stopped); every key of `deltas` is treated as a
competing arm.

Definitions (n = arms at the rung, mean_a = mean of arm a's deltas over its own seeds):

- leader: the arm with the highest mean_a; ties go to the smallest arm id.
- rank: position in the order (-mean_a, arm id); the leader has rank 0.
- paired interval of (candidate - leader): over the seeds S both have,
  e_s = d[cand][s] - d[leader][s], m = |S|, interval = mean(e) +- t_{(1+c)/2, m-1} * sd(e) / sqrt(m)
  with c = `confidence` and sd the sample standard deviation (ddof 1); without spread (the same e_s
  at every seed) the inverted exact sign-flip test: {mean(e)} when 2^(1-m) < 1 - c, else unbounded
  (`stats.paired_interval`).
- below the leader: the interval lies entirely below 0 (a stopping rule that spends seeds, not a verdict; the
  reasons say what the rule saw, "80% interval of Δ against the leader [-4.37, -2.13] over 6 seeds, below 0", and
  never name the leader: `RungDecision.leader` holds its id, and the readers (progress line, report, MLflow) name it).

Rules (checked in order; the first that applies decides):

1. the candidate is the only arm at the rung, or the leader -> keep;
2. `paired_asha` only: rank < max(1, ceil(n / eta)) -> keep (top 1/eta promotion);
3. fewer than `min_seeds` common seeds with the leader -> keep (no paired evidence yet);
4. the interval lies below 0 -> stop, otherwise keep.

So `race` stops exactly the arms whose interval lies below the leader, and `paired_asha` additionally protects the
top ceil(n/eta) arms even when their interval lies below the leader.

The defaults, declared once in `tune_dfrl.config.settings.SchedulerSettings`, were chosen with
benchmarks/search_decisions.py (docs/readme_decisions.md): without a grace period the earliest,
most misleading milestones stopped the truly best arm in about 1 campaign of 5.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tune_dfrl.config.constraints import Options, check_declared, check_value
from tune_dfrl.config.settings import PAIRED_SCHEDULERS, SchedulerSettings
from tune_dfrl.paired.ledger import FAILED, PairedLedger
from tune_dfrl.paired.stats import paired_interval


@dataclass(frozen=True)
class RungRule:
    """How the paired scheduler decides at a rung (see the module docstring for the exact rules); the
    defaults and allowed ranges are the scheduler settings' (`tune_dfrl.config.settings.SchedulerSettings`)."""

    mode: str = SchedulerSettings.name  # "paired_asha" | "race"
    eta: float = SchedulerSettings.eta  # paired_asha keeps the top ceil(n/eta) arms by mean paired delta (at least 1)
    confidence: float = SchedulerSettings.confidence  # two-sided level of the paired t-interval of (candidate - leader)
    min_seeds: int = SchedulerSettings.min_seeds  # fewer common seeds than this -> always keep
    grace_fraction: float = (
        SchedulerSettings.grace_fraction
    )  # milestones before this fraction of the last are not rungs

    def __post_init__(self) -> None:
        check_value("scheduler.name", self.mode, Options(PAIRED_SCHEDULERS))
        check_declared(self, "scheduler.", SchedulerSettings)

    @classmethod
    def of(cls, settings: SchedulerSettings) -> RungRule:
        """The rule of a paired scheduler's settings (`name` paired_asha or race)."""
        return cls(settings.name, settings.eta, settings.confidence, settings.min_seeds, settings.grace_fraction)

    def rungs(self, milestones: Sequence[int]) -> tuple[int, ...]:
        """Rung steps: the milestones m before the last one (L) with m / L >= grace_fraction."""
        ordered = sorted(set(milestones))
        if not ordered or ordered[0] <= 0:
            raise ValueError(f"milestones must be positive training steps; got {list(milestones)}")
        return tuple(step for step in ordered[:-1] if step / ordered[-1] >= self.grace_fraction)


@dataclass(frozen=True)
class RungDecision:
    keep: bool
    reason: str  # human-readable, logged
    leader: str | None  # arm id of the rung leader (highest mean paired delta)


AGAINST_LEADER = "against the leader"  # the words of a reason that the readers complete with the leader's name


def name_leader(reason: str, leader: str | None) -> str:
    """A rung reason as a person reads it: the leader named by `leader` (its label), e.g. "80% interval of Δ against
    the leader difffilter(high=0.1) [-4.37, -2.13] over 6 seeds, below 0"; unchanged without a leader."""
    if not leader or AGAINST_LEADER not in reason:
        return reason
    return reason.replace(AGAINST_LEADER, f"{AGAINST_LEADER} {leader}", 1)


def _check_deltas(candidate: str, deltas: Mapping[str, Mapping[int, float]]) -> None:
    if candidate not in deltas:
        raise ValueError(f"candidate arm {candidate!r} has no deltas at this rung; arms present: {sorted(deltas)}")
    for arm, by_seed in deltas.items():
        if not by_seed:
            raise ValueError(f"arm {arm!r} has no seeds at this rung; every arm passed needs >= 1 paired delta")
        for seed, value in by_seed.items():
            if not math.isfinite(value):
                raise ValueError(f"paired delta of arm {arm!r} at seed {seed} is {value}; deltas must be finite")


def rank_arms(deltas: Mapping[str, Mapping[int, float]]) -> list[str]:
    """Arm ids ordered by (-mean delta over the arm's own seeds, arm id); the first is the leader."""
    means = {arm: math.fsum(by_seed.values()) / len(by_seed) for arm, by_seed in deltas.items()}
    return sorted(deltas, key=lambda arm: (-means[arm], arm))


def decide(candidate: str, deltas: Mapping[str, Mapping[int, float]], rule: RungRule) -> RungDecision:
    """Pure. Keep or stop `candidate` given `deltas[arm][seed]` (arm - control, points) of every arm at the rung."""
    _check_deltas(candidate, deltas)
    order = rank_arms(deltas)
    leader, n = order[0], len(order)
    if n == 1:
        return RungDecision(True, "only arm at this rung", leader)
    if candidate == leader:
        return RungDecision(True, f"leader of {n} arms at this rung", leader)

    rank = order.index(candidate)
    if rule.mode == "paired_asha":
        top = max(1, math.ceil(n / rule.eta))
        if rank < top:
            return RungDecision(True, f"rank {rank + 1} of {n}, within the top {top} (eta={rule.eta:g})", leader)

    common = sorted(set(deltas[candidate]) & set(deltas[leader]))
    if len(common) < rule.min_seeds:
        seeds = "seed" if len(common) == 1 else "seeds"
        return RungDecision(
            True, f"only {len(common)} {seeds} in common with the leader < min_seeds={rule.min_seeds}", leader
        )
    diffs = np.array([deltas[candidate][s] - deltas[leader][s] for s in common], dtype=np.float64)
    low, high = (float(end) for end in paired_interval(diffs.mean(), diffs.std(ddof=1), diffs.size, rule.confidence))
    interval = (
        f"{rule.confidence:.0%} interval of Δ {AGAINST_LEADER} [{low:+.3g}, {high:+.3g}] over {len(common)} seeds"
    )
    if high < 0.0:
        return RungDecision(False, f"{interval}, below 0", leader)
    return RungDecision(True, f"{interval}, not below 0", leader)


CONTINUE, WAIT, STOP = "continue", "wait", "stop"
SCORE, RETRY_FAILED = "score", "retry_failed"  # events of a book's log, with FAILED (`RungBook.apply`)
BOOK_EVENTS = (SCORE, FAILED, RETRY_FAILED)


@dataclass(frozen=True)
class ArmDecision:
    """One rung decision: arm `arm` at rung step `rung`, with the seeds it was decided on."""

    arm: str
    rung: int
    seeds: tuple[int, ...]
    decision: RungDecision


class RungBook:
    """Pure per-arm rung bookkeeping over a `PairedLedger`: scores in, rung decisions and per-trial actions out.

    For a searched arm A at rung r, the decision waits until A has a score at r for every seed of the search and
    the control has a score at r for those same seeds (seeds whose trial failed, for A or for the control, are
    left out). Then d[A][s] = score(A, s, r) - score(control, s, r) and `decide(A, deltas_r, rule)` decides once,
    where deltas_r holds every arm decided at r before A (asynchronous ASHA), A itself, and the control with d = 0
    at each of its seeds, so an arm whose interval lies below uniform GRPO stops too. The control is never stopped and
    never waits. An arm left with no seed to pair (its own trials, or the control's, all failed) is stopped at
    once, so no trial waits for a decision that can never be made."""

    def __init__(self, rule: RungRule, rungs: Iterable[int], control: str, seeds: Iterable[int]) -> None:
        self.rule = rule
        self.rungs = tuple(sorted(rungs))
        self.control = control
        self.seeds = tuple(seeds)
        # The same events as the searcher's ledger, folded in the order Tune tells the scheduler (see PairedRepeater).
        self.ledger = PairedLedger(control)  # scores (first of a milestone kept) and the failed cells
        self.decisions: dict[tuple[str, int], ArmDecision] = {}  # (arm, rung) -> decision
        self._decided_at: dict[int, list[str]] = {rung: [] for rung in self.rungs}  # rung -> arms, in order

    def apply(self, event: Mapping[str, Any]) -> list[ArmDecision]:
        """One event of the book's log: {"event": "score", arm, seed, step, score} (`observe`), {"event": "failed",
        arm, seed} (`fail`) or {"event": "retry_failed"}; the book is the fold of its events, in order."""
        kind = event["event"]
        if kind == SCORE:
            return self.observe(event["arm"], event["seed"], event["step"], event["score"])
        if kind == FAILED:
            return self.fail(event["arm"], event["seed"])
        if kind == RETRY_FAILED:
            return self.retry_failed()
        raise ValueError(f"unknown rung book event {kind!r}; known: {SCORE}, {FAILED}, {RETRY_FAILED}")

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

    def retry_failed(self) -> list[ArmDecision]:
        """Forget the failed seeds and the decisions that had no seed to pair (a resume runs those cells again);
        return the decisions this made possible (every change of the book is followed by its decisions, so a score
        recorded again changes nothing)."""
        for arm in self.ledger.arms():
            for seed in self.ledger.seeds_ended(arm, FAILED):
                self.ledger.reopen(arm, seed)
        self.decisions = {key: d for key, d in self.decisions.items() if d.seeds}
        return self._decide_ready()

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
