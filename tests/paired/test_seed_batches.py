"""seeds=auto bookkeeping: which seeds each arm is handed after each look, read from a PairedLedger (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from tune_dfrl.paired.ledger import PairedLedger
from tune_dfrl.paired.seed_batches import OUT_FAILED, OUT_STOPPED, SeedBatches
from tune_dfrl.paired.sequential import SequentialRule, boundaries, look, nominal_levels

FINAL = 30
EFFECTS = {"good": 6.0, "null": 0.0, "bad": -8.0, "failed": 3.0}  # true paired effects (points); noise sd 1


def run_seeds(ledger: PairedLedger, arms: list[str], seeds: tuple[int, ...], rng: np.random.Generator) -> None:
    """Every (arm, seed) cell reports the final step and finishes; the control scores a per-seed offset."""
    for seed in seeds:
        base = 40.0 + 5.0 * seed
        for arm in arms:
            effect = 0.0 if arm == ledger.control else EFFECTS[arm] + rng.normal(0.0, 1.0)
            ledger.record(arm, seed, 10, base)
            ledger.record(arm, seed, FINAL, base + effect)
            ledger.end(arm, seed, "finished")


def test_open_arms_and_the_control_get_the_same_next_seeds_until_settled() -> None:
    rng = np.random.default_rng(3)
    rule = SequentialRule(start=3, batch=3, max=12)
    ledger, batches = PairedLedger("c"), SeedBatches(rule, "c")
    searched = ["good", "null", "bad", "stopped", "failed"]
    run_seeds(ledger, ["c", "good", "null", "bad"], batches.seeds_of("c"), rng)
    ledger.record("stopped", 0, 10, 1.0)
    for seed in batches.seeds_of("stopped"):
        ledger.end("stopped", seed, "stopped")
    run_seeds(ledger, ["failed"], (0, 1), rng)
    ledger.end("failed", 2, "failed")

    previous: dict = {}
    while not batches.finished:
        handed_before = {arm: batches.seeds_of(arm) for arm in ["c", *searched]}
        seen = batches.look(ledger, searched, FINAL)
        assert seen.number == len(batches.looks) and seen.seeds == rule.looks()[seen.number - 1]
        assert seen.out == {"stopped": OUT_STOPPED, "failed": OUT_FAILED}
        running = {
            arm: [ledger.paired_deltas(arm, FINAL)[s] for s in handed_before[arm]]
            for arm in ["good", "null", "bad"]
            if arm not in previous or previous[arm].status == "open"
        }
        assert seen.states == look(
            running, previous, rule, len(searched), seen.number
        )  # the pure rule, on the ledger's deltas
        arms_alpha = rule.alpha / len(searched)
        fractions = tuple(n / rule.max for n in rule.looks())
        assert seen.boundary == boundaries(fractions, arms_alpha)[seen.number - 1]
        assert seen.level == nominal_levels(rule, arms_alpha)[seen.number - 1]
        open_arms = [arm for arm, state in seen.states.items() if state.status == "open"]
        for arm in ["c", *searched]:
            gets = seen.next_seeds if arm == "c" or arm in open_arms else ()
            assert batches.seeds_of(arm) == handed_before[arm] + gets and seen.handed[arm] == batches.seeds_of(arm)
        if seen.next_seeds:
            assert open_arms and seen.next_seeds == tuple(range(seen.seeds, rule.looks()[seen.number]))
            run_seeds(ledger, ["c", *open_arms], seen.next_seeds, rng)
        previous = seen.states

    final = batches.looks[-1]
    assert len(batches.looks) > 1  # the first look left an arm open
    assert final.states["good"].status == "better" and final.states["bad"].status in ("worse", "futile")
    assert batches.seeds_of("bad") == tuple(range(rule.start))  # settled at the first look: no more seeds
    assert batches.history()["recommended"] == "good" and batches.history()["finished"]
    with pytest.raises(ValueError, match="no further look"):
        batches.look(ledger, searched, FINAL)


def test_the_last_look_hands_out_nothing_and_no_arm_means_no_seeds() -> None:
    rule = SequentialRule(start=2, batch=2, max=2)
    ledger, batches = PairedLedger("c"), SeedBatches(rule, "c")
    run_seeds(ledger, ["c", "null"], (0, 1), np.random.default_rng(0))
    assert batches.look(ledger, ["null"], FINAL).next_seeds == () and batches.finished
    empty = SeedBatches(SequentialRule(start=2, batch=2, max=6), "c")
    assert empty.look(ledger, [], FINAL).next_seeds == () and empty.history()["recommended"] == "c"
