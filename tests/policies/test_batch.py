"""RolloutBatch validation and derived signals."""

from __future__ import annotations

import pytest
import torch
from policies_batches import make_batch

from tune_dfrl.policies import RolloutBatch, make_policy
from tune_dfrl.policies.batch import rank_within_group


def fields(n: int = 3, length: int = 4) -> dict[str, torch.Tensor]:
    return dict(
        group=torch.tensor([7, 7, 3][:n]),
        domain=torch.zeros(n, dtype=torch.long),
        reward=torch.tensor([1.0, 0.0, 1.0][:n]),
        advantages=torch.zeros(n, length),
        response_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)[:n, :length],
        old_log_probs=torch.zeros(n, length),
    )


def test_derived_signals_by_hand():
    f = fields()
    f["advantages"] = torch.tensor([[2.0, -4.0, 9.0, 9.0], [1.0, 1.0, -1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    b = RolloutBatch(**f)
    assert b.token_counts.tolist() == [2, 4, 0]
    assert b.lengths.tolist() == [2, 4, 1]  # L_i = max(1, sum mask)
    assert b.abs_advantage.tolist() == [3.0, 1.0, 0.0]  # masked tokens (the 9s and 5s) ignored
    assert b.group_index.tolist() == [1, 1, 0]  # ids 3, 7 -> contiguous 0, 1
    assert b.group_sizes.tolist() == [1, 2]
    assert b.group_mean(b.reward.double()).tolist() == [1.0, 0.5]


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("reward", torch.tensor([1.0, 0.0]), r"reward has shape \(2,\); expected \(3,\)"),
        ("old_log_probs", torch.zeros(3, 5), r"old_log_probs has shape \(3, 5\); expected \(3, 4\)"),
        ("response_mask", torch.tensor([[1, 0.5, 0, 0], [1, 2, 1, 1], [0, 0, 0, 0]]), "must be 0/1; got 2 other"),
        ("reward", torch.tensor([float("nan"), 0.0, float("inf")]), "reward has 2 NaN/inf"),
        ("advantages", torch.tensor([[float("nan")] * 4, [0.0] * 4, [0.0] * 4]), "advantages has 4 NaN/inf"),
        ("rollout_is_weights", torch.full((3, 4), float("inf")), "rollout_is_weights has 12 NaN/inf"),
        (
            "old_log_probs",
            torch.tensor([[0.0, float("nan"), 0, 0], [-float("inf"), 0, 0, 0], [0.0] * 4]),
            "old_log_probs has 2 NaN/inf entries at valid tokens",
        ),
        ("group", torch.tensor([0.0, 1.0, 2.0]), "group must be an integer tensor"),
        ("domain", torch.tensor([0, -1, 0]), "domain must be >= 0"),
        ("reward", [1.0, 0.0, 1.0], "reward must be a torch.Tensor"),
    ],
)
def test_invalid_batches_name_the_signal(name, value, message):
    f = fields()
    f[name] = value
    with pytest.raises((ValueError, TypeError), match=message):
        RolloutBatch(**f)


def test_non_finite_old_log_probs_at_padded_tokens_are_ignored():
    f = fields()
    f["old_log_probs"] = torch.tensor([[-1.0, -0.5, float("nan"), -float("inf")], [-0.1] * 4, [float("nan")] * 4])
    w = make_policy("ar", {"alpha": 1.0}).apply(RolloutBatch(**f)).token_weights
    assert torch.isfinite(w).all()


def test_bool_mask_and_is_weights_accepted():
    f = fields()
    f["response_mask"] = f["response_mask"].bool()
    b = RolloutBatch(**f, rollout_is_weights=torch.ones(3, 4))
    assert b.token_counts.tolist() == [2, 4, 0]


def test_rank_within_group_ties_by_index_and_unequal_groups():
    group = torch.tensor([0, 1, 0, 0, 1, 2])
    key = torch.tensor([5.0, 1.0, 5.0, 7.0, 1.0, 3.0])
    assert rank_within_group(group, key, descending=True).tolist() == [1, 0, 2, 0, 1, 0]
    assert rank_within_group(group, key, descending=False).tolist() == [0, 0, 1, 2, 1, 0]


def test_make_batch_uses_verl_grpo_advantages():
    b = make_batch([[1.0, 0.0]])
    # mean 0.5, unbiased std sqrt(0.5): (1 - 0.5) / (0.7071 + 1e-6)
    assert b.advantages[0, 0].item() == pytest.approx(0.5 / (0.5**0.5 + 1e-6), rel=1e-6)
    assert b.advantages[1, 0].item() == pytest.approx(-0.5 / (0.5**0.5 + 1e-6), rel=1e-6)


def test_low_precision_advantages_give_float32_weights():
    f = fields()
    f["advantages"] = torch.tensor([[2.0, -4.0, 9.0, 9.0], [1.0, 1.0, -1.0, 1.0], [5.0] * 4], dtype=torch.bfloat16)
    f["old_log_probs"] = f["old_log_probs"].to(torch.bfloat16)
    b = RolloutBatch(**f)
    assert b.weight_dtype == torch.float32 and b.workspace().dtype == torch.float32
    assert b.abs_advantage.tolist() == [3.0, 1.0, 0.0]
    w = make_policy("ar", {"alpha": 1.0}).apply(b).token_weights
    assert w.dtype == torch.float32 and w[0, :2].tolist() == [1.0, 1.0]  # p = 1 everywhere
