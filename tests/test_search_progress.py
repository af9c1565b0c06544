"""Live progress: the leader is the arm with the highest paired lower bound, not the best mean."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest

from tune_dfrl.progress import Progress
from tune_dfrl.rungs import ArmDecision, RungDecision


def trial(arm_id: str, label: str, seed: int, step: int, db: float) -> SimpleNamespace:
    return SimpleNamespace(
        config={"arm": {"arm_id": arm_id, "label": label}, "seed": seed},
        last_result={"step": step, "final": step == 30, "score/db": db},
        local_path="/tmp/t",
    )


def test_leader_by_paired_lower_bound_and_concise_lines() -> None:
    out = io.StringIO()
    p = Progress(control_id="C", metric="score/db", total_cells=12, last_step=30, confidence=0.95, stream=out)
    control = {0: 40.0, 1: 50.0, 2: 60.0}
    steady = {0: 41.0, 1: 51.1, 2: 60.9}  # deltas 1.0, 1.1, 0.9: mean 1.0, tight interval
    noisy = {0: 46.0, 1: 48.0, 2: 65.0}  # deltas 6, -2, 5: mean 3.0, wide interval
    for arm, label, scores in (("C", "baseline", control), ("S", "steady", steady), ("N", "noisy", noisy)):
        for seed, db in scores.items():
            p.on_trial_complete(0, [], trial(arm, label, seed, 30, db))
    lead = p.leader()
    assert lead.arm == "S" and lead.seeds == (0, 1, 2) and lead.mean == pytest.approx(1.0)
    # 95% paired t-interval of (1.0, 1.1, 0.9): 1.0 +- 4.303 * 0.1 / sqrt(3)
    assert lead.low == pytest.approx(1.0 - 4.302653 * 0.1 / np.sqrt(3), abs=1e-5)
    p.on_trial_start(0, [], trial("D", "dropped", 0, 10, 30.0))
    p.note_decision(ArmDecision("D", 10, (0, 1, 2), RungDecision(False, "credibly worse than the leader 'S'", "S")))
    p.on_trial_complete(0, [], trial("D", "dropped", 0, 10, 30.0))
    lines = out.getvalue().splitlines()
    assert lines[-2].startswith("[9/12 cells] | stopped arm dropped at step 10: credibly worse than the leader steady")
    assert lines[-1].startswith("[10/12 cells] | dropped seed 0 stopped at step 10 | 1 arm stopped")
    assert lines[-1].endswith("leader by 95% paired lower bound: steady Δ=+1.00 [+0.75, +1.25] (3 seeds)")


def test_a_resumed_search_names_an_arm_stopped_before_its_trials_start_by_its_label() -> None:
    """On `resume=true retry_failed=true` the rung book's replay may stop an arm before any trial of this attempt
    started: the driver builds the progress line with the labels of results.jsonl, so the line names it."""
    out = io.StringIO()
    p = Progress("C", "score/db", total_cells=4, last_step=30, stream=out, labels={"C": "baseline", "D": "dropped"})
    p.note_decision(ArmDecision("D", 10, (0, 1), RungDecision(False, "credibly worse than the control 'C'", None)))
    assert out.getvalue().splitlines() == [
        "[0/4 cells] | stopped arm dropped at step 10: credibly worse than the control baseline | 1 arm stopped"
    ]
