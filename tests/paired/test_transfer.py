"""The transfer check's statistics against independent oracles: scipy's rank correlations, the null of Spearman's ρ
by brute-force enumeration and published critical values, the exact bootstrap distribution by enumerating every
seed draw, and known-truth simulations."""

from __future__ import annotations

import itertools
import json
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from tune_dfrl.paired.stats import paired_interval
from tune_dfrl.paired.transfer import (
    DOES_NOT_TRANSFER,
    TRANSFERS,
    rank_correlations,
    spearman_limits,
    spearman_null,
    transfer_check,
)


def stage(truth: np.ndarray, seeds: int, noise: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """{arm i: per-seed Δ} with true Δ truth[i] and independent normal noise."""
    return {f"a{i}": t + noise * rng.standard_normal(seeds) for i, t in enumerate(truth)}


def test_rank_correlations_are_scipys_batched_and_with_ties():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 4, size=(50, 7)).astype(float)  # many ties
    b = rng.integers(0, 4, size=(50, 7)).astype(float)
    a[0], b[1] = 2.0, 1.0  # constant: undefined
    rho, tau = rank_correlations(a, b)
    for i in range(len(a)):
        with warnings.catch_warnings():  # constant input: scipy warns and gives NaN
            warnings.simplefilter("ignore")
            expected = [stats.spearmanr(a[i], b[i]).statistic, stats.kendalltau(a[i], b[i]).statistic]
        np.testing.assert_allclose([rho[i], tau[i]], expected, atol=1e-12, equal_nan=True)
    assert np.isnan(rho[:2]).all() and np.isnan(tau[:2]).all()


def test_point_figures_match_scipy_and_the_paired_interval():
    rng = np.random.default_rng(2)
    screen = stage(rng.normal(0, 1, 6), 4, 0.7, rng)
    target = stage(rng.normal(0, 1, 6), 5, 0.7, rng)
    del target["a5"]  # an arm of the screen only
    check = transfer_check(screen, target, "control")
    arms = ["control", *[f"a{i}" for i in range(5)]]
    assert check.arms == tuple(arms) and check.k == 6 and check.screen_only == ("a5",) and check.target_only == ()
    s_means = np.array([0.0] + [screen[a].mean() for a in arms[1:]])
    t_means = np.array([0.0] + [target[a].mean() for a in arms[1:]])
    assert check.spearman == pytest.approx(stats.spearmanr(s_means, t_means).statistic, abs=1e-12)
    assert check.kendall == pytest.approx(stats.kendalltau(s_means, t_means).statistic, abs=1e-12)
    d = screen["a2"]
    low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    e = check.screen["a2"]
    assert (e.n, e.delta, e.low, e.high) == pytest.approx((4, d.mean(), low, high))
    assert (check.screen["control"].low, check.screen["control"].high) == (0.0, 0.0)
    assert [check.target[a].rank for a in arms] == list(stats.rankdata(-t_means))


def test_spearman_null_is_the_brute_force_distribution():
    for k in range(2, 7):
        counts: dict[float, int] = {}
        for perm in itertools.permutations(range(k)):
            rho = round(float(stats.spearmanr(range(k), perm).statistic), 9)
            counts[rho] = counts.get(rho, 0) + 1
        values, probs = spearman_null(k)
        assert [round(v, 9) for v in values] == sorted(counts)
        np.testing.assert_allclose(probs, [counts[v] / math.factorial(k) for v in sorted(counts)])
        limits = spearman_limits(k, 0.05)
        tail = {c: sum(n for v, n in counts.items() if abs(v) >= abs(c) - 1e-9) / math.factorial(k) for c in counts}
        significant = [abs(c) for c, p in tail.items() if p <= 0.05]
        assert limits.critical == (pytest.approx(min(significant)) if significant else None)
        assert limits.one_significant == (2 / math.factorial(k) <= 0.05)
        observed = sorted(counts)[1]
        assert limits.p_value(observed) == pytest.approx(tail[observed])


def test_spearman_limits_match_published_critical_values_and_say_what_few_items_show():
    # Two-sided alpha = 0.05 critical values of Spearman's rho (Zar 1972, exact): n = 5..8.
    for k, critical in {5: 1.0, 6: 0.886, 7: 0.786, 8: 0.738}.items():
        assert spearman_limits(k).critical == pytest.approx(critical, abs=5e-4)
    assert spearman_limits(4).critical is None and not spearman_limits(4).one_significant
    assert spearman_limits(5).one_significant
    assert spearman_limits(3).values == (-1.0, -0.5, 0.5, 1.0) and spearman_limits(2).values == (-1.0, 1.0)
    assert spearman_limits(4).values == ()
    big = spearman_limits(20)
    assert big.method.startswith("normal") and big.critical == pytest.approx(1.959964 / math.sqrt(19), abs=1e-6)
    assert big.p_value(0.5) == pytest.approx(2 * stats.norm.sf(0.5 * math.sqrt(19)))


