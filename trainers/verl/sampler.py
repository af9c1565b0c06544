"""Domain-aware batch sampler for verl's training dataloader (mixer arms).

verl builds its training `StatefulDataLoader` in `PPOTrainer._init_dataloader`
(verl/trainer/ppo/v1/trainer_base.py) from `create_rl_sampler`; for a mixer arm the plugin
trainer replaces it with one driven by this batch sampler. Batch k (= training step k, 0-based:
the synchronous trainer fetches exactly one batch per step) holds B prompts drawn by
`DomainSampler` from per-domain seeded index streams with the proportions `mixer.proportions(k)`,
which the mixer computes from the statistics observed up to step k - 1. The dataloader must run
without worker processes so that each batch is drawn only when verl asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tune_dfrl.policies import DomainSampler, Mixer


class MixtureBatchSampler:
    """Yields dataset row indices, one list of `batch_size` per step, in mixer proportions."""

    def __init__(self, row_domains: np.ndarray, num_domains: int, mixer: Mixer, batch_size: int, seed: int):
        row_domains = np.asarray(row_domains, dtype=np.int64)
        self.rows_by_domain = np.argsort(row_domains, kind="stable")  # dataset rows grouped by domain
        pool_sizes = np.bincount(row_domains, minlength=num_domains)
        self.pool_starts = np.cumsum(pool_sizes) - pool_sizes
        self.sampler = DomainSampler(pool_sizes.tolist(), seed)
        self.mixer, self.batch_size = mixer, batch_size
        self.steps_drawn = 0
        self.last_counts = np.zeros(num_domains, dtype=np.int64)

    def next_batch(self) -> list[int]:
        """Rows of the batch for step `steps_drawn`; records its realised per-domain counts."""
        draw = self.sampler.draw(self.mixer.proportions(self.steps_drawn), self.batch_size)
        self.steps_drawn += 1
        self.last_counts = draw.counts
        return self.rows_by_domain[self.pool_starts[draw.domain] + draw.index].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(len(self)):
            yield self.next_batch()

    def __len__(self) -> int:
        """Batches per pass over the dataset (verl counts epochs; the draw streams never run dry)."""
        return max(1, len(self.rows_by_domain) // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        """Sampler streams, mixer window and step count (saved by verl's dataloader checkpoint)."""
        return {
            "sampler": self.sampler.state_dict(),
            "mixer": self.mixer.state_dict(),
            "steps_drawn": self.steps_drawn,
            "last_counts": self.last_counts.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.mixer.load_state_dict(state["mixer"])
        self.steps_drawn = state["steps_drawn"]
        self.last_counts = np.asarray(state["last_counts"], dtype=np.int64)
