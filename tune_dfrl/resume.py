"""What a search keeps in OUT so that `resume=true` can continue it after Ctrl-C or kill -9.

    OUT/search.json            the plan, with its `fingerprint`: what a resumed search must match
    OUT/results.jsonl          every milestone the driver received (`tune_dfrl.results`)
    OUT/failures.jsonl         cells that failed after their last retry
    OUT/cells/<arm>/seed<k>/   each cell's checkpoint and milestone log (`tune_dfrl.trial`)
    OUT/state/searcher.pkl     the PairedRepeater (arms suggested, cell outcomes, Optuna's state)
    OUT/state/scheduler.pkl    the paired scheduler's rung book (arms stopped, and on what)
    OUT/state/attempts.jsonl   one line per driver run

Every file is either appended line by line or rewritten atomically (temporary file, rename)
after each event, so a kill at any moment leaves a consistent state. A resumed search rebuilds
its Ray Tune experiment from these files rather than from Tune's own experiment snapshot, which is
written only periodically: cells that ended are not run again, the others start again, replay
their milestone log and continue from their last checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

MAX_LISTED = 5


def state_dir(out: Path) -> Path:
    return out / "state"


def save_atomically(path: Path, save: Callable[[str], None]) -> None:
    """Let `save` write a temporary file next to `path`, then rename it into place."""
    tmp = path.with_name(path.name + ".tmp")
    save(str(tmp))
    os.replace(tmp, path)


def start_attempt(out: Path, resume: bool) -> int:
    """Record a driver run in OUT/state/attempts.jsonl; returns its index (0 for the first run)."""
    path = state_dir(out) / "attempts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    attempt = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        f.write(json.dumps({"attempt": attempt, "resume": resume, "pid": os.getpid(), "time": time.time()}) + "\n")
    return attempt


def differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """`key.sub: stored -> current` for each leaf that differs between two JSON-like mappings, shallowest first."""
    old, new = _leaves(stored), _leaves(current)
    keys = sorted(old.keys() | new.keys(), key=lambda k: (k.count("."), k))
    return [f"{key}: {old.get(key, '(absent)')!r} -> {new.get(key, '(absent)')!r}" for key in keys if old.get(key) != new.get(key)]


def describe_differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    found = differences(stored, current)
    shown = "; ".join(found[:MAX_LISTED])
    return shown + (f"; ... ({len(found)} in all)" if len(found) > MAX_LISTED else "")


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf; items of a list of mappings are numbered (`methods.0.ranges`)."""
    nested = isinstance(value, list) and any(isinstance(v, Mapping) for v in value)
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if nested else None
    if not items or not value:
        return {prefix.rstrip("."): value}
    out: dict[str, Any] = {}
    for key, sub in items:
        out.update(_leaves(sub, f"{prefix}{key}."))
    return out
