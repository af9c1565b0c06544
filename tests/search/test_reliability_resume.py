"""Kill -9 the driver mid-search, run the same command with resume=true, and check from what is stored that nothing
finished was trained again and the search ended complete; then re-run it (trains nothing) and start a second
search with another space under the same recipe (its control comes from the control cache, not from training).

The interrupted and the resumed search run as the user runs them: `python -m tune_dfrl.search` in a subprocess,
each with its own local Ray cluster under a private RAY_TMPDIR (its processes are stopped by that marker).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from reliability_helpers import TINY, records, resume_search, search_command, short_tmp, start, stop, wait_for
from search_helpers import search_cfg

from tune_dfrl.search.cli import OPTUNA_STUDY, plan_search, run_search
from tune_dfrl.state.records import write_records
from tune_dfrl.state.resume import STATE_LOG
from tune_dfrl.tune.searcher import ReplayError
from tune_dfrl.tune.trial import cell_dir

pytestmark = pytest.mark.integration  # searches in subprocesses and on the session's Ray cluster

SEARCH = ("space=difffilter_band", "seeds=2", "arms=2", *TINY)
EXPERIMENT = "tune_dfrl/out"  # named after the folder the search started in (out=ROOT/out), which it keeps when moved
Cell = tuple[str, int]


@dataclass(frozen=True)
class Interrupted:
    """What the killed search had stored."""

    lines: list[dict]
    finished: set[Cell]
    unfinished: dict[Cell, int]  # cells with a milestone but no final one -> last step recorded
    checkpoints: dict[Cell, int]  # finished cell -> mtime (ns) of its checkpoint
    arms: set[str]  # arm ids the searcher had handed out (its event log)


@dataclass(frozen=True)
class Resumed:
    root: Path
    out: Path
    cache: Path
    before: Interrupted


def cells(lines: list[dict]) -> set[Cell]:
    return {(r["arm_id"], r["seed"]) for r in lines}


def finished(lines: list[dict]) -> set[Cell]:
    return {(r["arm_id"], r["seed"]) for r in lines if r["final"]}


def interrupted_state(out: Path) -> Interrupted:
    lines = records(out / "results.jsonl")
    done = finished(lines)
    unfinished = {
        cell: max(r["step"] for r in lines if (r["arm_id"], r["seed"]) == cell) for cell in cells(lines) - done
    }
    stamps = {cell: (cell_dir(out / "cells", *cell) / "checkpoint" / "trial.pt").stat().st_mtime_ns for cell in done}
    handed = [e["cell"] for e in records(out / "state" / STATE_LOG) if e["event"] == "suggest"]
    arms = {cell[0] for cell in handed if isinstance(cell, list)}
    return Interrupted(lines, done, unfinished, stamps, arms)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    root = tmp_path_factory.mktemp("resume")
    out, cache, ray_tmp = root / "out", root / "control-cache", short_tmp("rt-resume-")
    command = search_command(*SEARCH, f"out={out}", f"control_cache={cache}", "ray.num_cpus=2")
    env = {"RAY_TMPDIR": str(ray_tmp)}
    driver = start(command, cwd=root, env=env, log=root / "interrupted.log")
    try:

        def mid_search() -> bool:  # a cell finished, another holds a milestone but is not finished
            lines = records(out / "results.jsonl")
            return driver.poll() is not None or (bool(finished(lines)) and bool(cells(lines) - finished(lines)))

        wait_for(mid_search, 600, "a finished cell next to an unfinished one")
        os.kill(driver.pid, signal.SIGKILL)  # kill -9 the driver
        driver.wait()
    finally:
        stop(driver, marker=str(ray_tmp), sig=signal.SIGKILL)  # then its local Ray cluster and trial workers
    assert driver.returncode == -signal.SIGKILL, (root / "interrupted.log").read_text()[-3000:]
    before = interrupted_state(out)

    moved = root / "moved"  # the interrupted folder is moved before the resume: it continues in its new place
    out.rename(moved)
    command = search_command(*SEARCH, f"out={moved}", f"control_cache={cache}", "ray.num_cpus=2")
    resume_search(command, root, env, ray_tmp, 900)
    assert not out.exists(), "the resumed search wrote to the folder's old place"
    return Resumed(root, moved, cache, before)


def test_the_moved_folder_keeps_its_mlflow_artifacts_in_its_new_place(resumed: Resumed) -> None:
    """Every artifact location of the folder's own store names the folder where it is now."""
    client = MlflowClient(f"sqlite:///{resumed.out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    locations = [experiment.artifact_location, *(r.info.artifact_uri for r in runs)]
    assert len(runs) > 3 and all(
        u.startswith((resumed.out / "mlartifacts").as_uri() + "/") or u == (resumed.out / "mlartifacts").as_uri()
        for u in locations
    ), locations
    assert (resumed.out / "mlartifacts").is_dir() and any((resumed.out / "mlartifacts").rglob("report.html"))


def test_the_kill_landed_mid_search(resumed: Resumed) -> None:
    assert resumed.before.finished and resumed.before.unfinished
    assert "(resumed, attempt 1)" in (resumed.root / "resumed.log").read_text()


def test_no_finished_cell_was_trained_again(resumed: Resumed) -> None:
    after = records(resumed.out / "results.jsonl")
    trial_dirs = [p.name for p in (resumed.out / "ray" / "resume1").iterdir() if "-seed" in p.name]
    for arm, seed in resumed.before.finished:
        assert not [r for r in after if (r["arm_id"], r["seed"]) == (arm, seed) and r["attempt"] > 0]
        assert (
            cell_dir(resumed.out / "cells", arm, seed) / "checkpoint" / "trial.pt"
        ).stat().st_mtime_ns == resumed.before.checkpoints[(arm, seed)]
        assert not [name for name in trial_dirs if name.startswith(f"{arm}-seed{seed}-")]  # not even started


def test_unfinished_cells_continued_after_their_last_milestone(resumed: Resumed) -> None:
    after = records(resumed.out / "results.jsonl")
    assert set(Counter((r["arm_id"], r["seed"], r["step"]) for r in after).values()) == {1}
    assert after[: len(resumed.before.lines)] == resumed.before.lines  # nothing stored was rewritten
    for (arm, seed), last in resumed.before.unfinished.items():
        new = [r["step"] for r in after if (r["arm_id"], r["seed"]) == (arm, seed) and r["attempt"] == 1]
        assert all(step > last for step in new)


def test_the_searcher_and_scheduler_continued(resumed: Resumed) -> None:
    after = records(resumed.out / "results.jsonl")
    arms = {r["arm_id"] for r in after}
    assert (
        resumed.before.arms <= arms and len(arms) == 3
    )  # the control + the 2 arms, those suggested before the kill kept
    study = optuna.load_study(study_name=OPTUNA_STUDY, storage=f"sqlite:///{resumed.out / 'optuna.db'}")
    told = {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}
    # the resume rebuilt the study from the searcher's log: an ask the kill cut off before its log line is not in it
    assert study.trials and all(t.state in told for t in study.trials)
    last = {}
    for r in after:
        last.setdefault(r["arm_id"], {})[r["seed"]] = max(r["step"], last.get(r["arm_id"], {}).get(r["seed"], 0))
    assert all(
        len(set(by_seed.values())) == 1 and len(by_seed) == 2 for by_seed in last.values()
    )  # whole arms, both seeds


def test_the_final_report_is_complete(resumed: Resumed) -> None:
    summary = json.loads((resumed.out / "summary.json").read_text())
    labels = {r["label"] for r in records(resumed.out / "results.jsonl")}
    assert summary["control"] == "baseline" and set(summary["arms"]) | set(summary["stopped"]) | {"baseline"} == labels
    assert summary["recommendation"]["recommended"]
    client = MlflowClient(f"sqlite:///{resumed.out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    roles = Counter(r.data.tags["tune_dfrl.role"] for r in runs)
    assert roles == {"search": 1, "arm": 3, "seed": 6}  # runs reopened, not duplicated
    assert all(r.info.status != "RUNNING" for r in runs)
    seed_runs = [r for r in runs if r.data.tags["tune_dfrl.role"] == "seed"]
    for run in seed_runs:  # each milestone logged once, across both attempts
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "score/db")]
        assert len(steps) == len(set(steps)) >= 1


