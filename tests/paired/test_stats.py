"""Paired statistics against hand-computed and library values; the verdict rule at its boundaries."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from tune_dfrl.paired.stats import (
    holm,
    paired_verdicts,
    power_figures,
    prob_best,
    rank_agreement,
    recommend,
    t_power,
    tost_power,
    winner_flip_rate,
)

T975_DF2 = 4.302652729911275  # t quantile 0.975, 2 degrees of freedom (tables: 4.303)
CONTROL = np.array([50.0, 52.0, 47.0, 55.0])


def one(diffs, **kwargs):
    """Verdict of a single arm whose paired differences against CONTROL[:len(diffs)] are `diffs`."""
    diffs = np.asarray(diffs, dtype=float)
    control = CONTROL[: len(diffs)]
    return paired_verdicts(control, {"arm": control + diffs}, **kwargs)["arm"]


def test_t_interval_hand_computed():
    v = one([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3)
    half = T975_DF2 / np.sqrt(3)
    assert (v.n, v.delta, v.sd) == (3, pytest.approx(2.0), pytest.approx(1.0))
    assert (v.t_low, v.t_high) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert (v.ci_low, v.ci_high, v.level) == (
        pytest.approx(2 - half),
        pytest.approx(2 + half),
        pytest.approx(0.95),
    )  # one arm: no adjustment


def test_t_interval_and_p_match_scipy_ttest_rel():
    rng = np.random.default_rng(1)
    control, arm = rng.normal(50, 2, 9), rng.normal(50.7, 2, 9)
    v = paired_verdicts(control, {"a": arm})["a"]
    ref = stats.ttest_rel(arm, control)
    ci = ref.confidence_interval(0.95)
    assert (v.p, v.t_low, v.t_high) == (pytest.approx(ref.pvalue), pytest.approx(ci.low), pytest.approx(ci.high))
    ci90 = ref.confidence_interval(0.90)
    assert (v.eq_low, v.eq_high) == (pytest.approx(ci90.low), pytest.approx(ci90.high))


def test_tost_matches_statsmodels():
    rng = np.random.default_rng(2)
    for shift in (0.0, 0.4, 0.9, 1.6):
        control, arm = rng.normal(50, 1, 8), rng.normal(50 + shift, 1, 8)
        arm = control + (arm - control) * 0.6
        v = paired_verdicts(control, {"a": arm}, delta=1.0)["a"]
        p_tost = ttost_paired(arm, control, -1.0, 1.0)[0]
        assert v.tost_p == pytest.approx(p_tost)
        assert (v.eq_low > -1 and v.eq_high < 1) == (p_tost < 0.05)


def test_holm_matches_statsmodels_and_hand_computed_levels():
    p = np.array([0.01, 0.04, 0.03])
    # sorted 0.01, 0.03, 0.04 against 0.05/3, 0.05/2, 0.05: the first passes, the second fails -> stop at step 2
    p_holm, alpha_k = holm(p, 0.05)
    assert alpha_k == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2])
    assert p_holm == pytest.approx([0.03, 0.06, 0.06])  # 3*0.01, max(2*0.03, 0.04)
    assert multipletests(p, method="holm")[1] == pytest.approx(p_holm)
    for size in (1, 2, 5, 9):
        random_p = np.random.default_rng(size).uniform(0, 0.1, size) ** 2
        assert holm(random_p, 0.05)[0] == pytest.approx(multipletests(random_p, alpha=0.05, method="holm")[1])
    rng = np.random.default_rng(3)
    control = rng.normal(50, 1, 6)
    arms = {f"a{i}": control + rng.normal(shift, 1, 6) for i, shift in enumerate([0, 0.5, 1, 2, 3, -2])}
    verdicts = paired_verdicts(control, arms)
    p_raw = np.array([v.p for v in verdicts.values()])
    assert [v.p_holm for v in verdicts.values()] == pytest.approx(multipletests(p_raw, alpha=0.05, method="holm")[1])


def test_adjusted_interval_excludes_zero_exactly_when_p_holm_below_alpha():
    rng = np.random.default_rng(4)
    seen = set()
    for _ in range(300):
        m, seeds = rng.integers(1, 9), rng.integers(2, 13)
        control = rng.normal(50, 1, seeds)
        arms = {f"a{i}": control + rng.normal(rng.normal(0, 1.2), 1, seeds) for i in range(m)}
        for v in paired_verdicts(control, arms).values():
            credible = v.ci_low > 0 or v.ci_high < 0
            assert credible == (v.p_holm < 0.05)
            assert (v.verdict in ("better", "worse")) == credible
            seen.add(credible)
    assert seen == {True, False}


def same_shift(seeds: int, shift: float) -> dict:
    """Control scores at `seeds` seeds and an arm shifted by `shift` at every one (float rounding makes sd ~1e-15)."""
    control = np.array([47.3, 71.1, 29.9, 53.7, 14.1, 90.3, 48.9, 52.2, 46.6, 51.7, 49.4, 45.8])[:seeds]
    return {"control": control, "arms": {"arm": control + shift}}


def test_zero_spread_is_judged_by_the_exact_sign_flip_test():
    """The same shift at every seed: the t-test would divide by a rounding error; the exact test's floor bounds the claim."""
    three = paired_verdicts(**same_shift(3, 0.3))["arm"]
    assert 0 < three.sd < 1e-13  # float rounding, not a real spread
    assert (three.exact, three.p, three.tost_p) == (True, 0.25, 0.125)  # sign-flip floors 2^(1-3), 2^-3
    assert three.verdict == "inconclusive" and (three.ci_low, three.ci_high) == (-np.inf, np.inf)
    assert one([0.0, 0.0, 0.0]).verdict == "inconclusive"  # 2^-3 = 0.125 > alpha: TOST cannot show equivalence
    five = paired_verdicts(**same_shift(5, 0.0))["arm"]
    assert (
        five.verdict == "equivalent" and five.p == 1.0 and five.tost_p == 2.0**-5 and five.eq_low == five.eq_high == 0.0
    )
    six = paired_verdicts(**same_shift(6, 0.3))["arm"]
    assert six.verdict == "better" and six.p == 2.0**-5 and six.ci_low == six.ci_high == pytest.approx(0.3)
    assert paired_verdicts(**same_shift(6, -2.0))["arm"].verdict == "worse"
    in_family = paired_verdicts(**same_shift(6, 0.3), family_size=2)["arm"]  # 2^-5 > 0.05 / 2
    assert in_family.verdict == "equivalent" and in_family.p_holm == pytest.approx(2 * 2.0**-5)  # TOST: 2^-6 < 0.05
    d = same_shift(6, 0.3)
    permutation = paired_verdicts(**d, bootstrap=True, rng=np.random.default_rng(0))["arm"].p_perm
    assert permutation == pytest.approx(six.p)  # the same value scipy's exact permutation test gives
    assert recommend(paired_verdicts(**same_shift(3, 0.3)), "ctl")["point_best"] == ["arm"]
    spread = one([0.3, 0.3 + 1e-6, 0.3])  # a real (if tiny) spread stays with the t-test
    assert not spread.exact and spread.p < 1e-6


