"""RungBook (pure paired rung bookkeeping) with hand-computed expectations."""

from __future__ import annotations

import pytest

from tune_dfrl.config.settings import SchedulerSettings, SearchSettings, from_mapping
from tune_dfrl.paired.rungs import CONTINUE, STOP, WAIT, RungBook, RungRule, decide
from tune_dfrl.tune.scheduler import PairedScheduler, make_scheduler

SEEDS = (0, 1, 2)
CONTROL_AT_10 = {0: 40.0, 1: 50.0, 2: 60.0}


def book(mode: str = "race") -> RungBook:
    return RungBook(RungRule(mode=mode, confidence=0.8), rungs=[10, 20], control="C", seeds=SEEDS)


def feed(b: RungBook, arm: str, step: int, scores: dict[int, float]) -> list:
    made = []
    for seed, score in scores.items():
        made += b.observe(arm, seed, step, score)
    return made


def test_rungs_follow_the_rule_grace_fraction() -> None:
    made = make_scheduler(
        SchedulerSettings("race", grace_fraction=0.5),
        metric="score/db",
        control="C",
        seeds=SEEDS,
        milestones=[40, 10, 30, 20],
    )
    assert isinstance(made, PairedScheduler) and made.book.rungs == (20, 30)


def test_arm_waits_for_all_its_seeds_and_the_control_then_decides_once() -> None:
    b = book()
    assert feed(b, "A", 10, {0: 45.0, 1: 55.0}) == []
    assert b.action("A", 10) == WAIT  # seed 2 missing
    assert feed(b, "A", 10, {2: 65.0}) == []
    assert b.action("A", 10) == WAIT  # control values missing
    assert b.action("C", 10) == CONTINUE  # the control never waits
    made = feed(b, "C", 10, CONTROL_AT_10)
    assert [(d.arm, d.rung, d.seeds) for d in made] == [("A", 10, (0, 1, 2))]
    # A: deltas +5 at every seed -> the leader (control has 0) -> keep.
    assert made[0].decision.keep and made[0].decision.leader == "A"
    assert b.action("A", 10) == CONTINUE
    assert b.action("A", 15) == CONTINUE
    assert b.action("A", 20) == WAIT  # next rung not decided yet
    assert feed(b, "A", 10, {0: 0.0}) == []  # a repeated milestone changes nothing


def test_a_credibly_worse_arm_stops_as_a_whole_with_hand_computed_deltas() -> None:
    b = book()
    feed(b, "C", 10, CONTROL_AT_10)
    feed(b, "A", 10, {0: 45.0, 1: 55.0, 2: 65.0})  # deltas +5, +5, +5
    made = feed(b, "B", 10, {0: 36.0, 1: 44.0, 2: 55.0})  # deltas -4, -6, -5
    assert len(made) == 1 and made[0].arm == "B"
    # Leader A; B - A = -9, -11, -10: mean -10, sd 1 -> 80% t-interval -10 +- 1.886*1/sqrt(3), entirely < 0.
    assert not made[0].decision.keep and made[0].decision.leader == "A"
    table = {"A": {0: 5.0, 1: 5.0, 2: 5.0}, "B": {0: -4.0, 1: -6.0, 2: -5.0}, "C": {0: 0.0, 1: 0.0, 2: 0.0}}
    assert made[0].decision == decide("B", table, b.rule)
    for step in (10, 11, 20, 30):
        assert b.action("B", step) == STOP
    assert b.stopped("B") is made[0] and b.stopped("A") is None
    assert b.observe("B", 0, 20, 99.0) == []  # a stopped arm is never decided again


def test_paired_asha_keeps_top_ceil_n_over_eta_even_when_credibly_worse() -> None:
    b = book(mode="paired_asha")  # eta 3
    feed(b, "C", 10, CONTROL_AT_10)
    feed(b, "A", 10, {0: 50.0, 1: 60.0, 2: 70.0})  # +10 each: leader
    made = feed(b, "B", 10, {0: 45.0, 1: 54.0, 2: 66.0})  # +5, +4, +6: rank 2 of 3 (A, B, C)
    # ceil(3/3) = 1 protects only the leader; B - A = -5, -6, -4 is credibly negative -> stop.
    assert not made[0].decision.keep
    made = feed(b, "D", 10, {0: 49.0, 1: 61.0, 2: 70.0})  # +9, +11, +10: rank 2 of 4; ceil(4/3) = 2 -> keep
    assert made[0].decision.keep and "top 2" in made[0].decision.reason


def test_failed_seeds_are_left_out_instead_of_waited_for() -> None:
    b = book()
    feed(b, "C", 10, CONTROL_AT_10)
    assert feed(b, "A", 10, {0: 41.0, 1: 52.0}) == []
    made = b.fail("A", 2)
    assert [(d.arm, d.seeds) for d in made] == [("A", (0, 1))]
    b2 = book()
    b2.fail("C", 1)  # a failed control seed is left out for every arm
    feed(b2, "C", 10, {0: 40.0, 2: 60.0})
    made = feed(b2, "A", 10, {0: 41.0, 2: 62.0})
    assert [(d.arm, d.seeds) for d in made] == [("A", (0, 2))]


def test_second_rung_waits_for_the_first() -> None:
    b = book()
    feed(b, "C", 20, {0: 1.0, 1: 1.0, 2: 1.0})
    assert feed(b, "A", 20, {0: 2.0, 1: 2.0, 2: 2.0}) == []  # rung 10 still open
    made = feed(b, "C", 10, CONTROL_AT_10) + feed(b, "A", 10, {0: 41.0, 1: 51.0, 2: 61.0})
    assert [(d.arm, d.rung) for d in made] == [("A", 10), ("A", 20)]


def test_unknown_scheduler_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="scheduler.name='ashaa': allowed: one of paired_asha, race, asha, fifo"):
        from_mapping(SearchSettings, {"scheduler": {"name": "ashaa"}})


def test_plain_asha_and_fifo_stay_selectable() -> None:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    asha = make_scheduler(
        SchedulerSettings("asha", eta=2.0, grace_fraction=0.4),
        metric="score/db",
        control="C",
        seeds=SEEDS,
        milestones=[10, 20, 30, 40],
    )
    assert isinstance(asha, ASHAScheduler) and asha._time_attr == "step" and asha._max_t == 40
    assert [rung for rung, _ in asha._brackets[0]._rungs][-1] == 20  # first rung at the first milestone >= 0.4 * 40
    assert (
        type(make_scheduler(SchedulerSettings("fifo"), metric="score/db", control="C", seeds=SEEDS, milestones=[10]))
        is FIFOScheduler
    )
