"""The Ray-integrated PairedScheduler makes the same stop/continue decisions as the pure rung function.

A scripted run drives `PairedScheduler.on_trial_result` / `choose_trial_to_run` with real Ray Tune
`Trial` objects on scores simulated by the decision benchmark: the control runs first, then each arm
in launch order, its seeds reporting milestone by milestone. Every rung decision the scheduler makes
must equal `tune_dfrl.paired.rungs.decide` on a table built here from the raw scores, and the arms stopped
and the trial-steps spent must equal the benchmark's simulation of the same campaign. Replaying the scheduler's
event log (what a resumed search does) gives back the same decisions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from decisions_helpers import load_benchmark
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from tune_dfrl.config.settings import SchedulerSettings
from tune_dfrl.paired.rungs import ArmDecision, RungRule, decide
from tune_dfrl.tune.scheduler import PairedScheduler, make_scheduler

METRIC = "score/db"
STEPS = (10, 20, 30, 40, 50)  # milestones; with GRACE = 0.4 the rungs are 20, 30, 40
SEEDS = (0, 1, 2, 3)
ETA, CONFIDENCE, GRACE = 3.0, 0.8, 0.4  # passed to both the scheduler and the pure rule


class ScriptedController:
    """The two TuneController calls PairedScheduler makes: list the trials, stop one."""

    def __init__(self, trials: list[Trial]) -> None:
        self.trials = trials

    def get_trials(self) -> list[Trial]:
        return self.trials

    def stop_trial(self, trial: Trial) -> None:
        trial.set_status(Trial.TERMINATED)


def scheduler_of(mode: str, bench, log: Path, on_decision=None) -> PairedScheduler:
    return make_scheduler(
        SchedulerSettings(mode, eta=ETA, confidence=CONFIDENCE, grace_fraction=GRACE),
        metric=METRIC,
        control=bench.CONTROL,
        seeds=SEEDS,
        milestones=STEPS,
        on_decision=on_decision,
        log_path=log,
    )


def scripted_run(
    mode: str, scores: np.ndarray, order: np.ndarray, bench, log: Path
) -> tuple[list[ArmDecision], np.ndarray]:
    """Drive the scheduler (its events logged to `log`) on one campaign's scores [A, S, M]; return its decisions and
    milestones run per arm."""
    decisions: list[ArmDecision] = []
    scheduler = scheduler_of(mode, bench, log, decisions.append)
    n_arms = scores.shape[0]
    trials = {
        (arm, seed): Trial("scripted", config={"arm": {"arm_id": bench.arm_name(arm)}, "seed": seed}, stub=True)
        for arm in range(n_arms)
        for seed in SEEDS
    }
    controller = ScriptedController(list(trials.values()))
    ran = np.zeros(n_arms, dtype=int)
    for arm in [0, *order]:
        for index, step in enumerate(STEPS):
            live = [seed for seed in SEEDS if trials[(arm, seed)].status != Trial.TERMINATED]
            if not live:
                break
            ran[arm] = index + 1
            for seed in live:
                trial = trials[(arm, seed)]
                trial.set_status(Trial.RUNNING)
                result = {"step": step, METRIC: float(scores[arm, seed, index])}
                action = scheduler.on_trial_result(controller, trial, result)
                status = {TrialScheduler.CONTINUE: Trial.RUNNING, TrialScheduler.PAUSE: Trial.PAUSED}
                trial.set_status(status.get(action, Trial.TERMINATED))
            while (resumed := scheduler.choose_trial_to_run(controller)) is not None and resumed.status == Trial.PAUSED:
                resumed.set_status(Trial.RUNNING)
            assert not any(trials[(arm, seed)].status == Trial.PAUSED for seed in SEEDS), "a decided arm left waiting"
    return decisions, ran


def expected_decision(
    decided: ArmDecision, scores: np.ndarray, order: np.ndarray, ran: np.ndarray, bench, rule: RungRule
):
    """decide() on the table built from raw scores: arms launched earlier that reached this rung, the control, the arm."""
    rung = STEPS.index(decided.rung)
    deltas = scores[:, :, rung] - scores[0, :, rung]
    position = list(order).index(int(decided.arm.removeprefix("arm")))
    earlier = [arm for arm in order[:position] if ran[arm] > rung]
    table = {bench.arm_name(arm): dict(enumerate(deltas[arm].tolist())) for arm in [0, *earlier]}
    table[decided.arm] = dict(enumerate(deltas[int(decided.arm.removeprefix("arm"))].tolist()))
    return decide(decided.arm, table, rule)


@pytest.mark.parametrize("mode", ["paired_asha", "race"])
def test_scheduler_decisions_equal_the_pure_function(mode: str, tmp_path: Path) -> None:
    """... and a scheduler that replays the run's event log (a resumed search) holds the same decisions, in order."""
    bench = load_benchmark()
    model = bench.CampaignModel(paired_sd=2.0, seed_sd=1.0, seeds=len(SEEDS), milestones=len(STEPS))
    effects = (2.5, 0.0, 0.0, 0.0, -1.0, -3.0, -6.0)
    rng = np.random.default_rng(11)
    scores = bench.simulate_scores(effects, model, 6, rng)
    orders = rng.permuted(np.tile(np.arange(1, len(effects) + 1), (6, 1)), axis=1)
    rule = RungRule(mode=mode, eta=ETA, confidence=CONFIDENCE, grace_fraction=GRACE)
    rungs = bench.Plan.paired_rungs(rule, len(STEPS))
    assert [STEPS[j] for j in rungs] == [20, 30, 40]
    simulated_finished, simulated_spent = bench.run_paired_rungs(scores, orders, bench.rung_rule_keep(rule), rungs)
    stops = 0
    for c in range(len(scores)):
        log = tmp_path / f"rungs{c}.jsonl"
        decisions, ran = scripted_run(mode, scores[c], orders[c], bench, log)
        assert decisions, "the scheduler made no rung decision"
        replayed = scheduler_of(mode, bench, log)
        replayed.replay()
        assert list(replayed.book.decisions.values()) == decisions
        for decided in decisions:
            assert decided.seeds == SEEDS and decided.rung in (20, 30, 40)
            assert decided.decision == expected_decision(decided, scores[c], orders[c], ran, bench, rule)
        np.testing.assert_array_equal(ran == len(STEPS), simulated_finished[c])
        assert len(SEEDS) * ran.sum() == simulated_spent[c]
        stops += int((ran < len(STEPS)).sum())
    assert 0 < stops < len(effects) * len(scores)  # the script exercises both stopping and continuing