def boundary_diffs(target_mean: float) -> np.ndarray:
    """Four differences with sd 1 (pattern +-0.5, +-1.5 scaled) and the given mean."""
    pattern = np.array([-1.5, -0.5, 0.5, 1.5]) / np.std([-1.5, -0.5, 0.5, 1.5], ddof=1)
    return target_mean + pattern


def test_verdict_boundary_better():
    se = 1.0 / 2.0  # sd 1, n 4
    edge = stats.t.ppf(0.975, 3) * se  # mean at which the 95% lower bound is exactly 0
    assert one(boundary_diffs(edge + 1e-6)).verdict == "better"
    assert one(boundary_diffs(edge - 1e-6)).verdict != "better"
    assert one(boundary_diffs(-edge - 1e-6)).verdict == "worse"


def test_verdict_boundary_equivalent():
    sd, se = 0.6, 0.3  # n 4
    edge = 1.0 - stats.t.ppf(0.95, 3) * se  # mean at which the 90% upper bound is exactly +delta (0.294)
    assert edge - stats.t.ppf(0.975, 3) * se < 0  # the 95% interval still straddles 0: not better
    assert one(sd * boundary_diffs(0) + edge - 1e-6, delta=1.0).verdict == "equivalent"
    assert one(sd * boundary_diffs(0) + edge + 1e-6, delta=1.0).verdict == "inconclusive"
    assert one(sd * boundary_diffs(0) - edge - 1e-6, delta=1.0).verdict == "inconclusive"


