"""The decision benchmark's machinery: calibration, simulation, the schedulers it compares, its output."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from decisions_helpers import load_benchmark
from scipy import stats

from tune_dfrl.paired.rungs import RungRule
from tune_dfrl.report.scores import dataflex_benchmarks


@pytest.fixture(scope="module")
def bench():
    return load_benchmark()


def test_calibration_pools_paired_and_seed_spread_hand_computed(bench, tmp_path):
    # Every benchmark of a run gets the same accuracy, so db = that value.
    # Slice main: baseline [50, 52, 54] (var 4); topk [51, 52, 56] -> deltas [1, 0, 2] (var 1).
    # Slice mixer: static [40, 40, 43] (var 3); tscl [40, 41, 43] -> deltas [0, 1, 0] (var 1/3).
    # paired sd = sqrt((2*1 + 2/3) / 4) = sqrt(2/3); seed sd = sqrt((2*4 + 2*3) / 4) = sqrt(3.5).
    runs = [
        ("main", "baseline", [50, 52, 54]),
        ("main", "topk", [51, 52, 56]),
        ("mixer", "static", [40, 40, 43]),
        ("mixer", "tscl", [40, 41, 43]),
    ]
    benchmarks = dataflex_benchmarks().names
    rows = [
        {"campaign": campaign, "model": "m", "method": method, "seed": seed + 1, "regime": None}
        | dict.fromkeys(benchmarks, float(value))
        for campaign, method, values in runs
        for seed, value in enumerate(values)
    ]
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    calibration = bench.estimate_calibration(path)
    assert calibration.paired_sd == pytest.approx(math.sqrt(2 / 3))
    assert calibration.seed_sd == pytest.approx(math.sqrt(3.5))
    assert (calibration.cells, calibration.slices) == (2, 2)


def test_calibration_of_the_real_run_table(bench):
    calibration = bench.estimate_calibration()
    assert (calibration.cells, calibration.slices) == (45, 12)
    assert 1.0 < calibration.paired_sd < 4.0 and 0.3 < calibration.seed_sd < 3.0


def test_simulation_is_calibrated_and_seeded(bench):
    model = bench.CampaignModel(paired_sd=2.0, seed_sd=1.0, seeds=8, milestones=5)
    effects = (3.0, 0.0, -2.0)
    scores = bench.simulate_scores(effects, model, 4000, np.random.default_rng(1))
    assert scores.shape == (4000, 4, 8, 5)
    final_deltas = scores[:, 1:, :, -1] - scores[:, :1, :, -1]
    assert final_deltas.mean(axis=(0, 2)) == pytest.approx(effects, abs=0.05)
    assert final_deltas.std(axis=2, ddof=1).mean() == pytest.approx(2.0, rel=0.05)
    assert scores[:, 0, :, -1].std(axis=1, ddof=1).mean() == pytest.approx(math.sqrt(1.0 + 2.0**2 / 2), rel=0.05)
    # Early milestones are noisier proxies: the first milestone's paired spread is wider.
    first_deltas = scores[:, 1:, :, 0] - scores[:, :1, :, 0]
    assert first_deltas.std(axis=2, ddof=1).mean() > 1.3 * 2.0
    again = bench.simulate_scores(effects, model, 4000, np.random.default_rng(1))
    np.testing.assert_array_equal(scores, again)


def test_bad_campaign_model_is_rejected(bench):
    with pytest.raises(ValueError, match=r"seeds=1 \(allowed: >= 2\); proxy_half=1.5 \(allowed: \(0, 1\]\)"):
        bench.CampaignModel(paired_sd=2.0, seed_sd=1.0, seeds=1, proxy_half=1.5)


def test_rung_placement(bench):
    plan = bench.Plan(rules={}, eta=3.0)
    assert plan.paired_rungs(RungRule(grace_fraction=0.0), 10) == list(range(9))
    assert plan.paired_rungs(RungRule(grace_fraction=0.3), 10) == list(range(2, 9))  # milestones 3..9 of 10
    assert plan.asha_rungs(10) == [0, 2, 8]  # Ray ASHA, grace period 1: milestones 1, 3, 9 of 10


def test_paired_rungs_stop_a_hopeless_arm_at_the_first_rung(bench):
    # One campaign, control + 2 arms, 4 seeds, 3 milestones (rungs at milestones 1 and 2).
    rng = np.random.default_rng(0)
    scores = 50.0 + rng.normal(0.0, 0.1, (1, 3, 4, 3))
    scores[0, 2] -= 50.0
    for keep in (
        bench.rung_rule_keep(RungRule()),
        bench.rung_rule_keep(RungRule(mode="race")),
        bench.wilcoxon_keep(0.1),
    ):
        finished, spent = bench.run_paired_rungs(scores, np.array([[2, 1]]), keep, rungs=range(2))
        np.testing.assert_array_equal(finished, [[True, True, False]])
        assert spent.tolist() == [4 * 3 + 4 * 1 + 4 * 3]  # control, arm 2 stopped after milestone 1, arm 1


def test_wilcoxon_rule_matches_scipy(bench):
    # Candidate (arm 2) is below the leader (arm 1) at 5 of 8 seeds: the exact one-sided p decides.
    diffs = np.array([-3.0, -2.5, -2.0, -1.5, -1.0, 0.4, 0.6, 0.8])
    deltas = np.zeros((1, 3, 8))
    deltas[0, 1] = 5.0
    deltas[0, 2] = 5.0 + diffs
    p = stats.wilcoxon(diffs, alternative="less").pvalue
    present, active = np.ones((1, 3), dtype=bool), np.ones(1, dtype=bool)
    for threshold in (p / 2, p * 2):
        kept = bench.wilcoxon_keep(threshold)(np.array([2]), present, deltas, active)
        assert kept.tolist() == [p >= threshold]


def test_point_asha_promotes_top_one_over_eta_in_arrival_order(bench):
    # Control + 1 arm, 1 seed each, 2 milestones, one rung at milestone 1, eta 3.
    scores = np.array([[[[10.0, 11.0]], [[12.0, 30.0]]]])  # [C=1, A=2, S=1, M=2]
    # The control arrives first (alone: promoted); the arm arrives second, is the top 1 of 2: promoted.
    both = bench.run_point_asha(scores, np.array([[0, 1]]), eta=3.0, rungs=[0])
    assert both.trial_steps.tolist() == [4] and both.winner.tolist() == [1]
    # Arriving in the other order, the control is not in the top 1 of 2 and stops after milestone 1.
    one = bench.run_point_asha(scores, np.array([[1, 0]]), eta=3.0, rungs=[0])
    assert one.trial_steps.tolist() == [3] and one.finished.tolist() == [[False, True]]


@pytest.fixture(scope="module")
def small_model(bench):
    return bench.CampaignModel(paired_sd=2.0, seed_sd=1.0, seeds=6, milestones=4)


def test_grid_spends_everything_and_keeps_everything(bench, small_model):
    plan = bench.Plan(rules={})
    results = bench.run_benchmark(small_model, plan, campaigns=20, seed=3, methods=("grid",))
    for setting, by_method in results.items():
        assert by_method["grid"].compute_frac == 1.0
        if setting != bench.NULL:
            assert by_method["grid"].best_kept == 1.0


def test_huge_true_effect_is_always_kept_and_picked(bench, small_model, monkeypatch):
    monkeypatch.setitem(bench.SETTINGS, "one_winner", (40.0,) + (0.0,) * 5 + (-3.0,))
    monkeypatch.setattr(bench, "SETTINGS", {"one_winner": bench.SETTINGS["one_winner"]})
    plan = bench.Plan(rules={"paired_asha": RungRule(), "race": RungRule(mode="race")})
    results = bench.run_benchmark(small_model, plan, campaigns=30, seed=4)["one_winner"]
    for method in bench.METHODS:
        assert results[method].best_kept == 1.0, method
        assert results[method].picked_best == 1.0, method
        assert results[method].false_winner == 0.0, method
    for method in ("paired_asha", "race", "wilcoxon_leader", "asha_point_best"):
        assert results[method].compute_frac < 1.0, method


def test_same_seed_same_table(bench, small_model):
    plan = bench.Plan(rules={"race": RungRule(mode="race")})
    first = bench.run_benchmark(small_model, plan, campaigns=15, seed=7, methods=("race", "asha_point_best"))
    assert bench.run_benchmark(small_model, plan, campaigns=15, seed=7, methods=("race", "asha_point_best")) == first
    assert bench.run_benchmark(small_model, plan, campaigns=15, seed=8, methods=("race", "asha_point_best")) != first


def test_script_ends_with_the_json_summary(bench, capsys):
    bench.main(["--campaigns", "6", "--seed", "1", "--milestones", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert list(summary) == list(bench.METHODS)
    for values in summary.values():
        assert set(values) == {
            "compute_frac",
            "best_kept",
            "false_winner",
            "null_correct",
            "picked_best",
            "worst_false_winner",
            "worst_compute_frac",
        }
    assert summary["grid"]["compute_frac"] == 1.0 and summary["fixed12"]["compute_frac"] == 1.0
    assert any(line.startswith("target ") and "for sequential vs fixed12" in line for line in lines)
    assert any(line.startswith("| one_winner | paired_asha |") for line in lines)
