"""What a search keeps in OUT so that `resume=true` can continue it after Ctrl-C or kill -9.

    OUT/search.json            the plan, with its `fingerprint`: what a resumed search must match
    OUT/results.jsonl          every milestone the driver received (`tune_dfrl.state.records`)
    OUT/failures.jsonl         cells that failed after their last retry
    OUT/cells/<arm>/seed<k>/   each cell's checkpoint and milestone log (`tune_dfrl.tune.trial`)
    OUT/state/events.jsonl     the search's state as events, in order: the PairedRepeater's (cells handed out, results,
                               ends, retries, resumes) and the paired scheduler's (scores, final failures, retries);
                               a resume replays them (and writes OUT/optuna.db again from the searcher's)
    OUT/state/attempts.jsonl   one line per driver run
    OUT/search.lock            held (fcntl.flock) by the one driver that runs the search; names it

Every file is either appended line by line or rewritten atomically (temporary file, rename)
after each event, so a kill at any moment leaves a consistent state. A resumed search rebuilds
its Ray Tune experiment from these files rather than from Tune's own experiment snapshot, which is
written only periodically: cells that ended are not run again, the others start again, replay
their milestone log and continue from their last checkpoint.

One search per folder: a driver takes an exclusive `flock` on OUT/search.lock before it writes
anything else and holds it to the end. The kernel releases it when the process dies, so the lock
of a killed driver never blocks a resume; the file's text (PID, host, start time) only names the
holder in the message another driver gets.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tune_dfrl.errors import FolderInUse, StateFormatError
from tune_dfrl.state.folder import ATTEMPTS, EVENTS, LOCK, STATE
from tune_dfrl.state.records import append_record

MAX_LISTED = 5
STATE_FORMAT = 3
"""The shape of what `resume=true` reads back (the files above), written to OUT/search.json as `state_format` (absent
in folders written before the field: format 1; format 2 replaced the pickled scheduler by its event log, format 3 the
pickled searcher too, one event log for both). Raised whenever a persisted file or event changes shape
(tests/tune/test_searcher.py pins the shape of the current version); a folder of another format is refused before
anything is read (`check_state_format`)."""
STATE_LOG = EVENTS  # in OUT/state: the searcher's and the paired scheduler's events, each replaying its own


def hold_folder(out: Path) -> int:
    """Take the folder's lock for this process (returns the open file descriptor: keep it open until the end)."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 1000, 0).decode(errors="replace").strip()
        os.close(fd)
        raise _in_use(out, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}".encode(), 0
    )
    return fd


def check_folder_free(out: Path) -> None:
    """FolderInUse when a live driver holds `out` (tries the lock and lets it go at once)."""
    if not (out / LOCK).is_file():
        return
    fd = os.open(out / LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(out, os.pread(fd, 1000, 0).decode(errors="replace").strip()) from None
    finally:
        os.close(fd)


def _in_use(out: Path, holder: str) -> FolderInUse:
    return FolderInUse(
        f"{out} is in use by another search ({holder or 'holder unknown'}); one search per folder: "
        "wait for it to end (then resume=true continues it), or choose another out=DIR"
    )


RESUME_ADVICE = "continue it with the tune_dfrl version that started it, or start the search again in another out=DIR"


def check_state_format(
    out: Path, stored: Mapping[str, Any], where: str = "resume=true", advice: str = RESUME_ADVICE
) -> None:
    """Refuse a folder whose search.json names another `state_format` than STATE_FORMAT (`where`: the setting that
    named the folder; `advice`: what to do instead)."""
    found = stored.get("state_format", 1)
    if found != STATE_FORMAT:
        raise StateFormatError(
            f"{where}: {out} holds search state format {found!r}; this tune_dfrl reads state format "
            f"{STATE_FORMAT} only: {advice}"
        )


def state_dir(out: Path) -> Path:
    return out / STATE


def save_atomically(path: Path, save: Callable[[str], None]) -> None:
    """Let `save` write a temporary file next to `path`, then rename it into place."""
    tmp = path.with_name(path.name + ".tmp")
    save(str(tmp))
    os.replace(tmp, path)


def start_attempt(out: Path, resume: bool) -> int:
    """Record a driver run in OUT/state/attempts.jsonl; returns its index (0 for the first run)."""
    path = attempts_log(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    attempt = len(path.read_text().splitlines()) if path.exists() else 0
    append_record(path, {"attempt": attempt, "resume": resume, "pid": os.getpid(), "time": time.time()})
    return attempt


def attempts_log(out: Path) -> Path:
    return state_dir(out) / ATTEMPTS


def differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """`key.sub: stored -> current` for each leaf that differs between two JSON-like mappings, shallowest first."""
    old, new = _leaves(stored), _leaves(current)
    keys = sorted(old.keys() | new.keys(), key=lambda k: (k.count("."), k))
    return [
        f"{key}: {old.get(key, '(absent)')!r} -> {new.get(key, '(absent)')!r}"
        for key in keys
        if old.get(key) != new.get(key)
    ]


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
