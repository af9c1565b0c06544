"""PairedLedger: one duplicate rule, paired deltas over common seeds, the interval of stats.paired_interval."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from tune_dfrl.paired.feedback import OptunaFeedback
from tune_dfrl.paired.ledger import FAILED, FINISHED, STOPPED, PairedLedger, estimate_of
from tune_dfrl.paired.rungs import RungBook, RungRule
from tune_dfrl.report.analysis import analyze
from tune_dfrl.report.scores import load_results
from tune_dfrl.state.records import append_record, milestone_record, read_records
from tune_dfrl.tune.progress import Progress
from tune_dfrl.tune.results_log import ResultsLog


def _ledger() -> PairedLedger:
    ledger = PairedLedger(control="c")
    for seed, (c, a) in enumerate([(10.0, 12.0), (11.0, 12.5), (9.0, 11.0)]):
        ledger.record("c", seed, 4, c)
        ledger.record("a", seed, 4, a)
    return ledger


def test_first_score_of_a_milestone_is_kept():
    ledger = _ledger()
    assert ledger.record("a", 0, 4, 99.0) is False
    assert ledger.scores("a", 4)[0] == 12.0
    assert ledger.record("a", 0, 8, 13.0) is True
    assert ledger.reached("a", 0) == 8 and ledger.reached("a", 5) == 0


def test_paired_deltas_use_only_common_seeds_and_a_seed_filter():
    ledger = _ledger()
    ledger.record("a", 7, 4, 50.0)  # no control at seed 7: not paired
    assert ledger.paired_deltas("a", 4) == {0: 2.0, 1: 1.5, 2: 2.0}
    assert ledger.paired_deltas("a", 4, seeds=[1, 2, 7]) == {1: 1.5, 2: 2.0}
    assert ledger.paired_deltas("a", 8) == {}


def test_estimate_is_the_paired_t_interval():
    est = _ledger().estimate("a", 4, 0.9)
    d = np.array([2.0, 1.5, 2.0])
    half = sps.t.ppf(0.95, 2) * d.std(ddof=1) / math.sqrt(3)
    assert est.seeds == (0, 1, 2) and est.mean == pytest.approx(d.mean())
    assert (est.low, est.high) == pytest.approx((d.mean() - half, d.mean() + half))


def test_estimate_without_spread_is_bounded_by_the_sign_flip_test():
    three = estimate_of("a", 4, {0: 1.0, 1: 1.0, 2: 1.0}, 0.95)  # smallest sign-flip p with 3 seeds: 0.25
    assert three.low == -math.inf and three.high == math.inf
    eight = estimate_of("a", 4, {s: 1.0 for s in range(8)}, 0.95)  # 2^-7 < 0.05
    assert eight.low == eight.high == 1.0
    one = estimate_of("a", 4, {0: 1.0}, 0.95)
    assert one.mean == 1.0 and math.isnan(one.low)


def test_ends_are_checked_and_can_be_reopened():
    ledger = _ledger()
    ledger.end("a", 0, FINISHED)
    ledger.end("a", 1, STOPPED)
    ledger.end("a", 2, FAILED)
    assert ledger.ends("a") == {0: FINISHED, 1: STOPPED, 2: FAILED}
    assert ledger.seeds_ended("a", FAILED) == {2}
    ledger.reopen("a", 2)
    assert ledger.ends("a") == {0: FINISHED, 1: STOPPED}
    with pytest.raises(ValueError, match="finished | stopped | failed"):
        ledger.end("a", 0, "done")
    assert ledger.arms() == ["c", "a"]


# -- every consumer reads through the one duplicate rule ------------------------------------------------------------


def test_a_repeated_milestone_keeps_its_first_score_in_every_consumer(tmp_path):
    """A resumed trial re-reports milestones with other values: the results log, the scheduler's book, the searcher's
    feedback to Optuna (the ledger the progress line reads) and the report (reading a log that holds the repeats)
    all keep the first score."""
    seeds, steps = (0, 1, 2), (10, 20)
    first = {("c", s, t): 40.0 + s + t / 10 for s in seeds for t in steps}
    first |= {("a", s, t): first[("c", s, t)] + 1.0 + 0.5 * s for s in seeds for t in steps}  # deltas 1, 1.5, 2
    again = {("a", 0, t): 90.0 for t in steps}  # seed 0 of arm a, reported again with other values

    def result(arm, seed, step, score):
        trial = SimpleNamespace(
            config={"arm": {"arm_id": arm, "label": arm, "method": "m", "params": {}}, "seed": seed},
            local_path="/tmp/t",
        )
        trial.last_result = {"step": step, "final": step == steps[-1], "threads": 1, "score/db": score, "acc/b": score}
        return trial, trial.last_result

    stream = [(*key, score) for key, score in first.items()] + [(*key, score) for key, score in again.items()]
    log = ResultsLog(tmp_path / "results.jsonl", tmp_path / "failures.jsonl", "score/db")
    book = RungBook(RungRule(mode="race"), rungs=[10], control="c", seeds=seeds)
    feedback = OptunaFeedback(PairedLedger("c"), seeds, final_step=steps[-1])
    feedback.add("a")
    progress = Progress(SimpleNamespace(ledger=feedback.ledger, arms={}), book, "score/db", 6, steps[-1])
    for arm, seed, step, score in stream:
        trial, res = result(arm, seed, step, score)
        log.on_trial_result(0, [], trial, res)
        book.observe(arm, seed, step, score)
        feedback.result(arm, seed, step, score)
    written = read_records(tmp_path / "results.jsonl")
    assert len(written) == len(first)
    assert {(r["arm_id"], r["seed"], r["step"]): r["accuracy"]["b"] for r in written} == first
    assert book.ledger.paired_deltas("a", 10) == {0: 1.0, 1: 1.5, 2: 2.0}
    assert progress.leader().mean == pytest.approx(1.5)
    assert feedback.intermediate["a"] == {10: pytest.approx(1.5)}  # what Optuna was told at step 10

    # A log written before the rule holds the repeats after the first lines: the report uses the first.
    for (arm, seed, step), score in again.items():
        trial, res = result(arm, seed, step, score)
        append_record(tmp_path / "results.jsonl", milestone_record(trial.config["arm"], seed, res))
    (tmp_path / "benchmarks.json").write_text(json.dumps([{"name": "b", "domain": "math", "items": 100}]))
    table = load_results(tmp_path)
    assert any("2 milestone(s) reported more than once" in note for note in table.notes)
    summary = analyze(table, "c", ["db"], flip_k=1)
    assert summary.arms["a"]["db"].delta == pytest.approx(1.5)
    assert {p.step: p.delta for p in summary.curves["a"]} == pytest.approx({10: 1.5, 20: 1.5})