def test_holm_boundary_depends_on_the_other_arms():
    """An arm significant at 0.05 but not at 0.025 is better only when the other arm is rejected first."""
    se = 0.5
    mean = (stats.t.ppf(0.975, 3) + stats.t.ppf(0.9875, 3)) / 2 * se  # between the two critical values
    control = CONTROL
    borderline = control + boundary_diffs(mean)
    strong = control + boundary_diffs(10.0)
    weak = control + boundary_diffs(0.0)
    assert paired_verdicts(control, {"b": borderline, "s": strong})["b"].verdict == "better"  # tested at 0.05
    with_weak = paired_verdicts(control, {"b": borderline, "w": weak})["b"]  # tested first, at 0.025
    assert with_weak.verdict == "inconclusive" and with_weak.level == pytest.approx(0.975)


def test_permutation_p_exact_hand_and_brute_force():
    v = one([1.0, 2.0, 3.0, 4.0], bootstrap=True, rng=np.random.default_rng(0))
    assert v.p_perm == pytest.approx(2 / 16)  # only all-plus and all-minus reach |mean| 2.5
    d = np.array([0.3, -1.2, 2.5, 0.8, 1.9, -0.4])
    flips = np.array(list(product([-1, 1], repeat=len(d))))
    brute = np.mean(np.abs((flips * d).mean(axis=1)) >= abs(d.mean()) - 1e-12)
    control = np.linspace(40, 60, 6)
    got = paired_verdicts(control, {"a": control + d}, bootstrap=True, rng=np.random.default_rng(0))["a"]
    assert got.p_perm == pytest.approx(brute)


def test_bca_matches_scipy_and_covers_the_mean():
    rng = np.random.default_rng(5)
    control = rng.normal(50, 1, 12)
    arm = control + rng.normal(1.0, 1.0, 12)
    v = paired_verdicts(control, {"a": arm}, bootstrap=True, rng=np.random.default_rng(7))["a"]
    ref = stats.bootstrap((arm - control,), np.mean, method="BCa", n_resamples=9999, rng=np.random.default_rng(7))
    # the permutation test draws from the same generator afterwards, so the bootstrap is first and identical
    assert (v.bca_low, v.bca_high) == (
        pytest.approx(ref.confidence_interval.low),
        pytest.approx(ref.confidence_interval.high),
    )
    assert v.bca_low < v.delta < v.bca_high
    assert v.bca_high - v.bca_low == pytest.approx(v.t_high - v.t_low, rel=0.35)


