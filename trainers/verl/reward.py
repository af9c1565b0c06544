"""The verl reward function of every trial (`reward.custom_reward_function`, recipe.py).

verl's reward manager (verl/experimental/reward_loop/reward_manager/naive.py) calls
`compute_score(data_source, solution_str, ground_truth, extra_info)` per response and logs every
key of the returned dict as a validation variable. We return

- `score`: the training reward R;
- `acc`: 1 for a correct answer, else 0 (verl's core validation variable -> accuracy);
- `length_chars`: the response length in characters;
- `format_fail`: 1 when the answer cannot be parsed, 0 when it can, NaN when unknown.

Rows of the generated tasks (extra_info `tune_dfrl_kind`, written by `export.py`) are scored by
the embedded backend's strict parser and verifier on the whitespace-stripped response. Any other
row goes to verl's `default_compute_score` (chosen by data_source); a response counts as correct
when that score exceeds 0.5 (verl's rule scorers give 1 for correct, 0 or a small format bonus
otherwise), and its format failures are unknown.
"""

from __future__ import annotations

import math
from typing import Any

from tune_dfrl.trainers.embedded.tasks import KINDS, Item, parse

KIND_KEY = "tune_dfrl_kind"
PROMPT_KEY = "tune_dfrl_prompt"


def generated_item(extra_info: dict[str, Any] | None, ground_truth: str) -> Item | None:
    """The generated-task item a row stands for, or None for any other dataset."""
    if not extra_info or KIND_KEY not in extra_info:
        return None
    kind = extra_info[KIND_KEY]
    return Item(KINDS[kind].domain, kind, extra_info[PROMPT_KEY], str(ground_truth))


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    item = generated_item(extra_info, ground_truth)
    if item is not None:
        answer = parse(item, solution_str.strip())
        correct = float(answer == item.answer)
        return {
            "score": correct,
            "acc": correct,
            "length_chars": float(len(solution_str)),
            "format_fail": float(answer is None),
        }
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    score = float(result["score"] if isinstance(result, dict) else result)
    return {
        "score": score,
        "acc": float(score > 0.5),
        "length_chars": float(len(solution_str)),
        "format_fail": math.nan,
    }
