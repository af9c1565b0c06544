"""GRPO trainer of the embedded backend: decoding, rewards, determinism, resume, the policy hook."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from tune_dfrl.backends.base import ArmSpec, Milestone
from tune_dfrl.policies import largest_remainder
from tune_dfrl.trainers.embedded.backend import EmbeddedBackend
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, training_pools
from tune_dfrl.trainers.embedded.evaluate import score_responses
from tune_dfrl.trainers.embedded.grpo import KL_TYPE, LOSS_AGG_MODE, GRPOObjective
from tune_dfrl.trainers.embedded.model import EOS, decode_responses, encode_items, load_model
from tune_dfrl.trainers.embedded.recipe import EmbeddedRecipe
from tune_dfrl.trainers.embedded.rollout import generate, response_log_probs
from tune_dfrl.trainers.embedded.trainer import GRPOTrainer, exact_match

TEST_BASE = {"steps": 150, "batch_size": 32}  # a short warm-up: these tests check mechanics, not skill
BASELINE = ArmSpec("baseline", {}, "baseline", "baseline")
DROP_ALL = ArmSpec(
    "difffilter", {"low": 0.85, "high": 0.95}, "drop-all", "difffilter 0.85-0.95"
)  # n=5: no rate in band


@pytest.fixture(scope="module")
def recipe(embedded_cache: Path) -> dict:
    return {
        "steps": 4,
        "milestone_every": 2,
        "prompts_per_step": 6,
        "base": TEST_BASE,
        "cache_dir": str(embedded_cache),
        "eval_benchmarks": ["math_sum3", "logic_bool3", "sci_mc3"],
        "num_threads": 1,
    }


@pytest.fixture(scope="module")
def base_dir(recipe: dict) -> Path:
    return ensure_base_model(BaseRecipe.from_dict(TEST_BASE), Path(recipe["cache_dir"]))


def _run(recipe: dict, arm: ArmSpec, seed: int, checkpoint_dir: Path) -> list[Milestone]:
    reported: list[Milestone] = []
    EmbeddedBackend(recipe).run_trial(arm, seed, reported.append, checkpoint_dir)
    return reported


def _sampled(base_dir: Path, count: int = 60, seed: int = 0):
    model, tokenizer = load_model(base_dir)
    items = list(training_pools()["science"][: count // 2]) + list(training_pools()["math"][: count // 2])
    enc = encode_items(tokenizer, [i.prompt for i in items], [i.answer for i in items])
    responses, mask = generate(model, enc.prompt_ids, enc.prompt_mask, 8, 1.5, torch.Generator().manual_seed(seed))
    return model, tokenizer, items, enc, responses, mask


def test_fast_encoding_equals_the_hf_tokenizer(base_dir):
    """encode_items (a table lookup) gives exactly the saved tokenizer's ids, padding and masks."""
    _, tokenizer = load_model(base_dir)
    items = [i for b in BENCHMARKS for i in b.items()]
    fast = encode_items(tokenizer, [i.prompt for i in items], [i.answer for i in items])
    hf = tokenizer([i.prompt for i in items], padding=True, return_tensors="pt", add_special_tokens=False)
    targets = tokenizer([i.answer + EOS for i in items], add_special_tokens=False)["input_ids"]
    width = max(len(t) for t in targets)
    assert torch.equal(fast.prompt_ids, hf["input_ids"]) and torch.equal(fast.prompt_mask, hf["attention_mask"])
    assert fast.targets.tolist() == [t + [tokenizer.pad_token_id] * (width - len(t)) for t in targets]


def test_vectorised_reward_equals_the_verifier_on_real_rollouts(base_dir):
    _, tokenizer, items, enc, responses, _ = _sampled(base_dir)
    scored = score_responses(items, *decode_responses(tokenizer, responses))
    assert np.array_equal(exact_match(responses, enc.targets).numpy().astype(bool), scored.correct)
    # and on hand-made responses: exact, answer without eos, answer with a trailing extra token
    answer = enc.targets[:1]
    eos_at = int((answer[0] == 1).nonzero()[0])
    extra = answer.clone()
    extra[0, eos_at] = answer[0, 0]
    cases = torch.nn.functional.pad(torch.cat([answer, answer.masked_fill(answer == 1, 0), extra]), (0, 2))
    assert exact_match(cases, answer.expand(3, -1)).tolist() == [1.0, 0.0, 0.0]


