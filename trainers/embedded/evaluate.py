"""Greedy evaluation on the benchmarks and the aggregates of DESIGN §6.

Per benchmark b with items i: accuracy_b = 100 * mean_i verify(i, response_i), length_b = mean
response characters (text before eos), format_failure_b = fraction of responses that do not
parse (malformed or without eos). Aggregates over the evaluated benchmarks:

    db         = mean over domains d of (mean over d's benchmarks of accuracy_b)
    macro      = mean over benchmarks of accuracy_b
    item       = 100 * sum_b correct_b / sum_b items_b
    efficiency = 1000 * sum_b correct_b / sum_b characters_b   (correct answers per 1000 characters)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .benchmarks import Benchmark
from .model import decode_responses, encode_items
from .rollout import generate
from .tasks import Item, parse


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
    """Per-benchmark figures and the db / macro / item / efficiency aggregates."""
    accuracy = {b.name: 100.0 * float(s.correct.mean()) for b, s in zip(benchmarks, scored)}
    by_domain: dict[str, list[float]] = {}
    for b in benchmarks:
        by_domain.setdefault(b.domain, []).append(accuracy[b.name])
    correct = sum(int(s.correct.sum()) for s in scored)
    chars = sum(float(s.chars.sum()) for s in scored)
    return EvalResult(
        accuracy=accuracy,
        length_chars={b.name: float(s.chars.mean()) for b, s in zip(benchmarks, scored)},
        format_failure={b.name: 1.0 - float(s.well_formed.mean()) for b, s in zip(benchmarks, scored)},
        aggregates={
            "db": float(np.mean([np.mean(v) for v in by_domain.values()])),
            "macro": float(np.mean(list(accuracy.values()))),
            "item": 100.0 * correct / sum(len(s.correct) for s in scored),
            "efficiency": 1000.0 * correct / max(chars, 1.0),
        },
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
