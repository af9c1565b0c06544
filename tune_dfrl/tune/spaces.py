"""Named search spaces: one YAML per space in `search_spaces/` (the Hydra config group `space`).

A space file declares:

    name: difffilter_band                 # = the file name
    description: ...
    mechanism: selection                  # selection | reweighting | mixture
    control: {method: baseline, params: {}}
    methods:                              # one entry; several make a cross-method space
      difffilter:
        scorer: group_solve_rate          # optional; checked against the policy library
        actuator: threshold_band          # optional; checked against the policy library
        search: {low: null, high: [0.5, 1.0]}   # searched parameters; null = the declared range
        fixed: {denominator: all}         # fixed values; anything else keeps its default

The Optuna define-by-run sampler picks the method (`method`, categorical, when there are several)
and then that method's searched parameters under the names `<method>.<param>`, so parameters are
conditional on the method. An arm's id hashes its canonical form (policies' `canonical_arm` and
`arm_key`) with the training recipe, so configurations that act identically under one recipe are
trained once, and a suggestion that acts exactly as uniform GRPO gets the `baseline` control's id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import yaml

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.policies import Context, ParamSpec, arm_key, canonical_arm, resolve, validate_params

MECHANISMS = {"selection": "selector", "reweighting": "reweighter", "mixture": "mixer"}
SPACE_KEYS = ("name", "description", "mechanism", "control", "methods")
METHOD_KEYS = ("scorer", "actuator", "search", "fixed")


def available_spaces() -> list[str]:
    """Names of the packaged spaces."""
    folder = resources.files("tune_dfrl.search_spaces")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def space_file_text(name: str) -> str:
    """The YAML text of a packaged space; an unknown name lists the available ones."""
    names = available_spaces()
    if name not in names:
        raise ValueError(f"unknown search space {name!r}; available: {', '.join(names)}")
    return resources.files("tune_dfrl.search_spaces").joinpath(f"{name}.yaml").read_text()


def recipe_hash(recipe: Mapping[str, Any]) -> str:
    """12 hex chars of sha256 over the sorted recipe: arms and control cells are keyed by it."""
    return hashlib.sha256(json.dumps(dict(recipe), sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class MethodSearch:
    """One method of a space: the searched parameters' sampling ranges and the fixed values."""

    method: str
    ranges: dict[str, Any]  # searched parameter -> (lo, hi) or list of choices, as the policy library resolved it
    fixed: dict[str, Any]

    def spec(self) -> ParamSpec:
        """The method's declaration with only the searched parameters left searchable."""
        spec = resolve(self.method).spec
        return ParamSpec(
            spec.owner, tuple(replace(p, searchable=p.name in self.ranges) for p in spec.params), spec.constraints
        )


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    mechanism: str
    control_method: str
    control_params: dict[str, Any]
    methods: tuple[MethodSearch, ...]
    rollout_n: int

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], rollout_n: int) -> SearchSpace:
        """Validate a space declaration against the policy library at group size `rollout_n`."""
        name = str(data.get("name", "?"))
        _check_keys(data, SPACE_KEYS, f"search space {name!r}")
        mechanism = data.get("mechanism")
        if mechanism not in MECHANISMS:
            raise ValueError(
                f"search space {name!r}: mechanism {mechanism!r} is not allowed; allowed: {', '.join(MECHANISMS)}"
            )
        control = data.get("control") or {}
        _check_keys(control, ("method", "params"), f"search space {name!r}: control")
        control_method = control.get("method", "static" if mechanism == "mixture" else "baseline")
        control_params = dict(control.get("params") or {})
        validate_params(control_method, control_params, rollout_n)
        declared = data.get("methods") or {}
        if not declared:
            raise ValueError(f"search space {name!r} declares no methods; give at least one under `methods`")
        methods = tuple(_method_search(name, mechanism, m, entry or {}, rollout_n) for m, entry in declared.items())
        return cls(
            name, str(data.get("description", "")), mechanism, control_method, control_params, methods, rollout_n
        )

    @classmethod
    def load(cls, name: str, rollout_n: int) -> SearchSpace:
        return cls.from_mapping(yaml.safe_load(space_file_text(name)), rollout_n)

    def sampler(self) -> SpaceSampler:
        return SpaceSampler(self.methods)

    def default_suggestions(self) -> list[dict[str, Any]]:
        """One suggestion per method at its defaults plus fixed values (for up-front backend checks)."""
        return [{"method": m.method, "params": dict(m.fixed)} for m in self.methods]


