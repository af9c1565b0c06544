"""Sequential paired seeds: spending boundaries, looks with Holm recycling, futility, error control by simulation."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from tune_dfrl.paired.sequential import (
    ArmState,
    SequentialRule,
    boundaries,
    is_settled,
    look,
    nominal_levels,
    recommendation,
    spent,
    t_stats,
)


def canonical_z(fractions: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws of (Z_1..Z_K) under the null: Z_k = S(t_k) / sqrt(t_k), S a Brownian motion."""
    increments = np.diff(np.concatenate([[0.0], fractions]))
    return np.cumsum(rng.normal(size=(n, fractions.size)) * np.sqrt(increments), axis=1) / np.sqrt(fractions)


def obrien_fleming_spent(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending, written out here (the standard normal of the standard library, not
    the module's scipy calls): alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t))."""
    normal = NormalDist()
    return 2.0 - 2.0 * normal.cdf(normal.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t))


@pytest.mark.parametrize("alpha", [0.05, 0.05 / 12, 0.01])
def test_the_spending_function_is_lan_demets_obrien_fleming(alpha):
    for t in (0.05, 0.1, 0.25, 1 / 3, 0.5, 0.75, 0.9, 1.0):
        assert spent(t, alpha) == pytest.approx(obrien_fleming_spent(t, alpha), rel=1e-9, abs=1e-15), t
    assert spent(1.0, alpha) == pytest.approx(alpha, rel=1e-12)  # the whole level by the last look


def test_the_spending_function_at_tabulated_points():
    """The cumulative alpha of Lan-DeMets O'Brien-Fleming spending at four equally spaced looks, alpha = 0.05, as
    group-sequential tables give it to four decimals: 0.0001, 0.0056, 0.0236, 0.0500."""
    assert [spent(t, 0.05) for t in (0.25, 0.5, 0.75, 1.0)] == pytest.approx([0.0001, 0.0056, 0.0236, 0.05], abs=5e-5)


def test_one_look_is_the_fixed_two_sided_test():
    assert boundaries((1.0,), 0.05) == pytest.approx((stats.norm.isf(0.025),), abs=1e-9)


@pytest.mark.parametrize("alpha", [0.05, 0.05 / 12])
def test_boundaries_spend_alpha_look_by_look(alpha):
    fractions = np.array([0.25, 0.5, 0.75, 1.0])
    c = np.array(boundaries(tuple(fractions), alpha))
    # the first look spends alpha(t_1) alone: |Z_1| >= c_1 with c_1 = z_{1-alpha/2} / sqrt(t_1) exactly
    assert c[0] == pytest.approx(NormalDist().inv_cdf(1.0 - alpha / 2.0) / math.sqrt(fractions[0]), rel=1e-6)
    z = canonical_z(fractions, 400_000, np.random.default_rng(0))
    crossed = np.abs(z) >= c
    first = crossed & (np.cumsum(crossed, axis=1) == 1)
    expected = np.diff([0.0] + [obrien_fleming_spent(f, alpha) for f in fractions])
    for k in range(4):
        se = math.sqrt(max(expected[k], 1e-7) / 400_000)
        assert first[:, k].mean() == pytest.approx(expected[k], abs=4 * se + 2e-6), k
    assert crossed.any(axis=1).mean() == pytest.approx(alpha, abs=4 * math.sqrt(alpha / 400_000))
    assert np.all(np.diff(c) < 0)  # O'Brien-Fleming shape: strict early, close to the fixed test at the end


def test_boundaries_refuse_bad_fractions():
    with pytest.raises(ValueError, match="increase from above 0 to 1"):
        boundaries((0.5, 0.4, 1.0), 0.05)
    with pytest.raises(ValueError, match="increase from above 0 to 1"):
        boundaries((0.5, 0.9), 0.05)


def test_rule_looks_and_validation():
    assert SequentialRule().looks() == (4, 8, 12, 16)
    assert SequentialRule(start=4, batch=5, max=16).looks() == (4, 9, 14, 16)
    assert SequentialRule(start=6, batch=3, max=6).looks() == (6,)
    assert SequentialRule(start=2, batch=2, max=4).looks() == (2, 4)
    for bad, message in (
        ({"start": 1}, "sequential.start=1: allowed: an integer >= 2"),
        ({"start": 4, "max": 3}, "sequential.max=3: allowed: an integer >= sequential.start=4"),
        ({"batch": 0}, "sequential.batch=0: allowed: an integer >= 1"),
        ({"alpha": 0.7}, r"report.alpha=0.7: allowed: a number in \(0, 0.5\)"),
        ({"futility_margin": float("nan")}, "sequential.futility_margin=nan"),
    ):
        with pytest.raises(ValueError, match=message):
            SequentialRule(**bad)


def test_zero_variance_is_as_strong_as_the_sign_flip_test_allows():
    mean, se, p = t_stats(np.full(4, 2.0) + np.array([0.0, 1e-15, -1e-15, 0.0]))
    assert (mean, se, p) == (pytest.approx(2.0), 0.0, 0.125)
    assert t_stats(np.zeros(5))[2] == 1.0
    rule = SequentialRule()
    states = look({"a": [2.0] * 16}, {}, rule, family_size=1, current=4)
    assert (states["a"].status, states["a"].look) == ("better", 3)  # 2^-11 at 12 seeds; 2^-7 at 8 is not enough
    assert look({"a": [2.0] * 4}, {}, rule, family_size=1, current=1)["a"].status == "open"  # 0.125 is not enough


def deltas_with(mean: float, sd: float, n: int, seed: int) -> list[float]:
    """n paired deltas whose sample mean and sd are exactly `mean` and `sd`."""
    x = np.random.default_rng(seed).normal(size=n)
    return list(mean + sd * (x - x.mean()) / x.std(ddof=1))


def test_holm_recycling_settles_an_arm_at_the_larger_level():
    """Arm a settles at alpha/2; arm b's p lies between alpha/2's and alpha/1's level at look 4, so it settles only after a."""
    rule = SequentialRule()
    strict, loose = nominal_levels(rule, rule.alpha / 2)[3], nominal_levels(rule, rule.alpha)[3]
    target_p = math.sqrt(strict * loose)  # in between
    t_value = stats.t.isf(target_p / 2, 15)
    b = deltas_with(t_value * 1.0 / 4.0, 1.0, 16, seed=1)  # se = 1 / sqrt(16)
    a = deltas_with(5.0, 1.0, 16, seed=2)
    assert strict < t_stats(np.array(b))[2] < loose
    alone = look({"b": b, "c": deltas_with(0.0, 1.0, 16, seed=3)}, {}, rule, family_size=2, current=4)
    assert alone["b"].status == "open"
    both = look({"a": a, "b": b}, {}, rule, family_size=2, current=4)
    assert both["a"].status == "better" and both["b"].status == "better"


def test_recycling_re_examines_earlier_looks():
    """An arm that crossed look 2's boundary at the larger level settles with its look-2 seeds."""
    rule = SequentialRule()
    strict, loose = nominal_levels(rule, rule.alpha / 2)[1], nominal_levels(rule, rule.alpha)[1]
    t_value = stats.t.isf(math.sqrt(strict * loose) / 2, 7)
    b = deltas_with(t_value / math.sqrt(8), 1.0, 8, seed=4) + deltas_with(0.0, 1.0, 4, seed=5)
    a = deltas_with(6.0, 1.0, 12, seed=6)
    states = look({"a": a, "b": b}, {}, rule, family_size=2, current=3)
    assert states["b"] == ArmState("better", 8, 2, states["b"].mean, states["b"].low, states["b"].high)
    assert states["b"].mean == pytest.approx(np.mean(b[:8]))


def test_futility_and_the_last_look():
    rule = SequentialRule()
    hopeless = deltas_with(-3.0, 1.0, 16, seed=7)
    promising = deltas_with(3.0, 1.0, 4, seed=8) + deltas_with(3.0, 1.0, 12, seed=12)  # t = 6 at 4 seeds: p ~ 0.01
    states = look({"h": hopeless, "p": promising}, {}, rule, family_size=2, current=1)
    assert states["h"].status == "futile" and states["p"].status == "open"
    assert not is_settled(states)
    later = look({"h": hopeless, "p": promising}, states, rule, family_size=2, current=2)
    assert later["h"] == states["h"]  # futile arms get no more seeds and keep their state
    assert (
        look({"p": [0.0, 1.0, -1.0, 0.5] * 4}, {}, rule, family_size=1, current=4)["p"].status == "open"
    )  # no futility at the end


def test_out_of_the_running_behind_a_settled_winner():
    rule = SequentialRule(futility_margin=0.0)
    winner = deltas_with(8.0, 1.0, 16, seed=9)
    follower = deltas_with(0.5, 1.0, 8, seed=10) + [0.5] * 8  # p ~ 0.2 at 8 seeds, upper bound ~ 0.8
    states = look({"w": winner, "f": follower}, {}, rule, family_size=2, current=2)
    assert states["w"].status == "better"
    assert states["f"].status == "futile"  # its upper bound is below the winner's lower bound
    assert recommendation(states, "control") == "w" and is_settled(states)


def test_look_refuses_missing_seeds_and_small_families():
    rule = SequentialRule()
    with pytest.raises(ValueError, match=r"arm 'a' has 5 paired seeds at look 2; the look needs 8"):
        look({"a": [0.1] * 5}, {}, rule, family_size=1, current=2)
    with pytest.raises(ValueError, match="family_size=1 is smaller than the 2 arms"):
        look({"a": [0.1] * 4, "b": [0.2] * 4}, {}, rule, family_size=1, current=1)
    with pytest.raises(ValueError, match="look 5 is not one of the rule's 4 looks"):
        look({"a": [0.1] * 16}, {}, rule, family_size=1, current=5)


def test_recommendation_compares_bounds_at_one_level_and_ties_go_by_name():
    states = {
        "b": ArmState("better", 12, 3, 2.3, 1.31, 3.3),
        "a": ArmState("better", 16, 4, 2.0, 1.40, 2.6),
        "c": ArmState("worse", 8, 2, -3.0, -4.0, -2.0),
    }
    assert recommendation(states, "control") == "a"
    assert (
        recommendation(
            {"y": ArmState("better", 8, 2, 1.0, 0.5, 1.5), "x": ArmState("better", 8, 2, 1.0, 0.5, 1.5)}, "control"
        )
        == "x"
    )
    assert recommendation({"c": states["c"]}, "control") == "control"


def test_familywise_error_under_the_global_null_with_optional_stopping():
    """K = 4 null arms sharing the control's noise, looks at 4/8/12/16 seeds: P(any arm settled) <= alpha."""
    rule = SequentialRule()
    rng = np.random.default_rng(11)
    campaigns, errors = 1500, 0
    for _ in range(campaigns):
        control = rng.normal(size=16)
        by_arm = {f"arm{k}": list(rng.normal(size=16) - control) for k in range(4)}
        states: dict[str, ArmState] = {}
        for current in range(1, 5):
            states = look(by_arm, states, rule, family_size=4, current=current)
            if is_settled(states):
                break
        errors += any(s.status in ("better", "worse") for s in states.values())
    assert errors / campaigns <= rule.alpha + 3 * math.sqrt(rule.alpha * 0.95 / campaigns)
