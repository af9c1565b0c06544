"""PairedLedger: one duplicate rule, paired deltas over common seeds, the interval of stats.paired_interval."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from tune_dfrl.ledger import FAILED, FINISHED, STOPPED, PairedLedger, estimate_of


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
