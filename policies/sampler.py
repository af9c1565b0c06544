"""Seeded domain sampler: turns proportions into a concrete prompt batch.

Counts are the largest-remainder rounding of p * B (floor everything, then hand the leftover
units to the largest fractional parts, ties to the lower domain index). Each domain has its own
stream: a numpy Generator spawned from the seed walks through seeded permutations of the
domain's pool, reshuffling when a pass is exhausted, so a domain's draws do not depend on what
the other domains drew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplerDraw:
    """One batch: per prompt its domain and index within the domain pool; counts per domain [K]."""

    domain: np.ndarray
    index: np.ndarray
    counts: np.ndarray

    @property
    def proportions(self) -> np.ndarray:
        """[K] realised proportions counts / B (zeros for an empty batch)."""
        return self.counts / max(1, int(self.counts.sum()))


def largest_remainder(proportions: Any, total: int) -> np.ndarray:
    """[K] non-negative ints summing to `total`, the largest-remainder rounding of p * total.

    `proportions`: K >= 1 finite numbers >= 0 summing to 1 (within 1e-6; they are renormalised);
    `total`: an integer >= 0. Anything else is a ValueError.
    """
    p = np.asarray(proportions, dtype=float)
    if p.ndim != 1 or not p.size or not np.isfinite(p).all() or (p < 0).any() or abs(p.sum() - 1) > 1e-6:
        raise ValueError(f"proportions must be non-negative numbers summing to 1; got {p.tolist()}")
    if isinstance(total, (bool, np.bool_)) or not isinstance(total, (int, np.integer)) or total < 0:
        raise ValueError(f"total must be an integer >= 0; got {total!r}")
    raw = np.round(p / p.sum() * total, 9)
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


class DomainSampler:
    """Draws (domain, index) pairs for a batch from per-domain seeded permutation streams."""

    def __init__(self, pool_sizes: list[int], seed: int):
        if not pool_sizes or any(int(s) < 0 for s in pool_sizes):
            raise ValueError(f"pool_sizes must be a non-empty list of sizes >= 0; got {pool_sizes}")
        self.pool_sizes = [int(s) for s in pool_sizes]
        self.rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(pool_sizes))]
        self.perms = [rng.permutation(size) for rng, size in zip(self.rngs, self.pool_sizes)]
        self.pos = [0] * len(pool_sizes)

    def draw(self, proportions: np.ndarray, batch_size: int) -> SamplerDraw:
        k = len(self.pool_sizes)
        if np.shape(proportions) != (k,):
            raise ValueError(f"proportions must be {k} numbers (one per domain); got shape {np.shape(proportions)}")
        counts = largest_remainder(proportions, batch_size)
        empty = [d for d in range(k) if counts[d] and not self.pool_sizes[d]]
        if empty:
            raise ValueError(f"domain {empty[0]} has an empty pool but was assigned {counts[empty[0]]} prompts")
        index = np.concatenate([self._take(d, int(c)) for d, c in enumerate(counts)])
        return SamplerDraw(np.repeat(np.arange(k), counts), index, counts)

    def _take(self, d: int, count: int) -> np.ndarray:
        """The next `count` indices of domain d's stream."""
        taken: list[np.ndarray] = []
        while count > 0:
            if self.pos[d] == self.pool_sizes[d]:
                self.perms[d], self.pos[d] = self.rngs[d].permutation(self.pool_sizes[d]), 0
            chunk = self.perms[d][self.pos[d] : self.pos[d] + count]
            self.pos[d] += len(chunk)
            count -= len(chunk)
            taken.append(chunk)
        return np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [rng.bit_generator.state for rng in self.rngs],
            "perms": [perm.tolist() for perm in self.perms],
            "pos": list(self.pos),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
        self.perms = [np.asarray(p, dtype=np.int64) for p in state["perms"]]
        self.pos = list(state["pos"])