def test_bootstrap_interval_is_a_percentile_of_the_exact_bootstrap_distribution():
    """3 seeds per stage: all 27 x 27 equally likely seed draws give the exact bootstrap distribution of ρ and τ; the
    Monte Carlo percentiles (9,999 resamples) lie between its 1.5% and 3.5% (96.5% and 98.5%) quantiles."""
    rng = np.random.default_rng(3)
    screen = stage(np.array([0.5, -0.2, 1.0, 0.1, -0.6]), 3, 0.8, rng)
    target = stage(np.array([0.3, 0.2, 0.9, -0.4, -0.1]), 3, 0.8, rng)
    check = transfer_check(screen, target, "control", seed=11)
    arms = list(screen)
    s = np.array([np.zeros(3)] + [screen[a] for a in arms])
    t = np.array([np.zeros(3)] + [target[a] for a in arms])
    draws = list(itertools.product(range(3), repeat=3))
    rhos, taus = [], []
    for i in draws:
        for j in draws:
            a, b = s[:, list(i)].mean(axis=1), t[:, list(j)].mean(axis=1)
            rhos.append(stats.spearmanr(a, b).statistic)
            taus.append(stats.kendalltau(a, b).statistic)
    for values, low, high in (
        (rhos, check.spearman_low, check.spearman_high),
        (taus, check.kendall_low, check.kendall_high),
    ):
        q = np.quantile(values, [0.015, 0.035, 0.965, 0.985], method="inverted_cdf")
        assert q[0] - 1e-12 <= low <= q[1] + 1e-12 and q[2] - 1e-12 <= high <= q[3] + 1e-12
    assert check.resamples_used == check.n_resamples == 9999


def test_known_truth_same_ranks_transfer_and_reversed_ranks_do_not():
    rng = np.random.default_rng(4)
    truth = np.linspace(-3.0, 4.0, 11)  # 11 arms and the control: K = 12
    screen = stage(truth, 6, 0.3, rng)
    same = stage(2.0 * truth + 0.5, 6, 0.3, rng)
    check = transfer_check(screen, same, "control")
    assert check.verdict == TRANSFERS and check.spearman_low > 0.8 and not check.pick_reversed
    assert check.screen_pick == check.target_pick == "a10" and check.reasons == () and check.advice == ""
    assert check.spearman_p < 1e-3 and check.rho_one_significant

    reversed_ = stage(-truth, 6, 0.3, rng)
    check = transfer_check(screen, reversed_, "control")
    assert check.verdict == DOES_NOT_TRANSFER and check.spearman_high < -0.8 and check.pick_reversed
    assert check.target_pick == "a0" and "falls below the control" in check.pick_note
    assert "lies below 0" in check.reasons[0] and "confirm more arms" in check.advice


def test_a_reversed_pick_alone_stops_the_transfer():
    """Rankings agree except the top two swap at the target: ρ high, the pick reversed."""
    rng = np.random.default_rng(5)
    truth = np.linspace(-3.0, 4.0, 11)
    swapped = truth.copy()
    swapped[[9, 10]] = swapped[[10, 9]]
    check = transfer_check(stage(truth, 8, 0.05, rng), stage(swapped, 8, 0.05, rng), "control")
    assert check.spearman_low > 0.9 and check.pick_reversed and check.verdict == DOES_NOT_TRANSFER
    assert check.reasons == (check.pick_note,) and "'a9' is best" in check.pick_note


def test_three_items_cannot_tell_even_in_perfect_agreement():
    rng = np.random.default_rng(6)
    check = transfer_check(stage(np.array([1.0, 3.0]), 5, 0.01, rng), stage(np.array([2.0, 5.0]), 5, 0.01, rng), "c")
    assert check.k == 3 and check.spearman == 1.0 and check.spearman_low == 1.0 and not check.pick_reversed
    assert check.verdict == DOES_NOT_TRANSFER and check.rho_values == (-1.0, -0.5, 0.5, 1.0)
    assert "cannot tell" in check.reasons[0] and "only the values -1, -0.5, +0.5, +1" in check.caveat


def test_deterministic_under_the_seed_and_json_able():
    rng = np.random.default_rng(7)
    screen, target = stage(rng.normal(0, 1, 5), 3, 1.0, rng), stage(rng.normal(0, 1, 5), 3, 1.0, rng)
    screen["a0"][2] = np.nan  # an arm without a run at one seed: compared on the other two
    target["a1"] = np.full(3, 0.4)  # no spread: its 95% interval at 3 seeds is unbounded
    one, two = transfer_check(screen, target, "c", seed=5), transfer_check(screen, target, "c", seed=5)
    assert one == two and one.screen["a0"].n == 2
    other = transfer_check(screen, target, "c", seed=6)  # another bootstrap; the same point figures
    assert (other.spearman, other.kendall, other.screen) == (one.spearman, one.kendall, one.screen)
    record = json.loads(one.to_json())
    assert record["target"]["a1"]["low"] is None and record["target"]["a1"]["delta"] == pytest.approx(0.4)
    low, high = paired_interval(0.4, 0.0, 3, 0.95)
    assert np.isinf(low) and np.isinf(high) and np.isinf(one.target["a1"].low)
    assert record["verdict"] == one.verdict and record["arms"] == list(one.arms)


def test_bad_input_is_a_one_line_error():
    d = np.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"no arm besides the control 'c' is in both stages: screen has \['a'\]"):
        transfer_check({"a": d}, {"b": d}, "c")
    with pytest.raises(
        ValueError, match=r"screen \(s\): a paired interval needs at least 2 seeds per arm; too few: a \(1 seed\)"
    ):
        transfer_check({"a": np.array([0.1, np.nan, np.nan])}, {"a": d}, "c", screen_label="s")
    with pytest.raises(ValueError, match="one Δ per seed"):
        transfer_check({"a": d, "b": d[:2]}, {"a": d, "b": d}, "c")
    with pytest.raises(ValueError, match="its paired Δ must be 0"):
        transfer_check({"a": d, "c": d}, {"a": d}, "c")
