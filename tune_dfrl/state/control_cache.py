"""Control-arm results cached across searches, so no control seed is trained twice.

A control trial's milestones depend only on the backend, the recipe and the seed (same arm +
seed + recipe -> identical milestones, `Backend.run_trial`). Once a control seed finishes, its
milestone records (the results.jsonl lines, `tune_dfrl.state.records`) are stored at

    <root>/<backend>/<recipe hash>-<code digest>/<control arm id>/seed<k>.jsonl

written to a temporary file and renamed into place. A later search with the same recipe (any
space whose control is the same arm) seeds its control cells with them: the trial function
replays the stored milestones to Ray Tune instead of training (`tune_dfrl.tune.trial`), so the paired
scheduler, the searcher, results.jsonl, MLflow and the report see the control exactly as if it
had been trained. Default root: `$TUNE_DFRL_CACHE/controls`, else `~/.cache/tune_dfrl/controls`.
The code digest hashes the source of the trainers and the policy library, so results of an older
version of the training code are never replayed as if the current code had produced them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ray.tune import Callback

from tune_dfrl.config.cache_root import default_cache_dir
from tune_dfrl.state.records import read_records, write_records

MILESTONE_FIELDS = (
    "arm_id",
    "label",
    "method",
    "params",
    "seed",
    "step",
    "final",
    "threads",
    "accuracy",
    "length_chars",
    "format_failure",
    "aggregates",
    "train",
)


@cache
def code_digest() -> str:
    """sha256 (12 hex) of every .py file of tune_dfrl.trainers and tune_dfrl.policies, in path order."""
    import tune_dfrl.policies
    import tune_dfrl.trainers

    h = hashlib.sha256()
    for package in (tune_dfrl.trainers, tune_dfrl.policies):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def default_cache_root() -> Path:
    """`controls/` in the shared tune_dfrl cache (the base-model cache's folder)."""
    return default_cache_dir() / "controls"


class ControlCache:
    """The cached milestones of one control arm under one recipe, per seed."""

    def __init__(self, root: Path, backend: str, recipe_hash: str, control_id: str, milestones: Sequence[int]) -> None:
        self.folder = Path(root) / backend / f"{recipe_hash}-{code_digest()}" / control_id
        self.milestones = [int(m) for m in milestones]

    def path(self, seed: int) -> Path:
        return self.folder / f"seed{seed}.jsonl"

    def get(self, seed: int) -> list[dict[str, Any]] | None:
        """The seed's milestone records, or None unless the cache holds exactly the planned milestones."""
        records = read_records(self.path(seed))
        complete = bool(records) and [r["step"] for r in records] == self.milestones and records[-1]["final"]
        return records if complete else None

    def put(self, seed: int, records: Sequence[dict[str, Any]]) -> None:
        """Store a finished control seed (records in step order, one per milestone)."""
        write_records(self.path(seed), [{k: r[k] for k in MILESTONE_FIELDS} for r in records])


class ControlCacheWriter(Callback):
    """Stores each control seed that finishes, from the search's results.jsonl (written before this runs)."""

    def __init__(self, cache: ControlCache, control_id: str, results: Path) -> None:
        self.cache = cache
        self.control_id = control_id
        self.results = results

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        seed = int(trial.config["seed"])
        final = bool((trial.last_result or {}).get("final", False))
        if trial.config["arm"]["arm_id"] != self.control_id or not final or self.cache.get(seed) is not None:
            return
        records = reversed(
            read_records(self.results)
        )  # reversed: a repeated milestone keeps its first line (the ledger's rule)
        by_step = {r["step"]: r for r in records if r["arm_id"] == self.control_id and r["seed"] == seed}
        self.cache.put(seed, [by_step[step] for step in sorted(by_step)])
