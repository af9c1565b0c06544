"""The training recipe of one embedded trial, validated from a plain dict (unknown keys are an error)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .base import BaseRecipe
from .benchmarks import BENCHMARK_NAMES, get_benchmarks, longest_answer


@dataclass(frozen=True)
class EmbeddedRecipe:
    """GRPO on the tiny model: `steps` updates of `prompts_per_step` prompts x `rollout_n` rollouts,
    greedy evaluation every `milestone_every` steps and at the end."""

    steps: int = 150
    milestone_every: int = 50
    prompts_per_step: int = 16
    rollout_n: int = 5
    lr: float = 1e-4
    kl_coef: float = 1e-3
    clip_ratio: float = 0.2
    max_new_tokens: int = 6
    temperature: float = 1.0
    eval_benchmarks: tuple[str, ...] = BENCHMARK_NAMES
    base: BaseRecipe = field(default_factory=BaseRecipe)
    cache_dir: str | None = None
    num_threads: int | None = None
    cpus_per_trial: int = 1

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
        recipe._check()
        return recipe

    def _check(self) -> None:
        positive_ints = ("steps", "milestone_every", "prompts_per_step", "max_new_tokens", "cpus_per_trial")
        for name in positive_ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"recipe '{name}' must be an integer >= 1; got {value!r}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ValueError(f"recipe 'num_threads' must be an integer >= 1 or null; got {self.num_threads!r}")
        if not isinstance(self.rollout_n, int) or self.rollout_n < 2:
            raise ValueError(f"recipe 'rollout_n' must be an integer >= 2 (GRPO needs a group); got {self.rollout_n!r}")
        if self.steps < self.milestone_every:
            raise ValueError(
                f"recipe 'steps' ({self.steps}) is smaller than 'milestone_every' ({self.milestone_every}); "
                "the budget must allow at least one milestone interval"
            )
        for name, low in (("lr", 0.0), ("temperature", 0.0)):
            if not getattr(self, name) > low:
                raise ValueError(f"recipe '{name}' must be > {low:g}; got {getattr(self, name)!r}")
        if not self.kl_coef >= 0:
            raise ValueError(f"recipe 'kl_coef' must be >= 0; got {self.kl_coef!r}")
        if self.max_new_tokens <= longest_answer():
            raise ValueError(
                f"recipe 'max_new_tokens' ({self.max_new_tokens}) must exceed the longest answer "
                f"({longest_answer()} characters) so that an answer and its eos fit"
            )
        if not 0 < self.clip_ratio < 1:
            raise ValueError(f"recipe 'clip_ratio' must be in (0, 1); got {self.clip_ratio!r}")

    @property
    def threads(self) -> int:
        """Torch threads of a trial: `num_threads`, else as many as the CPUs it was given."""
        return self.num_threads or self.cpus_per_trial
