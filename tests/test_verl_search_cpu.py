"""Real verl on CPU through the search CLI: `verl.trainer.main_ppo` children running our plugin trainer.

Two runs, shared by the tests (a verl CPU trial takes one to four minutes to start and ~4.5 GB):

- `searched`: benchmarks/verl_cpu_e2e.py's search at the sizing and scheduler a user gets by default, i.e.
  `python -m tune_dfrl.search space=difffilter_band backend=verl backend.device=cpu ...` with only the recipe
  and the paths set, on the exported tiny model and tasks: the control + 1 difffilter arm x 2 seeds x 2
  steps, a milestone (verl validation) every step, two trials at a time on this 2-CPU machine, the paired
  scheduler pausing each arm's first seed at its rung (step 1) until the other arrives (issue 25: this hung);
- `resumed`: the same search (same recipe and arm) one trial at a time (`ray.num_cpus=1`, no rung), its control
  taken from the first search's control cache (only the arm's 2 trials train), its driver killed with SIGKILL once
  a trial has checkpointed step 1 and not finished, then the same command with resume=true.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient
from reliability_helpers import (
    alive,
    records,
    resume_search,
    search_command,
    short_tmp,
    start,
    stop,
    trained_steps,
    verl_trees,
    wait_for,
)
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.verl.recipe import ray_temp_dir

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("verl_cpu_e2e", ROOT / "benchmarks" / "verl_cpu_e2e.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

pytestmark = pytest.mark.timeout(3600)

ARMS, SEEDS, STEPS = 1, 2, 2  # one arm: the scheduler's choices between arms are the embedded searches' tests
BASE_STEPS = 150
Cell = tuple[str, int]


def cells(out: Path) -> dict[Cell, list[dict]]:
    grouped: dict[Cell, list[dict]] = {}
    for r in records(out / "results.jsonl"):
        grouped.setdefault((r["arm_id"], r["seed"]), []).append(r)
    return grouped


def trial_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell[0] / f"seed{cell[1]}" / "checkpoint"


def verl_records(out: Path, cell: Cell) -> list[dict]:
    return records(trial_dir(out, cell) / "verl_metrics.jsonl")


@pytest.fixture(scope="module")
def files(embedded_cache, tmp_path_factory) -> dict:
    """The exported model (the embedded base model after BASE_STEPS steps: some groups solved, some not) and tasks."""
    base = ensure_base_model(BaseRecipe(steps=BASE_STEPS), embedded_cache)
    return e2e.export(tmp_path_factory.mktemp("verl_cpu") / "export", base)


@pytest.fixture(scope="module")
def control_cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("verl_cpu_controls"))


@pytest.fixture(scope="module")
def searched(files, control_cache, tmp_path_factory) -> tuple[Path, dict]:
    """benchmarks/verl_cpu_e2e.py's search and its figures (seconds per step, trial start-up). Minutes: 4 real verl
    trials, two at a time, each ~40 s of start-up on an idle 2-core machine (docs/readme_verl.md, "Start-up
    timeline"), longer beside the rest of `make test`."""
    root = tmp_path_factory.mktemp("verl_cpu_search")
    out = root / "out"
    args = e2e.search_args(files, "cpu", ARMS, SEEDS, STEPS, out, control_cache, one_at_a_time=False)
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.search", *args],
        env=e2e.search_env(),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    (root / "search.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, e2e.timings(out)


def test_control_and_arms_ran_every_seed_with_a_milestone_per_step(searched) -> None:
    out, figures = searched
    grouped = cells(out)
    assert len({arm for arm, _ in grouped}) == ARMS + 1 and {seed for _, seed in grouped} == set(range(SEEDS))
    assert all([r["step"] for r in rows] == list(range(1, STEPS + 1)) for rows in grouped.values())
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["arms"]) == ARMS and summary["seeds"] == list(range(SEEDS))
    assert figures["trials"] == (ARMS + 1) * SEEDS and figures["steps"] >= (ARMS + 1) * SEEDS
    assert figures["first_step_s"] > 0 and figures["later_step_s"] > 0 and figures["trial_startup_s"] > 0
    assert figures["phases_s"]["startup"] > 0 and "WorkerDict" in figures["process_imports_s"]  # the timeline


def test_two_trials_ran_at_a_time_and_every_arm_was_decided_at_its_rung(searched) -> None:
    """The two seeds of each arm ran at the same time (their MLflow seed runs overlap), and the rung at step 1 was
    decided for every arm (its parent run's `rung1` tag), which waits for both seeds: the first one paused there."""
    out, _ = searched
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(f"tune_dfrl/{out.name}").experiment_id], max_results=100)
    seed_runs: dict[str, list] = {}
    for run in runs:
        if run.data.tags["tune_dfrl.role"] == "seed":
            seed_runs.setdefault(run.data.tags["mlflow.parentRunId"], []).append(run.info)
    assert len(seed_runs) == ARMS + 1
    for first, second in seed_runs.values():
        assert first.start_time < second.end_time and second.start_time < first.end_time
    decided = [r.data.tags.get("rung1", "") for r in runs if r.data.tags["tune_dfrl.role"] == "arm"]
    assert len([tag for tag in decided if tag.startswith(("keep: ", "stop: "))]) == ARMS
    assert "Could not re-use actor" not in (out.parent / "search.log").read_text()


