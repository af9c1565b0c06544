"""A verl trial's start-up timeline: when each process started, when it had imported verl, and when the
trainer passed each stage of its set-up and of its first steps.

Every process of a trial appends events to the file named by `TIMELINE_ENV` (the launcher sets it to
`<trial>/verl_timeline.jsonl`; unset, nothing is written): one JSON object per line,
`{"event", "t" (epoch seconds), "pid", "process"}`. Lines are short single `write`s to a file opened
for appending, so the processes' lines never interleave.

Events: `spawn` (the launcher, before it starts the child), `process_start` and `verl_imported` (each
process that imports verl: plugin.py; `t` of the first is the process's creation time), `v1_imported`
(verl's v1 trainer stack imported: plugin.py), the trainer's
`trainer_init`, `dataloader_ready`, `workers_ready` (actor, rollout server, reward manager and weight sync
built, before the checkpoint loads), `setup_done`, `step_begin` / `step_end` / `validate_begin` /
`validate_end` (with `step`), and the launcher's `first_record` and `milestone` (with `step`).

`phases` turns one start's events into the seconds of each stage (`PHASES`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

TIMELINE_ENV = "TUNE_DFRL_TIMELINE"
FILE_NAME = "verl_timeline.jsonl"
DRIVER_MODULE = "tune_dfrl.trainers.verl.driver"  # the module the launcher runs as verl's driver (driver.py)


def record(event: str, t: float | None = None, path: Path | str | None = None, **fields: Any) -> None:
    """Append `event` (at `t`, default now) to the timeline at `path`, default this process's, if it has one."""
    path = path or os.environ.get(TIMELINE_ENV)
    if not path:
        return
    line = {"event": event, "t": time.time() if t is None else t, "pid": os.getpid(), "process": _process(), **fields}
    with open(path, "a") as handle:
        handle.write(json.dumps(line) + "\n")


def record_process_start() -> None:
    """`process_start` at this process's creation time (Linux: /proc), then `verl_imported` now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        started = None
    if started is not None:
        record("process_start", t=started)
    record("verl_imported")


def _process() -> str:
    """The process's name: the Ray actor or worker title (`ray::WorkerDict`), else its command's module."""
    try:
        words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    first = words[0].decode(errors="replace")
    if first.startswith("ray::"):
        return first.split()[0]
    return next((words[i + 1].decode() for i, w in enumerate(words[:-1]) if w == b"-m"), first)


# (phase, from event, to event): the stages of one start, in order.
PHASES = (
    ("driver_start", "spawn", "driver_imported"),
    ("ray_start", "driver_imported", "task_runner_start"),
    ("task_runner_import", "task_runner_start", "task_runner_imported"),
    ("trainer_imports", "task_runner_imported", "v1_imported"),
    ("transfer_queue_start", "v1_imported", "trainer_init"),
    ("dataloader", "trainer_init", "dataloader_ready"),
    ("workers_and_rollout", "dataloader_ready", "workers_ready"),
    ("checkpoint_load", "workers_ready", "setup_done"),
    ("fit_setup", "setup_done", "first_step_begin"),
    ("first_step", "first_step_begin", "first_step_end"),
    ("first_validation", "first_validate_begin", "first_validate_end"),
    ("first_step_to_milestone", "first_step_begin", "milestone"),
)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def starts(events: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The events of each start of the child (a start begins at `spawn`)."""
    split: list[list[Mapping[str, Any]]] = []
    for event in sorted(events, key=lambda e: e["t"]):
        if event["event"] == "spawn" or not split:
            split.append([])
        split[-1].append(event)
    return split


def actor_names(log: str) -> dict[int, str]:
    """pid -> Ray actor class from a trial's verl.log (Ray prefixes a worker's lines `(WorkerDict pid=123)`):
    a worker imports verl before Ray renames its process, so its timeline lines say `ray::IDLE`."""
    return {int(pid): name for name, pid in re.findall(r"\((\w+) pid=(\d+)\)", log)}


def phases(events: Iterable[Mapping[str, Any]], names: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Seconds of each of `PHASES` in one start's events, the start-up (spawn to the first step's
    begin), and each process's import time (creation to `verl_imported`) by process name (`names`:
    pid -> name, e.g. `actor_names`, over the name the process had when it wrote)."""
    names = names or {}
    events = [{**e, "process": names.get(e["pid"], e["process"])} for e in events]
    at = _landmarks(events)
    figures: dict[str, Any] = {
        name: round(at[end] - at[begin], 2) for name, begin, end in PHASES if begin in at and end in at
    }
    if "spawn" in at and "first_step_begin" in at:
        figures["startup"] = round(at["first_step_begin"] - at["spawn"], 2)
    created = {e["pid"]: e for e in events if e["event"] == "process_start"}
    figures["process_imports"] = sorted(
        (e["process"], round(e["t"] - created[e["pid"]]["t"], 2))
        for e in events
        if e["event"] == "verl_imported" and e["pid"] in created
    )
    return figures


def _landmarks(events: list[Mapping[str, Any]]) -> dict[str, float]:
    """The first time of each event, with the driver's and the TaskRunner's process events and the
    first step's and validation's events renamed to the names `PHASES` uses."""
    at: dict[str, float] = {}

    def first(name: str, t: float) -> None:
        at.setdefault(name, t)

    for e in sorted(events, key=lambda e: e["t"]):
        name = e["event"]
        if name in ("process_start", "verl_imported"):
            role = (
                "driver" if e["process"] == DRIVER_MODULE else "task_runner" if "TaskRunner" in e["process"] else None
            )
            if role is not None:
                first(f"{role}_{'start' if name == 'process_start' else 'imported'}", e["t"])
        elif name in ("step_begin", "step_end", "validate_begin", "validate_end"):
            kind, edge = name.split("_")
            first(f"first_{kind}_{edge}", e["t"])
        else:
            first(name, e["t"])
    return at