@dataclass(frozen=True)
class SpaceSampler:
    """Optuna define-by-run: `{"method": ..., "params": {...}}` (picklable, as Ray checkpoints it)."""

    methods: tuple[MethodSearch, ...]

    def __call__(self, trial: Any) -> dict[str, Any]:
        by_name = {m.method: m for m in self.methods}
        method = next(iter(by_name)) if len(by_name) == 1 else trial.suggest_categorical("method", list(by_name))
        chosen = by_name[method]
        params = chosen.spec().suggest(trial, chosen.ranges, prefix=f"{method}.")
        return {"method": method, "params": {**chosen.fixed, **params}}


@dataclass(frozen=True)
class ArmFactory:
    """Suggestion -> ArmSpec with canonical params, an id keyed by the recipe, and a short label.

    `binary_rewards`: the recipe's rewards are 0 or 1 (exact-match verifiers), so under GRPO a
    group of n >= 2 that is all solved or all unsolved has advantage 0, and canonical forms use it.
    A suggestion that acts exactly as uniform GRPO comes back as the `baseline` arm: the control of
    selection and reweighting spaces, which the searcher then treats as a duplicate (not trained,
    Optuna told 0).
    """

    rollout_n: int
    recipe_hash: str
    binary_rewards: bool = False

    def __call__(self, suggestion: Mapping[str, Any]) -> ArmSpec:
        context = Context(self.rollout_n, binary_rewards=self.binary_rewards)
        method, canonical = canonical_arm(suggestion["method"], suggestion.get("params") or {}, context)
        digest = hashlib.sha256(f"{arm_key(method, canonical)}/{self.recipe_hash}".encode()).hexdigest()[:12]
        return ArmSpec(method=method, params=canonical, arm_id=digest, label=arm_label(method, canonical))


def arm_label(method: str, params: Mapping[str, Any]) -> str:
    """`method(name=value, ...)` over the parameters that differ from their defaults."""
    defaults = validate_params(method, {})
    changed = [f"{k}={_short(v)}" for k, v in params.items() if v != defaults.get(k)]
    return f"{method}({', '.join(changed)})" if changed else method


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list):
        return "[" + ",".join(_short(x) for x in v) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


def _check_keys(data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def _method_search(space: str, mechanism: str, method: str, entry: Mapping[str, Any], rollout_n: int) -> MethodSearch:
    where = f"search space {space!r}, method {method!r}"
    _check_keys(entry, METHOD_KEYS, where)
    resolved = resolve(method)
    if resolved.kind != MECHANISMS[mechanism]:
        raise ValueError(f"{where}: a {resolved.kind} does not belong in a {mechanism} space")
    scorer, actuator = resolved.key.split(":")
    for key, actual in (("scorer", scorer), ("actuator", actuator)):
        if key in entry and entry[key] != actual:
            raise ValueError(f"{where}: declares {key} {entry[key]!r} but {method} uses {actual!r}")
    search = dict(entry.get("search") or {})
    fixed = dict(entry.get("fixed") or {})
    both = sorted(set(search) & set(fixed))
    if both:
        raise ValueError(f"{where}: parameter {both[0]!r} is both searched and fixed")
    if not search:
        raise ValueError(f"{where}: searches no parameter; list at least one under `search`")
    valid = validate_params(method, fixed, rollout_n)  # unknown names / bad values
    # unknown, unsearchable or empty ranges; a range whose `lower < upper` partner is fixed is cut
    ranges = resolved.spec.search_ranges(search, Context(rollout_n), {k: valid[k] for k in fixed})
    return MethodSearch(method, {k: ranges[k] for k in search}, fixed)
