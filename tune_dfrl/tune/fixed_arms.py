"""FixedArms: the inner searcher of a confirm search, a fixed list of arms suggested in order.

`PairedRepeater` asks its inner searcher for the next arm (`suggest(inner_id)`) and tells it each arm's paired
deltas (`on_trial_result`, `on_trial_complete`). A confirm search (`confirm.screen=DIR`) has nothing to search:
its arms are the screen's top K, so this searcher hands them out in the order given and ignores what it is told.
It holds no state besides how many it handed out, so `PairedRepeater.replay`, which rebuilds a search on a fresh
searcher by asking again in the same order, gets the same arms (no Optuna study: a confirm writes no optuna.db).
Past the end of the list it repeats the first arm (the repeater counts it as a duplicate and ends after
`max_duplicates`); the plan makes sure the K arms are distinct, so a search never gets there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.tune.search import Searcher


class FixedArms(Searcher):
    """Suggests `suggestions` ({method, params}) in order, one per call, whatever the trial id."""

    def __init__(self, suggestions: Sequence[dict[str, Any]], metric: str | None = None, mode: str = "max") -> None:
        super().__init__(metric=metric, mode=mode)
        if not suggestions:
            raise ValueError("FixedArms needs at least one suggestion")
        self.suggestions = [{"method": s["method"], "params": dict(s.get("params") or {})} for s in suggestions]
        self.handed_out = 0

    def suggest(self, trial_id: str) -> dict[str, Any]:
        index = self.handed_out if self.handed_out < len(self.suggestions) else 0
        self.handed_out += 1
        chosen = self.suggestions[index]
        return {"method": chosen["method"], "params": dict(chosen["params"])}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing to learn: the arms are fixed."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Nothing to learn: the arms are fixed."""

    def save(self, checkpoint_path: str) -> None:
        """Nothing: the searcher's state is the repeater's event log."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing: the repeater's `replay` asks again, in order."""
