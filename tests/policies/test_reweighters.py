"""Reweighters with hand-computed expectations (DESIGN §4)."""

from __future__ import annotations

import math

import pytest
import torch
from policies_batches import make_batch, random_batch

from tune_dfrl.policies import make_policy

E = math.e


def row_weights(method: str, params: dict, batch) -> list[float]:
    return make_policy(method, params, rollout_n=3).apply(batch).token_weights[:, 0].tolist()


def with_abs_adv(values: list[float], lengths: list[int] | None = None):
    """One group whose rows have constant advantages `values` (so mean |A| = |value|)."""
    adv = torch.tensor(values)[:, None].expand(len(values), 4).contiguous()
    return make_batch([[0.0] * len(values)], advantages=adv, lengths=lengths)


def test_softmax_by_hand():
    b = with_abs_adv([0.0, 1.0, -2.0])
    z = 1 + E + E**2
    assert row_weights("softmax", {"temperature": 1.0}, b) == pytest.approx([3 / z, 3 * E / z, 3 * E**2 / z])
    # informative scope: row 0 (|A| = 0) gets 1, the others mean 1 between them
    assert row_weights("softmax", {"temperature": 1.0, "scope": "informative"}, b) == pytest.approx(
        [1.0, 2 * E / (E + E**2), 2 * E**2 / (E + E**2)]
    )
    assert row_weights("softmax", {"temperature": 0.5}, b) == pytest.approx(
        [3 / (1 + E**2 + E**4), 3 * E**2 / (1 + E**2 + E**4), 3 * E**4 / (1 + E**2 + E**4)]
    )


@pytest.mark.parametrize("temperature", [1e-30, 1e-300, 5e-324])
def test_softmax_tiny_temperature_has_no_nan(temperature):
    assert row_weights("softmax", {"temperature": temperature}, with_abs_adv([0.0, 1.0, -2.0])) == [0.0, 0.0, 3.0]
    assert row_weights("softmax", {"temperature": temperature}, with_abs_adv([2.0, 1.0, -2.0])) == [1.5, 0.0, 1.5]


def test_softmax_huge_temperature_is_uniform():
    assert row_weights("softmax", {"temperature": 1e12}, with_abs_adv([0.0, 1.0, -2.0])) == pytest.approx([1.0] * 3)


def test_difficulty_band_by_hand():
    b = make_batch([[0.0, 0.25, 0.5, 0.75, 1.0]])
    # quantiles 0.25 / 0.75 of the rewards: 0.25 and 0.75 -> rows 1..3 get focus 2; mean 8/5
    w = make_policy("diffband", {"q_low": 0.25, "q_high": 0.75, "focus": 2.0}, rollout_n=5).apply(b)
    assert w.token_weights[:, 0].tolist() == pytest.approx([0.625, 1.25, 1.25, 1.25, 0.625])
    # interpolated quantiles: q=0.1 -> 0.1, q=0.4 -> 0.4: only reward 0.25 inside
    w = make_policy("diffband", {"q_low": 0.1, "q_high": 0.4, "focus": 6.0}, rollout_n=5).apply(b)
    assert w.token_weights[:, 0].tolist() == pytest.approx([0.5, 3.0, 0.5, 0.5, 0.5])


def test_difficulty_band_informative_scope_uses_scope_quantiles():
    b = make_batch([[1.0, 1.0], [0.0, 0.2, 0.4, 0.6]])  # the all-1 group has zero advantages
    w = make_policy("diffband", {"q_low": 0.0, "q_high": 0.5, "focus": 3.0, "scope": "informative"}, rollout_n=4)
    # quantiles over {0, .2, .4, .6}: 0 and 0.3 -> rows 2, 3 get 3, rows 4, 5 get 1; mean 2
    assert w.apply(b).token_weights[:, 0].tolist() == pytest.approx([1.0, 1.0, 1.5, 1.5, 0.5, 0.5])