def test_decoding_is_consistent_with_the_training_forward(base_dir):
    """Greedy tokens are the argmax of the full forward; log-probs do not depend on left padding."""
    model, _, _, enc, responses, mask = _sampled(base_dir, count=8)
    greedy, greedy_mask = generate(model, enc.prompt_ids, enc.prompt_mask, 8, 0.0)
    ids = torch.cat([enc.prompt_ids, greedy], 1)
    attention = torch.cat([enc.prompt_mask, greedy_mask.long()], 1)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(1) - 1).clamp(min=0)
        ).logits
    argmax = logits[:, enc.prompt_ids.shape[1] - 1 : -1].argmax(-1)
    assert torch.equal(argmax[greedy_mask.bool()], greedy[greedy_mask.bool()])

    with torch.no_grad():
        batched = response_log_probs(model, enc.prompt_ids, enc.prompt_mask, responses, mask)
        for row in range(4):
            keep = enc.prompt_mask[row].bool()
            alone = response_log_probs(
                model,
                enc.prompt_ids[row : row + 1, keep],
                enc.prompt_mask[row : row + 1, keep],
                responses[row : row + 1],
                mask[row : row + 1],
            )
            valid = mask[row].bool()
            assert torch.allclose(alone[0, valid], batched[row, valid], atol=1e-5)


def test_same_arm_and_seed_give_identical_milestones(recipe, tmp_path):
    first = _run(recipe, BASELINE, 0, tmp_path / "a")
    again = _run(recipe, BASELINE, 0, tmp_path / "b")
    other = _run(recipe, BASELINE, 1, tmp_path / "c")
    assert [m.step for m in first] == [2, 4]
    assert [m.flat() for m in first] == [m.flat() for m in again]
    assert [m.train for m in first] != [m.train for m in other]
    m = first[-1]
    assert set(m.accuracy) == {"math_sum3", "logic_bool3", "sci_mc3"}
    assert set(m.aggregates) == {"db", "macro", "item", "efficiency"}
    assert m.aggregates["db"] == pytest.approx(np.mean(list(m.accuracy.values())))  # one benchmark per domain
    for key in (
        "reward/mean",
        "policy/kept_fraction",
        "policy/kept_token_fraction",
        "policy/weight_std",
        "kl",
        "loss",
        "mix/p_math",
        "mix/count_math",
        "mix/count_logic",
        "mix/count_science",
    ):
        assert key in m.train
    assert (
        m.train["mix/count_math"] + m.train["mix/count_logic"] + m.train["mix/count_science"]
        == recipe["prompts_per_step"]
    )


class Crash(RuntimeError):
    pass


def test_resume_from_a_milestone_matches_an_uninterrupted_run(recipe, tmp_path):
    long = {**recipe, "steps": 6}
    uninterrupted = _run(long, BASELINE, 3, tmp_path / "whole")

    reported: list[Milestone] = []

    def crash_at_4(m: Milestone) -> None:
        reported.append(m)
        if m.step == 4:
            raise Crash

    with pytest.raises(Crash):
        EmbeddedBackend(long).run_trial(BASELINE, 3, crash_at_4, tmp_path / "resumed")
    resumed = _run(long, BASELINE, 3, tmp_path / "resumed")
    # milestone 2 was acknowledged and is not reported again; 4 was not, so it is reported once more
    assert [m.step for m in reported] == [2, 4] and [m.step for m in resumed] == [4, 6]
    assert [m.flat() for m in reported[:1] + resumed] == [m.flat() for m in uninterrupted]
    assert _run(long, BASELINE, 3, tmp_path / "resumed") == []  # finished: nothing to train or report


def _trainer(recipe: dict, arm: ArmSpec, base_dir: Path, seed: int = 0) -> GRPOTrainer:
    return GRPOTrainer(EmbeddedRecipe.from_dict(recipe), arm, seed, base_dir)


