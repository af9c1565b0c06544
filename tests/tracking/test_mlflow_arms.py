"""The MLflow side of a search's end, without Ray: what the search prints to browse its store, the saved arms view,
and every arm's parent run (control, analysed, stopped, failed) carrying its status, step series and final figures,
read back with `MlflowClient` (the API the UI reads). The search is `search_folder.build_search`'s.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from reliability_helpers import descendants, marked
from search_folder import (
    BETTER,
    CLOSE,
    CONTROL,
    ERROR,
    FAILED,
    SEEDS,
    STEPS,
    STOPPED,
    build_search,
    finish_search,
    open_tracker,
    score,
)

from tune_dfrl.paired.stats import paired_interval
from tune_dfrl.state.records import RECORD_FILES
from tune_dfrl.tracking.writer import ARMS_VIEW, RECORD, SAVED_VIEW_TAG, browse_lines, runs_url, ui_command

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mlflow_screenshot.py"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The folder, store and printed lines of the test search (`search_folder`): control, two analysed arms, one
    stopped at rung 20, one failed at every seed."""
    return build_search(tmp_path_factory.mktemp("arms") / "out")


def test_the_runs_url_names_the_experiment_and_the_runs_page_in_the_model_training_workflow() -> None:
    url = runs_url("sqlite:////tmp/out/mlflow.db", "7")
    assert url == (
        "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=tune_dfrl.arms&workflowType=machine_learning"
    )
    assert ui_command("sqlite:////tmp/out/mlflow.db") == (
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:////tmp/out/mlflow.db "
        "--host 127.0.0.1 --port 5000 --workers 1"
    )
    served = "http://mlflow.internal:8080/"
    assert ui_command(served) is None
    assert browse_lines(served, "12") == [
        "browse:  http://mlflow.internal:8080/#/experiments/12/runs?viewStateShareKey=tune_dfrl.arms"
        "&workflowType=machine_learning"
    ]


def test_the_search_ends_printing_the_ui_command_and_the_url_of_its_arms(searched: SimpleNamespace) -> None:
    *_, command, url = searched.printed.splitlines()
    assert command == (
        f"browse:  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri {searched.uri} "
        "--host 127.0.0.1 --port 5000 --workers 1"
    )
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
        level = f"Holm {figures.level:.2%}"
        assert (
            data.tags["paired_db"] == f"{figures.delta:+.2f} [{figures.ci_low:+.2f}, {figures.ci_high:+.2f}] ({level})"
        )
        assert data.tags["interval"] == level and data.metrics["at_step"] == 30
        assert data.metrics["control_mean_db"] == pytest.approx(figures.control_mean)
        assert steps(client, parents[arm["arm_id"]], "paired_delta_db") == [30]
    assert parents["a1"].data.tags["verdict"] == "better"

    stopped = parents["a3"].data
    assert (stopped.tags["status"], stopped.tags["verdict"]) == ("stopped at step 20", "stopped")
    deltas = np.array([score(STOPPED, s, 20) - score(CONTROL, s, 20) for s in SEEDS])
    low, high = map(float, paired_interval(deltas.mean(), deltas.std(ddof=1), deltas.size, 0.95))
    assert stopped.metrics["paired_delta_db"] == pytest.approx(deltas.mean())
    assert (stopped.metrics["ci_low_db"], stopped.metrics["ci_high_db"]) == pytest.approx((low, high))
    assert stopped.metrics["ci_level_db"] == pytest.approx(0.95) and stopped.metrics["seeds"] == len(SEEDS)
    assert stopped.tags["paired_db"] == f"{deltas.mean():+.2f} [{low:+.2f}, {high:+.2f}] (unadjusted 95% at step 20)"
    assert stopped.tags["interval"] == "unadjusted 95% at step 20" and stopped.metrics["at_step"] == 20
    assert stopped.metrics["control_mean_db"] == pytest.approx(np.mean([score(CONTROL, s, 20) for s in SEEDS]))
    assert stopped.tags["reason"].startswith("stopped at step 20: ") and "credibl" not in stopped.tags["reason"]
    assert stopped.metrics["mean_db"] == pytest.approx(np.mean([score(STOPPED, s, 20) for s in SEEDS]))
    assert steps(client, parents["a3"], "paired_delta_db") == [20]

    failed = parents["a4"].data
    assert (failed.tags["status"], failed.tags["verdict"]) == ("failed at seeds [0, 1, 2, 3]", "failed")
    assert failed.tags["reason"] == ERROR and "paired_delta_db" not in failed.metrics


def paired(arm: dict, step: int) -> tuple[float, float, float]:
    """Mean paired Δ against the control at `step` over every seed, and its 95% t-interval, from the scores."""
    deltas = np.array([score(arm, s, step) - score(CONTROL, s, step) for s in SEEDS])
    low, high = paired_interval(deltas.mean(), deltas.std(ddof=1), deltas.size, 0.95)
    return float(deltas.mean()), float(low), float(high)


