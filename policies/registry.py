"""Method registry: names -> (scorer, actuator), and the policy and mixer built from them.

A method is a paper name (difffilter, topk, ...) or a component name (threshold_band, ...,
which uses the component's default scorer). Its hyperparameters are the actuator's, then the
scorer's options, then the selection flag `denominator` for selectors; everything below is
derived from those declarations, and canonical forms from each actuator's own `reduce`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from tune_dfrl.config.constraints import Context

from .batch import RolloutBatch
from .mixers import MIXERS, Mixer, MixerRule
from .params import Param, ParamSpec
from .reweighters import REWEIGHTERS, Reweighter, Weights, in_scope
from .scorers import SCORERS, Scorer
from .selectors import DENOMINATOR, SELECTORS, Selector, kept_group_advantages

Kind = Literal["uniform", "selector", "reweighter", "mixer"]

PAPER_METHODS: dict[str, tuple[str | None, str]] = {
    "baseline": (None, "uniform"),
    "difffilter": ("group_solve_rate", "threshold_band"),
    "topk": ("advantage_magnitude", "topk_fraction"),
    "gfpo": ("response_length", "gfpo"),
    "maxvar": ("reward", "max_variance"),
    "softmax": ("advantage_magnitude", "softmax"),
    "diffband": ("reward", "difficulty_band"),
    "ar": ("token_prob", "advantage_reweight"),
    "per": ("advantage_magnitude", "per_advantage"),
    "static": (None, "static"),
    "reward_gap": (None, "reward_gap"),
    "dump_ucb": (None, "dump_ucb"),
    "tscl": (None, "tscl"),
}
COMPONENT_METHODS: dict[str, tuple[str | None, str]] = {
    "uniform": (None, "uniform"),
    **{name: (s.scorer, name) for name, s in SELECTORS.items()},
    **{name: (r.scorer, name) for name, r in REWEIGHTERS.items()},
    **{name: (None, name) for name in MIXERS},
}
ALL_METHODS: dict[str, tuple[str | None, str]] = {**COMPONENT_METHODS, **PAPER_METHODS}


@dataclass(frozen=True)
class Method:
    """A resolved method: its scorer, its actuator and their combined parameter declaration."""

    name: str
    kind: Kind
    scorer: Scorer | None
    actuator: Selector | Reweighter | MixerRule | None
    spec: ParamSpec

    @property
    def key(self) -> str:
        """`scorer:actuator`, the same for a paper name and its component name."""
        actuator = self.actuator.name if self.actuator is not None else "uniform"
        return f"{self.scorer.name if self.scorer else '-'}:{actuator}"


def resolve(method: str) -> Method:
    """Look up a method name; unknown names are an error listing the known ones."""
    if method not in ALL_METHODS:
        raise ValueError(f"unknown method '{method}'; allowed: {', '.join(sorted(ALL_METHODS))}")
    scorer_name, actuator_name = ALL_METHODS[method]
    scorer = SCORERS[scorer_name] if scorer_name else None
    scorer_params = scorer.params if scorer else ()
    if actuator_name in SELECTORS:
        s = SELECTORS[actuator_name]
        return Method(
            method, "selector", scorer, s, ParamSpec(method, s.params + scorer_params + (DENOMINATOR,), s.constraints)
        )
    if actuator_name in REWEIGHTERS:
        r = REWEIGHTERS[actuator_name]
        return Method(method, "reweighter", scorer, r, ParamSpec(method, r.params + scorer_params, r.constraints))
    if actuator_name in MIXERS:
        m = MIXERS[actuator_name]
        return Method(method, "mixer", None, m, ParamSpec(method, m.params))
    return Method(method, "uniform", None, None, ParamSpec(method, ()))


@dataclass
class PolicyResult:
    """token_weights [N, L] (multiplied into the batch's rollout_is_weights), advantages [N, L], diagnostics."""

    token_weights: torch.Tensor
    advantages: torch.Tensor
    diagnostics: dict[str, float]


@dataclass(frozen=True)
class Policy:
    """A selection or reweighting policy with validated parameters; `apply` is the only entry point."""

    method: Method
    params: dict[str, Any]

    def apply(self, batch: RolloutBatch) -> PolicyResult:
        m, p = self.method, self.params
        everyone = torch.ones(batch.num_responses, dtype=torch.bool)
        if m.kind == "uniform":
            return _result(
                batch, Weights.per_response(everyone.double(), batch.token_counts), batch.advantages, everyone
            )
        if m.kind == "reweighter":
            scope = in_scope(batch, p["scope"])  # before scoring: both may use the batch workspace
            weights = m.actuator.weigh(batch, m.scorer.score(batch, p), p, scope)
            if not isinstance(weights, Weights):
                weights = Weights.per_response(weights, batch.token_counts)
            return _result(batch, weights, batch.advantages, everyone)
        keep = m.actuator.select(batch, m.scorer.score(batch, p), p)
        counts = batch.token_counts
        kept_tokens = counts[keep].sum()
        scale = counts.sum() / kept_tokens if p["denominator"] == "kept" and kept_tokens > 0 else 1.0
        advantages = kept_group_advantages(batch, keep) if p.get("recompute_advantages") else batch.advantages
        return _result(batch, Weights.per_response(keep.double() * scale, counts), advantages, keep)


def _result(batch: RolloutBatch, weights: Weights, advantages: torch.Tensor, kept: torch.Tensor) -> PolicyResult:
    """Token weights (written into the batch workspace, times any IS weights) and diagnostics.

    Weight statistics are over valid tokens of the policy's own weights (before the IS factor).
    """
    out = batch.take_workspace()
    if weights.values.dim() == 1:
        column = weights.values.to(out.dtype)[:, None]
        if batch.rollout_is_weights is None:
            out.copy_(column.expand_as(out))
        else:
            torch.mul(batch.rollout_is_weights, column, out=out)
    elif batch.rollout_is_weights is not None:  # token-level values already live in `out`
        out.mul_(batch.rollout_is_weights)
    counts = batch.token_counts
    total = counts.sum()
    valid = counts > 0
    mean = weights.row_sum.sum() / total if total > 0 else torch.tensor(0.0)
    variance = weights.row_sq.sum() / total - mean**2 if total > 0 else torch.tensor(0.0)
    diagnostics = {
        "kept_fraction": float(kept.double().mean()),
        "kept_token_fraction": float(counts[kept].sum() / total) if total > 0 else 0.0,
        "weight_mean": float(mean),
        "weight_std": float(variance.clamp(min=0).sqrt()),
        "weight_max": float(weights.row_max[valid].max()) if valid.any() else 0.0,
        "empty_selection": float(not bool(kept.any())),
    }
    return PolicyResult(out, advantages, diagnostics)


def make_policy(method: str, params: Mapping[str, Any] | None = None, rollout_n: int | None = None) -> Policy:
    """Build a selection/reweighting policy (or `baseline`/`uniform`: weights all 1)."""
    m = resolve(method)
    if m.kind == "mixer":
        raise ValueError(f"'{method}' is a mixer; build it with make_mixer(method, params, num_domains)")
    return Policy(m, m.spec.validate(params, Context(rollout_n)))


def make_mixer(
    method: str, params: Mapping[str, Any] | None, num_domains: int, static_proportions: Any = None
) -> Mixer:
    """Build a mixer over `num_domains` domains; static proportions default to uniform."""
    m = resolve(method)
    if m.kind != "mixer":
        raise ValueError(f"'{method}' is not a mixer; mixers: {', '.join(MIXERS)}")
    if num_domains < 1:
        raise ValueError(f"num_domains must be >= 1; got {num_domains}")
    p = m.spec.validate(params, Context(num_domains=num_domains))
    chosen = p.get("proportions") or static_proportions
    static = np.full(num_domains, 1 / num_domains) if chosen is None else np.asarray(chosen, dtype=float)
    if static.shape != (num_domains,) or (static < 0).any() or not static.sum() > 0:
        raise ValueError(
            f"static proportions must be {num_domains} numbers >= 0 with a positive sum; got {list(chosen)}"
        )
    return Mixer(m.actuator, p, num_domains, static / static.sum())


def validate_params(method: str, params: Mapping[str, Any] | None, rollout_n: int | None = None) -> dict[str, Any]:
    """The parameters with defaults filled in; ValueError naming what is wrong and what is allowed."""
    return resolve(method).spec.validate(params, Context(rollout_n))


def suggest_params(
    trial: Any, method: str, ranges: Mapping[str, Any] | None = None, prefix: str = "", rollout_n: int | None = None
) -> dict[str, Any]:
    """Sample the searchable parameters with an Optuna trial (see ParamSpec.suggest)."""
    return resolve(method).spec.suggest(trial, ranges, Context(rollout_n), prefix)


def describe_method(method: str, rollout_n: int | None = None) -> str:
    """Markdown: the method's scorer and actuator, then its parameter table."""
    m = resolve(method)
    scorer, actuator = m.key.split(":")
    return f"**{method}** ({m.kind}; scorer `{scorer}`, actuator `{actuator}`)\n\n{m.spec.describe(Context(rollout_n))}"


def methods_table() -> str:
    """Markdown table of the paper methods: scorer, actuator, searched and fixed hyperparameters."""
    rows = [
        "| method | scorer | actuator | searched: default, search range (in the valid range, where wider) "
        "| other options: default, valid range |",
        "|---|---|---|---|---|",
    ]
    for name in PAPER_METHODS:
        m = resolve(name)
        scorer, actuator = m.key.split(":")
        searched = "; ".join(f"`{p.name}`: {p.default_text}, {_search_and_valid(m.spec, p)}" for p in m.spec.searchable)
        fixed = "; ".join(f"`{p.name}`: {p.default_text}, {p.valid.text()}" for p in m.spec.params if not p.searchable)
        constraints = "".join(f"; `{c.lower} < {c.upper}`" for c in m.spec.constraints)
        rows.append(f"| {name} | {scorer} | {actuator} | {(searched or '—') + constraints} | {fixed or '—'} |")
    return "\n".join(rows)


def _search_and_valid(spec: ParamSpec, p: Param) -> str:
    search, valid = spec.search_text(p.name), p.valid.text()
    return search if search.removesuffix(" log") == valid else f"{search} in {valid}"


UNIFORM = "baseline"  # the method name a configuration that acts exactly as uniform GRPO canonicalises to


def canonical_arm(method: str, params: Mapping[str, Any] | None, context: Context) -> tuple[str, dict[str, Any]]:
    """(method, params) in a canonical form: configurations that act identically compare equal.

    Defaults are filled, floats rounded to 6 significant digits, and the actuator's own reduction
    applied for groups of `context.rollout_n` responses (band edges -> the solve-rate levels
    they keep, per-group counts -> k/n, parameters that cannot matter -> defaults). A
    configuration that acts exactly as uniform GRPO is (`baseline`, {}): the control's form.
    """
    if context.rollout_n is None:
        raise ValueError("canonical forms need the group size: pass a Context with rollout_n")
    m = resolve(method)
    p: dict[str, Any] | None = m.spec.validate(params, context)
    reduce = getattr(m.actuator, "reduce", None)
    if reduce is not None:
        p = reduce(p, context, m.spec.defaults)
    if p is None:
        return UNIFORM, {}
    return method, {k: _round(v) for k, v in p.items()}


def arm_key(method: str, canonical: Mapping[str, Any]) -> str:
    """12 hex chars of sha256 over the resolved (scorer, actuator) and the sorted canonical params."""
    text = json.dumps({"method": resolve(method).key, "params": dict(canonical)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v
