"""The MLflow side of a search's end, without Ray: what the search prints to browse its store, the saved arms view,
and every arm's parent run (control, analysed, stopped, failed) carrying its final figures and status.

A synthetic search folder is written by the search's own callbacks (`ResultsLog`, `SearchTracker` on a real sqlite
store) from the trial events a search would deliver; `search_finish.finish` then reports it as a search does.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import urllib.request
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from search_helpers import BENCHMARKS

from tune_dfrl.guarded import Guarded
from tune_dfrl.results import ResultsLog
from tune_dfrl.rungs import RungDecision
from tune_dfrl.scheduler import ArmDecision
from tune_dfrl.search_finish import finish
from tune_dfrl.stats import paired_interval
from tune_dfrl.tracking import ARMS_VIEW, SAVED_VIEW_TAG, SearchTracker, browse_lines, runs_url, ui_command

TOOL = Path(__file__).resolve().parents[1] / "tools" / "mlflow_screenshot.py"
STEPS, SEEDS, METRIC = (10, 20, 30), (0, 1, 2, 3), "score/db"
CONTROL = {"arm_id": "c0", "label": "baseline", "method": "baseline", "params": {}}
BETTER = {"arm_id": "a1", "label": "topk(f=0.9)", "method": "topk", "params": {"f": 0.9}}
CLOSE = {"arm_id": "a2", "label": "topk(f=0.6)", "method": "topk", "params": {"f": 0.6}}
STOPPED = {"arm_id": "a3", "label": "topk(f=0.1)", "method": "topk", "params": {"f": 0.1}}
FAILED = {"arm_id": "a4", "label": "maxvar(f=0.5)", "method": "maxvar", "params": {"f": 0.5}}
EFFECT = {"c0": 0.0, "a1": 6.0, "a2": 0.5, "a3": -5.0, "a4": 0.0}


def score(arm: dict, seed: int, step: int) -> float:
    """A per-seed offset shared by all arms, the arm's effect growing with the step, and a little noise."""
    noise = float(np.random.default_rng([seed, step, int(arm["arm_id"][1:])]).standard_normal())
    return 40.0 + 5.0 * seed + EFFECT[arm["arm_id"]] * step / STEPS[-1] + 0.3 * noise


