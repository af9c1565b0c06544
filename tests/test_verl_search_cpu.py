"""Real verl on CPU through the search CLI: `verl.trainer.main_ppo` children running our plugin trainer.

One run, shared by the tests (a verl CPU trial takes one to four minutes to start and ~4.5 GB; one
at a time): benchmarks/verl_cpu_e2e.py's search, i.e. `python -m tune_dfrl.search space=difffilter_band
backend=verl backend.device=cpu ...` on the exported tiny model and tasks: the control + 2 difffilter
arms x 2 seeds x 2 steps, a milestone (verl validation) every step.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from reliability_helpers import records
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("verl_cpu_e2e", ROOT / "benchmarks" / "verl_cpu_e2e.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

pytestmark = pytest.mark.timeout(3600)

ARMS, SEEDS, STEPS = 2, 2, 2
BASE_STEPS = 150
Cell = tuple[str, int]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def supervisors(out: Path) -> list[int]:
    """Live verl supervisors (launcher.py) of trials of the search in `out`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if "tune_dfrl.trainers.verl.supervise" in command and str(out) in command:
            pids.append(int(entry.name))
    return pids


def cells(out: Path) -> dict[Cell, list[dict]]:
    grouped: dict[Cell, list[dict]] = {}
    for r in records(out / "results.jsonl"):
        grouped.setdefault((r["arm_id"], r["seed"]), []).append(r)
    return grouped


def verl_records(out: Path, cell: Cell) -> list[dict]:
    return records(out / "cells" / cell[0] / f"seed{cell[1]}" / "checkpoint" / "verl_metrics.jsonl")


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
    """benchmarks/verl_cpu_e2e.py's search and its figures (seconds per step, trial start-up)."""
    root = tmp_path_factory.mktemp("verl_cpu_search")
    out = root / "out"
    args = e2e.search_args(files, "cpu", ARMS, SEEDS, STEPS, out, control_cache)
    done = subprocess.run([sys.executable, "-m", "tune_dfrl.search", *args],
                          env=e2e.search_env(), cwd=root, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, e2e.timings(out)


def test_control_and_arms_ran_every_seed_with_a_milestone_per_step(searched) -> None:
    out, figures = searched
    grouped = cells(out)
    assert len({arm for arm, _ in grouped}) == ARMS + 1 and {seed for _, seed in grouped} == set(range(SEEDS))
    assert all([r["step"] for r in rows] == list(range(1, STEPS + 1)) for rows in grouped.values())
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["arms"]) == ARMS and summary["seeds"] == list(range(SEEDS))
    assert figures["trials"] == (ARMS + 1) * SEEDS and figures["steps"] == (ARMS + 1) * SEEDS * STEPS
    assert figures["seconds_per_step"] > 0 and figures["trial_startup_s"] > 0


def test_milestones_are_verls_validation_and_the_plugin_trainer_ran(searched, files) -> None:
    out, _ = searched
    sources = [b["data_source"] for b in files["benchmarks"]]
    for cell, rows in cells(out).items():
        logged = {r["step"]: r["data"] for r in verl_records(out, cell)}
        for row in rows:
            assert row["accuracy"] == pytest.approx({s: 100 * logged[row["step"]][f"val-core/{s}/acc/mean@1"] for s in sources})
            kept = row["train"]["policy/kept_fraction"]  # logged by our trainer's policy hook
            assert kept == 1.0 if row["method"] == "baseline" else 0.0 <= kept <= 1.0


def test_mlflow_holds_parent_and_child_runs(searched) -> None:
    out, _ = searched
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(f"tune_dfrl/{out.name}").experiment_id], max_results=100)
    parents = {r.info.run_id for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    children = [r for r in runs if r.data.tags["tune_dfrl.role"] == "seed"]
    assert len(parents) == ARMS + 1 and len(children) == (ARMS + 1) * SEEDS
    assert all(child.data.tags["mlflow.parentRunId"] in parents for child in children)


def test_no_verl_process_outlives_the_search(searched) -> None:
    assert supervisors(searched[0]) == []