def test_milestones_are_verls_validation_and_the_plugin_trainer_ran(searched, files) -> None:
    out, _ = searched
    sources = [b["data_source"] for b in files["benchmarks"]]
    for cell, rows in cells(out).items():
        logged = {r["step"]: r["data"] for r in verl_records(out, cell)}  # of the cell's last verl start
        assert rows[-1]["step"] in logged
        for row in (row for row in rows if row["step"] in logged):
            assert row["accuracy"] == pytest.approx(
                {s: 100 * logged[row["step"]][f"val-core/{s}/acc/mean@1"] for s in sources}
            )
            if not row["train"]:  # validated from a checkpoint whose step's training log died with a paused run
                assert row["step"] == rows[-1]["step"] and "timing_s/step" not in logged[row["step"]]
                continue
            kept = row["train"]["policy/kept_fraction"]  # logged by our trainer's policy hook
            assert kept == 1.0 if row["method"] == "baseline" else 0.0 <= kept <= 1.0


def test_the_arms_band_drops_responses_of_the_controls_rollouts_and_changes_verls_loss(searched) -> None:
    """Paired seeds sample the same rollouts at step 1 (same seed, same base weights); the difffilter arm's band keeps
    some groups' responses only, which changes the loss verl's actor computed. (The searcher's seed fixes the arm:
    low 0.625, high 0.875, inclusive, which keeps the groups of solve rate 3/4.) A step's means, from the milestone
    rows; a milestone validated from a checkpoint (training log lost with a paused run) has none."""
    out, _ = searched
    control = control_id(out)
    step_1 = {cell: rows[0]["train"] for cell, rows in cells(out).items() if rows[0]["step"] == 1 and rows[0]["train"]}
    paired = [
        (step_1[(control, seed)], means)
        for (arm, seed), means in step_1.items()
        if arm != control and (control, seed) in step_1
    ]
    assert paired
    for baseline, arm in paired:
        assert arm["critic/score/mean"] == baseline["critic/score/mean"]  # the same rollouts
        assert baseline["policy/kept_fraction"] == 1.0 and 0.0 < arm["policy/kept_fraction"] < 1.0
        assert arm["actor/pg_loss"] != baseline["actor/pg_loss"]