def test_arm_runs_carry_step_series_over_the_milestones_each_reached(searched: SimpleNamespace) -> None:
    client, parents = searched.client, searched.parents
    control = client.get_metric_history(parents["c0"].info.run_id, "curve/mean_db")
    assert [m.step for m in control] == list(STEPS)
    assert [m.value for m in control] == pytest.approx([np.mean([score(CONTROL, s, t) for s in SEEDS]) for t in STEPS])
    assert not client.get_metric_history(parents["c0"].info.run_id, "curve/delta_db")
    for arm, reached in ((BETTER, STEPS), (CLOSE, STEPS), (STOPPED, (10, 20))):
        run_id = parents[arm["arm_id"]].info.run_id
        series = {
            key: client.get_metric_history(run_id, f"curve/{key}_db") for key in ("delta", "ci95_low", "ci95_high")
        }
        for key, history in series.items():
            assert [m.step for m in history] == list(reached), (arm, key)
        expected = [paired(arm, step) for step in reached]
        got = [tuple(series[k][i].value for k in ("delta", "ci95_low", "ci95_high")) for i in range(len(reached))]
        assert np.array(got) == pytest.approx(np.array(expected))
        means = client.get_metric_history(run_id, "curve/mean_db")
        assert [m.value for m in means] == pytest.approx([np.mean([score(arm, s, t) for s in SEEDS]) for t in reached])
    stopped = parents["a3"]
    assert steps(client, stopped, "curve/delta_db")[-1] == int(stopped.data.tags["stopped_at_step"]) == 20
    assert not client.get_metric_history(parents["a4"].info.run_id, "curve/mean_db")  # failed cells: dropped


def test_numeric_hyperparameters_are_numbers_in_the_arm_runs(searched: SimpleNamespace) -> None:
    for arm in (BETTER, CLOSE, STOPPED, FAILED):
        data = searched.parents[arm["arm_id"]].data
        assert float(data.params["param.f"]) == data.metrics["param.f"] == arm["params"]["f"]
        assert data.params["method"] == arm["method"]
    assert not [k for k in searched.parents["c0"].data.metrics if k.startswith("param.")]  # the control has none


def test_the_search_run_carries_its_record_report_and_verdict_table(searched: SimpleNamespace, tmp_path: Path) -> None:
    client = searched.client
    search = next(
        r for r in client.search_runs([searched.experiment.experiment_id]) if r.data.tags["tune_dfrl.role"] == "search"
    )
    record = {Path(a.path).name for a in client.list_artifacts(search.info.run_id, RECORD)}
    assert record == {name for name in RECORD_FILES if (searched.out / name).exists()} >= {"search.json", "stops.jsonl"}
    assert "report/report.html" in {a.path for a in client.list_artifacts(search.info.run_id, "report")}
    table = json.loads(Path(client.download_artifacts(search.info.run_id, "verdicts.json", str(tmp_path))).read_text())
    rows = dict(zip([row[0] for row in table["data"]], [dict(zip(table["columns"], row)) for row in table["data"]]))
    for arm, status in searched.summary.statuses.items():
        assert (rows[arm]["text"], rows[arm]["verdict"]) == (status.text, status.verdict)
    assert json.loads(search.data.tags["recommendation"])["recommended"] == searched.summary.recommendation.recommended


@pytest.mark.integration
def test_the_screenshot_tool_serves_the_store_with_the_arms_view_and_stops_its_server(
    searched: SimpleNamespace,
) -> None:
    spec = importlib.util.spec_from_file_location("mlflow_screenshot", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    experiment_id = searched.experiment.experiment_id
    assert tool.arms_experiment(searched.uri) == experiment_id
    arms = tool.arm_runs(searched.uri, experiment_id)  # the compare view's runs: the arm parents, the control first
    assert arms[0] == searched.parents["c0"].info.run_id
    assert sorted(arms) == sorted(r.info.run_id for r in searched.parents.values())
    page, query = tool.compare_url("http://127.0.0.1:1", experiment_id, arms).split("?", 1)
    assert page == "http://127.0.0.1:1/#/compare-runs"
    assert {k: json.loads(v) for k, (v,) in urllib.parse.parse_qs(query).items()} == {
        "runs": arms,
        "experiments": [experiment_id],
    }
    with tool.mlflow_server(searched.out) as served:
        assert served.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{served}/", timeout=30) as index:
            assert b"static-files/static/js/main" in index.read()  # the UI the printed URL opens
        api = f"{served}/ajax-api/2.0/mlflow/experiments/get?experiment_id={experiment_id}"
        with urllib.request.urlopen(api, timeout=30) as response:  # what the UI reads the saved views from
            tags = {t["key"]: t["value"] for t in json.load(response)["experiment"]["tags"]}
        assert tags[SAVED_VIEW_TAG + ARMS_VIEW] == searched.experiment.tags[SAVED_VIEW_TAG + ARMS_VIEW]
        # the UI server as the printed command starts it (UI_SERVER_ENV): MLflow's job runner (started with the
        # server, before it answers) and its queue consumers are not among its processes
        servers = marked("mlflow", "server", str(searched.out / "mlflow.db"))
        commands = [" ".join(psutil.Process(pid).cmdline()) for server in servers for pid in descendants(server)]
        assert servers and not [c for c in commands if "mlflow.server.jobs" in c or "huey" in c], commands
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{served}/health", timeout=5)


def test_a_finish_that_runs_again_logs_nothing_twice(searched: SimpleNamespace, tmp_path: Path) -> None:
    """A resume of a finished search reopens its runs and finishes again: the series, figures and verdict table
    stay as the first finish left them."""
    client = searched.client
    search_id = next(
        r.info.run_id
        for r in client.search_runs([searched.experiment.experiment_id])
        if r.data.tags["tune_dfrl.role"] == "search"
    )

    def logged(folder: Path) -> tuple[dict, dict]:
        metrics = {
            (arm_id, key): [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for arm_id, run in searched.parents.items()
            for key in client.get_run(run.info.run_id).data.metrics
        }
        return metrics, json.loads(Path(client.download_artifacts(search_id, "verdicts.json", str(folder))).read_text())

    before = logged(tmp_path / "before")
    summary, _ = finish_search(searched.out, open_tracker(searched.out, resume=True))
    assert summary.statuses == searched.summary.statuses
    after = logged(tmp_path / "after")
    assert after == before
    assert [step for step, _ in after[0][("c0", "curve/mean_db")]] == list(STEPS)
    assert len(after[1]["data"]) == len(summary.statuses)