def test_advantage_reweight_token_level_by_hand():
    lp = torch.log(torch.tensor([[1.0, 0.5], [0.2, 0.9]]))
    b = make_batch([[1.0, 0.0]], lengths=[2, 1], old_log_probs=lp)
    r = make_policy("ar", {"alpha": 0.5}, rollout_n=2).apply(b)
    raw = torch.tensor([[1.0, 0.75], [0.6, 0.95]])  # 0.5 p + 0.5
    mean = (1.0 + 0.75 + 0.6) / 3  # over the three valid tokens
    assert r.token_weights[0].tolist() == pytest.approx((raw[0] / mean).tolist())
    assert r.token_weights[1, 0].item() == pytest.approx(0.6 / mean)
    assert r.diagnostics["weight_mean"] == pytest.approx(1.0)
    assert r.diagnostics["weight_max"] == pytest.approx(1.0 / mean)
    std = torch.tensor([1.0, 0.75, 0.6]).div(mean).std(unbiased=False).item()
    assert r.diagnostics["weight_std"] == pytest.approx(std, rel=1e-5)
    ones = make_policy("ar", {"alpha": 0.0}, rollout_n=2).apply(b).token_weights
    assert torch.allclose(ones, torch.ones_like(ones))


def test_advantage_reweight_informative_scope():
    lp = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.2], [1.0, 1.0]]))
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]])
    b = make_batch([[1.0, 0.0], [1.0]], lengths=[2, 2, 2], old_log_probs=lp, advantages=adv)
    r = make_policy("ar", {"alpha": 1.0, "scope": "informative"}, rollout_n=2).apply(b)
    assert r.token_weights.flatten().tolist() == pytest.approx([0.5 / 0.35] * 2 + [0.2 / 0.35] * 2 + [1.0, 1.0])


def test_per_advantage_by_hand():
    b = with_abs_adv([1.0, -2.0, 4.0])
    assert row_weights("per", {"alpha": 1.0}, b) == pytest.approx([3 / 7, 6 / 7, 12 / 7])
    root_sum = 3 + 2**0.5  # sqrt of 1, 2, 4
    assert row_weights("per", {"alpha": 0.5}, b) == pytest.approx([3 / root_sum, 3 * 2**0.5 / root_sum, 6 / root_sum])
    assert row_weights("per", {"alpha": 0.0}, b) == pytest.approx([1.0, 1.0, 1.0])
    # zero-advantage rows: (0 + 1e-8)^1 -> essentially 0 under batch scope, 1 under informative
    z = with_abs_adv([0.0, 1.0, 3.0])
    assert row_weights("per", {"alpha": 1.0}, z) == pytest.approx([0.0, 0.75, 2.25], abs=1e-7)
    assert row_weights("per", {"alpha": 1.0, "scope": "informative"}, z) == pytest.approx([1.0, 0.5, 1.5])


def test_reweighters_mean_one_over_scope_and_multiply_is_weights():
    b = random_batch(prompts=8, n=4, max_len=6, seed=5)
    is_w = torch.rand(b.advantages.shape, generator=torch.Generator().manual_seed(1)) + 0.5
    b_is = type(b)(b.group, b.domain, b.reward, b.advantages, b.response_mask, b.old_log_probs, is_w)
    informative = b.abs_advantage > 0
    for method in ("softmax", "diffband", "per"):
        for scope in ("batch", "informative"):
            r = make_policy(method, {"scope": scope}, rollout_n=4).apply(b)
            w = r.token_weights[:, 0]
            rows = informative if scope == "informative" else torch.ones_like(informative)
            assert w[rows].mean().item() == pytest.approx(1.0)
            assert torch.all(w[~rows] == 1.0)
            assert torch.allclose(
                make_policy(method, {"scope": scope}, rollout_n=4).apply(b_is).token_weights, is_w * r.token_weights
            )
            assert r.diagnostics["kept_fraction"] == 1.0 and r.diagnostics["empty_selection"] == 0.0


def test_no_informative_rows_gives_uniform_weights():
    b = make_batch([[1.0, 1.0], [0.0, 0.0]])
    for method in ("softmax", "diffband", "per", "ar"):
        w = make_policy(method, {"scope": "informative"}, rollout_n=2).apply(b).token_weights
        assert torch.equal(w, torch.ones_like(w))