def test_arms_missing_seeds_use_their_own_pairs():
    control = np.array([50.0, 51.0, 52.0, 53.0])
    arm = np.array([51.0, 52.5, np.nan, 53.5])
    v = paired_verdicts(control, {"a": arm, "b": control + 1}, bootstrap=True, rng=np.random.default_rng(0))
    assert v["a"].n == 3 and v["a"].delta == pytest.approx(1.0)
    assert v["a"].p_perm == pytest.approx(2 / 8)  # diffs (1, 1.5, 0.5): all positive, 3 seeds
    with pytest.raises(ValueError, match=r"at least 2 seeds shared with the control; too few: a \(1 seed\)"):
        paired_verdicts(control, {"a": np.array([51.0, np.nan, np.nan, np.nan])})


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one arm"):
        paired_verdicts(CONTROL, {})
    with pytest.raises(ValueError, match="score at every seed"):
        paired_verdicts(np.array([1.0, np.nan]), {"a": np.array([1.0, 2.0])})
    with pytest.raises(ValueError, match="one score per control seed"):
        paired_verdicts(CONTROL, {"a": CONTROL[:3]})
    with pytest.raises(ValueError, match="needs an explicit numpy Generator"):
        paired_verdicts(CONTROL, {"a": CONTROL + 1}, bootstrap=True)


def noncentral_power(effect: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t-test, from the noncentral t distribution (independent of statsmodels)."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = effect * np.sqrt(n)
    return stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)


def verdict_with_sd(sd: float, n: int) -> object:
    """The verdict of an arm whose n paired differences have mean 0.2 and standard deviation sd."""
    return paired_verdicts(np.full(n, 50.0), {"arm": 50.2 + sd * standardized(n)})["arm"]


def test_t_power_matches_the_noncentral_t_and_statsmodels():
    for effect, n, alpha in [(1 / 1.7, 25, 0.05), (0.5, 6, 0.05 / 8), (2.0, 3, 0.05), (0.2, 200, 0.01)]:
        assert t_power(effect, n, alpha) == pytest.approx(noncentral_power(effect, n, alpha), abs=1e-6)
        assert t_power(effect, n, alpha) == pytest.approx(TTestPower().power(effect, n, alpha), abs=1e-6)


def test_tost_power_matches_simulated_tost():
    """TOST decisions on simulated normal paired differences (true Δ 0) against the power integral."""
    rng = np.random.default_rng(11)
    for margin_sd, n in [(1 / 1.7, 20), (0.8, 8), (1.5, 4)]:
        d = rng.normal(0.0, 1.0, (40_000, n))
        mean, se = d.mean(axis=1), d.std(axis=1, ddof=1) / np.sqrt(n)
        crit = stats.t.ppf(0.95, n - 1)
        simulated = np.mean((mean - crit * se > -margin_sd) & (mean + crit * se < margin_sd))
        assert tost_power(margin_sd, n, 0.05) == pytest.approx(simulated, abs=4 * np.sqrt(0.25 / 40_000))


def test_power_figures():
    sd, n = 1.7, 6
    v = verdict_with_sd(sd, n)
    figures = power_figures(v, delta=1.0)  # one arm: detection at alpha
    assert noncentral_power(figures["mde"] / sd, n) == pytest.approx(0.8, abs=1e-4)
    needed = figures["seeds_to_detect"]
    assert noncentral_power(1.0 / sd, needed) >= 0.8 > noncentral_power(1.0 / sd, needed - 1)
    assert needed == 25  # ~ (1.96 + 0.84)^2 * 1.7^2 + 2 by the normal approximation
    equivalence = figures["seeds_for_equivalence"]
    assert tost_power(1.0 / sd, equivalence, 0.05) >= 0.8 > tost_power(1.0 / sd, equivalence - 1, 0.05)
    assert equivalence == 27  # ~ (1.645 + 1.28)^2 * 1.7^2 + 2 by the normal approximation
    in_family = power_figures(v, delta=1.0, family=8)  # detection at Holm's first step, 0.05 / 8
    assert noncentral_power(in_family["mde"] / sd, n, 0.05 / 8) == pytest.approx(0.8, abs=1e-4)
    assert in_family["seeds_to_detect"] > needed and in_family["seeds_for_equivalence"] == equivalence
    flat = paired_verdicts(**same_shift(3, 0.3))["arm"]  # no spread: the sign-flip floor decides
    assert power_figures(flat, 1.0) == {"mde": np.inf, "seeds_to_detect": 6, "seeds_for_equivalence": 5}
    assert power_figures(flat, 1.0, family=8)["seeds_to_detect"] == 9  # 2^-8 < 0.05 / 8 <= 2^-7


