"""The pure rung decision: hand-computed cases for every rule of tune_dfrl.paired.rungs, and the module loads without Ray."""

from __future__ import annotations

import pytest
from fresh_interpreter import imported

from tune_dfrl.paired.rungs import RungRule, decide

ASHA = RungRule(mode="paired_asha", eta=3.0, confidence=0.8, min_seeds=2)
RACE = RungRule(mode="race", confidence=0.8, min_seeds=2)


def shifted(base: dict[int, float], by: float) -> dict[int, float]:
    return {seed: value + by for seed, value in base.items()}


LEADER = {0: 5.0, 1: 3.0, 2: 7.0, 3: 5.0}
# Six arms with means 5, 4, 3, 2, 1, 0; each differs from the leader by a constant per seed (sd 0), over 4 seeds:
# the exact sign-flip test then reaches 2^-3 = 0.125 < 0.2, so a constant gap is credible at 80%.
SIX = {name: shifted(LEADER, -gap) for name, gap in zip("abcdef", range(6))}


def test_without_spread_the_exact_sign_flip_test_decides():
    # candidate - leader = -1 at every seed: the t-interval is undefined (sd 0). The inverted exact sign-flip test
    # gives the point {-1} when its smallest two-sided p, 2^(1-m), is below 1 - confidence = 0.2: at m = 4 seeds
    # (0.125) the arm is credibly worse; at m = 3 (0.25) no pattern of 3 seeds can show it at 80%, so it is kept.
    four = {"lead": {s: 1.0 for s in range(4)}, "worse": {s: 0.0 for s in range(4)}}
    decision = decide("worse", four, RACE)
    assert (
        not decision.keep and decision.reason == "80% interval of Δ against the leader [-1, -1] over 4 seeds, below 0"
    )
    three = {arm: {s: v for s, v in by_seed.items() if s < 3} for arm, by_seed in four.items()}
    decision = decide("worse", three, RACE)
    assert (
        decision.keep
        and decision.reason == "80% interval of Δ against the leader [-inf, +inf] over 3 seeds, not below 0"
    )


def test_top_one_over_eta_is_promoted_even_when_credibly_worse():
    # n = 6, eta = 3 -> the top ceil(6/3) = 2 arms are kept; b is 1 point below a at every seed.
    decision = decide("b", SIX, ASHA)
    assert decision.keep and decision.leader == "a"
    assert "rank 2 of 6" in decision.reason
    # c is rank 3: outside the top 2 and 2 points below the leader at every seed -> stopped.
    assert not decide("c", SIX, ASHA).keep
    # race has no promotion: b is credibly worse (sign-flip interval [-1, -1] over 4 seeds) -> stopped.
    assert not decide("b", SIX, RACE).keep
    # eta = 2 -> top 3, c is kept.
    assert decide("c", SIX, RungRule(eta=2.0)).keep


def test_at_least_one_arm_is_promoted():
    # n = 2, eta = 3: ceil(2/3) = 1, only the leader is inside the top; the other is credibly worse.
    arms = {"a": SIX["a"], "b": SIX["b"]}
    assert decide("a", arms, ASHA).keep
    assert not decide("b", arms, ASHA).keep


def test_overlap_rule_keeps_a_close_arm():
    # candidate - leader = [1, -1, -3]: mean -1, sd 2, half = 1.8856 * 2 / sqrt(3) = 2.177
    # -> interval [-3.18, 1.18] contains 0 -> kept although it ranks last of 3 (top 1 only).
    leader = {0: 4.0, 1: 6.0, 2: 8.0}
    close = {0: 5.0, 1: 5.0, 2: 5.0}
    middle = {0: 5.5, 1: 5.5, 2: 5.5}
    arms = {"lead": leader, "mid": middle, "close": close}
    for rule in (ASHA, RACE):
        decision = decide("close", arms, rule)
        assert decision.keep and decision.leader == "lead"
        assert decision.reason == "80% interval of Δ against the leader [-3.18, +1.18] over 3 seeds, not below 0"


def test_race_stops_a_credibly_worse_arm_and_confidence_matters():
    # candidate - leader = [-2, -3, -4]: 80% interval [-4.09, -1.91] -> stop.
    leader = {0: 6.0, 1: 6.0, 2: 6.0}
    worse = {0: 4.0, 1: 3.0, 2: 2.0}
    arms = {"lead": leader, "worse": worse}
    decision = decide("worse", arms, RACE)
    assert not decision.keep
    assert decision.reason == "80% interval of Δ against the leader [-4.09, -1.91] over 3 seeds, below 0"
    assert "credibl" not in decision.reason and "lead" not in decision.reason.replace("the leader", "")
    # at 99% the half width is 9.925 / sqrt(3) = 5.73 -> interval [-8.73, 2.73] contains 0 -> keep.
    assert decide("worse", arms, RungRule(mode="race", confidence=0.99)).keep


