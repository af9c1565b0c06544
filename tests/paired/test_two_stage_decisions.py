"""The two-stage benchmark (benchmarks/two_stage_decisions.py): screen on a proxy, confirm the top K on the target."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from decisions_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    load_benchmark()  # `import search_decisions` inside the script finds it registered
    return load_benchmark("two_stage_decisions")


@pytest.fixture(scope="module")
def model(bench):
    return bench.one_stage.CampaignModel(paired_sd=2.166, seed_sd=1.005, milestones=4)


def binomial_margin(p: float, n: int) -> float:
    return 3.0 * math.sqrt(p * (1.0 - p) / n)


def test_proxy_effects_have_the_mean_spread_and_correlation_asked_for(bench):
    theta = np.array(bench.one_stage.SETTINGS["one_winner"])
    z = np.random.default_rng(0).standard_normal((50, len(theta)))
    for rho in (1.0, 0.5, 0.0, -0.3, -1.0):
        phi = bench.proxy_effects(theta, rho, z, scale=2.0)
        assert phi.shape == (50, len(theta))
        np.testing.assert_allclose(phi.mean(axis=1), theta.mean())
        np.testing.assert_allclose(phi.std(axis=1), 2.0 * theta.std())
        np.testing.assert_allclose([np.corrcoef(row, theta)[0, 1] for row in phi], rho, atol=1e-12)
    np.testing.assert_allclose(bench.proxy_effects(theta, 1.0, z), np.tile(theta, (50, 1)))
    np.testing.assert_allclose(bench.proxy_effects(theta, -1.0, z), np.tile(2 * theta.mean() - theta, (50, 1)))
    with pytest.raises(ValueError, match="rho must lie in"):
        bench.proxy_effects(theta, 1.5, z)


def test_confirm_takes_finished_arms_by_screen_delta_and_picks_the_largest_better(bench):
    # One campaign, control + 4 arms, 6 seeds, 2 milestones. Screen deltas at the last milestone: arm 1 +4 (but
    # stopped), arm 2 +3, arm 3 +2, arm 4 +1 -> candidates (K = 2): arms 2 and 3. On the target arm 2 is +5,
    # arm 3 +9 (both clearly better), arm 1 +20: not a candidate, so not confirmed.
    rng = np.random.default_rng(0)
    screen = 50.0 + rng.normal(0.0, 0.01, (1, 5, 6, 2))
    target = 50.0 + rng.normal(0.0, 0.01, (1, 5, 6, 2))
    for arm, (s, t) in enumerate([(4.0, 20.0), (3.0, 5.0), (2.0, 9.0), (1.0, 0.0)], start=1):
        screen[0, arm] += s
        target[0, arm] += t
    finished = np.array([[True, False, True, True, True]])
    theta = np.array([0.0, 1.0, 1.0, 1.0, 0.0])
    design = bench.Design(top=2, proxy_cost=0.5, transfer_resamples=99)
    result = bench.confirm(theta, screen, finished, np.array([40]), target, 2, design)
    assert result.winner.tolist() == [3]  # the largest delta among the arms judged better
    assert result.confirmed.tolist() == [2] and result.checked.tolist() == [True]
    assert result.cost.tolist() == [0.5 * 40 + 3 * 6 * 2]  # screen at the proxy's cost + (K + 1) x seeds x milestones
    assert result.false_rejection.tolist() == [False]
    assert result.rho_significant.tolist() == [False]  # 3 items: nothing can be significant


def test_null_familywise_false_winners_stay_within_alpha_for_every_rho(bench, model):
    # The confirm's verdicts use only its own (fresh) seeds, with Holm over the confirmed arms.
    campaigns = 100
    null = {bench.NULL: bench.one_stage.SETTINGS[bench.NULL]}
    design = bench.Design(top_wide=3, transfer_resamples=49)
    results = bench.run_benchmark(model, design, campaigns, seed=5, settings=null)
    bound = design.alpha + binomial_margin(design.alpha, campaigns)
    for rho, by_variant in results.two_stage[bench.NULL].items():
        for variant, m in by_variant.items():
            assert m.false_winner <= m.fwer <= bound, (rho, variant)


def test_screening_on_a_faithful_proxy_picks_the_best_more_often_than_on_a_reversed_one(bench, model):
    one = {bench.HEADLINE: bench.one_stage.SETTINGS[bench.HEADLINE]}
    design = bench.Design(top_wide=3, transfer_resamples=49)
    results = bench.run_benchmark(model, design, 40, seed=2, rhos=(1.0, -0.3), settings=one)
    by_rho = results.two_stage[bench.HEADLINE]
    variant = ("paired_asha", 3)
    assert by_rho[1.0][variant].picked_best > by_rho[-0.3][variant].picked_best + 0.2
    assert by_rho[1.0][variant].best_screened > by_rho[-0.3][variant].best_screened


def test_two_stages_cost_less_than_one_stage_on_the_target_at_the_default_costs(bench, model):
    design = bench.Design(top_wide=3, transfer_resamples=49)
    results = bench.run_benchmark(model, design, 20, seed=3, rhos=(1.0, 0.0))
    for setting, by_rho in results.two_stage.items():
        for rho, by_variant in by_rho.items():
            assert by_variant[("paired_asha", 3)].compute_vs_one_stage < 1.0, (setting, rho)


def test_four_items_are_never_significant(bench, model):
    results = bench.run_benchmark(model, bench.Design(transfer_resamples=49), 10, seed=4, rhos=(1.0,))
    for by_rho in results.two_stage.values():
        assert by_rho[1.0][("paired_asha", 3)].rho_significant == 0.0


def test_same_seed_same_table(bench, model):
    one = {bench.HEADLINE: bench.one_stage.SETTINGS[bench.HEADLINE]}
    design = bench.Design(top_wide=3, transfer_resamples=49)
    first = bench.run_benchmark(model, design, 12, seed=7, rhos=(0.5,), settings=one)
    assert bench.run_benchmark(model, design, 12, seed=7, rhos=(0.5,), settings=one) == first
    assert bench.run_benchmark(model, design, 12, seed=8, rhos=(0.5,), settings=one) != first


def test_bad_design_is_rejected(bench):
    with pytest.raises(ValueError, match=r"top=0 \(allowed: >= 1\); screen_seeds=1 \(allowed: >= 2\)"):
        bench.Design(top=0, screen_seeds=1)


def test_script_ends_with_the_json_summary(bench, capsys):
    bench.main(["--campaigns", "4", "--seed", "1", "--milestones", "4", "--transfer-resamples", "19"])
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert set(summary) == {"one_stage", "two_stage"}
    assert [(row["rho"], row["screen"], row["top"]) for row in summary["two_stage"]] == [
        (rho, screen, top)
        for rho in bench.RHOS
        for screen, top in (("paired_asha", 3), ("paired_asha", 6), ("grid", 6))
    ]
    assert any(line.startswith("| one_winner | two_stage | paired_asha | +1 | 3 |") for line in lines)
