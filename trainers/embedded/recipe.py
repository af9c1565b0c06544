"""The training recipe of one embedded trial, validated from a plain dict (unknown keys are an error)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tune_dfrl.config.constraints import COUNT, POSITIVE, Interval, OrNull, Text, check_declared, declared

from .base import BaseRecipe
from .benchmarks import BENCHMARK_NAMES, get_benchmarks, longest_answer


@dataclass(frozen=True)
class EmbeddedRecipe:
    """GRPO on the tiny model: `steps` updates of `prompts_per_step` prompts x `rollout_n` rollouts,
    greedy evaluation every `milestone_every` steps and at the end."""

    steps: int = declared(150, COUNT)
    milestone_every: int = declared(50, COUNT)
    prompts_per_step: int = declared(16, COUNT)
    rollout_n: int = declared(5, Interval(int, 2, None))  # GRPO needs a group
    lr: float = declared(1e-4, POSITIVE)
    kl_coef: float = declared(1e-3, Interval(float, 0.0, None))
    clip_ratio: float = declared(0.2, Interval(float, 0.0, 1.0, "neither"))
    max_new_tokens: int = declared(6, COUNT)
    temperature: float = declared(1.0, POSITIVE)
    eval_benchmarks: tuple[str, ...] = BENCHMARK_NAMES
    base: BaseRecipe = field(default_factory=BaseRecipe)
    cache_dir: str | None = declared(None, OrNull(Text()))
    num_threads: int | None = declared(None, OrNull(COUNT))
    cpus_per_trial: int = declared(1, COUNT)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> EmbeddedRecipe:
        """Defaults overridden by `values`; ValueError naming any unknown key or invalid value."""
        values = dict(values or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"unknown embedded recipe key(s) {unknown}; allowed: {', '.join(allowed)}")
        if "base" in values and not isinstance(values["base"], BaseRecipe):
            values["base"] = BaseRecipe.from_dict(dict(values["base"]))
        if "eval_benchmarks" in values:
            values["eval_benchmarks"] = tuple(b.name for b in get_benchmarks(list(values["eval_benchmarks"])))
        recipe = cls(**values)
        recipe = dataclasses.replace(recipe, **check_declared(recipe, "backend."))
        recipe._check()
        return recipe

    def _check(self) -> None:
        """The relations between keys (each key's own range is checked by `from_dict`)."""
        if self.steps < self.milestone_every:
            raise ValueError(
                f"recipe 'steps' ({self.steps}) is smaller than 'milestone_every' ({self.milestone_every}); "
                "the budget must allow at least one milestone interval"
            )
        if self.max_new_tokens <= longest_answer():
            raise ValueError(
                f"recipe 'max_new_tokens' ({self.max_new_tokens}) must exceed the longest answer "
                f"({longest_answer()} characters) so that an answer and its eos fit"
            )

    @property
    def threads(self) -> int:
        """Torch threads of a trial: `num_threads`, else as many as the CPUs it was given."""
        return self.num_threads or self.cpus_per_trial
