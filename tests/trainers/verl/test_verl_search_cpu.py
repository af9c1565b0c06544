"""Real verl on CPU: `verl.trainer.main_ppo` children running our plugin trainer (device cpu: the CPU platform and
the HF rollout) on the embedded backend's base model, exported, through the search CLI and `VerlBackend.run_trial`.

Two runs, shared by the tests (a verl CPU trial starts ~30 processes in 30-60 s and takes ~4.5 GB):

- `searched`: benchmarks/verl_cpu_e2e.py's search at the sizing and scheduler a user gets by default, i.e.
  `python -m tune_dfrl.search space=difffilter_band backend=verl backend.device=cpu ...` with only the recipe
  and the paths set, plus verl's token-level rollout importance weights (`ROLLOUT_IS`: the plugin's hook must pass
  them on), on the exported tiny model and tasks: the control + 1 difffilter arm x 2 seeds x 2 steps (8 prompts x
  4 responses of at most 8 tokens, the KL loss with its reference model), a milestone (verl validation) every step,
  two trials at a time on this 2-CPU machine, the paired scheduler pausing each arm's first seed at its rung (step
  1) until the other arrives (issue 25: this hung);
- `resumed`: the same search (same recipe and arm) one trial at a time (`ray.num_cpus=1`, no rung), its control
  taken from the first search's control cache (only the arm's 2 trials train), its driver killed with SIGKILL and
  its first trial's verl run frozen as that run validates its step-1 checkpoint (the trial dies between verl's
  checkpoint of a step and that step's milestone), then the same command with resume=true on a Ray of 2 CPUs (two
  trials at a time).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient
from reliability_helpers import (
    LOOPBACK,
    alive,
    listening,
    marked,
    records,
    resume_search,
    search_command,
    session_members,
    short_tmp,
    signal_all,
    start,
    stop,
    trained_steps,
    verl_trees,
    wait_for,
)

from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.verl import timeline
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.recipe import OBJECT_STORE_BYTES, hydra_quote, private_ray_logical_cpus, ray_temp_dir

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("verl_cpu_e2e", ROOT / "benchmarks" / "verl_cpu_e2e.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]  # real verl searches

ARMS, SEEDS, STEPS = 1, 2, 2  # one arm: the scheduler's choices between arms are the embedded searches' tests
BASE_STEPS = 150
ROLLOUT_IS = f"backend.overrides=[{hydra_quote('algorithm.rollout_correction.rollout_is=token')}]"
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
    args = [*e2e.search_args(files, "cpu", ARMS, SEEDS, STEPS, out, control_cache, one_at_a_time=False), ROLLOUT_IS]
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


def uninterrupted_control(out: Path) -> Cell:
    """A control cell that verl trained in one start, every step logged (of an arm's two seeds, the one that
    arrived second at the rung was never paused)."""
    control = control_id(out)
    for cell in sorted(cells(out)):
        one_start = len(records(trial_dir(out, cell) / "verl_runs.jsonl")) == 1
        if cell[0] == control and one_start and trained_steps(verl_records(out, cell)) == list(range(1, STEPS + 1)):
            return cell
    raise AssertionError(f"no control cell of {out} trained every step in one verl start")


def test_verl_trained_grpo_steps_with_the_kl_loss_and_its_importance_weights_reached_the_hook(searched) -> None:
    """verl's own log of a control trial: every step trained (a gradient, a GRPO signal in a group whose responses
    differ, solved and unsolved responses), the rollout's log-probs the actor's, the GPU recipe's KL loss to the
    FSDP2 reference model (offloaded, unpinned) computed and added, verl's token-level importance weights passed by
    the plugin's hook unchanged (the control's own weights are 1), and validated (a milestone every step)."""
    out, _ = searched
    logged = {r["step"]: r["data"] for r in verl_records(out, uninterrupted_control(out))}
    for step in range(1, STEPS + 1):
        record = logged[step]
        assert any(key.startswith("val-core/") for key in record)
        assert record["actor/grad_norm"] > 0 and math.isfinite(record["actor/pg_loss"])
        assert record["critic/advantages/max"] > 0 and 0 < record["critic/score/mean"] < 1
        assert record["training/rollout_probs_diff_max"] < 0.05
        assert record["timing_s/ref"] > 0 and record["actor/kl_coef"] == 0.001
        # 0 here: after one step at lr 1e-4 the actor's bf16 log-probs still equal the reference's
        assert record["actor/kl_loss"] >= 0 and math.isfinite(record["actor/kl_loss"])
        verl_weights = record["policy/verl_is_weight_mean"]
        assert verl_weights != 1.0 and record["policy/is_weight_mean"] == verl_weights


def test_each_trials_private_ray_has_the_trials_size_and_a_bounded_object_store(searched) -> None:
    """verl's TaskRunner saw a Ray instance of `private_ray_logical_cpus` CPUs, one logical GPU and an object store of
    OBJECT_STORE_BYTES (Ray's default: 30% of this machine's memory, per trial), at every start of every cell; its
    folder is in the system's temporary folder (a trial folder's path is too long for Ray's sockets). The trial's
    driver (driver.py) started that node while verl imported: verl's `ray.init` connected to it instead of starting
    one."""
    out, _ = searched
    size = {
        "CPU": private_ray_logical_cpus(VerlBackend(search_plan(out)["recipe"]).config),
        "GPU": 1.0,
        "object_store_memory": OBJECT_STORE_BYTES,
    }
    for cell in cells(out):
        inits = [e for e in timeline.read(trial_dir(out, cell) / timeline.FILE_NAME) if e["event"] == "trainer_init"]
        assert inits and all(init["ray"] == size for init in inits), cell
        assert ray_temp_dir(trial_dir(out, cell)).parent == Path(tempfile.gettempdir())
        log = (trial_dir(out, cell) / "verl.log").read_text()
        connected = re.findall(r"^ray init kwargs: .*'address': '127\.0\.0\.1:\d+'", log, flags=re.MULTILINE)
        assert len(connected) == len(inits) and "Started a local Ray instance" not in log, cell


def test_each_trials_rollout_server_started_before_verls_training_workers(searched) -> None:
    """The plugin trainer creates the CPU rollout's server before verl builds its training workers (trainer.py,
    `_init_dataloader`): its process starts first, and imports while theirs do, at every start of every cell."""
    out, _ = searched
    for cell in cells(out):
        trial = trial_dir(out, cell)
        names = timeline.actor_names((trial / "verl.log").read_text())
        for events in timeline.starts(timeline.read(trial / timeline.FILE_NAME)):
            began = {names.get(e["pid"]): e["t"] for e in events if e["event"] == "process_start"}
            assert began["HFRolloutServer"] < began["WorkerDict"], cell


VERL_PROCESSES = 6  # the driver, TaskRunner, training worker, rollout server, reward worker, agent-loop worker


def test_each_trials_rollout_server_is_its_request_router(searched) -> None:
    """The CPU rollout's one server answers verl's router calls itself (cpu/patches.py): at every start of every
    cell, six processes imported verl, not seven; none was verl's `GlobalRequestLoadBalancer` (which logs nothing,
    so it would be the one process whose name verl's log does not give)."""
    out, _ = searched
    for cell in cells(out):
        trial = trial_dir(out, cell)
        names = timeline.actor_names((trial / "verl.log").read_text())
        for events in timeline.starts(timeline.read(trial / timeline.FILE_NAME)):
            imported = [names.get(e["pid"], e["process"]) for e in events if e["event"] == "verl_imported"]
            assert len(imported) == VERL_PROCESSES and "GlobalRequestLoadBalancer" not in imported, (cell, imported)
            assert {"HFRolloutServer", "AgentLoopWorkerTQ", "WorkerDict"} <= set(imported), (cell, imported)