def test_rerunning_a_finished_search_trains_nothing(resumed: Resumed, ray_session) -> None:
    before = (resumed.out / "results.jsonl").read_text()
    summary = run_search(
        plan_search(search_cfg(*SEARCH, f"out={resumed.out}", f"control_cache={resumed.cache}", "resume=true"))
    )
    assert (resumed.out / "results.jsonl").read_text() == before
    assert not [p for p in (resumed.out / "ray" / "resume2").iterdir() if "-seed" in p.name]  # no trial at all
    assert summary.recommendation.recommended  # run_search returns the typed Summary


def test_a_log_that_does_not_replay_is_refused_and_leaves_the_study(resumed: Resumed, ray_session, tmp_path) -> None:
    """A searcher log whose replay hands out another cell (as a log written under another sampler or version would) is
    refused naming the event, before any trial; the study is the one the folder had, and the MLflow runs the
    resume had reopened are ended (KILLED), not left RUNNING."""
    copy = tmp_path / resumed.out.name
    shutil.copytree(resumed.out, copy, ignore=shutil.ignore_patterns("ray", "search.lock"))
    events = records(copy / "state" / STATE_LOG)
    first = next(number for number, event in enumerate(events) if event["event"] == "suggest")
    events[first]["cell"][0] = "0" * 12
    write_records(copy / "state" / STATE_LOG, events)
    study = (copy / "optuna.db").read_bytes()
    store = f"sqlite:///{copy / 'mlflow.db'}"
    settings = (*SEARCH, f"out={copy}", f"control_cache={resumed.cache}", "resume=true", f"mlflow.tracking_uri={store}")
    with pytest.raises(ReplayError, match=rf"event {first + 1} does not replay: .* start the search again"):
        run_search(plan_search(search_cfg(*settings)))
    assert (copy / "optuna.db").read_bytes() == study and not list(copy.glob("optuna.db.*"))
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert runs and {run.info.status for run in runs} <= {"FINISHED", "KILLED"}


def test_a_second_search_takes_its_control_from_the_cache(resumed: Resumed, ray_session) -> None:
    second = resumed.root / "second"
    run_search(
        plan_search(
            search_cfg("space=topk_keep", "seeds=2", "arms=1", *TINY, f"out={second}", f"control_cache={resumed.cache}")
        )
    )
    control = next(r["arm_id"] for r in records(resumed.out / "results.jsonl") if r["label"] == "baseline")
    lines = records(second / "results.jsonl")
    mine = [r for r in lines if r["arm_id"] == control]
    assert len(mine) == 4 and all(r["replayed"] for r in mine)  # 2 seeds x 2 milestones, none trained
    assert all(not r["replayed"] for r in lines if r["arm_id"] != control)
    first = {
        (r["seed"], r["step"]): r["accuracy"] for r in records(resumed.out / "results.jsonl") if r["arm_id"] == control
    }
    assert {(r["seed"], r["step"]): r["accuracy"] for r in mine} == first
    trained = [
        p for root in (resumed.out, second) for p in (root / "cells" / control).glob("seed*/checkpoint/trial.pt")
    ]
    assert len(trained) == 2  # control trainings over both searches: one per seed
