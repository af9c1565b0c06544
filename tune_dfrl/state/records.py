"""The search's record files and their lines: OUT/results.jsonl, one JSON line per reported milestone, written by the
driver (`tune_dfrl.tune.results_log.ResultsLog`).

    {"arm_id", "label", "method", "params", "seed", "step", "final": bool, "threads",
     "accuracy": {bench: %}, "length_chars": {...}, "format_failure": {...}, "aggregates": {...}, "train": {...},
     "replayed": bool, "attempt": int}

`replayed`: the milestone came from a record (the control cache, or the cell's own log after a
pause, retry or resume) rather than from training in that trial; `attempt`: the driver run that
wrote the line (0, then 1 for the first `resume=true`, ...). Lines are appended as results arrive
(nothing lives only in memory); a milestone is written once, also across resumes.

OUT/failures.jsonl: one line per (arm, seed) whose trial failed after its last retry:
    {"arm_id", "label", "seed", "step" (last milestone reached, 0 if none), "failures" (crashes, retries + 1),
     "error" (the last line of the last crash), "attempt"}

OUT/stops.jsonl: one line per arm the paired scheduler stopped at a rung:
    {"arm_id", "step" (the rung), "seeds" (the seeds decided on), "reason" (with the interval that stopped it),
     "leader" (arm id of the rung leader), "attempt"}

OUT/control_equivalent.jsonl: one line per suggestion whose canonical form is the control (never trained):
    {"suggestion" (the searcher's inner trial id), "method", "params" (as suggested), "label", "arm_id" (the
     control's), "attempt"}

`SearchRecord` is what a search recorded besides its milestones, the input of the search's analysis
(`tune_dfrl.report.analysis.analyze_search`) together with the score table: the plan (search.json), the failures,
the stops, the control-equivalent suggestions and, with `seeds=auto`, the looks (sequential.json). The same files travel to MLflow
(`tune_dfrl.tracking.writer`), so a search analysed from its experiment gives the same answer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tune_dfrl.backends.base import RESULT_PREFIXES
from tune_dfrl.state.atomic_file import write_atomically
from tune_dfrl.state.folder import EQUIVALENTS, FAILURES, LOOKS, PLAN, STOPS

# a search's record, besides results.jsonl and benchmarks.json
RECORD_FILES = (PLAN, FAILURES, STOPS, EQUIVALENTS, LOOKS)


@dataclass(frozen=True)
class SearchRecord:
    """What a search recorded besides its milestones (module docstring): plan, failures, stops, looks, and the
    suggestions that canonicalised to the control."""

    plan: dict[str, Any]
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stops: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    looks: dict[str, Any] | None = None  # seeds=auto: the sequential history
    equivalents: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> SearchRecord | None:
        """The record of the search in `folder` (None when it holds no search.json)."""
        if not (folder / PLAN).exists():
            return None
        looks = folder / LOOKS
        return cls(
            json.loads((folder / PLAN).read_text()),
            read_records(folder / FAILURES),
            read_records(folder / STOPS),
            json.loads(looks.read_text()) if looks.exists() else None,
            read_records(folder / EQUIVALENTS),
        )

    @property
    def sequential(self) -> bool:
        """seeds=auto: the looks decide."""
        return "sequential" in self.plan


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
        record[field] = {k[len(prefix) :]: float(v) for k, v in result.items() if k.startswith(prefix)}
    record["replayed"] = bool(result.get("replayed", False))
    return record


def flat_result(record: Mapping[str, Any]) -> dict[str, Any]:
    """The flat Tune result a results line was built from (inverse of `milestone_record`)."""
    result: dict[str, Any] = {"step": float(record["step"]), "final": record["final"], "threads": record["threads"]}
    for prefix, field in RESULT_PREFIXES.items():
        result.update({prefix + k: v for k, v in record[field].items()})
    return result


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path` (none when it does not exist)."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def repair_log(path: Path) -> str | None:
    """Repair a torn last line of the JSON-lines log `path` (a crash in the middle of an append): cut it when
    it is not JSON, end it with its newline when it is. Returns a note saying what was done, None when the log
    was whole. A bad line before the last is no torn write: ValueError naming it."""
    if not path.exists():
        return None
    data = path.read_bytes()
    *lines, tail = data.split(b"\n")  # tail: the text after the last newline (empty in a whole log)
    for number, line in enumerate(lines, 1):
        if line.strip() and not _is_json(line):
            raise ValueError(f"{path}: line {number} is not JSON ({line[:60]!r}); only a torn last line is repaired")
    if not tail:
        return None
    with path.open("r+b") as f:
        if _is_json(tail):
            f.seek(len(data))
            f.write(b"\n")
            return f"{path.name}: its last line lacked the newline (a crash in the middle of a write); added it"
        f.truncate(len(data) - len(tail))
    return f"{path.name}: cut a torn last line ({len(tail)} bytes, a crash in the middle of a write)"


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line to `path`, starting on a fresh line even after a torn write."""
    with path.open("a+b") as f:
        if f.tell() and (f.seek(f.tell() - 1), f.read(1))[1] != b"\n":
            f.write(b"\n")
        f.write(json.dumps(record).encode() + b"\n")


def write_records(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write JSON lines atomically (`atomic_file.write_atomically`)."""
    write_atomically(path, "".join(json.dumps(r) + "\n" for r in records))
