"""Greedy evaluation on the benchmarks.

Per benchmark b with items i: accuracy_b = 100 * mean_i verify(i, response_i), length_b = mean
response characters (text before eos), format_failure_b = fraction of responses that do not
parse (malformed or without eos). The aggregates over the evaluated benchmarks are those of
`tune_dfrl.report.schema` (DESIGN §6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from tune_dfrl.backends.benchmarks import BenchmarkSet, milestone_aggregates

from .benchmarks import Benchmark
from .model import decode_responses, encode_items
from .rollout import generate
from .tasks import Item, parse

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


@dataclass(frozen=True)
class Scored:
    """Per-response outcome of one benchmark: correct, well-formed, characters."""

    correct: np.ndarray
    well_formed: np.ndarray
    chars: np.ndarray


def score_responses(items: list[Item], texts: list[str], finished: list[bool]) -> Scored:
    """Parse and verify decoded responses; a response without eos is a format failure."""
    parsed = [parse(item, text) if done else None for item, text, done in zip(items, texts, finished)]
    return Scored(
        correct=np.array([p is not None and p == item.answer for p, item in zip(parsed, items)]),
        well_formed=np.array([p is not None for p in parsed]),
        chars=np.array([len(t) for t in texts], dtype=float),
    )


@dataclass
class EvalResult:
    accuracy: dict[str, float]
    length_chars: dict[str, float]
    format_failure: dict[str, float]
    aggregates: dict[str, float]


def aggregate(benchmarks: list[Benchmark], scored: list[Scored]) -> EvalResult:
    """Per-benchmark figures and their aggregates (`tune_dfrl.backends.benchmarks.milestone_aggregates`)."""
    accuracy = {b.name: 100.0 * float(s.correct.mean()) for b, s in zip(benchmarks, scored)}
    length_chars = {b.name: float(s.chars.mean()) for b, s in zip(benchmarks, scored)}
    bench = BenchmarkSet(tuple(b.info() for b in benchmarks))
    return EvalResult(
        accuracy=accuracy,
        length_chars=length_chars,
        format_failure={b.name: 1.0 - float(s.well_formed.mean()) for b, s in zip(benchmarks, scored)},
        aggregates=milestone_aggregates(accuracy, length_chars, bench),
    )


class Evaluator:
    """Greedy decoding on fixed benchmarks; prompts are tokenised once."""

    def __init__(self, benchmarks: list[Benchmark], tokenizer: PreTrainedTokenizerFast, max_new_tokens: int):
        self.benchmarks = benchmarks
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.items = [b.items() for b in benchmarks]
        self.encoded = [
            encode_items(tokenizer, [i.prompt for i in items], [i.answer for i in items]) for items in self.items
        ]

    @torch.no_grad()
    def __call__(self, model: PreTrainedModel) -> EvalResult:
        scored = []
        for items, enc in zip(self.items, self.encoded):
            responses, _ = generate(model, enc.prompt_ids, enc.prompt_mask, self.max_new_tokens, temperature=0.0)
            scored.append(score_responses(items, *decode_responses(self.tokenizer, responses)))
        return aggregate(self.benchmarks, scored)
