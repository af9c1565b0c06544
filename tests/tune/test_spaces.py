"""Search spaces: every packaged space loads and samples valid canonical arms; bad declarations are clear errors."""

from __future__ import annotations

import optuna
import pytest
import yaml
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from tune_dfrl.policies import Context, canonical_arm
from tune_dfrl.tune.searcher import INNER_METRIC, PairedRepeater
from tune_dfrl.tune.spaces import ArmFactory, SearchSpace, arm_label, available_spaces, space_file_text

SEARCHABLE = [
    "difffilter_band",
    "topk_keep",
    "gfpo_k",
    "maxvar_keep",
    "softmax_temperature",
    "diffband",
    "ar_alpha",
    "per_alpha",
    "reward_gap_temperature",
    "dump_ucb_c",
    "tscl_temperature",
]


def sample(space: SearchSpace, count: int, seed: int = 0) -> list[dict]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed), direction="maximize")
    return [space.sampler()(study.ask()) for _ in range(count)]


def test_every_method_has_a_space_and_cross_method_spaces_exist() -> None:
    names = available_spaces()
    assert set(SEARCHABLE) <= set(names)
    assert {"all_selectors", "all_reweighters", "all_mixers"} <= set(names)
    for name in names:
        assert yaml.safe_load(space_file_text(name))["name"] == name


@pytest.mark.parametrize("name", available_spaces())
def test_sampled_suggestions_are_valid_arms_inside_the_declared_ranges(name: str) -> None:
    space = SearchSpace.load(name, rollout_n=8)
    factory = ArmFactory(rollout_n=8, recipe_hash="r0")
    methods = {m.method: m for m in space.methods}
    for suggestion in sample(space, 12):
        searched = methods[suggestion["method"]]
        for param, bounds in searched.ranges.items():
            value = suggestion["params"][param]
            assert value in bounds if isinstance(bounds, list) else bounds[0] <= value <= bounds[1]
        for param, value in searched.fixed.items():
            assert suggestion["params"][param] == value
        arm = factory(suggestion)
        assert (arm.method, arm.params) == canonical_arm(suggestion["method"], suggestion["params"], Context(8))
        assert len(arm.arm_id) == 12 and arm.label.startswith(arm.method)
    control = factory({"method": space.control_method, "params": space.control_params})
    assert control.method == ("static" if space.mechanism == "mixture" else "baseline")


def test_cross_method_space_samples_several_methods_with_conditional_names() -> None:
    space = SearchSpace.load("all_selectors", rollout_n=8)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1), direction="maximize")
    trials = [study.ask() for _ in range(30)]
    methods = [space.sampler()(t)["method"] for t in trials]
    assert set(methods) == {"difffilter", "topk", "gfpo", "maxvar"}
    for trial, method in zip(trials, methods):
        assert all(key == "method" or key.startswith(f"{method}.") for key in trial.params)


def test_arm_id_depends_on_canonical_form_and_recipe() -> None:
    a = ArmFactory(4, "r0")({"method": "difffilter", "params": {"low": 0.10, "high": 0.90}})
    b = ArmFactory(4, "r0")({"method": "difffilter", "params": {"low": 0.20, "high": 0.80}})  # same levels 1/4..3/4
    c = ArmFactory(4, "r1")({"method": "difffilter", "params": {"low": 0.10, "high": 0.90}})
    assert a.arm_id == b.arm_id != c.arm_id
    assert arm_label("topk", {"f": 0.25, "scope": "batch", "agg": "mean", "denominator": "all"}) == "topk(f=0.25)"


def test_a_fixed_partner_narrows_the_searched_range() -> None:
    space = SearchSpace.from_mapping(
        declared(difffilter={"search": {"high": None}, "fixed": {"low": 0.5}}), rollout_n=5
    )
    low, high = space.methods[0].ranges["high"]
    assert 0.5 < low < 0.5 + 1e-12 and high == 1.0


def test_a_suggestion_acting_as_the_control_gets_the_control_id() -> None:
    """difffilter(low=0.1, high=0.9, inclusive=true) at n=5 with 0/1 rewards and denominator=all drops only
    groups whose advantages are all 0: it is uniform GRPO, and gets the baseline control's id and form."""
    binary = ArmFactory(5, "r0", binary_rewards=True)
    control = binary({"method": "baseline", "params": {}})
    same = binary(
        {"method": "difffilter", "params": {"low": 0.1, "high": 0.9, "inclusive": True, "denominator": "all"}}
    )
    assert same == control and (same.method, same.params, same.label) == ("baseline", {}, "baseline")
    assert binary({"method": "maxvar", "params": {"f": 1.0, "recompute_advantages": True}}) == control
    partial = ArmFactory(5, "r0")({"method": "difffilter", "params": {"low": 0.1, "high": 0.9, "inclusive": True}})
    assert partial.arm_id != ArmFactory(5, "r0")({"method": "baseline", "params": {}}).arm_id


