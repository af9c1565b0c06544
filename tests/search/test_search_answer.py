"""One search, one answer: the search's summary.json, a re-render of its folder, a re-render from its MLflow
experiment, its report and its MLflow runs agree on every arm's status, verdict, level, Δ and interval and on the
recommendation; for fixed seeds and for seeds=auto (where the sequential looks are the answer). The searches are
`search_folder.build_search`'s (control, two analysed arms, one stopped at a rung, one failed at every seed).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_module
from search_folder import BETTER, CLOSE, CONTROL, EQUIVALENT, FAILED, STOPPED, answer, build_search

from tune_dfrl.config.settings import register_settings
from tune_dfrl.report.analysis import analyze_search
from tune_dfrl.report.cli import report_from_config
from tune_dfrl.report.schema import Summary
from tune_dfrl.report.scores import load_results
from tune_dfrl.state.records import FAILURES, PLAN, STOPS, SearchRecord


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return build_search(tmp_path_factory.mktemp("answer") / "fixed")


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return build_search(tmp_path_factory.mktemp("answer") / "auto", sequential=True)


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def analysed_without(searched: Path, folder: Path, *arms: dict) -> Summary:
    """`analyze_search` of a copy of the search in `folder` whose results.jsonl lacks every milestone of `arms`."""
    for name in (PLAN, FAILURES, STOPS, "benchmarks.json"):
        shutil.copy(searched / name, folder / name)
    dropped = {arm["arm_id"] for arm in arms}
    lines = [
        line
        for line in (searched / "results.jsonl").read_text().splitlines()
        if json.loads(line)["arm_id"] not in dropped
    ]
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    return analyze_search(load_results(folder), SearchRecord.read(folder))


def report_config(overrides: list[str]):
    register_settings()
    with initialize_config_module(config_module="tune_dfrl.conf", version_base="1.3"):
        return compose("report", overrides=overrides)


@pytest.mark.parametrize("search", ["fixed", "auto"])
def test_a_rerender_of_the_folder_gives_the_searchs_answer(search: str, request, tmp_path: Path) -> None:
    searched = request.getfixturevalue(search)
    own = (searched.out / "report" / "report.md").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.report", f"runs={searched.out}", f"out={tmp_path / 'elsewhere'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    again = summary_of(tmp_path / "elsewhere")
    assert answer(again) == answer(summary_of(searched.out))
    assert again["statuses"][FAILED["label"]]["status"] == "failed" and again["rerender"] == ""
    assert (searched.out / "report" / "report.md").read_bytes() == own
    assert not (searched.out / "rerender").exists()


@pytest.mark.parametrize("search", ["fixed", "auto"])
def test_a_rerender_from_mlflow_gives_the_searchs_answer(search: str, request, tmp_path: Path) -> None:
    searched = request.getfixturevalue(search)
    cfg = report_config([f"experiment={searched.name}", f"mlflow.tracking_uri={searched.uri}", f"out={tmp_path}"])
    report_from_config(cfg)
    assert answer(summary_of(tmp_path)) == answer(summary_of(searched.out))
    logged = {a.path for a in searched.client.list_artifacts(_search_run(searched))}
    assert "rerender" in logged and "report" in logged  # the search's own report is left as it was


def _search_run(searched: SimpleNamespace) -> str:
    runs = searched.client.search_runs([searched.experiment.experiment_id], "tags.`tune_dfrl.role` = 'search'")
    return runs[0].info.run_id


def test_a_rerender_with_other_options_is_labelled_and_leaves_the_searchs_report(
    fixed: SimpleNamespace, tmp_path: Path
) -> None:
    # on a copy of the search: the module's search stays as build_search wrote it, for the tests that read it
    searched = Path(shutil.copytree(fixed.out, tmp_path / fixed.out.name))
    own = {p.name: p.read_bytes() for p in (searched / "report").iterdir()}
    report_from_config(report_config([f"runs={searched}", "delta=0.5"]), frozenset({"runs", "delta"}))
    again = summary_of(searched / "rerender")
    assert again["equivalence_margin"] == 0.5 and "delta=0.5 (the search: 1.0)" in again["rerender"]
    assert "delta=0.5 (the search: 1.0)" in (searched / "rerender" / "report.md").read_text()
    assert {p.name: p.read_bytes() for p in (searched / "report").iterdir()} == own
    assert summary_of(searched)["rerender"] == ""
    assert not (fixed.out / "rerender").exists()


def test_a_fully_failed_arm_counts_in_the_holm_family_and_is_named(fixed: SimpleNamespace) -> None:
    summary = summary_of(fixed.out)
    searched = [arm for arm, s in summary["statuses"].items() if s["status"] not in ("control", "control-equivalent")]
    assert summary["holm_family"] == len(searched) == 4
    failed = summary["statuses"][FAILED["label"]]
    assert (failed["text"], failed["verdict"]) == ("failed at seeds [0, 1, 2, 3]", "failed")
    best = min((f["db"] for f in summary["arms"].values()), key=lambda f: f["p"])
    assert best["p_holm"] == pytest.approx(min(1.0, 4 * best["p"]))  # m = 4: the failed arm is a hypothesis
    assert best["level"] == pytest.approx(1 - 0.05 / 4)
    report = (fixed.out / "report" / "report.md").read_text()
    assert f"Holm family: 4 arm(s): {', '.join(searched)}" in report
    assert f"| {FAILED['label']} | failed at seeds [0, 1, 2, 3] | failed |" in report


def test_a_suggestion_that_acts_as_the_control_has_its_status_everywhere_and_no_place_in_the_family(
    fixed: SimpleNamespace, tmp_path: Path
) -> None:
    summary, label = summary_of(fixed.out), EQUIVALENT["label"]
    status = summary["statuses"][label]
    assert (status["status"], status["text"], status["verdict"], status["arm_id"]) == (
        "control-equivalent",
        "control-equivalent (never trained)",
        "control-equivalent",
        CONTROL["arm_id"],
    )
    assert "suggested 2 time(s)" in status["reason"] and status["seeds"] == [] and status["delta"] is None
    assert summary["verdicts"][label] == "control-equivalent" and summary["holm_family"] == 4
    assert label not in summary["arms"] and label not in summary["series"]
    row = f"| {label} | control-equivalent (never trained) | control-equivalent |"
    assert row in (fixed.out / "report" / "report.md").read_text()
    assert label in fixed.printed and "control-equivalent" in fixed.printed
    assert fixed.parents[CONTROL["arm_id"]].data.tags["control-equivalent"] == label  # no run of its own
    assert len(fixed.parents) == 5
    table = json.loads(
        Path(fixed.client.download_artifacts(_search_run(fixed), "verdicts.json", str(tmp_path))).read_text()
    )
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert (rows[label]["status"], rows[label]["verdict"]) == ("control-equivalent", "control-equivalent")
    assert "control_equivalent.jsonl" in {
        Path(a.path).name for a in fixed.client.list_artifacts(_search_run(fixed), "record")
    }


def test_an_arm_failed_before_its_first_milestone_stays_in_the_family(fixed: SimpleNamespace, tmp_path: Path) -> None:
    summary = analysed_without(fixed.out, tmp_path, FAILED)
    assert summary.holm_family == 4 and summary.statuses[FAILED["label"]].failed_seeds == [0, 1, 2, 3]
    assert any(FAILED["label"] in note and "failed after 2 attempt(s)" in note for note in summary.notes)
    before = summary_of(fixed.out)["arms"]
    assert {arm: by["db"].p_holm for arm, by in summary.arms.items()} == {
        a: f["db"]["p_holm"] for a, f in before.items()
    }


def test_under_seeds_auto_the_looks_are_the_answer_everywhere(auto: SimpleNamespace) -> None:
    summary, history = summary_of(auto.out), json.loads((auto.out / "sequential.json").read_text())
    states = history["looks"][-1]["states"]
    assert summary["rule"] == "sequential"
    for status in summary["statuses"].values():
        if status["status"] == "analysed":
            state = states[status["arm_id"]]
            assert (status["verdict"], status["delta"], status["ci_low"]) == (
                state["status"],
                state["mean"],
                state["low"],
            )
    recommended = history["labels"][history["recommended"]]
    assert summary["recommendation"]["recommended"] == recommended
    assert f"recommended (sequential looks): {recommended}" in auto.printed
    report = (auto.out / "report" / "report.md").read_text()
    assert f"**Recommended by the sequential looks: `{recommended}`**" in report
    assert "## Verdicts (descriptive fixed-sample analysis)" in report and "Descriptive only" in report
    run = auto.client.get_run(_search_run(auto))
    assert (
        json.loads(run.data.tags["recommendation"]) == summary["recommendation"]
        and run.data.tags["rule"] == "sequential"
    )
    for arm_id, parent in auto.parents.items():
        status = next(s for s in summary["statuses"].values() if s["arm_id"] == arm_id)
        assert (parent.data.tags["status"], parent.data.tags["verdict"]) == (status["text"], status["verdict"])
    disagree = [
        a
        for a, s in summary["statuses"].items()
        if a in summary["arms"] and s["verdict"] != summary["arms"][a]["db"]["verdict"]
    ]
    assert disagree  # the test search has an arm the fixed-sample analysis judges otherwise than the looks


def test_a_search_without_an_arm_at_the_full_budget_keeps_the_control_with_every_status(
    fixed: SimpleNamespace, tmp_path: Path
) -> None:
    summary = analysed_without(fixed.out, tmp_path, BETTER, CLOSE)
    assert summary.recommendation.is_control and not summary.arms
    assert {arm: s.status for arm, s in summary.statuses.items()} == {
        CONTROL["label"]: "control",
        STOPPED["label"]: "stopped",
        FAILED["label"]: "failed",
    }
    assert summary.holm_family == 2 and summary.stopped and summary.failed == {FAILED["label"]: [0, 1, 2, 3]}
    report_from_config(report_config([f"runs={tmp_path}"]), frozenset({"runs"}))
    assert answer(summary_of(tmp_path / "rerender")) == answer(summary.to_dict())