def test_min_seeds_keeps_without_enough_paired_evidence():
    arms = {"lead": {0: 6.0, 1: 6.0, 2: 6.0}, "worse": {0: 4.0, 1: 3.0, 2: 2.0}}
    decision = decide("worse", arms, RungRule(mode="race", min_seeds=4))
    assert decision.keep and decision.reason == "only 3 seeds in common with the leader < min_seeds=4"
    one_common = {"lead": {0: 6.0, 1: 6.0}, "worse": {1: 0.0, 7: 0.0}}
    decision = decide("worse", one_common, RACE)
    assert decision.keep and decision.reason == "only 1 seed in common with the leader < min_seeds=2"


def test_ties_are_broken_by_arm_id_whatever_the_order():
    values = {0: 1.0, 1: 2.0}
    for arms in ({"b": values, "a": dict(values)}, {"a": values, "b": dict(values)}):
        assert decide("b", arms, RACE).leader == "a"
        assert "leader" in decide("a", arms, RACE).reason
    # equal means, b sorts after a: with eta=3 and n=2 only "a" is in the top, and b - a is 0 at both seeds:
    # the sign-flip interval over 2 seeds is unbounded, which contains 0 -> kept by the overlap rule.
    assert decide("b", {"b": values, "a": dict(values)}, ASHA).keep


def test_missing_seeds_use_the_common_seeds():
    # Common seeds {3, 4}: candidate - leader = [0.5, -1.0], mean -0.25, sd 1.0607,
    # half = 3.0777 * 0.75 = 2.308 -> [-2.56, 2.06] contains 0 -> keep, although the
    # candidate's mean over its own seeds (0.83) is far below the leader's (5.75).
    leader = {1: 10.0, 2: 10.0, 3: 1.0, 4: 2.0}
    candidate = {3: 1.5, 4: 1.0, 5: 0.0}
    decision = decide("cand", {"lead": leader, "cand": candidate}, RACE)
    assert decision.keep and decision.leader == "lead"
    assert "[-2.56, +2.06] over 2 seeds, not below 0" in decision.reason
    # Same seeds, candidate - leader = [-4, -3.5]: mean -3.75, sd 0.354, half = 3.0777 * 0.25 = 0.769
    # -> [-4.52, -2.98] -> stop. (Exactly -4 at both seeds has no spread: 2 seeds cannot show it by the
    # sign-flip test, whose smallest p is 2^(1-2) = 0.5.)
    candidate = {3: -3.0, 4: -1.5, 5: 0.0}
    decision = decide("cand", {"lead": leader, "cand": candidate}, RACE)
    assert not decision.keep and "[-4.52, -2.98] over 2 seeds, below 0" in decision.reason


def test_single_arm_at_the_rung_is_kept():
    for rule in (ASHA, RACE):
        decision = decide("only", {"only": {0: -50.0, 1: -60.0}}, rule)
        assert decision.keep and decision.leader == "only"


def test_decide_is_pure():
    arms = {name: dict(values) for name, values in SIX.items()}
    snapshot = {name: dict(values) for name, values in arms.items()}
    first = decide("d", arms, ASHA)
    assert decide("d", arms, ASHA) == first
    assert arms == snapshot


def test_rungs_are_milestones_before_the_last_from_the_grace_fraction_on():
    steps = [20 * k for k in range(1, 11)]  # 20, 40, ..., 200
    assert RungRule(grace_fraction=0.0).rungs(steps) == tuple(steps[:-1])
    assert RungRule(grace_fraction=0.3).rungs(reversed(steps)) == (60, 80, 100, 120, 140, 160, 180)
    assert RungRule(grace_fraction=0.95).rungs(steps) == ()
    assert RungRule().rungs([100]) == ()
    with pytest.raises(ValueError, match="milestones must be positive training steps"):
        RungRule().rungs([0, 10])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "asha"}, "scheduler.name='asha': allowed: one of paired_asha, race"),
        ({"eta": 1.0}, "scheduler.eta=1.0: allowed: a number > 1"),
        ({"confidence": 1.0}, "scheduler.confidence=1.0: allowed: a number in \\(0, 1\\)"),
        ({"min_seeds": 1}, "scheduler.min_seeds=1: allowed: an integer >= 2"),
        ({"min_seeds": 2.5}, "scheduler.min_seeds=2.5: allowed: an integer >= 2"),
        ({"grace_fraction": 1.0}, "scheduler.grace_fraction=1.0: allowed: a number in \\[0, 1\\)"),
    ],
)
def test_bad_rules_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RungRule(**kwargs)


def test_bad_deltas_are_rejected():
    with pytest.raises(ValueError, match="candidate arm 'x' has no deltas"):
        decide("x", {"a": {0: 1.0}}, ASHA)
    with pytest.raises(ValueError, match="arm 'b' has no seeds"):
        decide("a", {"a": {0: 1.0}, "b": {}}, ASHA)
    with pytest.raises(ValueError, match="seed 3 is nan"):
        decide("a", {"a": {3: float("nan")}}, ASHA)


def test_the_rules_and_the_book_load_without_ray() -> None:
    """`decide` and `RungBook` are pure: importing them loads no Ray (the decision benchmark runs them without it)."""
    assert imported("import tune_dfrl.paired.rungs", ("ray",)) == []
