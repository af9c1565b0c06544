"""Policy weights through verl's real vanilla policy loss and agg_loss (CPU).

A selection passed as rollout_is_weights must equal training on the kept subset: times the kept
token fraction with denominator=all (verl's token-mean keeps dropped tokens in the denominator),
exactly with denominator=kept. Uniform reweighting must leave the loss unchanged, and so must
every configuration whose canonical form is the control.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from policies_batches import grpo_advantages, random_batch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
from verl.workers.config import ActorConfig

from tune_dfrl.policies import UNIFORM, Context, RolloutBatch, canonical_arm, make_policy

CONFIG = ActorConfig(strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=1)
VANILLA = get_policy_loss_fn("vanilla")
SELECTIONS = [
    ("difffilter", {"low": 0.3, "high": 0.7}),
    ("topk", {"f": 0.3}),
    ("gfpo", {"k": 3}),
    ("maxvar", {"f": 0.5}),
]


def new_log_probs(batch: RolloutBatch, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return batch.old_log_probs + 0.3 * torch.randn(batch.old_log_probs.shape, generator=g)


def loss(
    batch: RolloutBatch,
    log_prob: torch.Tensor,
    rows: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    w = None if weights is None else weights[rows]
    value, _ = VANILLA(
        batch.old_log_probs[rows],
        log_prob[rows],
        advantages[rows],
        batch.response_mask[rows],
        "token-mean",
        CONFIG,
        rollout_is_weights=w,
    )
    return value


@pytest.fixture(scope="module")
def batch() -> RolloutBatch:
    return random_batch(prompts=12, n=8, max_len=9, seed=21)


@pytest.mark.parametrize("method, params", SELECTIONS)
def test_selection_equals_kept_subset_loss(batch, method, params):
    log_prob = new_log_probs(batch, 0)
    everyone = torch.ones(batch.num_responses, dtype=torch.bool)
    r_all = make_policy(method, {**params, "denominator": "all"}, rollout_n=8).apply(batch)
    r_kept = make_policy(method, {**params, "denominator": "kept"}, rollout_n=8).apply(batch)
    keep = r_all.token_weights[:, 0] > 0
    assert 0 < int(keep.sum()) < batch.num_responses
    subset = loss(batch, log_prob, keep, batch.advantages, None)
    fraction = r_all.diagnostics["kept_token_fraction"]
    assert fraction == pytest.approx(float(batch.response_mask[keep].sum() / batch.response_mask.sum()))
    full_all = loss(batch, log_prob, everyone, batch.advantages, r_all.token_weights)
    full_kept = loss(batch, log_prob, everyone, batch.advantages, r_kept.token_weights)
    assert full_all.item() == pytest.approx(subset.item() * fraction, rel=1e-5, abs=1e-7)
    assert full_kept.item() == pytest.approx(subset.item(), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("method, params", [("gfpo", {"k": 3}), ("maxvar", {"f": 0.5})])
def test_selection_with_recomputed_advantages_and_existing_is_weights(batch, method, params):
    is_w = 0.5 + torch.rand(batch.advantages.shape, generator=torch.Generator().manual_seed(2))
    b = RolloutBatch(
        batch.group, batch.domain, batch.reward, batch.advantages, batch.response_mask, batch.old_log_probs, is_w
    )
    log_prob = new_log_probs(b, 1)
    r = make_policy(method, {**params, "denominator": "kept", "recompute_advantages": True}, rollout_n=8).apply(b)
    keep = r.token_weights[:, 0] > 0
    everyone = torch.ones(b.num_responses, dtype=torch.bool)
    subset = loss(b, log_prob, keep, r.advantages, is_w)
    assert loss(b, log_prob, everyone, r.advantages, r.token_weights).item() == pytest.approx(subset.item(), rel=1e-5)


def test_agg_loss_with_selection_weights(batch):
    """The same identity straight through agg_loss on an arbitrary per-token loss matrix."""
    loss_mat = torch.rand(batch.advantages.shape, generator=torch.Generator().manual_seed(3))
    r = make_policy("difffilter", {"low": 0.3, "high": 0.7, "denominator": "kept"}, rollout_n=8).apply(batch)
    keep = r.token_weights[:, 0] > 0
    weighted = agg_loss(loss_mat * r.token_weights, batch.response_mask, "token-mean")
    subset = agg_loss(loss_mat[keep], batch.response_mask[keep], "token-mean")
    assert weighted.item() == pytest.approx(subset.item(), rel=1e-5)


@pytest.mark.parametrize(
    "method, params",
    [
        ("baseline", {}),
        ("per", {"alpha": 0.0}),
        ("ar", {"alpha": 0.0}),
        ("diffband", {"focus": 1.0}),
        ("softmax", {"temperature": 1e9}),
    ],
)
def test_uniform_reweighting_leaves_the_loss_unchanged(batch, method, params):
    log_prob = new_log_probs(batch, 4)
    everyone = torch.ones(batch.num_responses, dtype=torch.bool)
    r = make_policy(method, params, rollout_n=8).apply(batch)
    plain = loss(batch, log_prob, everyone, batch.advantages, None)
    assert loss(batch, log_prob, everyone, r.advantages, r.token_weights).item() == pytest.approx(
        plain.item(), rel=1e-6
    )


def test_reweighting_changes_the_loss(batch):
    """Control for the test above: a non-uniform reweighting does move the loss."""
    log_prob = new_log_probs(batch, 4)
    everyone = torch.ones(batch.num_responses, dtype=torch.bool)
    r = make_policy("softmax", {"temperature": 0.1}, rollout_n=8).apply(batch)
    plain = loss(batch, log_prob, everyone, batch.advantages, None)
    assert abs(loss(batch, log_prob, everyone, r.advantages, r.token_weights).item() - plain.item()) > 1e-4


def configurations() -> list[tuple[str, dict]]:
    """A grid over every selector and reweighter, edges and keep-all settings included."""
    edges = (0.0, 0.1, 0.125, 0.3, 0.5, 0.875, 0.9, 1.0)
    grid = [
        ("difffilter", {"low": lo, "high": hi, "inclusive": inc, "denominator": d, "success_threshold": t})
        for lo, hi, inc, d, t in itertools.product(edges, edges, (False, True), ("all", "kept"), (0.5, 0.0))
        if lo < hi and lo < 1.0
    ]
    grid += [
        ("topk", {"f": f, "scope": s, "denominator": d})
        for f, s, d in itertools.product((0.3, 0.5, 0.9, 1.0), ("batch", "group"), ("all", "kept"))
    ]
    grid += [
        ("maxvar", {"f": f, "recompute_advantages": r, "denominator": d})
        for f, r, d in itertools.product((0.3, 0.5, 0.94, 1.0), (False, True), ("all", "kept"))
    ]
    grid += [("gfpo", {"k": k, "recompute_advantages": r}) for k, r in itertools.product(range(1, 8), (False, True))]
    grid += [
        ("diffband", {"focus": f, "q_low": q[0], "q_high": q[1], "scope": s})
        for f, q, s in itertools.product((1.0, 2.0), ((0.0, 1.0), (0.25, 0.75)), ("batch", "informative"))
    ]
    grid += [
        (m, {"alpha": a, "scope": s})
        for m, a, s in itertools.product(("ar", "per"), (0.0, 0.5), ("batch", "informative"))
    ]
    return grid


def test_configurations_with_one_canonical_form_give_the_same_loss_and_the_control_form_is_the_control(batch):
    """verl's loss, bit for bit: the original configuration against its canonical form (binary rewards, n = 8),
    on a batch with groups at every kind of level, all-unsolved and all-solved ones included."""
    reward = batch.reward.clone()
    reward[:8], reward[8:16] = 0.0, 1.0
    batch = RolloutBatch(
        batch.group,
        batch.domain,
        reward,
        grpo_advantages(reward, batch.group, batch.response_mask),
        batch.response_mask,
        batch.old_log_probs,
    )
    log_prob = new_log_probs(batch, 5)
    everyone = torch.ones(batch.num_responses, dtype=torch.bool)
    control = loss(batch, log_prob, everyone, batch.advantages, None)
    context = Context(rollout_n=8, binary_rewards=True)
    as_control = 0
    for method, params in configurations():
        original = make_policy(method, params, rollout_n=8).apply(batch)
        value = loss(batch, log_prob, everyone, original.advantages, original.token_weights)
        canonical_method, canonical = canonical_arm(method, params, context)
        again = make_policy(canonical_method, canonical, rollout_n=8).apply(batch)
        assert torch.equal(value, loss(batch, log_prob, everyone, again.advantages, again.token_weights)), (
            method,
            params,
        )
        if canonical_method == UNIFORM:
            as_control += 1
            assert torch.equal(value, control), (method, params)
    assert as_control > 50  # the grid does reach the control form from every kind of method
