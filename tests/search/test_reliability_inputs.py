"""Issue 15, without training: every setting checked by type and range before anything is written (case 3, 6, 7),
paths checked writable up front (case 1, 6), one search per folder (case 2), torn last lines repaired (case 4),
callbacks that cannot fail a trial (case 1), and a rung book that never waits for a control that failed (case 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from reliability_helpers import TINY

from tune_dfrl.config.cache_root import default_cache_dir
from tune_dfrl.paired.rungs import STOP, RungBook, RungRule
from tune_dfrl.search.plan import compose, plan_search
from tune_dfrl.state.control_cache import default_cache_root
from tune_dfrl.state.records import append_record, read_records, repair_log
from tune_dfrl.state.resume import FolderInUse, check_folder_free, hold_folder
from tune_dfrl.tune.guarded import Guarded
from tune_dfrl.tune.results_log import ResultsLog

SMALL = ("seeds=2", "arms=1", "steps=10", "milestone_every=5", "control_cache=null")


def refused(tmp_path: Path, *overrides: str, match: str) -> None:
    """`overrides` are refused by the planning step, with `match` in the message, and nothing is written."""
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=match):
        plan_search(compose([*SMALL, f"out={tmp_path / 'out'}", *overrides]))
    assert sorted(tmp_path.rglob("*")) == before


# ------------------------------------------------------------------------------ settings (cases 3, 6, 7)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("arms=1.5", r"arms=1.5: allowed: an integer >= 1"),
        ("arms=abc", r"arms='abc': allowed: an integer >= 1"),
        ("scheduler.min_seeds=2.5", r"scheduler.min_seeds=2.5: allowed: an integer >= 2"),
        ("scheduler.eta=abc", r"scheduler.eta='abc': allowed: a number > 1"),
        ("scheduler.confidence=1", r"scheduler.confidence=1: allowed: a number in \(0, 1\)"),
        ("searcher.n_startup_trials=-1", r"searcher.n_startup_trials=-1: allowed: an integer >= 0"),
        ("searcher.max_duplicates=0", r"searcher.max_duplicates=0: allowed: an integer >= 1"),
        ("searcher.seed=abc", r"searcher.seed='abc': allowed: an integer in \[0, 4294967295\]"),
        ("ray.num_cpus=abc", r"ray.num_cpus='abc': allowed: null or an integer >= 1"),
        ("ray.num_cpus=0", r"ray.num_cpus=0: allowed: null or an integer >= 1"),
        ("report.delta=-1", r"report.delta=-1: allowed: a number > 0"),
        ("report.alpha=0", r"report.alpha=0: allowed: a number in \(0, 0.5\)"),
        ("report.flip_k=0", r"report.flip_k=0: allowed: an integer >= 1"),
        ("report.seed=abc", r"report.seed='abc': allowed: an integer in \[0, 4294967295\]"),
        ("max_retries=-1", r"max_retries=-1: allowed: an integer >= 0"),
        ("resume=maybe", r"resume='maybe': allowed: one of true, false"),
        (
            "retry_failed=true",
            r"retry_failed=true runs the failed cells of a stored search again: it needs resume=true",
        ),
    ],
)
def test_every_setting_is_checked_by_type_and_range_before_anything_is_written(
    tmp_path: Path, override: str, message: str
) -> None:
    refused(tmp_path, override, match=message)


@pytest.mark.parametrize(
    ("override", "key", "allowed"),
    [
        ("seed=3", "'seed'", "seeds, arms, steps"),
        ("arm=2", "'arm'", "seeds, arms, steps"),
        ("backend.stepz=10", "'backend.stepz'", "backend.steps, backend.milestone_every"),
        ("scheduler.etaa=2", "'scheduler.etaa'", "scheduler.name, scheduler.eta, scheduler.confidence"),
        ("+report.deltaa=2", "'report.deltaa'", "report.delta, report.alpha"),
    ],
)
def test_a_misspelt_key_lists_the_allowed_keys(tmp_path: Path, override: str, key: str, allowed: str) -> None:
    refused(tmp_path, override, match=rf"unknown key {key}; allowed keys: .*{allowed}")


def test_report_settings_cannot_fail_after_training(tmp_path: Path) -> None:
    """The report's settings are the plan's, typed and checked: analyze receives exactly them."""
    plan = plan_search(compose([*SMALL, f"out={tmp_path / 'out'}", "report.delta=0.5", "report.flip_k=1"]))
    assert (plan.report.delta, plan.report.alpha, plan.report.flip_k, plan.report.seed) == (0.5, 0.05, 1, 0)
    assert isinstance(plan.scheduler.eta, float) and plan.searcher.max_duplicates == 50


# ----------------------------------------------------------------------------------- paths (cases 1, 6)


def test_output_paths_that_cannot_be_written_are_refused_up_front(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    began = time.monotonic()
    for out, message in [
        (a_file, "is a file, not a folder"),
        (a_file / "sub", "a_file is a file, not a folder"),
        (Path("/proc/tune_dfrl_out"), "cannot create anything in /proc"),
        (tmp_path / ("n" * 300), "is longer than 255 bytes"),
        (tmp_path.joinpath(*["d" * 100] * 5), r"sqlite opens paths of at most 511"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan_search(compose([*SMALL, f"out={out}"]))
    assert time.monotonic() - began < 30  # no MLflow retries: refused before any store is opened
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_stores_and_caches_that_cannot_be_written_are_refused_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    refused(
        tmp_path,
        f"mlflow.tracking_uri=sqlite:///{a_file}/mlflow.db",
        match=r"mlflow.tracking_uri=.*a_file is a file, not a folder",
    )
    refused(tmp_path, f"control_cache={a_file}", match=r"control_cache=.*a_file: .*a_file is a file, not a folder")
    cache = tmp_path / "cache"
    (cache / "controls").parent.mkdir()
    (cache / "controls").write_text("not a folder")
    monkeypatch.setenv("TUNE_DFRL_CACHE", str(cache))
    refused(tmp_path, "control_cache=auto", match=r"control_cache=.*controls is a file, not a folder")
    monkeypatch.setenv("TUNE_DFRL_CACHE", str(a_file / "cache"))
    refused(tmp_path, match=r"TUNE_DFRL_CACHE=.*a_file is a file, not a folder")


def test_a_cache_named_from_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`TUNE_DFRL_CACHE=~/...` names a folder in the home folder (the base models, the empty MLflow store and, in
    `controls/`, the control cache), not a folder named `~` in the working folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TUNE_DFRL_CACHE", "~/tdfrl")
    monkeypatch.chdir(tmp_path)
    assert default_cache_dir() == tmp_path / "home" / "tdfrl"
    assert default_cache_root() == tmp_path / "home" / "tdfrl" / "controls"


# ------------------------------------------------------------------------------ one search per folder (case 2)


def test_a_held_folder_is_refused_naming_the_holder_and_a_dead_holder_blocks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from tune_dfrl.state.resume import hold_folder; hold_folder(Path(sys.argv[1])); "
            "print('held', flush=True); time.sleep(300)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=rf"{out} is in use by another search \(pid {holder.pid} on .*, started "):
            check_folder_free(out)
        with pytest.raises(FolderInUse, match=rf"pid {holder.pid}"):
            hold_folder(out)
        with pytest.raises(
            FolderInUse, match="one search per folder"
        ):  # a fresh search there is refused while planning
            plan_search(compose([*SMALL, f"out={out}"]))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    check_folder_free(out)  # the lock file is still there, naming a dead process: the kernel released the lock
    fd = hold_folder(out)
    os.close(fd)
    assert plan_search(compose([*SMALL, f"out={out}"])).out == out  # the lock file alone does not make `out` non-empty


# ------------------------------------------------------------------------------------- torn lines (case 4)


def test_a_torn_last_line_is_cut_with_a_note_and_appends_start_on_a_fresh_line(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    log.write_text('{"step": 5}\n{"step": 10, "fin')
    assert repair_log(log) == "results.jsonl: cut a torn last line (17 bytes, a crash in the middle of a write)"
    assert read_records(log) == [{"step": 5}] and repair_log(log) is None
    log.write_text('{"step": 5}')  # a whole record whose newline was not written
    assert "lacked the newline" in repair_log(log) and log.read_text() == '{"step": 5}\n'
    log.write_text('{"step": 5}\n{"st')  # never repaired: the next append still starts on its own line
    append_record(log, {"step": 10})
    assert log.read_text().splitlines()[-1] == '{"step": 10}'
    log.write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        repair_log(log)


# ---------------------------------------------------------------------- callbacks cannot fail a trial (case 1)


def test_a_callback_that_cannot_write_is_reported_once_and_never_raises(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    guarded = Guarded(
        ResultsLog(a_file / "results.jsonl", a_file / "failures.jsonl", "score/db"), "writing results.jsonl", "goes on"
    )
    arm = {"arm_id": "0123", "label": "baseline", "method": "baseline", "params": {}}
    trial = SimpleNamespace(config={"arm": arm, "seed": 0})
    result = {"step": 5, "final": False, "threads": 1, "score/db": 1.0}
    for _ in range(3):
        guarded.on_trial_result(0, [], trial, result)
    assert guarded.error is not None and "NotADirectoryError" in guarded.error
    assert capsys.readouterr().err.count("warning: writing results.jsonl failed (NotADirectoryError") == 1


# ------------------------------------------------------------------ a rung never waits for failed seeds (case 1)


def test_a_rung_whose_control_seeds_all_failed_is_decided() -> None:
    book = RungBook(RungRule(), rungs=[5], control="C", seeds=(0, 1))
    assert book.observe("A", 0, 5, 40.0) == [] and book.observe("A", 1, 5, 41.0) == []
    assert book.fail("C", 0) == []  # one control seed left: still waiting for it
    [decided] = book.fail("C", 1)
    assert not decided.decision.keep and decided.seeds == ()
    assert decided.decision.reason == "no seed left to pair with the control (the control failed at seeds [0, 1])"
    assert book.action("A", 5) == STOP
    assert (
        book.retry_failed() == []
    )  # a resume with retry_failed=true: the arm is decided again once the control has run
    assert book.stopped("A") is None and book.observe("C", 0, 5, 40.0) == []
    [again] = book.observe("C", 1, 5, 40.0)
    assert again.decision.keep and again.seeds == (0, 1)


def test_the_cli_refuses_bad_input_with_one_error_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.search", *TINY, "seeds=2", "arms=1", "seed=3", f"out={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: unknown key 'seed'; allowed keys: ")
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.report", f"runs={tmp_path}", "delta=abc"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.strip() == "error: delta='abc': allowed: a number > 0"
