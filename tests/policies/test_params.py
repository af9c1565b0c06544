"""Hyperparameter declarations: constraints, validation, search ranges, Optuna sampling, canonical forms, docs."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from fresh_interpreter import imported
from policies_batches import make_batch, random_batch

from tune_dfrl.policies import (
    ALL_METHODS,
    PAPER_METHODS,
    Context,
    arm_key,
    canonical_arm,
    describe_method,
    make_mixer,
    make_policy,
    methods_table,
    resolve,
    suggest_params,
    validate_params,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
N5 = Context(rollout_n=5)
BINARY5 = Context(rollout_n=5, binary_rewards=True)


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
        "low": 0.1,
        "high": 1.0,
        "inclusive": False,
        "success_threshold": 0.5,
        "denominator": "all",
    }
    assert validate_params("baseline", None) == {}
    assert validate_params("gfpo", {"k": 3.0})["k"] == 3  # integral floats accepted as ints


def test_numpy_scalars_are_numbers_and_come_back_as_python_values():
    p = validate_params("gfpo", {"k": np.int64(2), "recompute_advantages": np.bool_(True), "metric": np.str_("short")})
    assert p["k"] == 2 and type(p["k"]) is int and p["recompute_advantages"] is True and p["metric"] == "short"
    f = validate_params("topk", {"f": np.float32(0.25)})["f"]
    assert f == 0.25 and type(f) is float
    assert type(validate_params("static", {"proportions": np.array([1, 3])})["proportions"][0]) is float
    make_policy("gfpo", {"k": np.int64(2)}, rollout_n=np.int64(5))


@pytest.mark.parametrize(
    "method, params, message",
    [
        (
            "softmax",
            {"temprature": 1.0},
            r"unknown parameter 'temprature' for softmax; allowed: temperature, scope, agg",
        ),
        ("baseline", {"f": 0.5}, r"unknown parameter 'f' for baseline; allowed: \(none\)"),
        ("softmax", {"temperature": 0.0}, r"parameter 'temperature' for softmax must be in \(0, inf\); got 0.0"),
        ("difffilter", {"low": 1.0}, r"parameter 'low' for difffilter must be in \[0, 1\); got 1.0"),
        ("difffilter", {"success_threshold": 1.0}, r"'success_threshold' for difffilter must be in \[0, 1\); got 1.0"),
        ("topk", {"f": 1.5}, r"parameter 'f' for topk must be in \(0, 1\]; got 1.5"),
        ("diffband", {"focus": 0.5}, r"parameter 'focus' for diffband must be in \[1, inf\)"),
        ("difffilter", {"low": 0.8, "high": 0.2}, r"must satisfy low < high; got low=0.8, high=0.2"),
        ("diffband", {"q_low": 0.5, "q_high": 0.5}, r"must satisfy q_low < q_high"),
        ("gfpo", {"k": 2.5}, r"parameter 'k' for gfpo must be an integer; got 2.5"),
        ("gfpo", {"k": 0}, r"parameter 'k' for gfpo must be in \[1, n-1\]; got 0"),
        ("gfpo", {"metric": "long"}, r"parameter 'metric' for gfpo must be one of efficiency, short; got 'long'"),
        ("gfpo", {"recompute_advantages": "yes"}, r"'recompute_advantages' for gfpo must be true or false"),
        ("gfpo", {"recompute_advantages": 1}, r"'recompute_advantages' for gfpo must be true or false; got 1"),
        ("topk", {"f": True}, r"'f' for topk must be a finite number; got True"),
        ("softmax", {"temperature": float("nan")}, r"'temperature' for softmax must be a finite number"),
        ("softmax", {"scope": "all"}, r"'scope' for softmax must be one of batch, informative; got 'all'"),
        ("static", {"proportions": [1, -1]}, r"'proportions' for static must be a list of numbers in \[0, inf\)"),
        ("difffiltre", {}, r"unknown method 'difffiltre'; allowed: .*difffilter"),
    ],
)
def test_validation_errors_say_what_is_allowed(method, params, message):
    with pytest.raises(ValueError, match=message):
        validate_params(method, params)


CONTEXT = Context(rollout_n=5, num_domains=3)


@pytest.mark.parametrize("method", sorted(ALL_METHODS))
def test_every_declaration_rejects_the_invalid_values_it_generates(method):
    spec = resolve(method).spec
    spec.validate({}, CONTEXT)  # the defaults are valid
    examples = spec.invalid_examples(CONTEXT)
    assert len(examples) >= 4 * len(spec.params) + len(spec.constraints)
    for example in examples:
        names = list(example)
        message = (
            rf"parameter '{names[0]}' for {method} must be" if len(names) == 1 else rf"must satisfy {' < '.join(names)}"
        )
        with pytest.raises(ValueError, match=message):
            spec.validate(example, CONTEXT)


def test_invalid_values_sit_just_outside_each_declared_end():
    def values(method: str, name: str) -> list:
        return [e[name] for e in resolve(method).spec.invalid_examples(CONTEXT) if list(e) == [name]]

    assert 5 in values("gfpo", "k") and 0 in values("gfpo", "k") and 1.5 in values("gfpo", "k")  # k in [1, n-1]
    assert 1 / 3 in values("reward_gap", "floor") and math.nextafter(0.0, -1) in values("reward_gap", "floor")
    assert 1.0 in values("difffilter", "success_threshold") and 0.0 in values("topk", "f")
    assert math.nextafter(1.0, 2) in values("ar", "alpha") and 1 in values("tscl", "signed")


def test_context_bounds_share_one_mechanism():
    assert validate_params("gfpo", {"k": 4}, rollout_n=5)["k"] == 4
    with pytest.raises(ValueError, match=r"'k' for gfpo must be in \[1, 4\] at rollout_n=5; got 5"):
        make_policy("gfpo", {"k": 5}, rollout_n=5)
    with pytest.raises(ValueError, match=r"'floor' for reward_gap must be in \[0, 0.25\) at num_domains=4; got 0.25"):
        make_mixer("reward_gap", {"floor": 0.25}, num_domains=4)
    assert "| `k` | int | 2 | [1, n-1] | [1, 7] |" in describe_method("gfpo")
    assert "| `floor` | float | 0.0 | [0, 1/K) | [0, 0.1] |" in describe_method("reward_gap")
    spec = resolve("reward_gap").spec
    assert spec.search_ranges(ctx=Context(num_domains=12))["floor"] == (0.0, math.nextafter(1 / 12, 0))
    assert spec.search_ranges(ctx=Context(num_domains=3))["floor"] == (0.0, 0.1)
    assert resolve("gfpo").spec.search_ranges(ctx=N5)["k"] == (1, 4)


def test_make_policy_rejects_mixers():
    with pytest.raises(ValueError, match="'tscl' is a mixer; build it with make_mixer"):
        make_policy("tscl", {})


def test_policies_import_nothing_from_ray_optuna_or_verl():
    assert imported("import tune_dfrl.policies", ("ray", "optuna", "verl")) == []


# --- search ranges --------------------------------------------------------------------------


def test_search_ranges_are_inclusive_sampling_bounds():
    spec = resolve("softmax").spec
    assert spec.search_ranges() == {"temperature": (0.01, 10.0), "scope": ["batch", "informative"]}  # agg: not searched
    narrowed = spec.search_ranges({"temperature": (0.1, 2.0), "scope": ["informative"]})
    assert narrowed == {"temperature": (0.1, 2.0), "scope": ["informative"]}
    assert resolve("topk").spec.search_ranges()["f"] == (math.nextafter(0.0, 1), 1.0)  # (0, 1]: step off the open end
    assert resolve("difffilter").spec.search_ranges()["low"] == (0.0, math.nextafter(1.0, 0))
    assert resolve("baseline").spec.search_ranges() == {}


def test_a_fixed_partner_cuts_the_searched_range():
    spec = resolve("difffilter").spec
    assert spec.search_ranges({"high": None}, fixed={"low": 0.5})["high"] == (math.nextafter(0.5, 1), 1.0)
    assert spec.search_ranges({"low": None}, fixed={"high": 0.5})["low"] == (0.0, math.nextafter(0.5, 0))
    assert spec.search_ranges({"high": (0.6, 0.9)}, fixed={"low": 0.5})["high"] == (0.6, 0.9)


@pytest.mark.parametrize(
    "method, ranges, fixed, message",
    [
        ("softmax", {"temperature": (0.0, 1.0)}, {}, r"log scale and needs low > 0"),
        (
            "topk",
            {"f": (0.5, 1.5)},
            {},
            r"search range for 'f' of topk \[0.5, 1.5\] is not a non-empty interval inside \(0, 1\]",
        ),
        ("topk", {"f": (0.6, 0.4)}, {}, r"not a non-empty interval"),
        ("softmax", {"agg": ["sum"]}, {}, r"cannot search parameter 'agg' of softmax; searchable: temperature, scope"),
        ("softmax", {"scope": ["everything"]}, {}, r"'everything' is not allowed"),
        ("tscl", {"signed": [1]}, {}, r"search range for 'signed' of tscl: 1 is not allowed; allowed: \[False, True\]"),
        ("difffilter", {"low": (0.6, 0.9), "high": (0.1, 0.5)}, {}, r"impossible search range for difffilter"),
        ("difffilter", {"high": (0.1, 0.3)}, {"low": 0.5}, r"high in \[0.1, 0.3\] cannot exceed fixed low=0.5"),
        ("gfpo", {"k": (1.2, 1.8)}, {}, r"search range for 'k' of gfpo holds no int in \[1.2, 1.8\]"),
    ],
)
def test_impossible_search_ranges_are_errors(method, ranges, fixed, message):
    with pytest.raises(ValueError, match=message):
        resolve(method).spec.search_ranges(ranges, fixed=fixed)


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
    forms = [canonical_arm("difffilter", p, N5) for p in same]
    assert (
        forms[0]
        == forms[1]
        == forms[2]
        == ("difffilter", {"low": 0.3, "high": 0.7, "inclusive": True, "success_threshold": 0.5, "denominator": "all"})
    )
    assert arm_key("threshold_band", forms[0][1]) == arm_key("difffilter", forms[0][1])
    # at n=8 the same edges keep different levels (0.25 = 2/8 is an edge there)
    n8 = Context(rollout_n=8)
    assert canonical_arm("difffilter", same[0], n8) != canonical_arm("difffilter", same[1], n8)
    inclusive = canonical_arm("difffilter", {"low": 0.2, "high": 0.8, "inclusive": True}, N5)
    assert inclusive == canonical_arm("difffilter", {}, N5)  # both keep levels 1..4
    assert inclusive != forms[0]


def test_band_keep_all_is_the_control_and_keep_none_drops_irrelevant_parameters():
    for denominator in ("all", "kept"):
        keep_all = {"low": 0.0, "high": 1.0, "inclusive": True, "denominator": denominator}
        assert canonical_arm("difffilter", keep_all, N5) == ("baseline", {})
    none_a = canonical_arm("difffilter", {"low": 0.2, "high": 0.4}, N5)
    none_b = canonical_arm(
        "difffilter", {"low": 0.61, "high": 0.79, "success_threshold": 0.1, "denominator": "kept"}, N5
    )
    assert none_a == none_b and none_a[0] == "difffilter"


def test_with_binary_rewards_a_band_dropping_only_zero_advantage_groups_is_the_control():
    """The default search trained difffilter(low=0.1, high=0.9, inclusive=true) at n=5 and measured 0.00 on every seed."""
    issue = {"low": 0.1, "high": 0.9, "inclusive": True, "denominator": "all"}
    assert canonical_arm("difffilter", issue, BINARY5) == ("baseline", {})
    assert canonical_arm("difffilter", {}, BINARY5) == ("baseline", {})  # (0, 1) open: levels 1..4 as well
    assert canonical_arm("difffilter", issue, N5)[0] == "difffilter"  # partial credit: level-0 groups may differ
    assert canonical_arm("difffilter", {**issue, "denominator": "kept"}, BINARY5)[0] == "difffilter"  # step rescaled
    # levels 0 and n carry no gradient: keeping level 0 or not, and the threshold, change nothing with `all`
    with_zero = canonical_arm(
        "difffilter", {"low": 0.0, "high": 0.7, "inclusive": True, "success_threshold": 0.2}, BINARY5
    )
    assert with_zero == canonical_arm("difffilter", {"low": 0.1, "high": 0.7, "inclusive": True}, BINARY5)
    only_extremes = canonical_arm("difffilter", {"low": 0.9, "high": 1.0, "inclusive": True}, BINARY5)
    assert only_extremes == canonical_arm("difffilter", {"low": 0.2, "high": 0.4}, BINARY5)  # no gradient at all
    lone = Context(rollout_n=1, binary_rewards=True)  # verl gives a group of one the advantage R, not 0
    assert canonical_arm("difffilter", {}, lone)[0] == "difffilter"


def test_keep_all_selections_are_the_control_whatever_the_flags():
    for flags in itertools.product((False, True), ("all", "kept")):
        params = {"recompute_advantages": flags[0], "denominator": flags[1]}
        assert canonical_arm("maxvar", {"f": 1.0, **params}, N5) == ("baseline", {})
        assert canonical_arm("maxvar", {"f": 0.9, **params}, N5) == ("baseline", {})  # m = floor(4.5 + .5) = 5
        assert canonical_arm("gfpo", {"k": 4, **params}, N5)[0] == "gfpo"  # k <= n-1 never keeps a whole group
    for scope, agg in itertools.product(("batch", "group"), ("mean", "max")):
        assert canonical_arm("topk", {"f": 1.0, "scope": scope, "agg": agg, "denominator": "kept"}, N5) == (
            "baseline",
            {},
        )
    assert canonical_arm("topk", {"f": 0.81, "scope": "group"}, N5) == ("baseline", {})  # ceil(4.05) = 5
    assert canonical_arm("topk", {"f": 0.81}, N5)[0] == "topk"  # batch scope: k depends on N, not on n


def test_per_group_counts_canonicalise_exactly():
    a = canonical_arm("maxvar", {"f": 0.5}, N5)[1]  # m = 3
    b = canonical_arm("maxvar", {"f": 0.55}, N5)[1]  # m = floor(2.75 + .5) = 3
    assert a == b and a["f"] == 0.6
    assert canonical_arm("maxvar", {"f": 0.7}, N5)[1]["f"] == 0.8  # m = 4
    batch = random_batch(prompts=10, n=5, max_len=3, seed=2, binary=False)
    for f in (0.1, 0.35, 0.5, 0.55, 0.7, 0.8):
        method, c = canonical_arm("maxvar", {"f": f}, N5)
        assert torch.equal(
            make_policy("maxvar", {"f": f}).apply(batch).token_weights,
            make_policy(method, c).apply(batch).token_weights,
        )
    assert canonical_arm("topk", {"f": 0.5, "scope": "group"}, N5)[1]["f"] == 0.6  # ceil(2.5) = 3
    assert canonical_arm("topk", {"f": 0.5}, N5)[1]["f"] == 0.5  # batch scope: N varies, no reduction


def test_constant_reweightings_are_the_control():
    assert canonical_arm("diffband", {"focus": 1.0, "q_low": 0.1, "scope": "informative"}, N5) == ("baseline", {})
    assert canonical_arm("diffband", {"q_low": 0.0, "q_high": 1.0}, N5) == ("baseline", {})
    assert canonical_arm("per", {"alpha": 0.0, "agg": "max"}, N5) == ("baseline", {})
    assert canonical_arm("ar", {"alpha": 0.0, "scope": "informative"}, N5) == ("baseline", {})
    assert canonical_arm("per", {"alpha": 0.5, "agg": "max"}, N5) != canonical_arm("per", {"alpha": 0.5}, N5)


def test_canonical_rounding_and_key_stability():
    method, a = canonical_arm("softmax", {"temperature": 0.30000000000000004}, N5)
    assert (method, a) == canonical_arm("softmax", {"temperature": 0.3}, N5) and a["temperature"] == 0.3
    assert arm_key("softmax", a) == arm_key("softmax", dict(reversed(list(a.items()))))
    assert len(arm_key("softmax", a)) == 12 and all(ch in "0123456789abcdef" for ch in arm_key("softmax", a))
    assert arm_key("softmax", a) != arm_key("per", canonical_arm("per", {}, N5)[1])
    assert arm_key(*canonical_arm("ar", {"alpha": 0.0}, N5)) == arm_key("uniform", {})
    with pytest.raises(ValueError, match="canonical forms need the group size"):
        canonical_arm("softmax", {}, Context())


def test_canonical_band_acts_like_the_original():
    batch = make_batch([[1.0] * k + [0.0] * (5 - k) for k in range(6)])
    edges = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9, 1.0]
    for low, high, inclusive in itertools.product(edges, edges, (False, True)):
        if not (low < high and low < 1.0):
            continue
        p = {"low": low, "high": high, "inclusive": inclusive}
        w = make_policy("difffilter", p, rollout_n=5).apply(batch).token_weights
        method, c = canonical_arm("difffilter", p, N5)
        assert torch.equal(w, make_policy(method, c, rollout_n=5).apply(batch).token_weights), p


# --- docs -----------------------------------------------------------------------------------


def test_describe_and_methods_table_come_from_the_declarations():
    text = describe_method("softmax")
    assert "scorer `advantage_magnitude`, actuator `softmax`" in text
    assert "| `temperature` | float | 1.0 | (0, inf) | [0.01, 10] log | softmax temperature T |" in text
    assert "| `low` | float | 0.0 | [0, 1) | [0, 1) | lower band edge on the solve rate |" in describe_method(
        "difffilter"
    )
    assert "`low < high`" in describe_method("difffilter")
    assert "| `k` | int | 2 | [1, 4] | [1, 4] | responses kept per group |" in describe_method("gfpo", rollout_n=5)
    table = methods_table()
    assert table.count("\n") == len(PAPER_METHODS) + 1
    assert "| maxvar | reward | max_variance | `f`: 0.5, (0, 1]; `recompute_advantages`: false, {false, true}" in table
    assert "`temperature`: 1.0, [0.01, 10] log in (0, inf)" in table and "`low < high`" in table
    assert "`k`: 2, [1, 7] in [1, n-1]" in table and "`floor`: 0.0, [0, 0.1] in [0, 1/K)" in table


def test_readme_methods_table_is_current():
    readme = (Path(__file__).parents[2] / "docs" / "readme_policies.md").read_text()
    table = readme.split("<!-- methods_table -->\n")[1].split("\n<!-- /methods_table -->")[0]
    assert table == methods_table(), "regenerate the table in docs/readme_policies.md from methods_table()"
