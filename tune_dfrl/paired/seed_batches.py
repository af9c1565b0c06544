"""seeds=auto: which seeds each arm is handed, and the looks that decide it (pure bookkeeping, no Ray).

Every arm and the control start on seeds 0..start-1 (`SequentialRule.looks()[0]`). When every
cell handed out so far has ended and no further arm will be suggested, the searcher asks for a
look: `SeedBatches.look` reads the final-step paired deltas of each searched arm from the
`PairedLedger` (over the seeds handed to it, in seed order) and applies `sequential.look`. Arms out
of the running get no verdict: an arm with a cell stopped by the rung scheduler, or with fewer
paired deltas than the look needs (a failed cell). The family size K is every searched arm. After
look k with n_k seeds, the arms still open and the control are handed seeds n_k..n_{k+1}-1 (the
same seeds: paired); the search ends when no arm is open (`is_settled`) or at the last look (max).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tune_dfrl.paired.ledger import STOPPED, PairedLedger
from tune_dfrl.paired.sequential import (
    ArmState,
    SequentialRule,
    boundaries,
    is_settled,
    look,
    nominal_levels,
    recommendation,
)

OUT_STOPPED, OUT_FAILED = "stopped by the scheduler", "a seed without a paired final score"


@dataclass(frozen=True)
class Look:
    """One look: `seeds` paired seeds per arm in the running, the boundary at level alpha / K (before Holm
    recycling), each arm's state, the arms out of the running (why), and the seeds handed out after it."""

    number: int  # 1-based
    seeds: int  # n_k
    boundary: float  # z boundary c_k of an arm tested at alpha / K
    level: float  # its two-sided nominal p-value threshold p_k = 2 (1 - Φ(c_k))
    states: dict[str, ArmState]
    out: dict[str, str]
    handed: dict[str, tuple[int, ...]]  # arm (control included) -> every seed handed to it so far
    next_seeds: tuple[int, ...]  # handed to the open arms and the control after this look; () at the end


class SeedBatches:
    """The seeds handed to each arm under `rule`, and the looks so far."""

    def __init__(self, rule: SequentialRule, control: str) -> None:
        self.rule = rule
        self.control = control
        self.looks: list[Look] = []
        self._added: dict[str, list[int]] = {}  # arm -> seeds handed after the starting ones

    def seeds_of(self, arm: str) -> tuple[int, ...]:
        """Every seed handed to `arm`: the starting seeds, then its batches."""
        return tuple(range(self.rule.start)) + tuple(self._added.get(arm, ()))

    @property
    def finished(self) -> bool:
        """No seed will be handed out again."""
        return bool(self.looks) and not self.looks[-1].next_seeds

    def look(self, ledger: PairedLedger, arms: Sequence[str], final_step: int) -> Look:
        """The next look at the searched `arms` (the control excluded); hands the next batch to the open arms."""
        if self.finished:
            raise ValueError(f"the sequential search ended at look {len(self.looks)}; there is no further look")
        counts, number = self.rule.looks(), len(self.looks) + 1
        previous = self.looks[-1].states if self.looks else {}
        running = [arm for arm in arms if arm not in previous or previous[arm].status == "open"]
        out = dict(self.looks[-1].out) if self.looks else {}
        deltas = {}
        for arm in running:
            if arm in out:
                continue
            paired = ledger.paired_deltas(arm, final_step, self.seeds_of(arm))
            if STOPPED in ledger.ends(arm).values():
                out[arm] = OUT_STOPPED
            elif len(paired) < counts[number - 1]:
                out[arm] = OUT_FAILED
            else:
                deltas[arm] = [paired[s] for s in sorted(paired)]
        states = look(deltas, previous, self.rule, max(len(arms), 1), number)
        open_arms = [arm for arm, state in states.items() if state.status == "open"]
        new = () if number == len(counts) or is_settled(states) else tuple(range(counts[number - 1], counts[number]))
        for arm in [self.control, *open_arms] if new else []:
            self._added.setdefault(arm, []).extend(new)
        arm_alpha = self.rule.alpha / max(len(arms), 1)
        boundary = boundaries(tuple(n / self.rule.max for n in counts), arm_alpha)[number - 1]
        handed = {arm: self.seeds_of(arm) for arm in [self.control, *arms]}
        self.looks.append(
            Look(
                number,
                counts[number - 1],
                boundary,
                nominal_levels(self.rule, arm_alpha)[number - 1],
                states,
                out,
                handed,
                new,
            )
        )
        return self.looks[-1]

    def history(self) -> dict:
        """The looks as JSON-able data (OUT/sequential.json), with the recommendation after the last one."""
        states = self.looks[-1].states if self.looks else {}
        return {
            "rule": asdict(self.rule),
            "control": self.control,
            "looks": [asdict(look) for look in self.looks],
            "finished": self.finished,
            "recommended": recommendation(states, self.control),
        }
