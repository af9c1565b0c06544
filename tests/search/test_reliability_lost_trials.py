"""Trials that end outside `run_cell`, and a driver that Ray Tune keeps waiting on its searcher (issue 25), with
real searches: `python -m tune_dfrl.search` (real Ray, Optuna, MLflow), two trials at a time as the defaults give
on two CPUs, the paired scheduler pausing arms at their rung.

- Ray Tune refuses to hand a cached actor to the next trial when the previous trial's thread has not ended within
  `TUNE_FUNCTION_THREAD_TIMEOUT_S`; it marks that trial ERROR and tells no one. With the timeout at 0 every reuse
  is refused (embedded backend, tiny budgets, control not cached): each such trial is retried as a new trial of its
  cell, `max_retries` times, then recorded failed; the search ends by itself with every cell accounted for.
- The searcher never told that a trial ended (a planted bookkeeping bug; the synthetic backend of
  tests/search_helpers.py: the driver's waiting does not depend on the backend): once nothing else runs, Tune waits
  on the searcher. SIGTERM / SIGINT end the driver within seconds (exit 143 / 130, the resume line); left alone,
  the search ends with an `error:` line after `trial_watch.STALL_S` instead of waiting forever.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from reliability_helpers import (
    TINY,
    UNTOLD_END_CLI,
    interrupt,
    records,
    search_command,
    short_tmp,
    start,
    synthetic_search_command,
    wait_for,
)

from tune_dfrl.tune.trial_watch import STALL_S

pytestmark = pytest.mark.integration  # searches in subprocesses

RUN_TIMEOUT_S = 400
EXIT_S = 20.0  # `make test` runs three test modules at a time on 2 cores
REFUSED = "Could not re-use actor for trial"


def test_trials_whose_actor_reuse_is_refused_are_retried_then_failed_and_the_search_ends(
    tmp_path: Path, embedded_cache: Path
) -> None:
    """The embedded backend (it lets Tune reuse actors), its defaults' concurrency and scheduler. Up to three minutes
    beside the rest of `make test` (two more modules on the two cores): a whole search that trains, in which every
    trial Tune would have handed a reused actor is refused and trained again in a new trial of its own."""
    out = tmp_path / "out"
    done = subprocess.run(
        search_command("space=difffilter_band", *TINY, "seeds=2", "arms=1", "max_retries=1", f"out={out}"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env={**_env(), "TUNE_DFRL_CACHE": str(embedded_cache), "TUNE_FUNCTION_THREAD_TIMEOUT_S": "0"},
    )
    text = done.stdout + done.stderr
    notes = re.findall(r"note: the trial of (.+) seed (\d+) ended outside its run \(.*reset_config.*\); (.+)", text)
    assert text.count(REFUSED) == len(notes) >= 1, text[-3000:]  # every refusal was noticed, once
    finals = {(r["label"], r["seed"]) for r in records(out / "results.jsonl") if r["final"]}
    failed = {(r["label"], r["seed"]) for r in records(out / "failures.jsonl")}
    retried = {(label, int(seed)) for label, seed, what in notes if what.startswith("running the cell again")}
    given_up = {(label, int(seed)) for label, seed, what in notes if what == "no retry left: the cell failed"}
    assert given_up == failed and not finals & failed
    assert all(r["failures"] == 2 for r in records(out / "failures.jsonl"))  # its first trial and one retry
    assert retried - given_up <= finals  # a retried cell that was not given up finished
    assert len(finals | failed) == len({(r["label"], r["seed"]) for r in records(out / "results.jsonl")} | failed)
    for label, seed in retried:
        assert sum(1 for lb, sd, _ in notes if (lb, int(sd)) == (label, seed)) <= 2  # the first refusal + 1 retry
    steps = [(r["arm_id"], r["seed"], r["step"]) for r in records(out / "results.jsonl")]
    assert len(steps) == len(set(steps))  # no milestone recorded twice
    if done.returncode == 0:  # the report names each failed seed of an arm it has milestones of
        summary = json.loads((out / "summary.json").read_text())
        reported = {r["label"] for r in records(out / "results.jsonl")}
        expected: dict[str, list[int]] = {}
        for label, seed in sorted(failed):
            if label in reported:
                expected.setdefault(label, []).append(seed)
        assert summary["failed"] == expected
    else:  # too many seeds failed to compare any arm: said so, with how to train them again
        assert done.returncode == 1 and "retry_failed=true" in done.stderr.strip().splitlines()[-1], text[-3000:]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_a_driver_that_tune_keeps_waiting_on_its_searcher(sig: int, code: int) -> None:
    out = short_tmp("tdfrl-wait-") / "out"
    log = out.parent / "driver.log"
    driver = start(
        synthetic_search_command(f"out={out}", "control_cache=null", cli=UNTOLD_END_CLI), out.parent, _env(), log
    )
    took = interrupt(
        driver,
        lambda: _wait_until_nothing_runs(out, driver, log),
        lambda: driver.send_signal(sig),
        str(out),
        EXIT_S * 6,
    )
    text = log.read_text()
    print(f"{signal.Signals(sig).name} while Tune waits on the searcher: exit {driver.returncode} after {took:.1f} s")
    assert driver.returncode == code and took < EXIT_S, (driver.returncode, took, text[-3000:])
    name = signal.Signals(sig).name
    assert text.strip().splitlines()[-1] == (
        f"interrupted by {name}; to continue, run the same command with resume=true out={out}"
    )


def test_a_search_waiting_for_a_trial_that_does_not_exist_ends_with_an_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    began = time.monotonic()
    done = subprocess.run(
        synthetic_search_command(f"out={out}", "control_cache=null", cli=UNTOLD_END_CLI),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env=_env(),
    )
    took = time.monotonic() - began
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    assert last.startswith(f"error: no trial has run for {STALL_S:g} s and the searcher has nothing to give")
    assert "(cells it still waits for: " in last and " seed 1)" in last and "resume=true" in last
    assert took < RUN_TIMEOUT_S / 2


def _wait_until_nothing_runs(out: Path, driver: subprocess.Popen, log: Path) -> None:
    """Every cell has its final milestone (the searcher was not told of one): Tune is waiting on the searcher."""

    def finished() -> bool:
        assert driver.poll() is None, log.read_text()[-3000:]
        plan = out / "search.json"
        if not plan.exists():
            return False
        cells = {(r["arm_id"], r["seed"]) for r in records(out / "results.jsonl")}
        finals = {(r["arm_id"], r["seed"]) for r in records(out / "results.jsonl") if r["final"]}
        return len(cells) == 4 and finals == cells  # control + 1 arm, 2 seeds each

    wait_for(finished, RUN_TIMEOUT_S, "every cell's final milestone")
    time.sleep(3)  # Tune's step ends and it starts waiting on the searcher


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