def test_recommend_highest_lower_bound_never_point_best():
    control = np.zeros(8) + 50
    base = np.array([-1.0, 1.0] * 4)
    arms = {"tight": control + 2.0 + 0.2 * base, "wide": control + 3.0 + 2.0 * base, "lucky": control + 5.0 + 9 * base}
    verdicts = paired_verdicts(control, arms)
    assert [verdicts[a].verdict for a in arms] == ["better", "better", "inconclusive"]
    assert verdicts["tight"].common_low > verdicts["wide"].common_low
    rec = recommend(verdicts, "ctl")
    assert (rec["recommended"], rec["is_control"], rec["point_best"]) == ("tight", False, ["lucky"])
    nothing = recommend({"lucky": verdicts["lucky"]}, "ctl", margin=1.0, seeds_to_detect=60, seeds_for_equivalence=40)
    assert (nothing["recommended"], nothing["is_control"], nothing["seeds_for_equivalence"]) == ("ctl", True, 40)
    assert "credibl" not in rec["reason"] + nothing["reason"]
    assert "is better than the control 'ctl': its Holm-adjusted " in rec["reason"]
    assert (
        "for the 1 arm still inconclusive, taking its paired SD observed at 8 seeds as known (an estimate), "
        "about 40 paired seeds would show equivalence within ±1 with 80% power (TOST" in nothing["reason"]
    )
    both = recommend({"a": verdicts["lucky"], "b": verdicts["lucky"]}, "ctl", seeds_for_equivalence=40)
    assert "for the 2 arms still inconclusive, taking their paired SDs observed at 8 seeds" in both["reason"]
    assert "about 40 paired seeds per arm would show" in both["reason"]
    assert (
        "about 60 would detect a true Δ of +1 with 80% power (paired t-test at α/m = 0.0167)" in nothing["reason"]
    )  # m = 3


def standardized(n: int, shift: int = 0) -> np.ndarray:
    """n values with mean 0 and sd 1 (ddof 1), rotated by `shift`."""
    z = np.roll(np.linspace(-1.0, 1.0, n), shift)
    return z / np.std(z, ddof=1)


def test_selection_compares_lower_bounds_at_one_common_level():
    """The audit's case: A (Δ 2.0, p 3.5e-5) is tested first by Holm at 97.5%, B (Δ 2.3, p 3.4e-4) second at 95%.
    B's 95% bound (1.31) beats A's 97.5% bound (1.22), yet A's bound is higher at either common level."""
    control = np.linspace(45.0, 55.0, 12)
    verdicts = paired_verdicts(
        control, {"A": control + 2.0 + 1.038 * standardized(12), "B": control + 2.3 + 1.560 * standardized(12, 5)}
    )
    a, b = verdicts["A"], verdicts["B"]
    assert (a.p, b.p) == (pytest.approx(3.5e-5, rel=0.02), pytest.approx(3.4e-4, rel=0.02))
    assert (a.level, b.level) == (pytest.approx(0.975), pytest.approx(0.95)) and a.verdict == b.verdict == "better"
    assert (a.ci_low, b.ci_low) == (pytest.approx(1.22, abs=0.01), pytest.approx(1.31, abs=0.01))  # B wins on these
    assert a.t_low > b.t_low  # at the common 95% level A is higher ...
    assert a.common_level == b.common_level == pytest.approx(0.975) and a.common_low > b.common_low  # ... and at 97.5%
    rec = recommend(verdicts, "ctl")
    assert rec["recommended"] == "A" and rec["common_low"] == pytest.approx(a.common_low)
    assert "common level 97.50%" in rec["reason"]


