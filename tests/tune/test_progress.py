"""Live progress: the leader is the arm with the highest paired lower bound, not the best mean."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.paired.ledger import FINISHED, STOPPED, PairedLedger
from tune_dfrl.paired.rungs import ArmDecision, RungBook, RungDecision, RungRule
from tune_dfrl.tune.progress import Progress


def trial(arm_id: str, label: str, seed: int, step: int, db: float) -> SimpleNamespace:
    return SimpleNamespace(
        config={"arm": {"arm_id": arm_id, "label": label}, "seed": seed},
        last_result={"step": step, "final": step == 30, "score/db": db},
        local_path="/tmp/t",
    )


class Searcher:
    """The part of `PairedRepeater` the progress line reads, told of each trial's end as Ray Tune tells it (before
    its callbacks)."""

    def __init__(self, control: str) -> None:
        self.ledger = PairedLedger(control)
        self.arms: dict[str, ArmSpec] = {}

    def ended(self, trial: SimpleNamespace) -> None:
        arm, seed, result = trial.config["arm"], trial.config["seed"], trial.last_result
        self.arms.setdefault(arm["arm_id"], ArmSpec("m", {}, arm["arm_id"], arm["label"]))
        self.ledger.record(arm["arm_id"], seed, result["step"], result["score/db"])
        self.ledger.end(arm["arm_id"], seed, FINISHED if result["final"] else STOPPED)


def test_leader_by_paired_lower_bound_and_concise_lines() -> None:
    out, searcher = io.StringIO(), Searcher("C")
    book = RungBook(RungRule(mode="race"), rungs=[10], control="C", seeds=[0, 1, 2])
    p = Progress(searcher, book, metric="score/db", total_cells=12, last_step=30, confidence=0.95, stream=out)
    control = {0: 40.0, 1: 50.0, 2: 60.0}
    steady = {0: 41.0, 1: 51.1, 2: 60.9}  # deltas 1.0, 1.1, 0.9: mean 1.0, tight interval
    noisy = {0: 46.0, 1: 48.0, 2: 65.0}  # deltas 6, -2, 5: mean 3.0, wide interval
    for arm, label, scores in (("C", "baseline", control), ("S", "steady", steady), ("N", "noisy", noisy)):
        for seed, db in scores.items():
            searcher.ended(trial(arm, label, seed, 30, db))
            p.on_trial_complete(0, [], trial(arm, label, seed, 30, db))
    lead = p.leader()
    assert lead.arm == "S" and lead.seeds == (0, 1, 2) and lead.mean == pytest.approx(1.0)
    # 95% paired t-interval of (1.0, 1.1, 0.9): 1.0 +- 4.303 * 0.1 / sqrt(3)
    assert lead.low == pytest.approx(1.0 - 4.302653 * 0.1 / np.sqrt(3), abs=1e-5)
    searcher.arms["D"] = ArmSpec("m", {}, "D", "dropped")  # suggested, started
    book.decisions[("D", 10)] = dropped = ArmDecision(
        "D",
        10,
        (0, 1, 2),
        RungDecision(False, "80% interval of Δ against the leader [-9, -8] over 3 seeds, below 0", "S"),
    )
    p.note_decision(dropped)
    searcher.ended(trial("D", "dropped", 0, 10, 30.0))
    p.on_trial_complete(0, [], trial("D", "dropped", 0, 10, 30.0))
    lines = out.getvalue().splitlines()
    # one line per stopped arm: its seeds end quietly
    assert lines[-1].startswith(
        "[9/12 cells] | stopped arm dropped at step 10: 80% interval of Δ against the leader steady [-9, -8] over 3 "
        "seeds, below 0 | 1 arm stopped"
    )
    assert "credibl" not in out.getvalue() and "'S'" not in out.getvalue()
    assert not any("seed 0 stopped at step 10" in line for line in lines)
    assert lines[-1].endswith(
        "leader by 95% paired lower bound above the control: steady Δ=+1.00 [+0.75, +1.25] (3 seeds, unadjusted)"
    )


def test_the_control_leads_when_no_lower_bound_is_above_it() -> None:
    out, searcher = io.StringIO(), Searcher("C")
    p = Progress(searcher, None, metric="score/db", total_cells=6, last_step=30, confidence=0.95, stream=out)
    control = {0: 40.0, 1: 50.0, 2: 60.0}
    behind = {0: 38.0, 1: 51.0, 2: 59.0}  # deltas -2, 1, -1: the interval holds 0
    for arm, label, scores in (("C", "baseline", control), ("B", "behind", behind)):
        for seed, db in scores.items():
            searcher.ended(trial(arm, label, seed, 30, db))
            p.on_trial_complete(0, [], trial(arm, label, seed, 30, db))
    last = out.getvalue().splitlines()[-1]
    assert "the control leads: no arm's 95% paired lower bound is above the control yet (highest: behind" in last
    assert "leader by" not in last
