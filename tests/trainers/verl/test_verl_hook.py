"""The data-policy hook on real verl DataProto batches after verl's own GRPO advantages.

Batch: two prompt groups of n = 4 (uids "a", "b"), response lengths 3,2,3,1 | 3,3,2,2 tokens
(19 in all), rewards 1,0,0,0 | 1,1,1,1. verl's GRPO gives group a: mean 0.25, unbiased std 0.5,
advantages (R - 0.25) / (0.5 + 1e-6) = 1.5, -0.5, -0.5, -0.5; group b: all 0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import compute_advantage

from tune_dfrl.trainers.verl.hook import DataPolicy, domain_ids
from tune_dfrl.trainers.verl.sampler import MixtureBatchSampler

LENGTHS = [3, 2, 3, 1, 3, 3, 2, 2]
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
WIDTH = 4
GRPO_A = [1.5 / (1 + 2e-6), -0.5 / (1 + 2e-6)]  # (R - mean) / (std + eps) for R = 1, 0 in group a


def verl_batch(rewards=REWARDS, lengths=LENGTHS, domains=None, is_weights=None) -> DataProto:
    """A DataProto as verl's `_compute_advantage` holds it, advantages computed by verl's GRPO."""
    n = len(rewards)
    mask = (torch.arange(WIDTH)[None, :] < torch.tensor(lengths)[:, None]).float()
    scores = torch.zeros(n, WIDTH)
    scores[torch.arange(n), torch.tensor(lengths) - 1] = torch.tensor(rewards, dtype=torch.float32)
    tensors = {
        "response_mask": mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "old_log_probs": torch.log(torch.full((n, WIDTH), 0.5)) * mask,
    }
    if is_weights is not None:
        tensors["rollout_is_weights"] = is_weights
    uid = np.array(["a"] * (n // 2) + ["b"] * (n - n // 2), dtype=object)
    non_tensors = {"uid": uid, **({"domain": np.array(domains, dtype=object)} if domains is not None else {})}
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    return compute_advantage(data, AdvantageEstimator.GRPO, num_repeat=4)


def response_weights(data: DataProto) -> torch.Tensor:
    """Per-response weight, asserting it is constant over the response's valid tokens."""
    w, mask = data.batch["rollout_is_weights"], data.batch["response_mask"].bool()
    first = w[:, 0]
    assert torch.all((w == first[:, None]) | ~mask)
    return first


def test_verl_grpo_advantages_are_the_hand_computed_ones():
    data = verl_batch()
    per_response = data.batch["advantages"][:, 0]
    torch.testing.assert_close(per_response, torch.tensor([GRPO_A[0]] + [GRPO_A[1]] * 3 + [0.0] * 4))


def test_difffilter_keeps_the_mixed_group_and_multiplies_verl_weights():
    is_weights = torch.full((8, WIDTH), 2.0)
    is_weights[1] = 0.5  # verl's own truncated IS weight of response 1
    data = verl_batch(is_weights=is_weights)
    policy = DataPolicy.from_arm({"method": "difffilter", "params": {"low": 0.1, "high": 0.9}}, 4, [], "domain")
    metrics = policy.apply(data, step=0)
    # solve rates 0.25 (kept: 0.1 < 0.25 < 0.9) and 1.0 (dropped); verl's weights multiplied, not replaced
    torch.testing.assert_close(response_weights(data), torch.tensor([2.0, 0.5, 2.0, 2.0, 0, 0, 0, 0]))
    assert metrics["policy/kept_fraction"] == 0.5
    assert metrics["policy/kept_token_fraction"] == pytest.approx(9 / 19)
    assert metrics["policy/empty_selection"] == 0.0


def test_difffilter_kept_denominator_rescales_by_all_over_kept_tokens():
    data = verl_batch()
    params = {"low": 0.1, "high": 0.9, "denominator": "kept"}
    DataPolicy.from_arm({"method": "difffilter", "params": params}, 4, [], "domain").apply(data, step=0)
    torch.testing.assert_close(response_weights(data), torch.tensor([19 / 9] * 4 + [0.0] * 4))


def test_softmax_reweights_by_advantage_magnitude():
    data = verl_batch(is_weights=torch.full((8, WIDTH), 3.0))
    metrics = DataPolicy.from_arm({"method": "softmax", "params": {"temperature": 1.0}}, 4, [], "domain").apply(data, 0)
    s = [abs(GRPO_A[0])] + [abs(GRPO_A[1])] * 3 + [0.0] * 4  # per-response mean |A|
    total = sum(math.exp(x) for x in s)
    expected = torch.tensor([3.0 * 8 * math.exp(x) / total for x in s])  # norm1 over the batch, times verl's 3
    torch.testing.assert_close(response_weights(data), expected)
    assert metrics["policy/kept_fraction"] == 1.0


