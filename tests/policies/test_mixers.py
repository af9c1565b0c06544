"""Mixers and the domain sampler, with hand-computed expectations (DESIGN §4)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from policies_batches import make_batch

from tune_dfrl.policies import DomainSampler, largest_remainder, make_mixer

E = math.e


def observe(mixer, step: int, rewards: dict[int, list[float]], abs_adv: float = 0.5) -> None:
    domain = [d for d, rs in rewards.items() for _ in rs]
    reward = [r for rs in rewards.values() for r in rs]
    mixer.observe(step, torch.tensor(domain), torch.tensor(reward), torch.full((len(reward),), abs_adv))


def softmax(x: list[float]) -> np.ndarray:
    e = np.exp(np.asarray(x) - max(x))
    return e / e.sum()


def test_reward_gap_by_hand():
    m = make_mixer("reward_gap", {"temperature": 0.5}, num_domains=2)
    observe(m, 0, {0: [1.0, 1.0], 1: [0.0, 0.5]})  # mu = 1, 0.25 -> logits 0, 1.5
    assert m.proportions(1) == pytest.approx([1 / (1 + E**1.5), E**1.5 / (1 + E**1.5)])


def test_floor_is_exact():
    m = make_mixer("reward_gap", {"temperature": 1e-6, "floor": 0.1}, num_domains=4)
    observe(m, 0, {0: [0.9], 1: [0.8], 2: [0.7], 3: [0.1]})
    p = m.proportions(1)
    assert p.tolist()[:3] == [0.1, 0.1, 0.1]  # target 0 there: exactly the floor
    assert p[3] == pytest.approx(0.7) and p.sum() == pytest.approx(1.0)
    soft = make_mixer("dump_ucb", {"floor": 0.2}, num_domains=4)
    observe(soft, 0, {0: [1.0] * 50, 1: [0.0]})
    assert (soft.proportions(1) >= 0.2).all() and soft.proportions(1).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"'floor' for reward_gap must be in \[0, 0.25\) at num_domains=4; got 0.25"):
        make_mixer("reward_gap", {"floor": 0.25}, num_domains=4)


def test_dump_ucb_uses_draw_counts():
    unequal = make_mixer("dump_ucb", {"c": 1.0, "temperature": 1.0, "window": 1}, num_domains=2)
    observe(unequal, 0, {0: [1.0] * 8})  # outside the window, but counted: n = (10, 2) after step 1
    observe(unequal, 1, {0: [1.0, 0.0], 1: [1.0, 0.0]})  # window: v = (0.5, 0.5)
    equal = make_mixer("dump_ucb", {"c": 1.0, "temperature": 1.0, "window": 1}, num_domains=2)
    observe(equal, 1, {0: [1.0, 0.0], 1: [1.0, 0.0]})
    bonus = [math.sqrt(2 * math.log(13) / 11), math.sqrt(2 * math.log(13) / 3)]
    assert unequal.proportions(2) == pytest.approx(softmax([0.5 + bonus[0], 0.5 + bonus[1]]))
    assert unequal.proportions(2)[1] > 0.5
    assert equal.proportions(2) == pytest.approx([0.5, 0.5])


def test_dump_ucb_uses_mean_abs_advantage():
    m = make_mixer("dump_ucb", {"c": 0.0, "temperature": 0.5}, num_domains=2)
    m.observe(0, torch.tensor([0, 1]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.5]))
    assert m.proportions(1) == pytest.approx(softmax([2.0, 1.0]))


def test_tscl_gives_a_rising_low_reward_domain_the_weight():
    steps = [(0.9, 0.1, 0.1), (0.9, 0.2, 0.1), (0.9, 0.3, 0.1), (0.9, 0.4, 0.1)]
    tscl = make_mixer("tscl", {"temperature": 0.05}, num_domains=3)
    gap = make_mixer("reward_gap", {"temperature": 0.05}, num_domains=3)
    for step, rewards in enumerate(steps):
        for m in (tscl, gap):
            observe(m, step, {d: [r] for d, r in enumerate(rewards)})
    # slopes 0, 0.1, 0 -> logits 0, 2, 0
    assert tscl.proportions(4) == pytest.approx([1 / (2 + E**2), E**2 / (2 + E**2), 1 / (2 + E**2)])
    assert tscl.diagnostics()["mixer/slope_1"] == pytest.approx(0.1)
    assert np.argmax(gap.proportions(4)) == 2  # reward_gap prefers the lowest mean reward instead


def test_tscl_signed_ignores_falling_domains():
    unsigned = make_mixer("tscl", {"temperature": 0.05}, num_domains=2)
    signed = make_mixer("tscl", {"temperature": 0.05, "signed": True}, num_domains=2)
    for step, r in enumerate([0.4, 0.3, 0.2, 0.1]):
        for m in (unsigned, signed):
            observe(m, step, {0: [0.5], 1: [r]})
    assert unsigned.proportions(4) == pytest.approx([1 / (1 + E**2), E**2 / (1 + E**2)])
    assert signed.proportions(4) == pytest.approx([0.5, 0.5])


def test_slope_is_least_squares_over_the_steps_a_domain_appears_in():
    m = make_mixer("tscl", {}, num_domains=2)
    observe(m, 0, {0: [0.0], 1: [0.2]})
    observe(m, 1, {0: [0.5]})
    observe(m, 3, {0: [1.5], 1: [0.8]})  # domain 1 at steps 0, 3: slope 0.6 / 3
    d = m.diagnostics()
    # domain 0: x = 0, 1, 3 (mean 4/3), y = 0, .5, 1.5 (mean 2/3): sxy = 7/3, sxx = 14/3
    assert d["mixer/slope_0"] == pytest.approx((7 / 3) / (14 / 3))
    assert d["mixer/slope_1"] == pytest.approx(0.2)


def test_window_slides_and_absent_domains_are_neutral():
    m = make_mixer("reward_gap", {"window": 2}, num_domains=3)
    observe(m, 0, {0: [1.0], 1: [1.0]})
    observe(m, 1, {0: [0.2], 1: [0.6]})
    observe(m, 2, {0: [0.2, 0.2], 1: [0.6]})
    d = m.diagnostics()
    assert d["mixer/mean_reward_0"] == pytest.approx(0.2)  # step 0 left the window
    assert d["mixer/mean_reward_1"] == pytest.approx(0.6)
    assert d["mixer/mean_reward_2"] == pytest.approx(0.4)  # never seen: mean of the present domains
    assert [d[f"mixer/drawn_{k}"] for k in range(3)] == [4, 3, 0]


def test_observe_same_step_accumulates_and_accepts_a_batch():
    b = make_batch([[1.0, 0.0], [1.0, 1.0]], domain=[0, 0, 1, 1])
    from_batch = make_mixer("dump_ucb", {}, num_domains=2)
    from_batch.observe(0, b)
    split = make_mixer("dump_ucb", {}, num_domains=2)
    split.observe(0, b.domain[:2], b.reward[:2], b.abs_advantage[:2])
    split.observe(0, b.domain[2:], b.reward[2:], b.abs_advantage[2:])
    assert from_batch.diagnostics() == split.diagnostics()
    assert from_batch.diagnostics()["mixer/mean_abs_adv_1"] == 0.0  # the all-solved group


def test_warmup_and_update_every():
    m = make_mixer("reward_gap", {"warmup": 2, "update_every": 2}, num_domains=2, static_proportions=[3, 1])
    assert m.proportions(0).tolist() == [0.75, 0.25]
    observe(m, 0, {0: [1.0], 1: [0.0]})
    assert m.proportions(1).tolist() == [0.75, 0.25]
    p2 = m.proportions(2)
    assert p2 == pytest.approx([1 / (1 + E), E / (1 + E)])
    observe(m, 2, {0: [0.0] * 9, 1: [1.0] * 9})
    assert m.proportions(3).tolist() == p2.tolist()  # held between updates
    assert m.proportions(4)[0] > 0.5


def test_static_mixer():
    assert make_mixer("static", {}, num_domains=4).proportions(100).tolist() == [0.25] * 4
    assert make_mixer("static", {"proportions": [1, 3]}, num_domains=2).proportions(5).tolist() == [0.25, 0.75]
    with pytest.raises(ValueError, match="static proportions must be 3 numbers"):
        make_mixer("static", {"proportions": [1, 3]}, num_domains=3)
    with pytest.raises(ValueError, match="'softmax' is not a mixer"):
        make_mixer("softmax", {}, num_domains=3)


def test_mixer_state_dict_roundtrip_through_json():
    a = make_mixer("tscl", {"window": 3}, num_domains=2)
    for step in range(5):
        observe(a, step, {0: [0.1 * step], 1: [0.5, 0.1 * step * step]})
    a.proportions(5)
    b = make_mixer("tscl", {"window": 3}, num_domains=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for m in (a, b):
        observe(m, 5, {0: [0.9], 1: [0.0]})
    assert a.proportions(6).tolist() == b.proportions(6).tolist()
    assert a.diagnostics() == b.diagnostics()


def test_observe_rejects_bad_input():
    m = make_mixer("tscl", {}, num_domains=2)
    with pytest.raises(ValueError, match=r"domain ids must be in \[0, 2\)"):
        observe(m, 0, {2: [1.0]})
    observe(m, 3, {0: [1.0]})
    with pytest.raises(ValueError, match="steps must not decrease"):
        observe(m, 2, {0: [1.0]})
    bad = (([np.nan, 1.0], [0.5, 0.5], "reward"), ([0.0, 1.0], [np.inf, 0.5], "abs_advantage"))
    for reward, abs_advantage, name in bad:
        for as_array in (np.asarray, torch.tensor):
            with pytest.raises(ValueError, match=f"observe: {name} has 1 NaN/inf entries"):
                m.observe(4, as_array([0, 1]), as_array(reward), as_array(abs_advantage))
    assert m.window.steps == [3]  # nothing recorded


# --- sampler -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p, total, counts",
    [
        ([0.5, 0.3, 0.2], 7, [4, 2, 1]),  # 3.5, 2.1, 1.4: the leftover unit goes to .5
        ([1 / 3] * 3, 4, [2, 1, 1]),  # ties go to the lower index
        ([1 / 3] * 3, 5, [2, 2, 1]),
        ([0.1] * 10, 10, [1] * 10),
        ([0.3, 0.7], 10, [3, 7]),  # 0.3 * 10 is 3.0000000000000004 in floats
        ([0.0, 1.0], 3, [0, 3]),
    ],
)
def test_largest_remainder(p, total, counts):
    assert largest_remainder(np.array(p), total).tolist() == counts


@pytest.mark.parametrize(
    "p, total, message",
    [
        ([0.5, 0.6], 4, r"proportions must be non-negative numbers summing to 1; got \[0.5, 0.6\]"),
        ([1.5, -0.5], 4, "proportions must be non-negative"),
        ([np.nan, 1.0], 4, "proportions must be non-negative"),
        ([], 4, "proportions must be non-negative"),
        ([[0.5, 0.5]], 4, "proportions must be non-negative"),
        ([0.5, 0.5], -1, "total must be an integer >= 0; got -1"),
        ([0.5, 0.5], 2.5, "total must be an integer >= 0; got 2.5"),
    ],
)
def test_largest_remainder_rejects_bad_input(p, total, message):
    with pytest.raises(ValueError, match=message):
        largest_remainder(p, total)
    assert largest_remainder([0.5, 0.5 + 1e-9], np.int64(3)).sum() == 3  # renormalised within 1e-6


def test_sampler_is_seeded_and_reports_counts():
    a, b = DomainSampler([5, 7, 3], seed=4), DomainSampler([5, 7, 3], seed=4)
    for _ in range(4):
        da, db = a.draw(np.array([0.5, 0.3, 0.2]), 10), b.draw(np.array([0.5, 0.3, 0.2]), 10)
        assert np.array_equal(da.index, db.index) and np.array_equal(da.domain, db.domain)
        assert da.counts.tolist() == [5, 3, 2]
        assert np.bincount(da.domain, minlength=3).tolist() == [5, 3, 2]
    other = DomainSampler([5, 7, 3], seed=5).draw(np.array([0.5, 0.3, 0.2]), 10)
    assert not np.array_equal(other.index, DomainSampler([5, 7, 3], seed=4).draw(np.array([0.5, 0.3, 0.2]), 10).index)


def test_sampler_streams_are_per_domain_permutations():
    s = DomainSampler([4, 6], seed=0)
    first = s.draw(np.array([1.0, 0.0]), 4)
    assert sorted(first.index.tolist()) == [0, 1, 2, 3]  # one full pass
    second = s.draw(np.array([1.0, 0.0]), 8)
    assert np.bincount(second.index, minlength=4).tolist() == [2, 2, 2, 2]  # two more passes
    # domain 0's stream does not depend on what domain 1 draws
    alone = DomainSampler([4, 6], seed=0).draw(np.array([1.0, 0.0]), 3).index
    mixed = DomainSampler([4, 6], seed=0).draw(np.array([0.5, 0.5]), 6)
    assert mixed.index[mixed.domain == 0].tolist() == alone.tolist()


def test_sampler_state_dict_roundtrip():
    a = DomainSampler([5, 3], seed=9)
    a.draw(np.array([0.5, 0.5]), 7)
    b = DomainSampler([5, 3], seed=0)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), default=int)))
    for _ in range(3):
        assert a.draw(np.array([0.6, 0.4]), 9).index.tolist() == b.draw(np.array([0.6, 0.4]), 9).index.tolist()


def test_sampler_errors():
    s = DomainSampler([5, 0], seed=0)
    with pytest.raises(ValueError, match="domain 1 has an empty pool but was assigned 1"):
        s.draw(np.array([0.5, 0.5]), 2)
    with pytest.raises(ValueError, match="proportions must be non-negative numbers summing to 1"):
        s.draw(np.array([0.5, 0.6]), 2)
    with pytest.raises(ValueError, match=r"proportions must be 2 numbers \(one per domain\); got shape \(3,\)"):
        s.draw(np.array([0.5, 0.25, 0.25]), 2)
    with pytest.raises(ValueError, match="pool_sizes"):
        DomainSampler([], seed=0)


def test_a_mixer_changes_what_is_sampled():
    m = make_mixer("reward_gap", {"temperature": 0.1, "floor": 0.05}, num_domains=2)
    sampler = DomainSampler([100, 100], seed=1)
    assert sampler.draw(m.proportions(0), 20).counts.tolist() == [10, 10]
    observe(m, 0, {0: [1.0] * 10, 1: [0.0] * 10})
    # p = 0.05 + 0.9 * softmax(0, 10) -> domain 0 gets 0.05 + 0.9 / (1 + e^10)
    expected = 0.05 + 0.9 / (1 + E**10)
    assert m.proportions(1)[0] == pytest.approx(expected)
    draw = sampler.draw(m.proportions(1), 20)
    assert draw.counts.tolist() == [1, 19] and draw.proportions.tolist() == [0.05, 0.95]
