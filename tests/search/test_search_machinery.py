"""The whole search machinery on a real local Ray cluster, Optuna and MLflow (sqlite), with the
synthetic backend of search_helpers (fast, deterministic, known arm effects). The same properties
on the embedded backend are checked in test_search_e2e.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
import ray.cloudpickle
import search_helpers
from mlflow import MlflowClient
from reliability_helpers import records

from tune_dfrl.backends import registry as backend_registry
from tune_dfrl.search.cli import OPTUNA_STUDY, SearchError, plan_search, run_search

ray.cloudpickle.register_pickle_by_value(sys.modules["search_helpers"])  # workers cannot import tests/


@pytest.fixture
def synthetic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backend_registry.BACKENDS, "synthetic", search_helpers.build)


@pytest.fixture(scope="module")
def searched(ray_session, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A maxvar search whose keep fraction snaps to m/8: f in [0.3, 0.45] holds 3 distinct arms (m = 2, 3, 4)."""
    out = tmp_path_factory.mktemp("machinery") / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(backend_registry.BACKENDS, "synthetic", search_helpers.build)
        cfg = search_helpers.search_cfg(
            "space=maxvar_keep",
            "space.methods.maxvar.search.f=[0.3,0.45]",
            "backend.name=synthetic",
            "seeds=[2,5,9]",
            "arms=4",
            "searcher.max_duplicates=15",
            f"out={out}",
        )
        run_search(plan_search(cfg))
    return out


@pytest.mark.integration
def test_control_and_arms_ran_on_identical_seed_lists(searched: Path) -> None:
    seeds: dict[str, set[int]] = {}
    for r in records(searched / "results.jsonl"):
        seeds.setdefault(r["arm_id"], set()).add(r["seed"])
    assert len(seeds) == 4  # control + the 3 distinct canonical arms; duplicates were not trained again
    assert all(s == {2, 5, 9} for s in seeds.values())


@pytest.mark.integration
def test_scheduler_stops_whole_arms_never_single_seeds(searched: Path) -> None:
    last: dict[str, dict[int, int]] = {}
    for r in records(searched / "results.jsonl"):
        last.setdefault(r["label"], {})[r["seed"]] = max(r["step"], last.get(r["label"], {}).get(r["seed"], 0))
    ends = {label: set(by_seed.values()) for label, by_seed in last.items()}
    assert all(len(steps) == 1 for steps in ends.values()), ends  # every seed of an arm ends at the same step
    # effect = 20 (f - 0.5): m=2 (-5) and m=3 (-2.5) have 80% intervals below the leader at the first rung; m=4 ties the control.
    assert ends == {"baseline": {30}, "maxvar(f=0.25)": {10}, "maxvar(f=0.375)": {10}, "maxvar": {30}}
    summary = json.loads((searched / "summary.json").read_text())
    assert set(summary["stopped"]) == {"maxvar(f=0.25)", "maxvar(f=0.375)"}
    assert set(summary["arms"]) == {"maxvar"} and summary["control"] == "baseline"


@pytest.mark.integration
def test_optuna_received_paired_deltas_or_pruned_states(searched: Path) -> None:
    study = optuna.load_study(study_name=OPTUNA_STUDY, storage=f"sqlite:///{searched / 'optuna.db'}")
    rows = {}
    for r in records(searched / "results.jsonl"):
        rows[(r["label"], r["seed"], r["step"])] = r["aggregates"]["db"]
    by_f = {0.25: [], 0.375: [], 0.5: []}
    for trial in study.trials:
        m = int(trial.params["maxvar.f"] * 8 + 0.5)
        by_f[m / 8].append(trial)
    assert all(by_f.values()) and len(study.trials) > 3  # duplicates were told too
    final = {s: rows[("maxvar", s, 30)] - rows[("baseline", s, 30)] for s in (2, 5, 9)}
    for trial in by_f[0.5]:
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert trial.value == pytest.approx(sum(final.values()) / 3)
    for f, label in ((0.25, "maxvar(f=0.25)"), (0.375, "maxvar(f=0.375)")):
        rung = sum(rows[(label, s, 10)] - rows[("baseline", s, 10)] for s in (2, 5, 9)) / 3
        for trial in by_f[f]:
            assert trial.state == optuna.trial.TrialState.PRUNED
            assert trial.intermediate_values == {10: pytest.approx(rung)}


@pytest.mark.integration
def test_mlflow_holds_parents_children_and_summary_metrics(searched: Path) -> None:
    client = MlflowClient(f"sqlite:///{searched / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune_dfrl/{searched.name}")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    role = lambda r: r.data.tags["tune_dfrl.role"]  # noqa: E731
    parents = {r.info.run_id: r for r in runs if role(r) == "arm"}
    children = [r for r in runs if role(r) == "seed"]
    assert len(parents) == 4 and len(children) == 12
    assert sum(role(r) == "search" for r in runs) == 1
    for child in children:
        parent = parents[child.data.tags["mlflow.parentRunId"]]
        assert parent.data.tags["arm_id"] == child.data.tags["arm_id"]
        history = client.get_metric_history(child.info.run_id, "score/db")
        stopped = child.data.tags.get("stopped") == "true"
        assert [m.step for m in history] == ([10] if stopped else [10, 20, 30])
        assert child.info.status == "FINISHED"  # a stopped seed run ended as the rule decided, with its `stopped` tag
    finished = [p for p in parents.values() if p.data.tags["arm_label"] == "maxvar"][0]
    assert {"paired_delta_db", "ci_low_db", "ci_high_db"} <= set(finished.data.metrics)
    assert finished.data.tags["verdict"] in ("better", "worse", "equivalent", "inconclusive")
    stopped = [p for p in parents.values() if p.data.tags["arm_label"] == "maxvar(f=0.25)"][0]
    assert stopped.data.tags["stopped_at_step"] == "10" and stopped.data.tags["verdict"] == "stopped"
    assert stopped.data.tags["status"] == "stopped at step 10"  # not analysed; its figures at the rung that stopped it
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "paired_delta_db")] == [10]
    control = [p for p in parents.values() if p.data.tags["is_control"] == "true"][0]
    assert control.data.tags["status"] == "control" and "mean_db" in control.data.metrics
    search_run = [r for r in runs if role(r) == "search"][0]
    artifacts = {a.path for a in client.list_artifacts(search_run.info.run_id)}
    assert {"benchmarks.json", "report"} <= artifacts


def test_calibration_failure_refuses_before_any_trial(synthetic: None, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = search_helpers.search_cfg(
        "space=topk_keep", "backend.name=synthetic", "+backend.calibration_ok=false", f"out={out}"
    )
    plan = plan_search(cfg)
    with pytest.raises(
        SearchError, match="calibration smoke test failed; refusing to start the search:\n  units: reference"
    ):
        run_search(plan)
    assert not out.exists()