def test_the_searcher_trains_no_arm_that_is_the_control_and_tells_optuna_zero() -> None:
    """A space where every suggestion keeps levels 1..4 of 5: no arm besides the control is ever trained."""
    space = SearchSpace.from_mapping(
        declared(
            difffilter={
                "search": {"low": [0.0, 0.19], "high": [0.81, 1.0]},
                "fixed": {"inclusive": True, "denominator": "all"},
            }
        ),
        rollout_n=5,
    )
    storage = optuna.storages.InMemoryStorage()
    inner = OptunaSearch(
        space=space.sampler(),
        metric=INNER_METRIC,
        mode="max",
        sampler=optuna.samplers.RandomSampler(seed=0),
        storage=storage,
        study_name="s",
    )
    factory = ArmFactory(5, "r0", binary_rewards=True)
    control = factory({"method": "baseline", "params": {}})
    searcher = PairedRepeater(
        inner, factory, control, (0, 1), n_arms=3, final_step=4, metric="score/db", max_duplicates=5
    )
    handed = [(f"t{i}", searcher.suggest(f"t{i}")) for i in range(2)]
    assert [cfg["arm"]["arm_id"] for _, cfg in handed] == [control.arm_id] * 2
    assert searcher.suggest("t2") is None and list(searcher.arms) == [control.arm_id]  # 5 duplicates: exhausted
    for tid, cfg in handed:
        searcher.on_trial_result(tid, {"step": 4, "score/db": 50.0 + cfg["seed"]})
        searcher.on_trial_complete(tid, {"step": 4, "score/db": 50.0 + cfg["seed"]})
    assert searcher.suggest("t2") == Searcher.FINISHED
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert len(trials) == 5 and all(t.state == optuna.trial.TrialState.COMPLETE and t.value == 0.0 for t in trials)


def declared(**methods) -> dict:
    return {"name": "custom", "mechanism": "selection", "control": {"method": "baseline"}, "methods": methods}


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            declared(difffilter={"search": {"low": [0.6, 0.9], "high": [0.1, 0.5]}}),
            "impossible search range for difffilter",
        ),
        (
            declared(difffilter={"search": {"high": [0.1, 0.3]}, "fixed": {"low": 0.5}}),
            "high in [0.1, 0.3] cannot exceed fixed low=0.5",
        ),
        (declared(topk={"search": {"f": [0.0, 1.5]}}), "search range for 'f' of topk"),
        (
            declared(topk={"search": {"fraction": None}}),
            "cannot search parameter 'fraction' of topk; searchable: f, scope, denominator",
        ),
        (declared(topk={"search": {"f": None}, "fixed": {"f": 0.3}}), "'f' is both searched and fixed"),
        (declared(topk={"search": {"f": None}, "fixed": {"scop": "batch"}}), "unknown parameter 'scop' for topk"),
        (
            declared(topk={"search": {"f": None}, "actuator": "softmax"}),
            "declares actuator 'softmax' but topk uses 'topk_fraction'",
        ),
        (declared(softmax={"search": {"temperature": None}}), "a reweighter does not belong in a selection space"),
        (declared(topk={"fixed": {"f": 0.3}}), "searches no parameter"),
        (declared(), "declares no methods"),
        (
            {**declared(topk={"search": {"f": None}}), "mechanism": "pruning"},
            "mechanism 'pruning' is not allowed; allowed: selection, reweighting, mixture",
        ),
        ({**declared(topk={"search": {"f": None}}), "seeds": 3}, "unknown key 'seeds'; allowed: name, description"),
    ],
)
def test_bad_space_declarations_are_clear_errors(space: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SearchSpace.from_mapping(space, rollout_n=8)


def test_unknown_space_lists_the_available_ones() -> None:
    with pytest.raises(ValueError, match="unknown search space 'difffilter'; available: all_mixers, all_reweighters"):
        SearchSpace.load("difffilter", rollout_n=8)
