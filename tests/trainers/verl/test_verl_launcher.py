"""The verl launcher end to end with a stand-in child (tests/verl_stand_in.py) that writes
verl's file-logger JSONL: milestones reach the caller and Ray Tune, ASHA stops a weak trial,
no child process survives, a crash becomes an error carrying the log tail, and the child sees
the GPUs Ray Tune gave the trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reliability_helpers import alive, records
from verl_stand_in import accuracy, command, write_model

from tune_dfrl.backends.base import ArmSpec, Milestone
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.launcher import JsonlTail, MilestoneReader, VerlRunError
from tune_dfrl.trainers.verl.recipe import VerlRecipe, default_recipe

HERE = Path(__file__).resolve().parents[2]  # tests/
# validation data_sources (sorted: index i in the stand-in's accuracy) -> benchmark, domain, items
BENCHMARKS = [
    {"data_source": "src/a", "name": "alpha", "domain": "math", "items": 4},
    {"data_source": "src/b", "name": "beta", "domain": "math", "items": 2},
    {"data_source": "src/c", "name": "gamma", "domain": "logic", "items": 2},
]


def verl_rows(source: str, count: int, domain: str) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"{source} {i}"}],
            "data_source": source,
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "domain": domain,
        }
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("verl_data")
    model = write_model(root / "model")
    val = [row for b in BENCHMARKS for row in verl_rows(b["data_source"], b["items"], b["domain"])]
    pq.write_table(pa.Table.from_pylist(val), root / "val.parquet")
    pq.write_table(pa.Table.from_pylist(verl_rows("train", 8, "math")), root / "train.parquet")
    return default_recipe(
        model_path=str(model),
        train_files=[str(root / "train.parquet")],
        val_files=[str(root / "val.parquet")],
        gpus_per_trial=0,
        steps=4,
        milestone_every=2,
        benchmarks=BENCHMARKS,
    )


def child_pids(trial_dir: Path) -> list[int]:
    info = json.loads((trial_dir / "stand_in.json").read_text())
    return [info["parent"], info["pid"], info["lingering"]]  # supervisor, verl stand-in, its lingering process


def wait_all_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def test_reader_reads_verl_file_logger_records_and_aggregates(recipe, tmp_path, monkeypatch):
    """A record written by verl's own FileLogger -> accuracy %, lengths, format failures, aggregates."""
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    logger = FileLogger("p", "e")
    logger.log({"actor/entropy": 1.0, "policy/kept_fraction": 0.25}, step=1)
    val = {}
    for source, acc, chars in (("src/a", 0.5, 10.0), ("src/b", 0.25, 20.0), ("src/c", 1.0, 40.0)):
        val |= {
            f"val-core/{source}/acc/mean@4": acc,
            f"val-aux/{source}/acc/mean@2": 0.0,
            f"val-aux/{source}/length_chars/mean@4": chars,
            f"val-aux/{source}/format_fail/mean@4": 0.1,
        }
    logger.log({"actor/entropy": 3.0, "policy/kept_fraction": 0.75, "val-aux/num_turns/mean": 1.0, **val}, step=2)
    logger.finish()

    parsed = VerlRecipe.from_dict(recipe)
    reader = MilestoneReader(parsed.benchmark_sources(), parsed.benchmark_set())
    milestones = [m for r in JsonlTail(tmp_path / "m.jsonl").records() if (m := reader.read(r)) is not None]
    assert len(milestones) == 1
    m = milestones[0]
    assert (m.step, m.accuracy) == (2, {"alpha": 50.0, "beta": 25.0, "gamma": 100.0})
    assert m.length_chars == {"alpha": 10.0, "beta": 20.0, "gamma": 40.0}
    assert m.format_failure == {"alpha": 0.1, "beta": 0.1, "gamma": 0.1}
    # db: mean of domain means (math (50+25)/2, logic 100); item: weights 4, 2, 2;
    # efficiency: 1000 * sum n_b a_b / 100 / sum n_b l_b = 1000 * (2 + 0.5 + 2) / (40 + 40 + 80)
    assert m.aggregates == pytest.approx(
        {"db": (37.5 + 100) / 2, "macro": 175 / 3, "item": (200 + 50 + 200) / 8, "efficiency": 1000 * 4.5 / 160}
    )
    assert m.train == {"actor/entropy": 2.0, "policy/kept_fraction": 0.5}  # means since the last milestone


def stand_in(recipe: dict, *options: str) -> VerlBackend:
    """The verl backend with the stand-in child in place of verl's main_ppo."""
    return VerlBackend({**recipe, "command": command(*options)})