def test_point_best_lists_every_tied_arm_and_the_control():
    control = np.array([50.0, 52.0, 47.0, 55.0])
    d = np.array([1.0, -1.0, 2.0, -0.5])
    tied = paired_verdicts(control, {"a": control + d, "b": control + d[::-1], "c": control - 1.0 + d})
    assert recommend(tied, "ctl")["point_best"] == ["a", "b"]  # the same mean Δ (0.375): no single point-best
    below = paired_verdicts(control, {"c": control - 1.0 + d})
    assert recommend(below, "ctl")["point_best"] == ["ctl"]


def test_prob_best_hand_computed_and_joint():
    # seeds resampled jointly: counts (2,0) p=1/4 -> A; (1,1) p=1/2 -> A (1 vs 0.5); (0,2) p=1/4 -> B
    p = prob_best(np.array([[2.0, 0.0], [0.0, 1.0]]), np.random.default_rng(0), n_resamples=200_000)
    assert p == pytest.approx([0.75, 0.25], abs=0.005)
    # B = A + 0.1 at every seed: whatever seeds are drawn, B wins. Independent per-arm resampling would not say so.
    rng = np.random.default_rng(1)
    a = rng.normal(50, 5, 6)
    assert prob_best(np.stack([a, a + 0.1]), np.random.default_rng(2)) == pytest.approx([0.0, 1.0])
    ties = prob_best(np.stack([a, a]), np.random.default_rng(2))
    assert ties == pytest.approx([0.5, 0.5])


def test_winner_flip_rate_hand_computed():
    scores = np.array([[4.0, 0.0, 0.0, 0.0], [0.9, 0.9, 0.9, 0.9], [0.0, 0.0, 0.0, 0.1]])
    # winner on all seeds: arm 0 (mean 1). Pairs with seed 0 (3 of 6): arm 0 wins; the other 3: arm 1 wins.
    rate, subsets = winner_flip_rate(scores, 2, np.random.default_rng(0))
    assert (rate, subsets) == (pytest.approx(0.5), 6)
    sampled, used = winner_flip_rate(np.tile(scores, 5), 4, np.random.default_rng(0), max_subsets=2000)
    assert used == 2000 and 0.0 < sampled < 1.0
    with pytest.raises(ValueError, match="1 <= k < seeds"):
        winner_flip_rate(scores, 4, np.random.default_rng(0))


def test_rank_agreement_hand_computed():
    r = rank_agreement(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0]))
    assert r["spearman"] == pytest.approx(1 - 6 * 2 / (4 * 15))  # sum d^2 = 2
    assert r["kendall"] == pytest.approx((5 - 1) / 6)  # 5 concordant, 1 discordant pair


def test_stopped_arms_count_in_the_holm_family():
    """Arms stopped early enter the family as untested (p = 1): stricter for the survivors, never looser."""
    p = np.array([0.01, 0.02])
    padded = np.array([0.01, 0.02, 1.0, 1.0])
    p_holm, alpha_k = holm(p, 0.05, family_size=4)
    assert p_holm == pytest.approx(multipletests(padded, method="holm")[1][:2])  # 4*0.01, 3*0.02
    assert alpha_k == pytest.approx([0.05 / 4, 0.05 / 3])
    se = 0.5
    mean = (stats.t.ppf(0.975, 3) + stats.t.ppf(0.9875, 3)) / 2 * se  # better alone at 0.05, not at 0.025
    borderline = CONTROL + boundary_diffs(mean)
    assert paired_verdicts(CONTROL, {"b": borderline})["b"].verdict == "better"
    within_search = paired_verdicts(CONTROL, {"b": borderline}, family_size=2)["b"]
    assert within_search.verdict == "inconclusive" and within_search.level == pytest.approx(0.975)
