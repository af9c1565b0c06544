"""Mixers: windowed per-domain statistics -> domain proportions of the next batch (DESIGN §4).

Per domain d over the last W observed steps: mean reward mu_d (pooled over responses), mean
|advantage| v_d, reward slope beta_d (least squares of the per-step domain mean reward against
step; 0 with fewer than two steps), and n_d = responses observed from d so far (all steps).
A domain absent from the window gets the mean of the present domains' mu and v (neutral) and
beta = 0 (no evidence of change).

| name | target p~_d |
|---|---|
| static | the static proportions (uniform by default) |
| reward_gap | softmax_d((max_e mu_e - mu_d) / T) |
| dump_ucb | softmax_d(u_d / T), u_d = v_d + c sqrt(2 ln(sum_e n_e + 1) / (n_d + 1)) |
| tscl | softmax_d(|beta_d| / T), or max(beta_d, 0) / T when signed |

Floor (exact): p = floor + (1 - K floor) p~, 0 <= floor < 1/K. Before `warmup` steps the static
proportions apply; after, p is recomputed when at least `update_every` steps passed since the
last update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tune_dfrl.config.constraints import BOOL, Bound, Interval, ListOf

from .batch import RolloutBatch
from .params import TEMPERATURE, Param


@dataclass(frozen=True)
class DomainStats:
    """Window statistics, each [K]."""

    mean_reward: np.ndarray
    mean_abs_advantage: np.ndarray
    slope: np.ndarray
    drawn: np.ndarray
    present: np.ndarray


class DomainWindow:
    """Per-step, per-domain sums over a sliding window of the last `window` observed steps."""

    def __init__(self, num_domains: int, window: int):
        self.num_domains, self.window = num_domains, window
        self.steps: list[int] = []
        self.sums = np.zeros((0, 3, num_domains))  # per step: reward sum, |adv| sum, count
        self.drawn = np.zeros(num_domains)

    def observe(self, step: int, domain: np.ndarray, reward: np.ndarray, abs_advantage: np.ndarray) -> None:
        if domain.size and (domain.min() < 0 or domain.max() >= self.num_domains):
            raise ValueError(f"domain ids must be in [0, {self.num_domains}); got {domain.min()}..{domain.max()}")
        if self.steps and step < self.steps[-1]:
            raise ValueError(f"steps must not decrease; got step {step} after {self.steps[-1]}")
        row = np.stack(
            [np.bincount(domain, weights=w, minlength=self.num_domains) for w in (reward, abs_advantage)]
            + [np.bincount(domain, minlength=self.num_domains).astype(float)]
        )
        self.drawn += row[2]
        if self.steps and self.steps[-1] == step:
            self.sums[-1] += row
        else:
            self.steps = (self.steps + [step])[-self.window :]
            self.sums = np.concatenate([self.sums, row[None]])[-self.window :]

    def stats(self) -> DomainStats:
        reward_sum, adv_sum, count = self.sums.sum(axis=0) if self.steps else np.zeros((3, self.num_domains))
        present = count > 0
        safe = np.maximum(count, 1)
        mu, v = reward_sum / safe, adv_sum / safe
        if present.any():
            mu = np.where(present, mu, mu[present].mean())
            v = np.where(present, v, v[present].mean())
        return DomainStats(mu, v, self._slope(), self.drawn.copy(), present)

    def _slope(self) -> np.ndarray:
        """Least-squares slope of per-step domain mean reward vs step, over the steps d appears in."""
        if not self.steps:
            return np.zeros(self.num_domains)
        x = np.asarray(self.steps, dtype=float)[:, None]
        seen = self.sums[:, 2] > 0
        y = self.sums[:, 0] / np.maximum(self.sums[:, 2], 1)
        n = seen.sum(axis=0)
        x_bar = (x * seen).sum(axis=0) / np.maximum(n, 1)
        y_bar = (y * seen).sum(axis=0) / np.maximum(n, 1)
        dx = (x - x_bar) * seen
        sxx = (dx * dx).sum(axis=0)
        sxy = (dx * (y - y_bar)).sum(axis=0)
        return np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1), 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "sums": self.sums.tolist(), "drawn": self.drawn.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = list(state["steps"])
        self.sums = np.asarray(state["sums"], dtype=float).reshape(len(self.steps), 3, self.num_domains)
        self.drawn = np.asarray(state["drawn"], dtype=float)


def reward_gap(s: DomainStats, p: dict[str, Any]) -> np.ndarray:
    return (s.mean_reward.max() - s.mean_reward) / p["temperature"]


def dump_ucb(s: DomainStats, p: dict[str, Any]) -> np.ndarray:
    bonus = p["c"] * np.sqrt(2 * np.log(s.drawn.sum() + 1) / (s.drawn + 1))
    return (s.mean_abs_advantage + bonus) / p["temperature"]


def tscl(s: DomainStats, p: dict[str, Any]) -> np.ndarray:
    progress = np.maximum(s.slope, 0) if p["signed"] else np.abs(s.slope)
    return progress / p["temperature"]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


@dataclass(frozen=True)
class MixerRule:
    """A named target rule (logits over domains from window statistics), None for static."""

    name: str
    params: tuple[Param, ...]
    logits: Callable[[DomainStats, dict[str, Any]], np.ndarray] | None


FLOOR = Param(
    "floor",
    0.0,
    Interval(float, 0.0, Bound("num_domains", reciprocal=True, unknown=1.0), "left"),
    search=(0.0, 0.1),
    doc="exact minimum proportion per domain",
)
SCHEDULE = (
    Param("window", 10, Interval(int, 1, None), searchable=False, doc="steps in the statistics window W"),
    Param("update_every", 1, Interval(int, 1, None), searchable=False, doc="steps between proportion updates"),
    Param("warmup", 1, Interval(int, 0, None), searchable=False, doc="steps on the static proportions first"),
)

MIXERS: dict[str, MixerRule] = {
    m.name: m
    for m in (
        MixerRule(
            "static",
            (
                Param(
                    "proportions",
                    None,
                    ListOf(Interval(float, 0.0, None)),
                    searchable=False,
                    doc="fixed domain proportions (normalised; uniform when omitted)",
                ),
            ),
            None,
        ),
        MixerRule("reward_gap", (TEMPERATURE, FLOOR, *SCHEDULE), reward_gap),
        MixerRule(
            "dump_ucb",
            (
                Param("c", 1.0, Interval(float, 0.0, None), search=(0.0, 4.0), doc="exploration weight"),
                TEMPERATURE,
                FLOOR,
                *SCHEDULE,
            ),
            dump_ucb,
        ),
        MixerRule(
            "tscl",
            (TEMPERATURE, Param("signed", False, BOOL, doc="use max(beta, 0) instead of |beta|"), FLOOR, *SCHEDULE),
            tscl,
        ),
    )
}


def _as_numpy(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype).reshape(-1)


class Mixer:
    """Observes per-response (domain, reward, |advantage|) each step; proposes the next proportions."""

    def __init__(self, rule: MixerRule, params: dict[str, Any], num_domains: int, static: np.ndarray):
        self.rule, self.params, self.num_domains, self.static = rule, params, num_domains, static
        self.window = DomainWindow(num_domains, params.get("window", 1))
        self.last_update: int | None = None
        self.current = static.copy()

    def observe(
        self,
        step: int,
        domain: torch.Tensor | np.ndarray | RolloutBatch,
        reward: torch.Tensor | np.ndarray | None = None,
        abs_advantage: torch.Tensor | np.ndarray | None = None,
    ) -> None:
        """Record one step; pass per-response tensors, or a RolloutBatch as the second argument.

        NaN/inf rewards or |advantages| are an error (they would poison the window for W steps).
        """
        if isinstance(domain, RolloutBatch):
            domain, reward, abs_advantage = domain.domain, domain.reward, domain.abs_advantage
        if reward is None or abs_advantage is None:
            raise ValueError("observe needs domain, reward and abs_advantage (or a RolloutBatch)")
        d, r, a = _as_numpy(domain, np.int64), _as_numpy(reward, float), _as_numpy(abs_advantage, float)
        if not d.shape == r.shape == a.shape:
            raise ValueError(
                f"domain, reward, abs_advantage must have equal length; got {d.shape}, {r.shape}, {a.shape}"
            )
        for name, values in (("reward", r), ("abs_advantage", a)):
            if not np.isfinite(values).all():
                raise ValueError(f"observe: {name} has {int((~np.isfinite(values)).sum())} NaN/inf entries")
        self.window.observe(step, d, r, a)

    def proportions(self, step: int) -> np.ndarray:
        """[K] proportions for the batch drawn at `step` (sum 1, each >= floor)."""
        if self.rule.logits is None or step < self.params["warmup"]:
            return self.static.copy()
        if self.last_update is None or step >= self.last_update + self.params["update_every"]:
            target = softmax(self.rule.logits(self.window.stats(), self.params))
            floor = self.params["floor"]
            self.current = floor + (1 - self.num_domains * floor) * target
            self.last_update = step
        return self.current.copy()

    def diagnostics(self) -> dict[str, float]:
        s = self.window.stats()
        out: dict[str, float] = {}
        for d in range(self.num_domains):
            out[f"mixer/p_{d}"] = float(self.current[d])
            out[f"mixer/mean_reward_{d}"] = float(s.mean_reward[d])
            out[f"mixer/mean_abs_adv_{d}"] = float(s.mean_abs_advantage[d])
            out[f"mixer/slope_{d}"] = float(s.slope[d])
            out[f"mixer/drawn_{d}"] = float(s.drawn[d])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window.state_dict(), "last_update": self.last_update, "current": self.current.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.load_state_dict(state["window"])
        self.last_update = state["last_update"]
        self.current = np.asarray(state["current"], dtype=float)