@pytest.mark.integration
def test_run_trial_reports_milestones_and_leaves_no_process(recipe, tmp_path):
    backend = stand_in(recipe)
    arm = ArmSpec("softmax", {"temperature": 2.0}, "arm1", "softmax T=2")
    reported: list[Milestone] = []
    backend.run_trial(arm, 7, reported.append, tmp_path / "ckpt")

    assert [m.step for m in reported] == [2, 4]
    for m in reported:
        assert m.accuracy == pytest.approx(
            {b["name"]: 100 * accuracy(m.step, 4, 2.0, i, "arm1", 7) for i, b in enumerate(BENCHMARKS)}
        )
    assert [r["step"] for r in records(tmp_path / "ckpt" / "milestones.jsonl")] == [2, 4]

    info = json.loads((tmp_path / "ckpt" / "stand_in.json").read_text())
    assert info["cwd"] == str(tmp_path / "ckpt")
    assert info["env"] == {
        "CUDA_VISIBLE_DEVICES": info["env"]["CUDA_VISIBLE_DEVICES"],
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "RAY_ADDRESS": None,
        "RAY_AUTH_MODE": "token",
        "VERL_PLATFORM": None,
    }  # device cuda: no CPU platform; the child's own Ray with token authentication
    assert {
        "data.seed=7",
        "actor_rollout_ref.actor.data_loader_seed=7",
        "actor_rollout_ref.rollout.seed=7",
        "trainer.test_freq=2",
        "+ray_kwargs.ray_init.address=local",
    } <= set(info["overrides"])
    assert wait_all_gone(child_pids(tmp_path / "ckpt"), timeout_s=5) == []

    (tmp_path / "ckpt" / "stand_in.json").unlink()
    backend.run_trial(arm, 7, reported.append, tmp_path / "ckpt")  # finished: nothing to rerun
    assert len(reported) == 2 and not (tmp_path / "ckpt" / "stand_in.json").exists()


@pytest.mark.integration
def test_a_cpu_trials_child_is_killed_at_its_final_milestone_unless_verl_writes_after_its_last_log(recipe, tmp_path):
    """On device cpu, verl's own shutdown after its last log line (the stand-in's: 60 s) is not waited for: once the
    final milestone is delivered the child's group is killed, the trial succeeds and no process is left. A recipe
    whose overrides ask verl for output it writes after that line (another logger), and any cuda trial (vLLM's
    shutdown releases its shared memory), wait for the child's own exit."""
    arm, cpu = ArmSpec("baseline", {}, "arm0", "baseline"), {**recipe, "device": "cpu", "gpus_per_trial": 1}
    reported: list[Milestone] = []
    began = time.monotonic()
    stand_in(cpu, "--shutdown-seconds", "60").run_trial(arm, 0, reported.append, tmp_path / "killed")
    assert time.monotonic() - began < 40 and [m.step for m in reported] == [2, 4]
    assert wait_all_gone(child_pids(tmp_path / "killed"), timeout_s=5) == []

    logged = {**cpu, "overrides": ["trainer.logger=[console,file,wandb]"]}
    for name, waits in (("logged", logged), ("cuda", recipe)):
        began = time.monotonic()
        stand_in(waits, "--shutdown-seconds", "3").run_trial(arm, 0, reported.append, tmp_path / name)
        assert time.monotonic() - began >= 3 and [m.step for m in reported][-2:] == [2, 4], name


@pytest.mark.integration
def test_a_rerun_reports_the_milestone_checkpointed_but_never_logged(recipe, tmp_path):
    """verl saves a milestone's checkpoint before it validates and logs that step: killed in between,
    the rerun validates the checkpoint first, then trains on, no step twice."""
    arm, reported = ArmSpec("baseline", {}, "arm0", "baseline"), []
    with pytest.raises(VerlRunError, match="exited with code 137"):
        stand_in(recipe, "--exit-after-checkpoint", "2").run_trial(arm, 0, reported.append, tmp_path / "ckpt")
    assert reported == [] and (tmp_path / "ckpt" / "verl" / "global_step_2").is_dir()

    stand_in(recipe).run_trial(arm, 0, reported.append, tmp_path / "ckpt")
    assert [m.step for m in reported] == [2, 4]
    assert reported[0].accuracy == pytest.approx(
        {b["name"]: 100 * accuracy(2, 4, 1.0, i, "arm0", 0) for i, b in enumerate(BENCHMARKS)}
    )
    logged = records(tmp_path / "ckpt" / "verl_metrics.jsonl")
    assert [r["step"] for r in logged if "timing_s/step" in r["data"]] == [3, 4]  # trained after the checkpoint only
    assert logged[0]["step"] == 2 and "timing_s/step" not in logged[0]["data"]  # validation before training


