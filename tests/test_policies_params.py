"""Hyperparameter declarations: validation, Tune/Optuna search spaces, canonical forms, docs."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from ray.tune.search import BasicVariantGenerator
from ray.tune.search.sample import Categorical, Float, Integer
from ray.tune.search.variant_generator import generate_variants

from policies_batches import make_batch, random_batch
from tune_dfrl.policies import (
    PAPER_METHODS,
    arm_key,
    canonical_params,
    describe_method,
    make_policy,
    methods_table,
    resolve,
    suggest_params,
    tune_space,
    validate_params,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_paper_methods_resolve_to_scorer_actuator_pairs():
    expected = {
        "baseline": "-:uniform",
        "difffilter": "group_solve_rate:threshold_band",
        "topk": "advantage_magnitude:topk_fraction",
        "gfpo": "response_length:gfpo",
        "maxvar": "reward:max_variance",
        "softmax": "advantage_magnitude:softmax",
        "diffband": "reward:difficulty_band",
        "ar": "token_prob:advantage_reweight",
        "per": "advantage_magnitude:per_advantage",
        "static": "-:static",
        "reward_gap": "-:reward_gap",
        "dump_ucb": "-:dump_ucb",
        "tscl": "-:tscl",
    }
    assert {name: resolve(name).key for name in PAPER_METHODS} == expected
    assert resolve("threshold_band").key == resolve("difffilter").key
    assert resolve("uniform").key == resolve("baseline").key


def test_defaults_filled():
    assert validate_params("softmax", {}) == {"temperature": 1.0, "scope": "batch", "agg": "mean"}
    assert validate_params("difffilter", {"low": 0.1}) == {
        "low": 0.1, "high": 1.0, "inclusive": False, "success_threshold": 0.5, "denominator": "all"
    }
    assert validate_params("baseline", None) == {}
    assert validate_params("gfpo", {"k": 3.0})["k"] == 3  # integral floats accepted as ints


@pytest.mark.parametrize(
    "method, params, message",
    [
        ("softmax", {"temprature": 1.0}, r"unknown parameter 'temprature' for softmax; allowed: temperature, scope, agg"),
        ("baseline", {"f": 0.5}, r"unknown parameter 'f' for baseline; allowed: \(none\)"),
        ("softmax", {"temperature": 0.0}, r"parameter 'temperature' for softmax must be in \(0, inf\); got 0.0"),
        ("difffilter", {"low": 1.0}, r"parameter 'low' for difffilter must be in \[0, 1\); got 1.0"),
        ("topk", {"f": 1.5}, r"parameter 'f' for topk must be in \(0, 1\]; got 1.5"),
        ("diffband", {"focus": 0.5}, r"parameter 'focus' for diffband must be in \[1, inf\)"),
        ("difffilter", {"low": 0.8, "high": 0.2}, r"must satisfy low < high; got low=0.8, high=0.2"),
        ("diffband", {"q_low": 0.5, "q_high": 0.5}, r"must satisfy q_low < q_high"),
        ("gfpo", {"k": 2.5}, r"parameter 'k' for gfpo must be an integer; got 2.5"),
        ("gfpo", {"k": 0}, r"parameter 'k' for gfpo must be in \[1, n-1\]; got 0"),
        ("gfpo", {"metric": "long"}, r"parameter 'metric' for gfpo must be one of efficiency, short; got 'long'"),
        ("gfpo", {"recompute_advantages": "yes"}, r"'recompute_advantages' for gfpo must be true or false"),
        ("softmax", {"temperature": float("nan")}, r"'temperature' for softmax must be a finite number"),
        ("softmax", {"scope": "all"}, r"'scope' for softmax must be one of batch, informative; got 'all'"),
        ("static", {"proportions": [1, -1]}, r"'proportions' for static must be a list of finite numbers >= 0"),
        ("difffiltre", {}, r"unknown method 'difffiltre'; allowed: .*difffilter"),
    ],
)
def test_validation_errors_say_what_is_allowed(method, params, message):
    with pytest.raises(ValueError, match=message):
        validate_params(method, params)


def test_rollout_n_bounds_gfpo_k():
    assert validate_params("gfpo", {"k": 4}, rollout_n=5)["k"] == 4
    with pytest.raises(ValueError, match=r"'k' for gfpo must be in \[1, 4\] at rollout_n=5; got 5"):
        make_policy("gfpo", {"k": 5}, rollout_n=5)


def test_make_policy_rejects_mixers():
    with pytest.raises(ValueError, match="'tscl' is a mixer; build it with make_mixer"):
        make_policy("tscl", {})


# --- Ray Tune -------------------------------------------------------------------------------


def test_tune_space_domains():
    space = tune_space("softmax")
    assert set(space) == {"temperature", "scope"}  # agg is declared but not searched
    assert isinstance(space["temperature"], Float) and type(space["temperature"].sampler).__name__ == "_LogUniform"
    assert (space["temperature"].lower, space["temperature"].upper) == (0.01, 10.0)
    assert isinstance(space["scope"], Categorical) and space["scope"].categories == ["batch", "informative"]
    k = tune_space("gfpo", rollout_n=5)["k"]
    assert isinstance(k, Integer) and (k.lower, k.upper) == (1, 5)  # randint upper is exclusive: k in 1..4
    narrowed = tune_space("softmax", ranges={"temperature": (0.1, 2.0), "scope": ["informative"]})
    assert (narrowed["temperature"].lower, narrowed["temperature"].upper) == (0.1, 2.0)
    assert narrowed["scope"].categories == ["informative"]
    assert tune_space("baseline") == {}


@pytest.mark.parametrize(
    "method, ranges, message",
    [
        ("softmax", {"temperature": (0.0, 1.0)}, r"log scale and needs low > 0"),
        ("topk", {"f": (0.5, 1.5)}, r"search range for 'f' of topk \[0.5, 1.5\] is not a non-empty interval inside \(0, 1\]"),
        ("topk", {"f": (0.6, 0.4)}, r"not a non-empty interval"),
        ("softmax", {"agg": ["sum"]}, r"cannot search parameter 'agg' of softmax; searchable: temperature, scope"),
        ("softmax", {"scope": ["everything"]}, r"'everything' is not allowed"),
        ("difffilter", {"low": (0.6, 0.9), "high": (0.1, 0.5)}, r"impossible search range for difffilter"),
        ("gfpo", {"k": (1.2, 1.8)}, r"holds no integer"),
    ],
)
def test_tune_space_rejects_impossible_ranges(method, ranges, message):
    with pytest.raises(ValueError, match=message):
        tune_space(method, ranges=ranges)


def test_tune_space_respects_low_below_high_when_nested():
    space = {"policy": {"method": "difffilter", "params": tune_space("difffilter", ranges={"low": (0.0, 0.6)})}}
    draws = [
        variant["config"]["policy"]["params"]
        for seed in range(200)
        for _, variant in generate_variants({"config": space}, random_state=np.random.default_rng(seed))
    ]
    lows = np.array([d["low"] for d in draws])
    highs = np.array([d["high"] for d in draws])
    assert (lows < highs).all() and lows.max() <= 0.6 and highs.max() <= 1.0
    assert lows.max() > 0.5 and highs.min() < 0.3  # the ranges are actually explored
    for d in draws[:20]:
        validate_params("difffilter", d)
    again = [v["config"]["policy"]["params"]["high"] for _, v in generate_variants({"config": space}, random_state=np.random.default_rng(7))]
    assert again == [draws[7]["high"]]  # seeded by Tune's random state


def test_tune_space_through_tunes_variant_generator():
    def trial(config):  # never run: the generator only resolves configs
        pass

    def configs(seed: int) -> list[dict]:
        generator = BasicVariantGenerator(random_state=seed)
        space = {"params": tune_space("diffband", ranges={"q_low": (0.0, 0.5)})}
        generator.add_configurations({"space": {"run": trial, "config": space, "num_samples": 30}})
        return [generator.next_trial().config["params"] for _ in range(30)]

    draws = configs(3)
    for d in draws:
        validate_params("diffband", d)
        assert d["q_low"] <= 0.5 and 1.0 <= d["focus"] <= 8.0
    assert configs(3) == draws and configs(4) != draws


# --- Optuna ---------------------------------------------------------------------------------


def test_suggest_params_respects_constraints_and_ranges():
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    seen = []

    def objective(trial):
        p = suggest_params(trial, "difffilter", ranges={"low": (0.0, 0.8)}, prefix="policy.")
        seen.append(p)
        validate_params("difffilter", p)
        return p["high"] - p["low"]

    study.optimize(objective, n_trials=25)
    assert all(0.0 <= p["low"] <= 0.8 and p["low"] < p["high"] <= 1.0 for p in seen)
    assert set(study.trials[0].params) == {"policy.low", "policy.high", "policy.denominator"}


def test_suggest_params_types():
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    p = suggest_params(trial, "gfpo", rollout_n=4)
    assert isinstance(p["k"], int) and 1 <= p["k"] <= 3
    assert isinstance(p["recompute_advantages"], bool) and p["metric"] in ("efficiency", "short")
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    assert 0.01 <= suggest_params(trial, "dump_ucb")["temperature"] <= 10.0


# --- canonical forms ------------------------------------------------------------------------


def test_band_edges_canonicalise_to_kept_levels_at_n5():
    same = [{"low": 0.2, "high": 0.8}, {"low": 0.25, "high": 0.75}, {"low": 0.3, "high": 0.7, "inclusive": True}]
    forms = [canonical_params("difffilter", p, rollout_n=5) for p in same]
    assert forms[0] == forms[1] == forms[2] == {
        "low": 0.3, "high": 0.7, "inclusive": True, "success_threshold": 0.5, "denominator": "all"
    }
    assert len({arm_key("difffilter", f) for f in forms}) == 1
    assert arm_key("threshold_band", forms[0]) == arm_key("difffilter", forms[0])
    # at n=8 the same edges keep different levels (0.25 = 2/8 is an edge there)
    assert canonical_params("difffilter", same[0], 8) != canonical_params("difffilter", same[1], 8)
    inclusive = canonical_params("difffilter", {"low": 0.2, "high": 0.8, "inclusive": True}, 5)
    assert inclusive == canonical_params("difffilter", {}, 5)  # both keep levels 1..4
    assert arm_key("difffilter", forms[0]) != arm_key("difffilter", inclusive)


def test_band_keep_all_and_keep_none_drop_irrelevant_parameters():
    keep_all = canonical_params("difffilter", {"low": 0.0, "high": 1.0, "inclusive": True, "denominator": "kept"}, 5)
    assert keep_all["denominator"] == "all" and keep_all["low"] == 0.0 and keep_all["high"] == 1.0
    none_a = canonical_params("difffilter", {"low": 0.2, "high": 0.4}, 5)
    none_b = canonical_params("difffilter", {"low": 0.61, "high": 0.79, "success_threshold": 0.1}, 5)
    assert none_a == none_b


def test_canonical_band_acts_like_the_original():
    batch = make_batch([[1.0] * k + [0.0] * (5 - k) for k in range(6)])
    edges = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9, 1.0]
    for low, high, inclusive in itertools.product(edges, edges, (False, True)):
        if not (low < high and low < 1.0):
            continue
        p = {"low": low, "high": high, "inclusive": inclusive}
        w = make_policy("difffilter", p, rollout_n=5).apply(batch).token_weights
        c = make_policy("difffilter", canonical_params("difffilter", p, 5), rollout_n=5).apply(batch).token_weights
        assert torch.equal(w, c), p


def test_per_group_counts_canonicalise_exactly():
    a = canonical_params("maxvar", {"f": 0.5}, rollout_n=5)  # m = 3
    b = canonical_params("maxvar", {"f": 0.55}, rollout_n=5)  # m = floor(2.75 + .5) = 3
    assert a == b and a["f"] == 0.6
    assert canonical_params("maxvar", {"f": 0.7}, rollout_n=5)["f"] == 0.8  # m = 4
    batch = random_batch(prompts=10, n=5, max_len=3, seed=2, binary=False)
    for f in (0.1, 0.35, 0.5, 0.55, 0.7, 0.95, 1.0):
        c = canonical_params("maxvar", {"f": f}, 5)
        assert torch.equal(make_policy("maxvar", {"f": f}).apply(batch).token_weights,
                           make_policy("maxvar", c).apply(batch).token_weights)
    assert canonical_params("topk", {"f": 0.5, "scope": "group"}, 5)["f"] == 0.6  # ceil(2.5) = 3
    assert canonical_params("topk", {"f": 0.5}, 5)["f"] == 0.5  # batch scope: N varies, no reduction
    assert canonical_params("topk", {"f": 1.0, "scope": "group", "agg": "max"}, 5) == canonical_params("topk", {"f": 1.0}, 5)


def test_constant_reweightings_drop_irrelevant_parameters():
    assert canonical_params("diffband", {"focus": 1.0, "q_low": 0.1, "scope": "informative"}, 5) == canonical_params(
        "diffband", {"focus": 1.0}, 5
    )
    assert canonical_params("per", {"alpha": 0.0, "agg": "max"}, 5) == canonical_params("per", {"alpha": 0.0}, 5)
    assert canonical_params("ar", {"alpha": 0.0, "scope": "informative"}, 5) == canonical_params("ar", {"alpha": 0.0}, 5)
    assert canonical_params("per", {"alpha": 0.5, "agg": "max"}, 5) != canonical_params("per", {"alpha": 0.5}, 5)


def test_canonical_rounding_and_key_stability():
    a = canonical_params("softmax", {"temperature": 0.30000000000000004}, 5)
    assert a == canonical_params("softmax", {"temperature": 0.3}, 5) and a["temperature"] == 0.3
    assert arm_key("softmax", a) == arm_key("softmax", dict(reversed(list(a.items()))))
    assert len(arm_key("softmax", a)) == 12 and all(ch in "0123456789abcdef" for ch in arm_key("softmax", a))
    assert arm_key("softmax", a) != arm_key("per", canonical_params("per", {}, 5))


# --- docs -----------------------------------------------------------------------------------


def test_describe_and_methods_table_come_from_the_declarations():
    text = describe_method("softmax")
    assert "scorer `advantage_magnitude`, actuator `softmax`" in text
    assert "| `temperature` | float | 1.0 | (0, inf) | [0.01, 10] | yes | softmax temperature T |" in text
    assert "| `low` | float | 0.0 | [0, 1) | [0, 1) | no | lower band edge on the solve rate |" in describe_method("difffilter")
    assert "`low < high`" in describe_method("difffilter")
    assert "| `k` | int | 2 | [1, 4] | [1, 4] | no | responses kept per group |" in describe_method("gfpo", rollout_n=5)
    table = methods_table()
    assert table.count("\n") == len(PAPER_METHODS) + 1
    assert "| maxvar | reward | max_variance | `f`: 0.5, (0, 1]; `recompute_advantages`: False, {False, True}" in table
    assert "`temperature`: 1.0, [0.01, 10] log" in table and "`low < high`" in table


def test_readme_methods_table_is_current():
    readme = (Path(__file__).parents[1] / "docs" / "readme_policies.md").read_text()
    table = readme.split("<!-- methods_table -->\n")[1].split("\n<!-- /methods_table -->")[0]
    assert table == methods_table(), "regenerate the table in docs/readme_policies.md from methods_table()"
