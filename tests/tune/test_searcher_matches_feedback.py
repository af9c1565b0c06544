"""The Ray Tune / Optuna glue (`PairedRepeater`) tells Optuna exactly what the pure rule (`OptunaFeedback`) decides.

Scripted campaigns: the control and three arms on three seeds, each arm finishing, stopped by the
scheduler at a milestone (its last result arriving with the trial's end, or before it) or losing a
seed to a failure; the cells' events interleaved at random. The same events drive the pure rule on
its own ledger and the searcher with a real `OptunaSearch` whose calls are recorded: the calls must
be, decision for decision and in order, the rule's events, and the study's trial states its outcomes.
"""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from ray.tune.search.optuna import OptunaSearch

from tune_dfrl.paired.feedback import COMPLETE, FAIL, INTERMEDIATE, OptunaFeedback, Told
from tune_dfrl.paired.ledger import PairedLedger
from tune_dfrl.tune.searcher import INNER_METRIC, PairedRepeater
from tune_dfrl.tune.spaces import ArmFactory, SearchSpace

SEEDS = (0, 1, 2)
STEPS = (10, 20, 30)
METRIC = "score/db"


class RecordingSearch(OptunaSearch):
    """A real OptunaSearch that records what it is told."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.calls.append((trial_id, INTERMEDIATE, result[INNER_METRIC], result["training_iteration"]))
        super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.calls.append((trial_id, "end", None if result is None else result[INNER_METRIC], error))
        super().on_trial_complete(trial_id, result, error)


def cell_script(rng: np.random.Generator, fate: str, seed: int) -> list[tuple]:
    """The events of one cell: ("result", step, score)... then ("end", error, last) with `last` (step, score) or None."""
    scores = {step: float(40 + 5 * seed + rng.normal(0, 2) + step / 10) for step in STEPS}
    if fate == "finish":
        return [("result", step, scores[step]) for step in STEPS] + [("end", False, (30, scores[30]))]
    if fate == "fail" and seed == 1:
        return [("result", 10, scores[10]), ("end", True, None)]
    if fate.startswith("stop"):  # stopped at step 20; the stopping result may come only with the end
        reported = [("result", step, scores[step]) for step in (10, 20)]
        return (
            reported[:-1] + [("end", False, (20, scores[20]))]
            if fate == "stop_late"
            else reported + [("end", False, None)]
        )
    return [("result", step, scores[step]) for step in STEPS] + [("end", False, None)]


def expected_calls(told: list[Told], inner: dict[str, str]) -> list[tuple]:
    out = []
    for event in told:
        if event.state == INTERMEDIATE:
            out.append((inner[event.arm], INTERMEDIATE, event.value, event.step))
        else:
            out.append((inner[event.arm], "end", event.value, event.state == FAIL))
    return out


@pytest.mark.parametrize("campaign", range(12))
def test_the_searcher_tells_optuna_what_the_pure_rule_decides(campaign: int) -> None:
    rng = np.random.default_rng(campaign)
    space = SearchSpace.load("topk_keep", rollout_n=8)
    storage = optuna.storages.InMemoryStorage()
    inner_search = RecordingSearch(
        space=space.sampler(),
        metric=INNER_METRIC,
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=campaign),
        storage=storage,
        study_name="s",
    )
    factory = ArmFactory(rollout_n=8, recipe_hash="r0")
    control = factory({"method": "baseline", "params": {}})
    searcher = PairedRepeater(inner_search, factory, control, SEEDS, n_arms=3, final_step=max(STEPS), metric=METRIC)
    handed = [(f"t{i}", searcher.suggest(f"t{i}")) for i in range(12)]
    arms = list(dict.fromkeys(cfg["arm"]["arm_id"] for _, cfg in handed))
    fates = dict(zip(arms, ["finish", *rng.choice(["finish", "stop", "stop_late", "fail"], size=3)]))
    rule = OptunaFeedback(PairedLedger(control.arm_id), SEEDS, max(STEPS))
    for arm in arms[1:]:
        rule.add(arm)

    scripts = {tid: cell_script(rng, fates[cfg["arm"]["arm_id"]], cfg["seed"]) for tid, cfg in handed}
    cells = {tid: (cfg["arm"]["arm_id"], cfg["seed"]) for tid, cfg in handed}
    told: list[Told] = []
    while any(scripts.values()):
        tid = rng.choice([tid for tid, events in scripts.items() if events])
        kind, *event = scripts[tid].pop(0)
        if kind == "result":
            searcher.on_trial_result(tid, {"step": event[0], METRIC: event[1]})
            told += rule.result(*cells[tid], *event)
        else:
            error, last = event
            searcher.on_trial_complete(tid, None if last is None else {"step": last[0], METRIC: last[1]}, error=error)
            told += rule.end(*cells[tid], error, last)

    inner = {arm: ids[0] for arm, ids in searcher._optuna_ids.items()}
    assert inner_search.calls == expected_calls(told, inner)
    assert set(rule.outcome) == set(arms[1:])  # every arm's outcome was told
    trials = {t.number: t for t in optuna.load_study(study_name="s", storage=storage).trials}
    for arm in arms[1:]:
        trial = trials[int(inner[arm].removeprefix("arm"))]
        assert trial.state.name == rule.outcome[arm].state
        assert trial.intermediate_values == pytest.approx(rule.intermediate[arm])
        if rule.outcome[arm].state == COMPLETE:
            assert trial.value == pytest.approx(rule.outcome[arm].value)