def same_numbers(record: dict) -> dict:
    """A verl metrics record without its clock readings (`timing_s/`, `timing_per_token_ms/`, `perf/` and
    `actor/perf/`: seconds, throughput, memory)."""
    clock = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
    return {k: v for k, v in record.items() if not k.startswith(clock)}


def validating_step_1(out: Path) -> tuple[Cell, int] | None:
    """A cell whose first verl start has saved its step-1 checkpoint and begun validating it (trainer.py's
    `validate_begin`): verl logs step 1 only after that validation, so its milestone cannot have been recorded.
    With the pid of the process that validates and would log (verl's TaskRunner)."""
    for path in (out / "cells").glob(f"*/seed*/checkpoint/{timeline.FILE_NAME}"):
        complete = path.read_text().split("\n")[:-1]  # (a line being written is not read)
        for event in map(json.loads, complete):
            if event["event"] == "validate_begin" and event["step"] == 1:
                return (path.parts[-4], int(path.parts[-3].removeprefix("seed"))), event["pid"]
    return None


@dataclass(frozen=True)
class Resumed:
    out: Path
    cell: Cell  # the cell whose trial the kill interrupted
    rows_at_kill: list[dict]  # that cell's milestones in results.jsonl at the kill
    killed_records: list[dict]  # what that cell's killed verl run logged
    log_at_kill: int  # the size of its verl.log then
    tree: set[int]  # the killed trial's verl processes (supervisor, main_ppo, its Ray) at the kill
    sockets: set[tuple[str, str, int]]  # what they listened on
    left: set[int]  # those still alive 60 s after the kill