def result(arm: dict, seed: int, step: int) -> dict:
    s = score(arm, seed, step)
    return {
        "step": step,
        "final": step == STEPS[-1],
        "threads": 1,
        **{f"acc/{b.name}": s for b in BENCHMARKS},
        **{f"score/{agg}": s for agg in ("db", "macro", "item")},
    }


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The folder, store and printed lines of a search whose arms end every way an arm can: the control and two
    arms at the full budget, one stopped at rung 20, one failed at every seed after step 10."""
    out = tmp_path_factory.mktemp("arms") / "out"
    out.mkdir()
    (out / "benchmarks.json").write_text(json.dumps([asdict(b) for b in BENCHMARKS]))
    uri = f"sqlite:///{out / 'mlflow.db'}"
    tracker = SearchTracker(
        uri, "tune_dfrl/arms", (out / "mlartifacts").as_uri(), "topk_keep", "c0", METRIC, {"arms": 4}, BENCHMARKS
    )
    log = ResultsLog(out / "results.jsonl", out / "failures.jsonl", METRIC)
    callbacks = [log, tracker]
    for arm in (CONTROL, BETTER, CLOSE, STOPPED, FAILED):
        last = {"a3": 20, "a4": 10}.get(arm["arm_id"], STEPS[-1])
        for seed in SEEDS:
            trial = SimpleNamespace(
                config={"arm": arm, "seed": seed}, last_result=None, error_file=None, num_failures=2
            )
            tracker.on_trial_start(0, [], trial)
            for step in (s for s in STEPS if s <= last):
                trial.last_result = result(arm, seed, step)
                for callback in callbacks:
                    callback.on_trial_result(0, [], trial, trial.last_result)
            for callback in callbacks:
                if arm is FAILED:
                    callback.on_trial_error(0, [], trial)
                else:
                    callback.on_trial_complete(0, [], trial)
        if arm is STOPPED:
            tracker.note_decision(
                ArmDecision("a3", 20, SEEDS, RungDecision(False, "80% interval below the leader", "a1"))
            )
    plan = SimpleNamespace(
        out=out,
        milestones=STEPS,
        seeds=list(SEEDS),
        control=SimpleNamespace(arm_id="c0"),
        report=SimpleNamespace(delta=1.0, alpha=0.05, seed=0, flip_k=2),
        aggregate="db",
        tracking_uri=uri,
    )
    printed, logging = io.StringIO(), Guarded(tracker, "MLflow logging", "the test fails")
    with contextlib.redirect_stdout(printed):
        summary = finish(
            plan,
            logging,
            None,  # no scheduler state: the stopped arm's note comes without its rung
            Guarded(log, "results.jsonl", "the test fails"),
            SimpleNamespace(control_failed=lambda: False),
        )
    assert logging.error is None
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tune_dfrl/arms")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = {r.data.tags["arm_id"]: r for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    return SimpleNamespace(
        out=out,
        uri=uri,
        client=client,
        experiment=experiment,
        parents=parents,
        summary=summary,
        printed=printed.getvalue(),
    )


def test_the_runs_url_names_the_experiment_and_the_runs_page_in_the_model_training_workflow() -> None:
    url = runs_url("sqlite:////tmp/out/mlflow.db", "7")
    assert url == (
        "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=tune_dfrl.arms&workflowType=machine_learning"
    )
    assert ui_command("sqlite:////tmp/out/mlflow.db") == (
        "mlflow ui --backend-store-uri sqlite:////tmp/out/mlflow.db --host 127.0.0.1 --port 5000"
    )
    served = "http://mlflow.internal:8080/"
    assert ui_command(served) is None
    assert browse_lines(served, "12") == [
        "browse:  http://mlflow.internal:8080/#/experiments/12/runs?viewStateShareKey=tune_dfrl.arms"
        "&workflowType=machine_learning"
    ]


def test_the_search_ends_printing_the_ui_command_and_the_url_of_its_arms(searched: SimpleNamespace) -> None:
    *_, command, url = searched.printed.splitlines()
    assert command == f"browse:  mlflow ui --backend-store-uri {searched.uri} --host 127.0.0.1 --port 5000"
    assert url == f"         then open {runs_url(searched.uri, searched.experiment.experiment_id)}"
    assert f"/#/experiments/{searched.experiment.experiment_id}/runs?" in url


def test_the_saved_arms_view_selects_the_arm_runs_and_columns_they_all_carry(searched: SimpleNamespace) -> None:
    envelope = json.loads(searched.experiment.tags[SAVED_VIEW_TAG + ARMS_VIEW])
    assert envelope["name"] and isinstance(envelope["createdAt"], int)
    view = json.loads(envelope["state"])
    shown = searched.client.search_runs([searched.experiment.experiment_id], filter_string=view["searchFilter"])
    assert {r.info.run_id for r in shown} == {r.info.run_id for r in searched.parents.values()}
    assert [r.data.tags["arm_id"] for r in sorted(shown, key=lambda r: r.info.start_time)][0] == "c0"
    columns = [c.split(".", 1) for c in view["selectedColumns"]]
    assert ("metrics", "`paired_delta_db`") in [tuple(c) for c in columns]
    for arm in ("a1", "a2"):  # analysed: every column filled
        data = searched.parents[arm].data
        for kind, key in columns:
            assert key.strip("`") in (data.metrics if kind == "metrics" else data.tags), (arm, key)


def steps(client: MlflowClient, run: Run, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run.info.run_id, key)]


def test_every_arm_run_carries_its_final_figures_and_status(searched: SimpleNamespace) -> None:
    client, summary, parents = searched.client, searched.summary, searched.parents
    assert set(parents) == {"c0", "a1", "a2", "a3", "a4"}

    control = parents["c0"].data
    assert (control.tags["status"], control.tags["verdict"]) == ("control", "control")
    assert control.metrics["mean_db"] == pytest.approx(summary.control_mean["db"])
    assert control.metrics["mean_db"] == pytest.approx(np.mean([score(CONTROL, s, 30) for s in SEEDS]))
    assert control.metrics["seeds"] == len(SEEDS) and control.tags["paired_db"] == "Δ ≡ 0 (the reference)"

    for arm in (BETTER, CLOSE):
        data, figures = parents[arm["arm_id"]].data, summary.arms[arm["label"]]["db"]
        assert data.tags["status"] == "analysed at step 30" and data.tags["verdict"] == figures.verdict
        assert data.metrics["paired_delta_db"] == pytest.approx(figures.delta)
        assert (data.metrics["ci_low_db"], data.metrics["ci_high_db"]) == pytest.approx(
            (figures.ci_low, figures.ci_high)
        )
        assert data.metrics["ci_level_db"] == pytest.approx(figures.level)
        assert data.metrics["seeds"] == figures.n == len(SEEDS)
        level = f"{figures.level:.2%}"
        assert (
            data.tags["paired_db"] == f"{figures.delta:+.2f} [{figures.ci_low:+.2f}, {figures.ci_high:+.2f}] at {level}"
        )
        assert steps(client, parents[arm["arm_id"]], "paired_delta_db") == [30]
    assert parents["a1"].data.tags["verdict"] == "better"

    stopped = parents["a3"].data
    assert (stopped.tags["status"], stopped.tags["verdict"]) == ("stopped at step 20", "stopped")
    deltas = np.array([score(STOPPED, s, 20) - score(CONTROL, s, 20) for s in SEEDS])
    low, high = map(float, paired_interval(deltas.mean(), deltas.std(ddof=1), deltas.size, 0.95))
    assert stopped.metrics["paired_delta_db"] == pytest.approx(deltas.mean())
    assert (stopped.metrics["ci_low_db"], stopped.metrics["ci_high_db"]) == pytest.approx((low, high))
    assert stopped.metrics["ci_level_db"] == pytest.approx(0.95) and stopped.metrics["seeds"] == len(SEEDS)
    assert stopped.tags["paired_db"] == f"{deltas.mean():+.2f} [{low:+.2f}, {high:+.2f}] at 95.00%"
    assert stopped.metrics["mean_db"] == pytest.approx(np.mean([score(STOPPED, s, 20) for s in SEEDS]))
    assert steps(client, parents["a3"], "paired_delta_db") == [20]

    failed = parents["a4"].data
    assert (failed.tags["status"], failed.tags["verdict"]) == ("failed at seeds [0, 1, 2, 3]", "failed")
    assert "paired_delta_db" not in failed.metrics


def test_the_screenshot_tool_serves_the_store_with_the_arms_view_and_stops_its_server(
    searched: SimpleNamespace,
) -> None:
    spec = importlib.util.spec_from_file_location("mlflow_screenshot", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    experiment_id = searched.experiment.experiment_id
    assert tool.arms_experiment(searched.uri) == experiment_id
    with tool.mlflow_server(searched.out) as served:
        assert served.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{served}/", timeout=30) as index:
            assert b"static-files/static/js/main" in index.read()  # the UI the printed URL opens
        api = f"{served}/ajax-api/2.0/mlflow/experiments/get?experiment_id={experiment_id}"
        with urllib.request.urlopen(api, timeout=30) as response:  # what the UI reads the saved views from
            tags = {t["key"]: t["value"] for t in json.load(response)["experiment"]["tags"]}
        assert tags[SAVED_VIEW_TAG + ARMS_VIEW] == searched.experiment.tags[SAVED_VIEW_TAG + ARMS_VIEW]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{served}/health", timeout=5)
