"""Kill -9 the driver again and again, resuming after each kill: the answer is the uninterrupted search's.

A small search (the synthetic backend through the real CLI, 2 arms + control x 2 seeds, 2 milestones per cell, the
default paired scheduler) runs once uninterrupted, and once killed with SIGKILL at successive moments: each time
results.jsonl has grown past the next of `KILL_AT` lines, after a seeded random delay of up to `JITTER_S` (a kill
lands anywhere in the driver's work, not only right after a line). Each kill is followed by the same command with
resume=true, until one finishes. The final summary.json must equal the uninterrupted one's, its source path aside,
and every milestone must be recorded once.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import records, short_tmp, start, stop, synthetic_search_command, wait_for

pytestmark = pytest.mark.integration  # searches: the synthetic CLI in subprocesses, killed and resumed

ARGS = ("arms=2", "+backend.sleep_s=0.2", "control_cache=null")
KILL_AT = (2, 7)  # results lines (of 12) before each kill
JITTER_S = 1.5


def answer(out: Path) -> dict:
    """summary.json without where its table came from (the folder differs)."""
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("source")
    return summary


def run(root: Path, out: Path, *extra: str, log: str) -> None:
    """The search to its end (exit 0), its Ray's processes ended."""
    ray_tmp = short_tmp("rt-kills-")
    done = start(
        synthetic_search_command(*ARGS, f"out={out}", *extra),
        cwd=root,
        env={"RAY_TMPDIR": str(ray_tmp)},
        log=root / log,
    )
    try:
        done.wait(timeout=600)
    finally:
        stop(done, marker=str(ray_tmp))
    assert done.returncode == 0, (root / log).read_text()[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("uninterrupted")
    run(root, root / "out", log="search.log")
    return root / "out"


def test_a_search_killed_at_many_points_and_resumed_each_time_gives_the_uninterrupted_answer(
    uninterrupted: Path, tmp_path: Path
) -> None:
    out, jitter = tmp_path / "out", random.Random(0)
    kills = 0
    for attempt, lines in enumerate(KILL_AT):
        ray_tmp = short_tmp("rt-kills-")
        command = synthetic_search_command(*ARGS, f"out={out}", *(("resume=true",) if attempt else ()))
        log = tmp_path / f"attempt{attempt}.log"
        driver = start(command, cwd=tmp_path, env={"RAY_TMPDIR": str(ray_tmp)}, log=log)
        try:
            wait_for(
                lambda: driver.poll() is not None or len(records(out / "results.jsonl")) >= lines,  # noqa: B023
                300,
                f"{lines} results lines",
                poll_s=0.05,
            )
            time.sleep(jitter.uniform(0, JITTER_S))
            if driver.poll() is None:
                driver.send_signal(signal.SIGKILL)
                kills += 1
            driver.wait(timeout=60)
        finally:
            stop(driver, marker=str(ray_tmp), sig=signal.SIGKILL)
        assert driver.returncode in (0, -signal.SIGKILL), log.read_text()[-3000:]
        if driver.returncode == 0:
            break
    else:
        run(tmp_path, out, "resume=true", log="finished.log")
    assert kills >= 2  # the search was interrupted more than once
    recorded = [(r["arm_id"], r["seed"], r["step"]) for r in records(out / "results.jsonl")]
    assert len(set(recorded)) == len(recorded)  # every milestone once
    assert sorted(recorded) == sorted(
        (r["arm_id"], r["seed"], r["step"]) for r in records(uninterrupted / "results.jsonl")
    )
    assert answer(out) == answer(uninterrupted)