@pytest.fixture(scope="module")
def resumed(searched, files, control_cache, tmp_path_factory) -> Resumed:
    """The first search's command, one trial at a time, killed with `kill -9` as a trial validates its step-1
    checkpoint, then resumed. At that moment every process of the trial's verl run is frozen (verl would log step 1
    and checkpoint step 2 within a second otherwise) and its TaskRunner killed, so that the trial dies between verl's
    checkpoint of a step and that step's log and milestone; its supervisor, left running, must end the rest (SIGTERM,
    then SIGKILL after its grace). The resume runs two trials at a time (`ray.num_cpus=2`). Minutes: 3 real verl
    starts, the first alone."""
    root = tmp_path_factory.mktemp("verl_cpu_resume")
    out, ray_tmp = root / "out", short_tmp("rt-verl-")
    one_at_a_time = ("ray.num_cpus=1", "scheduler.name=fifo")  # the first search's recipe (its control is cached)
    args = [*e2e.search_args(files, "cpu", ARMS, SEEDS, STEPS, out, control_cache, one_at_a_time=False), ROLLOUT_IS]
    command = search_command(*args, *one_at_a_time)
    env = {**e2e.search_env(), "RAY_TMPDIR": str(ray_tmp)}
    driver = start(command, cwd=root, env=env, log=root / "interrupted.log")
    found: list[tuple[Cell, int]] = []

    def validating() -> bool:
        found.extend(run for run in [validating_step_1(out)] if run)
        return bool(found) or driver.poll() is not None

    try:
        wait_for(validating, 1800, "a trial validating its step-1 checkpoint", poll_s=0.05)
        cell = found[0][0] if found else None
        # The run's whole session at once: verl logs step 1 as soon as the validation ends. Its TaskRunner, which
        # would log it, is killed: Ray's workers lead process groups of their own, and when the supervisor ends its
        # group (the driver, the Ray node), the kernel continues the stopped processes of those orphaned groups.
        if found:
            signal_all(session_members(os.getsid(found[0][1])), signal.SIGSTOP)
            os.kill(found[0][1], signal.SIGKILL)
        tree = verl_trees(out)
        signal_all(tree - set(marked("supervise")), signal.SIGSTOP)  # any process of the run outside its session
        signal_all(tree & set(marked("supervise")), signal.SIGCONT)  # its supervisor and guard go on
        rows_at_kill = cells(out).get(cell, [])
        sockets = listening(tree)  # (slow: every socket of ~30 processes)
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
    signal_all(left, signal.SIGKILL)
    killed_records = verl_records(out, cell)
    log_at_kill = (trial_dir(out, cell) / "verl.log").stat().st_size

    # resumed on a Ray of 2 CPUs: the arm's two trials (the killed one's second verl start, the other seed's first)
    # at once; a search's fingerprint holds no Ray setting
    resume_search(search_command(*args, "ray.num_cpus=2", "scheduler.name=fifo"), root, env, ray_tmp, 2400)
    return Resumed(out, cell, rows_at_kill, killed_records, log_at_kill, tree, sockets, left)


def test_the_killed_trials_processes_ended_with_it(resumed: Resumed) -> None:
    """The Tune trial's process died with the driver; the trial's supervisor ended its frozen verl run."""
    assert len(resumed.tree) >= 3 and resumed.left == set()  # supervisor, main_ppo and its Ray at least


def test_a_running_trials_processes_listen_on_loopback_only(resumed: Resumed) -> None:
    """Its private Ray, and its process group's rendezvous, which is a file (cpu_env's DIST_INIT_METHOD), not a
    TCPStore on every interface."""
    assert len(resumed.sockets) > 10
    assert {s for s in resumed.sockets if s[1] not in LOOPBACK} == set(), resumed.sockets


def test_the_trial_validated_the_milestone_it_lost_then_trained_on_from_verls_checkpoint(resumed: Resumed) -> None:
    """The killed run had checkpointed step 1 and logged nothing (the milestone was lost with it). The resumed start
    found that checkpoint newer than the trial's last milestone: it loaded it, validated it before training
    (milestone 1: validation only, no training means), then trained step 2 only."""
    trial = trial_dir(resumed.out, resumed.cell)
    assert resumed.rows_at_kill == [] and resumed.killed_records == []
    assert int((trial / "verl" / "latest_checkpointed_iteration.txt").read_text()) == STEPS
    assert len(timeline.starts(timeline.read(trial / timeline.FILE_NAME))) == 2
    # a start's first record: the killed one logged none, the resumed one's is the validation of step 1
    assert [run["first_step"] for run in records(trial / "verl_runs.jsonl")] == [1]
    logged = verl_records(resumed.out, resumed.cell)
    assert [r["step"] for r in logged] == [1, STEPS] and trained_steps(logged) == [STEPS]
    rows = cells(resumed.out)[resumed.cell]
    assert [r["step"] for r in rows] == [1, STEPS] and rows[0]["train"] == {} and rows[1]["train"]
    with (trial / "verl.log").open("rb") as log:
        log.seek(resumed.log_at_kill)
        assert b"global_step_1" in log.read()  # the resumed start loaded the step-1 checkpoint


