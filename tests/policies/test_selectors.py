"""Selectors with hand-computed expectations (DESIGN §4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from policies_batches import make_batch, random_batch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from tune_dfrl.policies import RolloutBatch, make_policy


def kept(method: str, params: dict, batch, n: int = 5) -> list[int]:
    w = make_policy(method, params, rollout_n=n).apply(batch).token_weights[:, 0]
    return w.nonzero().flatten().tolist()


# Groups solving 0..5 of 5: solve rates 0, 0.2, 0.4, 0.6, 0.8, 1 (group g = rows 5g..5g+4).
LADDER = make_batch([[1.0] * k + [0.0] * (5 - k) for k in range(6)])


def rows(*groups: int) -> list[int]:
    return [5 * g + j for g in groups for j in range(5)]


@pytest.mark.parametrize(
    "params, groups",
    [
        ({"low": 0.2, "high": 0.8}, (2, 3)),  # open band: 0.2 and 0.8 themselves excluded
        ({"low": 0.2, "high": 0.8, "inclusive": True}, (1, 2, 3, 4)),
        ({}, (1, 2, 3, 4)),  # default (0, 1): drop all-wrong and all-right groups
        ({"low": 0.0, "high": 1.0, "inclusive": True}, (0, 1, 2, 3, 4, 5)),
        ({"low": 0.5, "high": 1.0, "inclusive": True}, (3, 4, 5)),
    ],
)
def test_threshold_band_edges_on_solve_rates_at_n5(params, groups):
    assert kept("difffilter", params, LADDER) == rows(*groups)


def test_threshold_band_success_threshold_on_continuous_rewards():
    b = make_batch([[0.9, 0.6, 0.3, 0.1]])  # rate 0.5 at tau=0.5, 0.25 at tau=0.7
    assert kept("difffilter", {"low": 0.4, "high": 0.6}, b, n=4) == [0, 1, 2, 3]
    assert kept("difffilter", {"low": 0.4, "high": 0.6, "success_threshold": 0.7}, b, n=4) == []


def test_empty_selection_is_valid_and_reported():
    for denominator in ("all", "kept"):
        r = make_policy("difffilter", {"low": 0.2, "high": 0.4, "denominator": denominator}, rollout_n=5).apply(LADDER)
        assert torch.equal(r.token_weights, torch.zeros_like(r.token_weights))
        assert r.diagnostics["empty_selection"] == 1.0
        assert r.diagnostics["kept_fraction"] == 0.0
        assert r.diagnostics["kept_token_fraction"] == 0.0
        assert r.diagnostics["weight_max"] == 0.0
        assert all(np.isfinite(v) for v in r.diagnostics.values())


def test_all_equal_groups():
    same = make_batch([[1.0] * 4, [0.0] * 4])  # every advantage 0, every solve rate 0 or 1
    assert kept("difffilter", {}, same, n=4) == []
    assert kept("topk", {"f": 0.25}, same, n=4) == [0, 1]  # all scores tie: lowest indices
    # max_variance at f=0.5, G=4: m=2, every a gives variance 0 -> a=0: the two "highest" by stable order
    assert kept("maxvar", {"f": 0.5}, same, n=4) == [2, 3, 6, 7]
    assert kept("gfpo", {"k": 2}, same, n=4) == [0, 1, 4, 5]


def test_topk_fraction_counts_and_ties():
    adv = torch.tensor([1.0, -3.0, 2.0, 3.0, 0.5, -2.0, 1.0, 0.0, 0.1, 0.2])[:, None].expand(10, 4).contiguous()
    b = make_batch([[0.0] * 5, [1.0] * 5], advantages=adv)
    # |A| = 1, 3, 2, 3, .5, 2, 1, 0, .1, .2 ; k = ceil(0.3 * 10) = 3 (not 4: 0.3*10 rounds to 3)
    assert kept("topk", {"f": 0.3}, b) == [1, 2, 3]  # ties 2 vs 2: index 2 before 5
    assert kept("topk", {"f": 0.01}, b) == [1]  # k = max(1, ceil(0.1)) = 1, tie 3 vs 3 -> index 1
    # scope=group: k_g = ceil(0.4 * 5) = 2 per group
    assert kept("topk", {"f": 0.4, "scope": "group"}, b) == [1, 3, 5, 6]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_abs_advantages_of_different_lengths_tie_and_break_by_index(dtype):
    """0.1 averaged over 3 tokens is 0.10000000000000002 by a plain sum; the rule says all three rows tie."""
    adv = torch.full((3, 3), 0.1, dtype=dtype) * torch.tensor([1.0, -1.0, 1.0], dtype=dtype)[:, None]
    b = make_batch([[1.0, 0.0, 1.0]], lengths=[3, 1, 3], advantages=adv)
    assert b.abs_advantage[0] == b.abs_advantage[1] == b.abs_advantage[2] == float(torch.tensor(0.1, dtype=dtype))
    assert kept("topk", {"f": 0.5}, b, n=3) == [0, 1]  # k = 2 of 3, ties by index
    assert kept("topk", {"f": 0.5, "scope": "group"}, b, n=3) == [0, 1]


def test_abs_advantage_is_the_mean_over_valid_tokens():
    b = random_batch(prompts=20, n=4, max_len=9, seed=5, binary=False)
    g = torch.Generator().manual_seed(1)
    token_level = RolloutBatch(
        b.group, b.domain, b.reward, torch.randn(b.advantages.shape, generator=g), b.response_mask, b.old_log_probs
    )
    left_padded = RolloutBatch(
        b.group, b.domain, b.reward, token_level.advantages, b.response_mask.flip(1), b.old_log_probs
    )
    for batch in (b, token_level, left_padded):
        plain = (batch.advantages.abs() * batch.response_mask).sum(1).double() / batch.lengths
        assert torch.allclose(batch.abs_advantage, plain, rtol=1e-6, atol=0)
        assert torch.equal(batch.abs_advantage_max, (batch.advantages.abs() * batch.response_mask).amax(1).double())


def test_topk_agg_sum_and_max():
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    b = make_batch([[0.0, 1.0, 0.5]], lengths=[4, 1, 2], advantages=adv)
    # mean |A| over valid tokens: 1, 3, 2; sum: 4, 3, 4; max: 1, 3, 2
    assert kept("topk", {"f": 0.34, "agg": "mean"}, b, n=3) == [1, 2]
    assert kept("topk", {"f": 0.34, "agg": "sum"}, b, n=3) == [0, 2]
    assert kept("topk", {"f": 0.01, "agg": "max"}, b, n=3) == [1]


def test_gfpo_efficiency_short_and_small_groups():
    b = make_batch([[1.0, 0.0, 1.0, 1.0, 0.0], [1.0, 0.0]], lengths=[10, 4, 8, 4, 6, 3, 5])
    # efficiency R/L: .1, 0, .125, .25, 0 -> best two: rows 3, 2; group of 2 <= k kept whole
    assert kept("gfpo", {"k": 2}, b) == [2, 3, 5, 6]
    # short: -L: -10, -4, -8, -4, -6 -> rows 1 and 3 (tie at 4, index order)
    assert kept("gfpo", {"k": 2, "metric": "short"}, b) == [1, 3, 5, 6]
    assert kept("gfpo", {"k": 1, "metric": "short"}, b) == [1, 5]


@pytest.mark.parametrize("size, m", [(5, 3), (4, 2), (3, 2), (2, 1), (1, 1), (6, 3), (8, 4)])
def test_max_variance_keep_counts_at_half(size, m):
    b = make_batch([[float(i % 2) for i in range(size)], [0.3] * 5])
    w = make_policy("maxvar", {"f": 0.5}, rollout_n=5).apply(b).token_weights[:, 0]
    assert int(w[:size].sum()) == m
    assert int(w[size:].sum()) == 3


def test_max_variance_best_a_by_hand():
    # binary, G=5, m=3: a=0 keeps {1,1,1} (var 0); a=1 keeps {0,1,1}; a=2,3 keep {0,0,1} (same var) -> a=1
    assert kept("maxvar", {"f": 0.5}, make_batch([[0.0, 1.0, 0.0, 1.0, 1.0]])) == [0, 3, 4]
    # continuous: sorted .1(0) .3(3) .5(2) .7(4) .9(1); a=1 {.1,.7,.9} ties a=2 {.1,.3,.9}: first a wins
    assert kept("maxvar", {"f": 0.5}, make_batch([[0.1, 0.9, 0.5, 0.3, 0.7]])) == [0, 1, 4]
    # f=0.8, m=4: a=2 keeps {.1,.3,.7,.9}, the widest spread
    assert kept("maxvar", {"f": 0.8}, make_batch([[0.1, 0.9, 0.5, 0.3, 0.7]])) == [0, 1, 3, 4]


def test_denominator_kept_rescales_by_token_ratio():
    b = make_batch([[1.0, 0.0, 1.0, 1.0, 0.0]], lengths=[10, 4, 8, 4, 6])
    r_all = make_policy("gfpo", {"k": 2}, rollout_n=5).apply(b)
    r_kept = make_policy("gfpo", {"k": 2, "denominator": "kept"}, rollout_n=5).apply(b)
    # kept rows 2, 3 with 8 + 4 of 32 tokens
    assert r_all.diagnostics["kept_token_fraction"] == pytest.approx(12 / 32)
    assert r_all.diagnostics["kept_fraction"] == pytest.approx(2 / 5)
    assert r_kept.token_weights[:, 0].tolist() == pytest.approx([0, 0, 32 / 12, 32 / 12, 0])
    assert r_kept.diagnostics["weight_mean"] == pytest.approx(1.0)  # token-weighted mean over valid tokens
    assert r_all.diagnostics["weight_mean"] == pytest.approx(12 / 32)


@pytest.mark.parametrize("method, params", [("gfpo", {"k": 3}), ("gfpo", {"k": 1}), ("maxvar", {"f": 0.5})])
def test_recompute_advantages_matches_verl_on_the_kept_subset(method, params):
    b = random_batch(prompts=6, n=5, max_len=7, seed=3, binary=False)
    r = make_policy(method, {**params, "recompute_advantages": True}, rollout_n=5).apply(b)
    keep = r.token_weights[:, 0] > 0
    scores = torch.zeros(int(keep.sum()), 7)
    scores[:, 0] = b.reward[keep]
    expected = compute_grpo_outcome_advantage(scores, b.response_mask[keep], np.asarray(b.group[keep]))[0]
    assert torch.allclose(r.advantages[keep], expected, atol=1e-5)
    assert torch.equal(r.advantages[~keep], torch.zeros_like(r.advantages[~keep]))
    unchanged = make_policy(method, params, rollout_n=5).apply(b)
    assert unchanged.advantages is b.advantages


def test_recompute_keeps_the_batch_advantages_of_groups_kept_whole():
    """gfpo keeps groups of size <= k whole; maxvar f=1 keeps all: their advantages are the batch's, bit for bit."""
    b = make_batch([[1.0, 0.0, 0.0, 1.0, 1.0], [0.3, 0.9]], lengths=[2, 3, 4, 1, 2, 3, 1])
    r = make_policy("gfpo", {"k": 2, "recompute_advantages": True}).apply(b)
    assert torch.equal(r.advantages[5:], b.advantages[5:])  # the group of 2
    assert not torch.equal(r.advantages[:5], b.advantages[:5])
    whole = make_policy("maxvar", {"f": 1.0, "recompute_advantages": True}).apply(b)
    assert torch.equal(whole.advantages, b.advantages)


