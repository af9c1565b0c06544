"""OUT/results.jsonl: one JSON line per reported milestone, written by the driver.

    {"arm_id", "label", "method", "params", "seed", "step", "final": bool, "threads",
     "accuracy": {bench: %}, "length_chars": {...}, "format_failure": {...}, "aggregates": {...}, "train": {...}}

Lines are appended as results arrive (nothing lives only in memory); a milestone reported twice
(a trial resumed after waiting at a rung) is written once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.tune import Callback

# Prefix of a flat result key (`Milestone.flat`) -> field of the results line.
RESULT_PREFIXES = {"acc/": "accuracy", "len/": "length_chars", "fmt_fail/": "format_failure",
                   "score/": "aggregates", "train/": "train"}


def milestone_record(arm: Mapping[str, Any], seed: int, result: Mapping[str, Any]) -> dict[str, Any]:
    """One results line, rebuilt from a flat Tune result."""
    record: dict[str, Any] = {
        "arm_id": arm["arm_id"],
        "label": arm["label"],
        "method": arm["method"],
        "params": arm["params"],
        "seed": int(seed),
        "step": int(result["step"]),
        "final": bool(result["final"]),
        "threads": int(result["threads"]),  # torch threads the trial trained with
    }
    for prefix, field in RESULT_PREFIXES.items():
        record[field] = {k[len(prefix):]: float(v) for k, v in result.items() if k.startswith(prefix)}
    return record


class ResultsLog(Callback):
    """Appends every new milestone of every trial to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: set[tuple[str, int, int]] = set()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        key = (arm["arm_id"], seed, int(result["step"]))
        if key in self._written:
            return
        self._written.add(key)
        with self.path.open("a") as f:
            f.write(json.dumps(milestone_record(arm, seed, result)) + "\n")