def test_every_milestone_reached_the_search_once(resumed: Resumed) -> None:
    lines = records(resumed.out / "results.jsonl")
    assert len({(r["arm_id"], r["seed"], r["step"]) for r in lines}) == len(lines)
    assert all([r["step"] for r in rows] == list(range(1, STEPS + 1)) for rows in cells(resumed.out).values())
    assert (resumed.out / "summary.json").exists()


def test_no_private_ray_folder_is_left(resumed: Resumed) -> None:
    """The killed trial left its private Ray's temporary folder; its resumed start removed it."""
    assert [cell for cell in cells(resumed.out) if ray_temp_dir(trial_dir(resumed.out, cell)).exists()] == []


def test_the_same_arm_and_seed_give_the_same_milestones(searched, resumed: Resumed) -> None:
    """The resumed search trained the same (arm, seed) cells as the first search (same recipe and searcher seed: the
    same first arm), in another search folder, and reported the same numbers: the cell the kill did not touch (though
    the first search paused its twin at the rung), and the killed one, whose step 2 trained from the checkpoint of a
    killed run and whose step 1 was validated from it. Bit for bit: each milestone's accuracies, each step's training
    means, and the rest of verl's own log of step 2 (clock readings aside). Its control cells replayed the cache.
    (A milestone validated from a checkpoint whose step's training log died with a paused run has no training means to
    compare.) Each response is seeded by its index in its group and the update sees the responses in submission order
    (trainers/verl/cpu/rollout.py, trainers/verl/trainer.py), not in the order they finished.

    Where a comparison cannot be made, the reason is asserted, so that nothing is skipped silently: the resumed
    search's killed cell validated step 1 from the checkpoint (no training means); in the first search, the arm's seed
    paused at the rung may have validated step 2 from a checkpoint its paused run saved (a later verl start beginning
    at step 2, which verl did not train then). Its twin was never paused and trained every step: verl's own
    log of step 2 is compared for every cell whose step 2 both searches trained (the killed cell's unless it was the
    paused one in the first search; its twin's then)."""
    first, again = cells(searched[0]), cells(resumed.out)
    assert all(rows[0]["replayed"] for (arm, _), rows in again.items() if arm == control_id(searched[0]))
    common = [cell for cell in again if cell in first and not again[cell][0]["replayed"]]
    assert resumed.cell in common and len(common) == SEEDS

    def validated_after_the_pause(cell: Cell) -> bool:
        """In the first search, the cell's last milestone was validated from a checkpoint of a paused run."""
        starts = [run["first_step"] for run in records(trial_dir(searched[0], cell) / "verl_runs.jsonl")]
        last = {r["step"]: r["data"] for r in verl_records(searched[0], cell)}[STEPS]
        return len(starts) > 1 and starts[-1] == STEPS and "timing_s/step" not in last and not first[cell][-1]["train"]

    compared = []
    for cell in common:
        for a, b in zip(again[cell], first[cell], strict=True):
            assert a["accuracy"] == b["accuracy"], cell
            if (cell, a["step"]) == (resumed.cell, 1):
                assert a["train"] == {} and b["train"], cell  # validated from the killed run's checkpoint
            elif not b["train"]:
                assert b["step"] == STEPS and validated_after_the_pause(cell), cell
            else:
                assert a["train"] and a["train"] == b["train"], cell  # verl's step means, all numbers
                compared.append((cell, a["step"]))
    assert len(compared) >= len(common) * STEPS - 2 and any(cell != resumed.cell for cell, _ in compared), compared
    step_2 = {
        cell: [{r["step"]: r["data"] for r in verl_records(out, cell)}[STEPS] for out in (resumed.out, searched[0])]
        for cell in common
    }
    assert all("timing_s/step" in again_2 for again_2, _ in step_2.values())  # the resumed search trained each step 2
    trained = [cell for cell, (_, first_2) in step_2.items() if "timing_s/step" in first_2]
    assert trained and all(validated_after_the_pause(cell) for cell in common if cell not in trained), trained
    for cell in trained:
        again_2, first_2 = step_2[cell]
        assert len(same_numbers(again_2)) > 50 and same_numbers(again_2) == same_numbers(first_2), cell


def search_plan(out: Path) -> dict:
    return json.loads((out / "search.json").read_text())


def control_id(out: Path) -> str:
    return search_plan(out)["control"]["arm_id"]
