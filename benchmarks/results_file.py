"""The results file a benchmark writes when it runs: `benchmarks/results/<name>.json`.

    {"benchmark": name, "script": "benchmarks/<script>", "what": one sentence, "command": what was run,
     "machine": {"cores", "memory_gib", "cpu_model", "python", "torch", "load_average"},
     "date": UTC, ISO 8601, "wall_s": seconds the run took, "rows": [{figure: value, ...}, ...]}

`load_average` is the 1-minute load average when the run ended. A re-measured benchmark replaces its
file; `benchmarks/performance_page.py` turns the files into docs/performance.md. Absolute paths in the
command are written relative to the repository (or `~` for the home folder), so a file can be committed.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def machine() -> dict[str, Any]:
    """This machine: cores, memory, CPU model (from /proc on Linux), the Python and torch versions, the load."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch,
        "load_average": round(os.getloadavg()[0], 1),
    }


def _cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name") and ":" in line]
    return names[0] if names else platform.processor() or None


def portable(word: str) -> str:
    """`word` with this checkout's absolute path made relative and the home folder written `~`."""
    for prefix, replacement in ((f"{REPO}/", ""), (str(REPO), "."), (str(Path.home()), "~")):
        word = word.replace(prefix, replacement)
    return word


def this_command() -> str:
    """The command line that started this process, as run from the repository root."""
    script, *args = sys.argv
    return shlex.join(["python", portable(str(Path(script).resolve())), *(portable(a) for a in args)])


def _plain(value: Any) -> Any:
    """JSON-ready: NaN and infinities become null, tuples lists, numpy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(
    name: str,
    rows: Sequence[dict[str, Any]],
    what: str,
    command: str | None = None,
    script: str | None = None,
) -> Path:
    """Write `benchmarks/results/<name>.json` (replacing it) and say so on standard error.

    `command` defaults to this process's command line, `script` to the script it runs."""
    started = psutil.Process().create_time()
    record = {
        "benchmark": name,
        "script": script or portable(str(Path(sys.argv[0]).resolve())),
        "what": what.strip(),
        "command": command or this_command(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - started, 1),
        "rows": _plain(list(rows)),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    partial.replace(path)
    print(
        f"results: {portable(str(path))} (docs/performance.md: python benchmarks/performance_page.py)", file=sys.stderr
    )
    return path
