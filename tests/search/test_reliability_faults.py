"""A crashing trial does not sink the search: planted faults on the embedded backend, a real local Ray cluster.

Two faults (`fault_injection`, test only), `max_retries=1`:
- the searched arm at seed 1 crashes at its step-2 milestone on every attempt: retried once, then recorded as
  failed; the search goes on and the report compares that arm on the seeds it shares with the control;
- the control at seed 0 crashes once at its final milestone, after its checkpoint: the retry finishes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from reliability_helpers import TINY, records
from search_helpers import search_cfg

from tune_dfrl.search.cli import plan_search, run_search
from tune_dfrl.tune.trial import cell_dir

pytestmark = pytest.mark.integration  # a search on the session's Ray cluster

FAULTS = "fault_injection=[{arm: searched, seed: 1, step: 2}, {arm: control, seed: 0, step: 4, times: 1}]"


@pytest.fixture(scope="module")
def faulted(ray_session, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "out"
    cfg = search_cfg(
        "space=difffilter_band",
        "seeds=3",
        "arms=1",
        *TINY,
        "scheduler.name=fifo",
        "max_retries=1",
        "control_cache=null",
        FAULTS,
        f"out={out}",
    )
    run_search(plan_search(cfg))
    return out


def arms(out: Path) -> tuple[str, str]:
    """(control arm id, searched arm id)."""
    control = json.loads((out / "search.json").read_text())["control"]["arm_id"]
    return control, next(r["arm_id"] for r in records(out / "results.jsonl") if r["arm_id"] != control)


def test_a_crashing_trial_is_retried_then_recorded_failed_and_the_search_finishes(faulted: Path) -> None:
    control, searched = arms(faulted)
    [failure] = records(faulted / "failures.jsonl")
    assert (failure["arm_id"], failure["seed"], failure["step"], failure["failures"]) == (searched, 1, 0, 2)
    assert "PlantedFaultError: planted fault (fault_injection)" in failure["error"]
    assert (cell_dir(faulted / "cells", searched, 1) / "planted_faults").read_text() == "2"  # first attempt + 1 retry
    finals = {(r["arm_id"], r["seed"]) for r in records(faulted / "results.jsonl") if r["final"]}
    assert finals == {(control, 0), (control, 1), (control, 2), (searched, 0), (searched, 2)}
    summary = json.loads((faulted / "summary.json").read_text())
    label = next(r["label"] for r in records(faulted / "results.jsonl") if r["arm_id"] == searched)
    assert summary["failed"] == {label: [1]}


def test_the_report_names_the_missing_seed_and_compares_on_the_shared_seeds(faulted: Path) -> None:
    control, searched = arms(faulted)
    summary = json.loads((faulted / "summary.json").read_text())
    label = next(iter(summary["arms"]))
    notes = "\n".join(summary["notes"])
    assert f"arm {label!r}: seed 1 failed after 2 attempt(s), at step 0 (tune_dfrl.errors.PlantedFaultError" in notes
    assert f"arm {label!r}: no run at control seeds [1]; compared on 2 seeds" in notes
    final = {(r["arm_id"], r["seed"]): r["aggregates"]["db"] for r in records(faulted / "results.jsonl") if r["final"]}
    expected = np.mean([final[(searched, s)] - final[(control, s)] for s in (0, 2)])  # by hand, from the stored results
    figures = summary["arms"][label]["db"]
    assert figures["n"] == 2 and figures["delta"] == pytest.approx(expected)


def test_a_retried_trial_finishes_from_its_checkpoint_with_each_milestone_once(faulted: Path) -> None:
    control, _ = arms(faulted)
    cell = cell_dir(faulted / "cells", control, 0)
    assert (cell / "planted_faults").read_text() == "1"  # crashed once, at step 4, after saving its checkpoint
    lines = [
        (r["step"], r["final"]) for r in records(faulted / "results.jsonl") if (r["arm_id"], r["seed"]) == (control, 0)
    ]
    assert lines == [(2, False), (4, True)]
    assert [r["step"] for r in records(cell / "milestones.jsonl")] == [2, 4]
    assert not records(faulted / "failures.jsonl")[0]["arm_id"] == control


def test_mlflow_marks_the_failed_seed_run(faulted: Path) -> None:
    control, searched = arms(faulted)
    client = MlflowClient(f"sqlite:///{faulted / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune_dfrl/{faulted.name}")
    seeds = {
        (r.data.tags["arm_id"], int(r.data.tags["seed"])): r.info.status
        for r in client.search_runs([experiment.experiment_id], "tags.`tune_dfrl.role` = 'seed'")
    }
    assert seeds[(searched, 1)] == "FAILED"
    assert {status for cell, status in seeds.items() if cell != (searched, 1)} == {"FINISHED"}
