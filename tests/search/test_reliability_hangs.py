"""Issue 15 with real searches: `python -m tune_dfrl.search` (synthetic backend, real Ray, Optuna, MLflow;
seeds=2 arms=1 steps=10 milestone_every=5). Each run has a timeout; a case passes only when the search ends by
itself with its message, never when the timeout kills it.

- every control seed fails -> exit 1 naming `retry_failed=true` (case 1); a torn last line of results.jsonl is
  then repaired by that resume, which trains the failed cells again and reports (cases 1, 4); a report that
  fails afterwards says how to re-render it (case 3);
- a control seed that keeps crashing -> exit 1, "no arm shares 2 finished seeds" (case 6);
- a control cache that cannot be written -> one warning, the search finishes, no trial fails (case 1);
- a second driver on a folder in use -> exit 2 naming the holder; SIGINT to the process group and SIGTERM
  to the driver -> exit 130 / 143 in seconds, one line saying how to resume, MLflow runs KILLED (cases 2, 5).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from reliability_helpers import interrupt, records, short_tmp, start, synthetic_search_command, wait_for

pytestmark = pytest.mark.integration  # searches: the synthetic CLI in subprocesses

RUN_TIMEOUT_S = 400  # a search of this size ends in about a minute on 2 loaded cores
EXIT_S = 20.0  # an interrupted search must be gone within this


def search(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """Run the CLI to its end; a run the timeout has to kill fails the test (it hung)."""
    return subprocess.run(
        synthetic_search_command(f"out={out}", *overrides),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=out.parent,
    )


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def driver_traceback(text: str) -> bool:
    """Whether the driver's own code raised through to the output (Ray Tune logs each crashed trial's traceback,
    which names the trial function; those are expected)."""
    return "tune_dfrl/search/" in text


CONTROL_FAILS = "fault_injection=[{arm: control, seed: 0, step: 5}, {arm: control, seed: 1, step: 5}]"


def test_every_control_seed_failing_ends_the_search_and_retry_failed_recovers_it(tmp_path: Path) -> None:
    """Every control seed fails: the search ends with the resume line; that line's command retrains them (past a torn
    last line of results.jsonl); a resume whose report cannot be written says how to re-render it, which works. Up to
    three minutes beside the rest of `make test` (two more modules on the two cores): three searches in sequence, each
    a new driver starting its own Ray as a user's command does, then the report's command."""
    out = tmp_path / "out"
    done = search(out, "max_retries=0", "control_cache=null", CONTROL_FAILS)
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr) == (
        f"error: every control seed failed (see {out}/failures.jsonl), so no arm could be "
        f"compared; fix the cause, then run the same command with resume=true "
        f"retry_failed=true out={out} to train them again"
    )
    assert not driver_traceback(done.stderr) and len(records(out / "failures.jsonl")) == 2

    with (out / "results.jsonl").open("a") as f:  # a crash in the middle of an append
        f.write('{"arm_id": "torn", "se')
    done = search(out, "max_retries=0", "control_cache=null", "resume=true", "retry_failed=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "note: results.jsonl: cut a torn last line (22 bytes, a crash in the middle of a write)" in done.stdout
    lines = records(out / "results.jsonl")
    keys = [(r["arm_id"], r["seed"], r["step"]) for r in lines]
    assert len(keys) == len(set(keys)) == 8  # control and arm, 2 seeds, milestones 5 and 10, each once
    assert (out / "summary.json").exists() and (out / "report" / "report.md").exists()

    (out / "report").rename(out / "report.old")
    (out / "report").write_text("a file where the report folder goes")
    done = search(out, "control_cache=null", "resume=true")
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr).startswith("error: the report failed (")
    assert last_line(done.stderr).endswith(
        f"training is complete and {out}/results.jsonl holds every milestone: "
        f"`python -m tune_dfrl.report runs={out}` re-renders the report"
    )
    assert records(out / "results.jsonl") == lines
    rendered = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.report", f"runs={out}", f"out={out / 'report2'}"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert rendered.returncode == 0 and (out / "report2" / "report.md").exists()


def test_a_control_seed_that_keeps_crashing_ends_with_a_clear_message(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = search(out, "max_retries=1", "control_cache=null", "fault_injection={arm: control, seed: 1, step: 5}")
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr) == (
        f"error: no arm shares 2 finished seeds with the control (the control failed at "
        f"seeds [1]; see {out}/failures.jsonl); fix the cause, then run the same command "
        f"with resume=true retry_failed=true out={out} to train the failed cells again"
    )
    assert not driver_traceback(done.stderr)


def test_a_control_cache_that_cannot_be_written_fails_no_trial(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "synthetic").write_text("a file where the backend's cache folder goes")  # passes the up-front check
    out = tmp_path / "out"
    done = search(out, f"control_cache={cache}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("warning: storing control results in the cache") == 1
    assert "the search goes on; later searches train their control again" in done.stderr
    assert not (out / "failures.jsonl").exists() and (out / "summary.json").exists()


def test_one_search_per_folder_and_interrupts_end_it_in_seconds(tmp_path: Path) -> None:
    out = short_tmp("tdfrl-int-") / "out"
    log = out.parent / "first.log"
    slow = ("+backend.sleep_s=5.0", "control_cache=null")  # 50 s per cell: still running when interrupted
    first = start(synthetic_search_command(f"out={out}", *slow), out.parent, log=log)

    def second_driver_refused() -> None:
        wait_for(lambda: bool(records(out / "results.jsonl")), RUN_TIMEOUT_S, "a first milestone")
        second = subprocess.run(
            synthetic_search_command(f"out={out}", *slow, "resume=true"),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            cwd=out.parent,
        )
        assert second.returncode == 2
        assert last_line(second.stderr).startswith(f"error: {out} is in use by another search (pid {first.pid} on ")

    ctrl_c = lambda: os.killpg(first.pid, signal.SIGINT)  # noqa: E731 - Ctrl-C in a terminal: the whole process group
    took = interrupt(first, second_driver_refused, ctrl_c, str(out), EXIT_S * 3)
    text = log.read_text()
    print(f"SIGINT to the process group: exit {first.returncode} after {took:.1f} s")
    assert first.returncode == 130 and took < EXIT_S, (first.returncode, took, text[-3000:])
    assert last_line(text) == f"interrupted by SIGINT; to continue, run the same command with resume=true out={out}"
    assert "Traceback" not in text and "database is locked" not in text  # no trial crashed here: no traceback at all
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(f"tune_dfrl/{out.name}").experiment_id])
    assert runs and {r.info.status for r in runs} <= {"KILLED", "FINISHED"}

    resumed = start(synthetic_search_command(f"out={out}", *slow, "resume=true"), out.parent, log=log)
    took = interrupt(
        resumed,
        lambda: wait_for(lambda: "(resumed, attempt 1)" in log.read_text(), RUN_TIMEOUT_S, "the resumed search"),
        lambda: resumed.send_signal(signal.SIGTERM),  # the driver alone
        str(out),
        EXIT_S * 3,
    )
    text = log.read_text()
    print(f"SIGTERM to the driver: exit {resumed.returncode} after {took:.1f} s")
    assert resumed.returncode == 143 and took < EXIT_S, (resumed.returncode, took, text[-3000:])
    assert last_line(text) == f"interrupted by SIGTERM; to continue, run the same command with resume=true out={out}"
    assert "Traceback" not in text