def test_existing_is_weights_are_multiplied_not_replaced():
    is_w = torch.linspace(0.5, 1.5, 5 * 4).reshape(5, 4)
    b = make_batch([[1.0, 0.0, 1.0, 1.0, 0.0]], lengths=[4] * 5, rollout_is_weights=is_w)
    r = make_policy("gfpo", {"k": 2, "metric": "short"}, rollout_n=5).apply(b)
    expected = is_w * torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])[:, None]  # all length 4: rows 0, 1 by index
    assert torch.equal(r.token_weights, expected)
    base = make_policy("baseline", {}).apply(b)
    assert torch.equal(base.token_weights, is_w)


def kept_by_group(batch: RolloutBatch, weights: torch.Tensor) -> dict[int, list[tuple[float, float]]]:
    """Per group (by its id): the (reward, weight) of each response kept, sorted."""
    kept: dict[int, list[tuple[float, float]]] = {}
    for group, reward, weight in zip(batch.group.tolist(), batch.reward.tolist(), weights.tolist(), strict=True):
        kept.setdefault(group, [])
        if weight > 0:
            kept[group].append((reward, weight))
    return {group: sorted(responses) for group, responses in kept.items()}


def test_selection_is_deterministic_and_group_order_free():
    """The rows of a batch permuted (each response keeps its group id): the same responses are kept, row for row
    through the permutation, where no two responses of a group tie on the selector's score (continuous rewards). With
    binary rewards, ties are broken by index (the row order), so of tied responses other rows may be kept: each group
    still keeps as many responses, with the same rewards and weights."""
    perm = torch.randperm(40 * 8, generator=torch.Generator().manual_seed(0))
    for binary in (True, False):
        b = random_batch(prompts=40, n=8, max_len=5, seed=11, binary=binary)
        shuffled = type(b)(
            b.group[perm],
            b.domain[perm],
            b.reward[perm],
            b.advantages[perm],
            b.response_mask[perm],
            b.old_log_probs[perm],
        )
        for method, params in [("difffilter", {}), ("maxvar", {"f": 0.75}), ("gfpo", {"k": 3})]:
            w1 = make_policy(method, params, rollout_n=8).apply(b).token_weights[:, 0]
            assert torch.equal(w1, make_policy(method, params, rollout_n=8).apply(b).token_weights[:, 0])
            w2 = make_policy(method, params, rollout_n=8).apply(shuffled).token_weights[:, 0]
            assert kept_by_group(shuffled, w2) == kept_by_group(b, w1), (method, binary)
            assert w2.sum() == w1.sum()  # same number kept per group whatever the row order
            if not binary or method == "difffilter":  # no ties (difffilter decides whole groups)
                assert torch.equal(w2, w1[perm]), (method, binary)