@pytest.mark.integration
def test_a_rerun_reports_the_milestones_logged_after_the_trial_died(recipe, tmp_path):
    """The trial process dies at milestone 2 while verl runs on to its final milestone: the rerun
    reports both from verl's log of that start, without starting verl again."""
    arm, reported = ArmSpec("baseline", {}, "arm0", "baseline"), []

    def die_at_first_milestone(milestone: Milestone) -> None:
        deadline = time.monotonic() + 30
        while len(records(tmp_path / "ckpt" / "verl_metrics.jsonl")) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        raise RuntimeError("the trial process died")

    with pytest.raises(RuntimeError, match="the trial process died"):
        stand_in(recipe).run_trial(arm, 0, die_at_first_milestone, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "stand_in.json").unlink()
    stand_in(recipe).run_trial(arm, 0, reported.append, tmp_path / "ckpt")
    assert [m.step for m in reported] == [2, 4]
    assert reported[1].train == pytest.approx({"critic/score/mean": 0.35, "policy/kept_fraction": 0.5})  # steps 3, 4
    assert not (tmp_path / "ckpt" / "stand_in.json").exists()


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else []
        except OSError:
            continue
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@pytest.mark.integration
def test_a_killed_supervisor_takes_its_process_group_along():
    """Ray SIGKILLs the child processes of a trial worker it ends, the supervisor among them: its guard
    (PR_SET_PDEATHSIG) then ends the group, down to a process the child left behind."""
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    )
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tune_dfrl.trainers.verl.supervise",
            str(os.getpid()),
            "--",
            sys.executable,
            "-c",
            child,
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while (
        len(members := group_members(supervisor.pid)) < 4 and time.monotonic() < deadline
    ):  # + guard, child, its child
        time.sleep(0.2)
    assert len(members) == 4
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait()
    assert wait_all_gone(members, timeout_s=15) == []


@pytest.mark.integration
def test_crashing_child_becomes_an_error_with_its_log_tail(recipe, tmp_path):
    backend = stand_in(recipe, "--crash-after", "3")
    reported: list[Milestone] = []
    arm = ArmSpec("baseline", {}, "arm0", "baseline")
    with pytest.raises(VerlRunError, match=r"(?s)exited with code 3.*stand-in CUDA out of memory"):
        backend.run_trial(arm, 0, reported.append, tmp_path / "ckpt")
    assert [m.step for m in reported] == [2]
    assert wait_all_gone(child_pids(tmp_path / "ckpt"), timeout_s=5) == []


@pytest.mark.integration
def test_asha_stops_the_weak_trial_and_no_child_survives(ray_session, recipe, tmp_path):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    recipe = {**recipe, "steps": 6, "milestone_every": 1}
    cases = {
        name: {"arm": asdict(ArmSpec("softmax", {"temperature": t}, name, name)), "dir": str(tmp_path / name)}
        for name, t in (("strong", 5.0), ("weak", 0.1))
    }
    backends = {name: stand_in(recipe, "--step-seconds", str(s)) for name, s in (("strong", 0.2), ("weak", 2.0))}

    def trainable(config: dict) -> None:
        case = config["case"]
        backends[case["arm"]["arm_id"]].run_trial(
            ArmSpec(**case["arm"]), 0, lambda m: tune.report(m.flat()), Path(case["dir"])
        )

    scheduler = ASHAScheduler(
        time_attr="step", metric="score/db", mode="max", max_t=6, grace_period=1, reduction_factor=2
    )
    results = tune.Tuner(
        tune.with_resources(trainable, VerlBackend(recipe).resources()),
        param_space={"case": tune.grid_search(list(cases.values()))},
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="asha", verbose=0),
    ).fit()

    assert results.errors == []
    last_step = {r.config["case"]["arm"]["arm_id"]: r.metrics["step"] for r in results}
    assert last_step["strong"] == 6
    assert last_step["weak"] < 6  # stopped at a rung by ASHA
    pids = [p for name in cases for p in child_pids(tmp_path / name)]
    assert wait_all_gone(pids) == []


@pytest.mark.integration
def test_trial_child_sees_the_gpus_tune_assigned(recipe, tmp_path):
    """8 logical GPUs (own Ray cluster, in a subprocess); a trial asks for 2."""
    probe = subprocess.run(
        [sys.executable, str(HERE / "verl_gpu_probe.py"), json.dumps({**recipe, "gpus_per_trial": 2}), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    assert out["resources"] == {"cpu": 1, "gpu": 2}
    assert out["errors"] == [] and out["final_step"] == 4
    assert len(out["trial_gpu_ids"]) == 2 and set(out["trial_gpu_ids"]) <= set(range(8))
    assert sorted(int(i) for i in out["child_cuda_visible_devices"].split(",")) == sorted(out["trial_gpu_ids"])