def _parameters(trainer: GRPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_selection_that_drops_everything_leaves_only_the_kl_term(recipe, base_dir):
    """From one state, a drop-all step equals a step on the KL term alone and differs from a uniform step."""
    warm = _trainer(recipe, BASELINE, base_dir)
    warm.step()
    warm.step()  # away from the reference, so that the KL term has a gradient
    state = warm.state_dict()

    class KLOnly(GRPOObjective):
        def loss(self, log_probs, old_log_probs, ref_log_probs, advantages, mask, weights):
            kl = _kl(log_probs, ref_log_probs, mask)
            return self.kl_coef * kl, {
                "loss": self.kl_coef * kl.item(),
                "pg_loss": 0.0,
                "kl": kl.item(),
                "pg_clipfrac": 0.0,
            }

    after = {}
    for name, arm in (("dropped", DROP_ALL), ("kl_only", DROP_ALL), ("uniform", BASELINE)):
        trainer = _trainer(recipe, arm, base_dir)
        if name == "kl_only":
            trainer.objective = KLOnly(0.2, EmbeddedRecipe().kl_coef, 5)
        trainer.load_state_dict(state)
        after[name] = (trainer.step(), _parameters(trainer))
    metrics, dropped = after["dropped"]
    assert metrics["policy/kept_fraction"] == 0.0 and metrics["policy/empty_selection"] == 1.0
    assert metrics["pg_loss"] == 0.0 and metrics["kl"] > 0.0
    assert all(torch.equal(a, b) for a, b in zip(after["kl_only"][1], dropped))
    assert any(not torch.equal(a, b) for a, b in zip(after["uniform"][1], dropped))


def _kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    return agg_loss(loss_mat=kl_penalty(log_probs, ref_log_probs, KL_TYPE), loss_mask=mask, loss_agg_mode=LOSS_AGG_MODE)


def test_policy_weights_and_advantages_reach_the_loss(recipe, base_dir):
    """The loss uses the policy's token weights: scaling them scales the policy-gradient term."""
    trainer = _trainer(recipe, BASELINE, base_dir)
    objective = trainer.objective
    log_probs = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.4, 0.6, 0.3]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantages = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]])
    weights = torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]])
    _, metrics = objective.loss(log_probs, log_probs.detach(), log_probs.detach(), advantages, mask, weights)
    # ratio 1: pg = token-mean(-A * w) over the 5 valid tokens = (-1*2 - 1*2 + 0) / 5
    assert metrics["pg_loss"] == pytest.approx(-4 / 5)
    assert metrics["kl"] == 0.0


def test_mixer_arm_changes_what_is_sampled(recipe, base_dir):
    mixer = ArmSpec("reward_gap", {"temperature": 0.01, "floor": 0.05, "warmup": 1}, "gap", "reward_gap T=0.01")
    trainer = _trainer({**recipe, "prompts_per_step": 12}, mixer, base_dir)
    first, second = trainer.step(), trainer.step()
    assert [first[f"mix/count_{d}"] for d in ("math", "logic", "science")] == [4, 4, 4]
    counts = [second[f"mix/count_{d}"] for d in ("math", "logic", "science")]
    proportions = np.array([second[f"mix/p_{d}"] for d in ("math", "logic", "science")])
    assert counts != [4, 4, 4] and proportions.min() == pytest.approx(0.05)
    assert counts == largest_remainder(proportions, 12).tolist()


def test_grpo_advantages_come_from_verl(recipe, base_dir):
    """Hand-computed GRPO advantages: (R - mean) / (std + 1e-6), std unbiased, constant over valid tokens."""
    objective = _trainer(recipe, BASELINE, base_dir).objective
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    advantages = objective.advantages(rewards, mask, np.array([0, 0, 0, 1, 1, 1]))
    a = (1 - 1 / 3) / (np.std([1, 0, 0], ddof=1) + 1e-6)
    b = (0 - 1 / 3) / (np.std([1, 0, 0], ddof=1) + 1e-6)
    expected = torch.tensor([[a, a], [b, 0], [b, b], [0, 0], [0, 0], [0, 0]], dtype=torch.float32)
    assert torch.allclose(advantages, expected, atol=1e-5)


def test_recipe_round_trips_through_a_plain_dict():
    recipe = EmbeddedRecipe.from_dict(
        {"steps": 20, "milestone_every": 10, "base": {"steps": 10, "shape": {"hidden": 32}}}
    )
    assert EmbeddedRecipe.from_dict(dataclasses.asdict(recipe)) == recipe