def test_baseline_writes_unit_weights_and_keeps_verl_advantages():
    data = verl_batch()
    advantages = data.batch["advantages"].clone()
    DataPolicy.from_arm({"method": "baseline"}, 4, [], "domain").apply(data, 0)
    assert torch.equal(data.batch["rollout_is_weights"], torch.ones(8, WIDTH))
    assert torch.equal(data.batch["advantages"], advantages)


def test_gfpo_recomputes_advantages_on_the_kept_subset():
    data = verl_batch(rewards=[1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    params = {"k": 2, "metric": "short", "recompute_advantages": True}
    DataPolicy.from_arm({"method": "gfpo", "params": params}, 4, [], "domain").apply(data, 0)
    # group a keeps the two shortest (lengths 2 and 1: responses 1, 3; rewards 1, 0),
    # group b keeps lengths 2, 2 (responses 6, 7; rewards 1, 0): GRPO on each pair gives +-1/sqrt(1/2)
    torch.testing.assert_close(response_weights(data), torch.tensor([0, 1, 0, 1, 0, 0, 1, 1.0]))
    kept = data.batch["advantages"][[1, 3, 6, 7], 0]
    torch.testing.assert_close(kept, torch.tensor([1, -1, 1, -1]) * 0.5 / math.sqrt(0.5), atol=1e-5, rtol=1e-5)


def test_mixer_changes_the_samplers_next_draw():
    """reward_gap, T = 1: p_d ~ exp(max_e mu_e - mu_d); warmup 1 -> step 0 is uniform."""
    domains = ["logic", "math", "science"]  # ids 0, 1, 2 (sorted)
    rows = np.repeat([0, 1, 2], 10)  # a 30-row dataset, 10 prompts per domain
    policy = DataPolicy.from_arm({"method": "reward_gap", "params": {"temperature": 1.0}}, 4, domains, "domain")
    sampler = MixtureBatchSampler(rows, 3, policy.mixer, batch_size=6, seed=0)
    first = sampler.next_batch()
    assert sampler.last_counts.tolist() == [2, 2, 2]
    assert np.bincount(rows[first], minlength=3).tolist() == [2, 2, 2]

    # step 0's rollouts: mean reward logic 1.0, math 0.0, science 0.5 (two responses each, one group each)
    data = verl_batch(
        rewards=[1, 1, 0, 0, 1, 0, 1, 0],
        lengths=[2] * 8,
        domains=["logic", "logic", "math", "math", "science", "science", "logic", "math"],
    )
    # rows 6, 7 (group b) add one logic reward 1 and one math reward 0: means stay 1.0 / 0.0 / 0.5
    metrics = policy.apply(data, step=0)
    second = sampler.next_batch()
    p = np.exp([0.0, 1.0, 0.5]) / np.exp([0.0, 1.0, 0.5]).sum()  # 0.186, 0.507, 0.307 -> x6: 1.12, 3.04, 1.84
    assert metrics["policy/mixer/p_1"] == pytest.approx(1 / 3)  # the proportions step 0 was drawn with
    assert policy.mixer.diagnostics()["mixer/p_1"] == pytest.approx(p[1])
    assert sampler.last_counts.tolist() == [1, 3, 2]  # floors 1, 3, 1; the leftover goes to the largest remainder
    assert np.bincount(rows[second], minlength=3).tolist() == [1, 3, 2]


def test_mixer_sampler_state_round_trip_reproduces_the_draws():
    rows = np.repeat([0, 1], [7, 5])

    def fresh() -> MixtureBatchSampler:
        policy = DataPolicy.from_arm({"method": "static", "params": {"proportions": [0.25, 0.75]}}, 4, ["x", "y"], "d")
        return MixtureBatchSampler(rows, 2, policy.mixer, batch_size=4, seed=3)

    a = fresh()
    a.next_batch()
    state = a.state_dict()
    b = fresh()
    b.load_state_dict(state)
    assert [a.next_batch() for _ in range(5)] == [b.next_batch() for _ in range(5)]
    assert a.last_counts.tolist() == [1, 3]


def test_unknown_domain_and_missing_domains_are_errors():
    with pytest.raises(ValueError, match=r"unknown domain values \['physics'\]; known domains: logic, math"):
        domain_ids(["math", "physics"], ["logic", "math"])
    with pytest.raises(ValueError, match="mixer arm 'tscl' needs the training prompts' domain column 'topic'"):
        DataPolicy.from_arm({"method": "tscl", "params": {}}, 4, [], "topic")
    with pytest.raises(ValueError, match="temprature"):
        DataPolicy.from_arm({"method": "softmax", "params": {"temprature": 1.0}}, 4, [], "domain")