def test_mlflow_holds_parent_and_child_runs(searched) -> None:
    out, _ = searched
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(f"tune_dfrl/{out.name}").experiment_id], max_results=100)
    parents = {r.info.run_id for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    children = [r for r in runs if r.data.tags["tune_dfrl.role"] == "seed"]
    assert len(parents) == ARMS + 1 and len(children) == (ARMS + 1) * SEEDS
    assert all(child.data.tags["mlflow.parentRunId"] in parents for child in children)


def test_no_verl_process_or_private_ray_folder_outlives_the_search(searched) -> None:
    out = searched[0]
    assert verl_trees(out) == set()
    assert [cell for cell in cells(out) if ray_temp_dir(trial_dir(out, cell)).exists()] == []


@dataclass(frozen=True)
class Resumed:
    out: Path
    cell: Cell  # the cell whose trial the kill interrupted
    checkpoint: int  # verl's last checkpointed step of that cell when its processes were gone
    killed_records: list[dict]  # what that cell's killed verl run logged
    starts: int  # verl starts of that cell before the resume (lines of its verl_runs.jsonl)
    log_at_kill: int  # the size of its verl.log then
    tree: set[int]  # the killed trial's verl processes (supervisor, main_ppo, its Ray) at the kill
    left: set[int]  # those still alive 60 s after the kill


@pytest.fixture(scope="module")
def resumed(searched, files, control_cache, tmp_path_factory) -> Resumed:
    """The first search's command, one trial at a time, killed with `kill -9` once a trial is checkpointed
    and unfinished, then resumed. Minutes: up to 3 real verl starts in sequence."""
    root = tmp_path_factory.mktemp("verl_cpu_resume")
    out, ray_tmp = root / "out", short_tmp("rt-verl-")
    one_at_a_time = ("ray.num_cpus=1", "scheduler.name=fifo")  # the first search's recipe (its control is cached)
    args = e2e.search_args(files, "cpu", ARMS, SEEDS, STEPS, out, control_cache, one_at_a_time=False)
    command = search_command(*args, *one_at_a_time)
    env = {**e2e.search_env(), "RAY_TMPDIR": str(ray_tmp)}
    driver = start(command, cwd=root, env=env, log=root / "interrupted.log")
    try:

        def checkpointed() -> Cell | None:
            for cell, rows in cells(out).items():
                if (
                    not rows[-1]["final"]
                    and (trial_dir(out, cell) / "verl" / "latest_checkpointed_iteration.txt").exists()
                ):
                    return cell
            return None

        wait_for(
            lambda: driver.poll() is not None or checkpointed() is not None, 1800, "a checkpointed, unfinished trial"
        )
        cell = checkpointed()
        tree = verl_trees(out)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        stop(driver, marker=str(ray_tmp), sig=signal.SIGKILL)  # the driver's own Ray cluster and trial workers
    assert driver.returncode == -signal.SIGKILL and cell is not None, (root / "interrupted.log").read_text()[-3000:]
    try:
        wait_for(lambda: not any(alive(pid) for pid in tree), 60, "the killed trial's verl processes to end")
    except TimeoutError:
        pass
    left = {pid for pid in tree if alive(pid)}
    checkpoint = int((trial_dir(out, cell) / "verl" / "latest_checkpointed_iteration.txt").read_text())
    killed_records = verl_records(out, cell)
    starts = len(records(trial_dir(out, cell) / "verl_runs.jsonl"))
    log_at_kill = (trial_dir(out, cell) / "verl.log").stat().st_size

    resume_search(command, root, env, ray_tmp, 2400)
    return Resumed(out, cell, checkpoint, killed_records, starts, log_at_kill, tree, left)


def test_the_killed_trials_processes_ended_with_it(resumed: Resumed) -> None:
    assert len(resumed.tree) >= 3 and resumed.left == set()  # supervisor, main_ppo and its Ray at least


def test_the_trial_continued_from_verls_checkpoint_without_training_a_step_twice(resumed: Resumed) -> None:
    assert 1 <= resumed.checkpoint <= STEPS
    killed = trained_steps(resumed.killed_records)
    assert killed and max(killed) <= resumed.checkpoint  # every step it logged was checkpointed (milestone_every=1)
    trial = trial_dir(resumed.out, resumed.cell)
    logged = verl_records(resumed.out, resumed.cell)
    if len(records(trial / "verl_runs.jsonl")) == resumed.starts:  # not started again: the killed run logged the rest
        assert logged == resumed.killed_records and resumed.checkpoint == STEPS
        return
    assert trained_steps(logged) == list(range(resumed.checkpoint + 1, STEPS + 1))
    assert [r["step"] for r in logged if "timing_s/step" not in r["data"]] in (
        [],
        [resumed.checkpoint],
    )  # validated first
    with (trial / "verl.log").open("rb") as log:
        log.seek(resumed.log_at_kill)
        assert f"global_step_{resumed.checkpoint}".encode() in log.read()  # the resumed start loaded that checkpoint


def test_every_milestone_reached_the_search_once(resumed: Resumed) -> None:
    lines = records(resumed.out / "results.jsonl")
    assert len({(r["arm_id"], r["seed"], r["step"]) for r in lines}) == len(lines)
    assert all([r["step"] for r in rows] == list(range(1, STEPS + 1)) for rows in cells(resumed.out).values())
    assert (resumed.out / "summary.json").exists()


def test_no_private_ray_folder_is_left(resumed: Resumed) -> None:
    """The killed trial left its private Ray's temporary folder; its resumed start removed it (a killed trial
    whose verl run had logged its final milestone is not started again, and its folder stays)."""
    restarted = len(records(trial_dir(resumed.out, resumed.cell) / "verl_runs.jsonl")) > resumed.starts
    left = [cell for cell in cells(resumed.out) if ray_temp_dir(trial_dir(resumed.out, cell)).exists()]
    assert set(left) <= (set() if restarted else {resumed.cell})


def test_the_same_arm_and_seed_give_the_same_milestones(searched, resumed: Resumed) -> None:
    """The arm cell of the resumed search that the kill did not touch trained the same (arm, seed) as the first
    search (same recipe and searcher seed: the same first arm), in another search folder, and reported the same
    numbers, though the first search paused it at its rung and trained it on from its checkpoint; its control
    cells replayed the cache. (A milestone validated from a checkpoint whose step's training log died with the
    paused run has no training means to compare.)"""
    first, again = cells(searched[0]), cells(resumed.out)
    assert all(rows[0]["replayed"] for (arm, _), rows in again.items() if arm == control_id(searched[0]))
    common = [cell for cell in again if cell in first and cell != resumed.cell and not again[cell][0]["replayed"]]
    assert common
    for cell in common:
        for a, b in zip(again[cell], first[cell], strict=True):
            assert a["accuracy"] == b["accuracy"], cell
            if a["train"] and b["train"]:
                assert a["train"] == b["train"], cell  # verl's step means, all numbers


def control_id(out: Path) -> str:
    return json.loads((out / "search.json").read_text())["control"]["arm_id"]
