"""`python -m tune_dfrl.search ... backend=verl` through the CLI, with the stand-in child
(tests/verl_stand_in.py) in place of verl's main_ppo (recipe key `command`): validation,
calibration, Ray Tune trials on a private local cluster, milestones, MLflow (sqlite), report.
And the recipe errors a user meets first: each is `error: ...`, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from reliability_helpers import alive, records
from verl_stand_in import accuracy, command_override, write_model

from tune_dfrl.trainers.verl.export import export_tasks
from tune_dfrl.trainers.verl.recipe import hydra_quote

STEPS, EVERY, SEEDS = 4, 2, (0, 1)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verl_search_data")
    train, val = export_tasks(root / "data", per_domain=4)
    return {"model": write_model(root / "model"), "train": train, "val": val, "root": root}


def verl_args(data: dict[str, Path], *changes: str) -> list[str]:
    """A CPU verl search on the exported tasks, its trials run by the stand-in child."""
    return [
        "space=difffilter_band",
        "backend=verl",
        "backend.device=cpu",
        "backend.gpus_per_trial=1",
        "backend.cpus_per_trial=8",
        f"backend.model_path={hydra_quote(str(data['model']))}",
        f"backend.train_files=[{hydra_quote(str(data['train']))}]",
        f"backend.val_files=[{hydra_quote(str(data['val']))}]",
        command_override(),
        f"steps={STEPS}",
        f"milestone_every={EVERY}",
        f"seeds={len(SEEDS)}",
        "control_cache=null",
        *changes,
    ]


def search(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "tune_dfrl.search", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def searched(data) -> Path:
    """Control + 2 difffilter arms x 2 seeds, 4 steps, milestones at 2 and 4; two trials at a time."""
    out = data["root"] / "out"
    done = search(data["root"], *verl_args(data, "arms=2", "scheduler.name=fifo", "ray.num_cpus=16", f"out={out}"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


@pytest.mark.integration
def test_every_cell_reports_the_childs_validation_milestones(searched: Path) -> None:
    rows = records(searched / "results.jsonl")
    cells = {(r["arm_id"], r["seed"]): [] for r in rows}
    for r in rows:
        cells[r["arm_id"], r["seed"]].append(r["step"])
    assert len({arm for arm, _ in cells}) == 3 and {seed for _, seed in cells} == set(SEEDS)
    assert all(steps == [EVERY, STEPS] for steps in cells.values()) and len(cells) == 3 * len(SEEDS)
    sources = sorted(b["name"] for b in json.loads((searched / "benchmarks.json").read_text()))
    for r in rows:  # difffilter has no temperature: strength 1
        assert r["accuracy"] == pytest.approx(
            {s: 100 * accuracy(r["step"], STEPS, 1.0, i, r["arm_id"], r["seed"]) for i, s in enumerate(sources)}
        )


@pytest.mark.integration
def test_trials_ran_the_cpu_overrides_and_left_no_process(searched: Path) -> None:
    from tune_dfrl.trainers.verl.cpu import ROLLOUT_NAME, cpu_overrides

    infos = [json.loads(p.read_text()) for p in (searched / "cells").glob("*/seed*/checkpoint/stand_in.json")]
    assert len(infos) == 3 * len(SEEDS)
    for info in infos:
        assert info["overrides"][-len(cpu_overrides()) :] == cpu_overrides()
        assert f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}" in info["overrides"]
        assert info["env"]["VERL_PLATFORM"] == "cpu" and info["env"]["RAY_ADDRESS"] is None
    assert [pid for info in infos for pid in (info["parent"], info["pid"], info["lingering"]) if alive(pid)] == []


@pytest.mark.integration
def test_report_and_mlflow_parent_and_child_runs(searched: Path) -> None:
    summary = json.loads((searched / "summary.json").read_text())
    assert summary["seeds"] == list(SEEDS) and len(summary["arms"]) == 2
    assert (searched / "report" / "report.md").exists()
    client = MlflowClient(f"sqlite:///{searched / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune_dfrl/{searched.name}")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = {r.info.run_id for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    children = [r for r in runs if r.data.tags["tune_dfrl.role"] == "seed"]
    assert len(parents) == 3 and len(children) == 3 * len(SEEDS)
    assert all(child.data.tags["mlflow.parentRunId"] in parents for child in children)
    assert [m.step for m in client.get_metric_history(children[0].info.run_id, "score/db")] == [EVERY, STEPS]


def crashing_reward(root: Path) -> str:
    path = root / "crashing_reward.py"
    path.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise RuntimeError('reward server unreachable')\n"
    )
    overrides = (f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=score")
    return f"backend.overrides=[{','.join(map(hydra_quote, overrides))}]"


def no_template(root: Path) -> str:
    model = write_model(root / "no_template")
    (model / "chat_template.jinja").unlink()
    return f"backend.model_path={model}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda root: "backend.gpus_per_trial=2",
            "error: device=cpu trains in one process, which verl places on one "
            "logical GPU of the trial's private Ray: gpus_per_trial must be 1; got 2",
        ),
        (
            lambda root: "backend.rollout_engine=vllm",
            "error: device=cpu rolls out with tune_dfrl's HF rollout; "
            "rollout_engine=vllm needs GPUs: set rollout_engine=null",
        ),
        (no_template, "its tokenizer has no chat template"),
        (crashing_reward, "error: the verl backend failed to calibrate: RuntimeError: reward server unreachable"),
    ],
    ids=["gpus", "engine", "template", "calibration-crash"],
)
def test_bad_recipe_is_an_error_before_any_trial(data, tmp_path: Path, change, message) -> None:
    out = tmp_path / "out"
    done = search(tmp_path, *verl_args(data, change(tmp_path), "arms=1", f"out={out}"))
    assert (done.returncode, done.stderr.count("Traceback")) == (2, 0), done.stderr[-3000:]
    assert message in done.stderr
    assert not out.exists()
