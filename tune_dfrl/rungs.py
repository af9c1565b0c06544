"""The rung decision of the paired scheduler: paired deltas in, keep or stop one arm out.

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
- credibly worse: the interval lies entirely below 0.

Rules (checked in order; the first that applies decides):

1. the candidate is the only arm at the rung, or the leader -> keep;
2. `paired_asha` only: rank < max(1, ceil(n / eta)) -> keep (top 1/eta promotion);
3. fewer than `min_seeds` common seeds with the leader -> keep (no paired evidence yet);
4. credibly worse than the leader -> stop, otherwise keep.

So `race` stops exactly the credibly-worse arms, and `paired_asha` additionally protects the
top ceil(n/eta) arms even when they are credibly worse than the leader.

The defaults, declared once in `tune_dfrl.settings.SchedulerSettings`, were chosen with
benchmarks/search_decisions.py (docs/readme_decisions.md): without a grace period the earliest,
most misleading milestones stopped the truly best arm in about 1 campaign of 5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tune_dfrl.settings import PAIRED_SCHEDULERS, OneOf, SchedulerSettings, check_fields, checked
from tune_dfrl.stats import paired_interval


@dataclass(frozen=True)
class RungRule:
    """How the paired scheduler decides at a rung (see the module docstring for the exact rules); the
    defaults and allowed ranges are the scheduler settings' (`tune_dfrl.settings.SchedulerSettings`)."""

    mode: str = SchedulerSettings.name  # "paired_asha" | "race"
    eta: float = SchedulerSettings.eta  # paired_asha keeps the top ceil(n/eta) arms by mean paired delta (at least 1)
    confidence: float = SchedulerSettings.confidence  # two-sided level of the paired t-interval of (candidate - leader)
    min_seeds: int = SchedulerSettings.min_seeds  # fewer common seeds than this -> always keep
    grace_fraction: float = (
        SchedulerSettings.grace_fraction
    )  # milestones before this fraction of the last are not rungs

    def __post_init__(self) -> None:
        checked("scheduler.name", self.mode, OneOf(PAIRED_SCHEDULERS))
        check_fields(self, SchedulerSettings, "scheduler.")

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
        return RungDecision(
            True, f"{len(common)} common seeds with leader {leader!r} < min_seeds={rule.min_seeds}", leader
        )
    diffs = np.array([deltas[candidate][s] - deltas[leader][s] for s in common], dtype=np.float64)
    low, high = (float(end) for end in paired_interval(diffs.mean(), diffs.std(ddof=1), diffs.size, rule.confidence))
    interval = (
        f"{rule.confidence:.0%} interval of (candidate - {leader!r}) over {len(common)} seeds [{low:.3g}, {high:.3g}]"
    )
    if high < 0.0:
        return RungDecision(False, f"credibly worse than the leader: {interval}", leader)
    return RungDecision(True, f"not credibly worse than the leader: {interval}", leader)
