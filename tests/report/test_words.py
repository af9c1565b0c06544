"""What a user reads says exactly what was measured: names (not ids) where a person reads, the rung rule's words (never
"credibly") for a stop, every interval with its kind and level, stopped arms in both pictures, "unsettled" (not
"open") after the last look, and the caveats of the small-sample tables.

Reads the surfaces of a small search written by the search's own callbacks and finish (`search_folder.build_search`:
report.md / report.html, summary.json, the printed text, the MLflow store), without Ray."""

from __future__ import annotations

import json
import re
import shutil
from types import SimpleNamespace

import pytest
from search_folder import ARMS, STOPPED, build_search, open_tracker

from tune_dfrl.paired.rungs import ArmDecision, RungDecision, RungRule, decide, name_leader
from tune_dfrl.report import render
from tune_dfrl.report.analysis import analyze_search
from tune_dfrl.report.schema import Summary
from tune_dfrl.report.scores import load_results
from tune_dfrl.state.records import SearchRecord

IDS = {arm["arm_id"] for arm in ARMS}
AN_ID = re.compile(
    "|".join([rf"\b{arm_id}\b" for arm_id in sorted(IDS)] + [r"\b[0-9a-f]{12}\b"])
)  # a test arm id or a 12-hex arm id
MACHINE_TAGS = {"arm_id", "control_id", "canonical"}  # ids as ids: machine fields
KIND = re.compile(r"^(?:Holm \d+\.\d\d%|unadjusted \d+% at step \d+|sequential boundary \d+\.\d\d%)$")
STOP_REASON = "80% interval of Δ against the leader [-5.2, -3.1] over 4 seeds, below 0"


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return build_search(tmp_path_factory.mktemp("words") / "fixed")


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    return build_search(tmp_path_factory.mktemp("words") / "sequential", sequential=True)


def arms_table(markdown: str) -> tuple[list[str], list[list[str]], str]:
    """The report's arms table: (columns, rows, the text after it up to the next section)."""
    section = markdown.split("## Arms", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    columns, rows = lines[0].strip("| ").split(" | "), [line[2:-2].split(" | ") for line in lines[1:]]
    return columns, rows, section.split(lines[-1], 1)[1]


def test_a_rung_stop_says_what_the_rule_saw_never_credibly_and_names_no_id() -> None:
    arms = {"lead": {0: 6.0, 1: 6.0, 2: 6.0}, "worse": {0: 4.0, 1: 3.0, 2: 2.0}}
    stop = decide("worse", arms, RungRule(mode="race"))
    kept = decide("worse", arms, RungRule(mode="race", confidence=0.99))
    for decision in (stop, kept):
        assert "credibl" not in decision.reason and "'lead'" not in decision.reason and decision.leader == "lead"
    assert stop.reason.endswith(", below 0") and kept.reason.endswith(", not below 0")
    assert name_leader(stop.reason, "topk(f=0.9)") == (
        "80% interval of Δ against the leader topk(f=0.9) [-4.09, -1.91] over 3 seeds, below 0"
    )


def test_the_report_and_the_printed_text_name_arms_and_use_no_verdict_word_for_a_stop(fixed: SimpleNamespace) -> None:
    report = fixed.out / "report"
    page = re.sub(r'src="data:[^"]*"', "", (report / "report.html").read_text())  # the figures' base64 left out
    for text in ((report / "report.md").read_text(), page, fixed.printed):
        assert "credibl" not in text
        found = AN_ID.search(text)
        assert found is None, text[max(0, found.start() - 80) : found.end() + 80]
    assert "not analysed" not in (report / "report.md").read_text()
    assert "its Δ at the stop step is shown unadjusted, no verdict" in (report / "report.md").read_text()


@pytest.mark.parametrize(
    "reason",
    [
        STOP_REASON,
        "credibly worse than the leader: 80% interval of (candidate - 'a1') over 4 seeds [-5.2, -3.1]",  # older words
    ],
)
def test_a_stop_names_its_leader_in_the_report_from_the_id_in_stops_jsonl(
    fixed: SimpleNamespace, tmp_path, reason: str
) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(fixed.out, folder)
    stops = [json.loads(line) for line in (folder / "stops.jsonl").read_text().splitlines()]
    assert stops[0]["leader"] == "a1"  # the machine field keeps the id
    stops[0]["reason"] = reason
    (folder / "stops.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stops))
    summary = analyze_search(load_results(folder), SearchRecord.read(folder))
    why = summary.statuses[STOPPED["label"]].reason
    assert why == "80% interval of Δ against the leader topk(f=0.9) [-5.2, -3.1] over 4 seeds, below 0"
    row = next(r for r in render.status_table(summary).rows if r[0] == STOPPED["label"])
    assert row[-1] == f"stopped at step 20: {why}"


def test_every_interval_carries_its_kind_and_level_and_a_stopped_row_its_step(fixed: SimpleNamespace) -> None:
    columns, rows, after = arms_table((fixed.out / "report" / "report.md").read_text())
    assert columns[3:8] == [
        "Δ on db",
        "interval",
        "interval kind (level)",
        "mean",
        "control mean (same step, same seeds)",
    ]
    kinds = {row[0]: row[5] for row in rows if row[4]}
    assert kinds and all(KIND.match(kind) for kind in kinds.values()), kinds
    assert kinds[STOPPED["label"]] == "unadjusted 95% at step 20"
    assert kinds["topk(f=0.9)"].startswith("Holm ")
    assert after.count("Holm (at the row's level):") == 1 and after.count("unadjusted 95% at step N:") == 1
    summary = Summary.from_json((fixed.out / "summary.json").read_text())
    stopped = summary.statuses[STOPPED["label"]]
    assert stopped.step == 20 and stopped.interval == "unadjusted"
    assert stopped.mean - stopped.control_mean == pytest.approx(stopped.delta)  # the control at the same step
    analysed = summary.statuses["topk(f=0.9)"]
    assert analysed.mean - analysed.control_mean == pytest.approx(analysed.delta)


def test_caveats_of_few_arms_equivalence_power_and_selection_are_stated(fixed: SimpleNamespace) -> None:
    text = (fixed.out / "report" / "report.md").read_text()
    assert "Rests on 3 arms (the control and the 2 arm(s) analysed at the last step; the 1 stopped arm(s)" in text
    assert "Spearman ρ can only be +1, +0.5, -0.5, -1" in text
    assert "1/3 = 33% is what a probability of being best reads" in text
    assert "Equivalence is not in the Holm family: TOST at α = 0.05 per arm" in text
    assert "| Holm CI (level) | t 95% CI (unadjusted) | TOST 90% CI (unadjusted) |" in text
    assert "take the SD observed at the arm's seeds as known (an estimate" in text
    assert "selected on these same seeds" in text and "`confirm.screen=`" in text
    head = text.split("## Arms")[0]
    assert "(better than the control)" in head and "Holm-adjusted 98.75% interval lies above 0" in head


def test_both_pictures_draw_the_stopped_arm(fixed: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = Summary.from_json((fixed.out / "summary.json").read_text())
    marked = f"{STOPPED['label']} (stopped at step 20)"
    figures = []
    monkeypatch.setattr(render.plt, "close", figures.append)
    render.forest_plot(summary, fixed.out / "forest_test.png")
    render.learning_curves(summary, fixed.out / "curves_test.png")
    forest, curves = figures
    rows = [label.get_text() for label in forest.axes[0].get_yticklabels()]
    assert marked in rows and {"topk(f=0.9)", "topk(f=0.6)"} <= set(rows)
    [ax] = curves.axes
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert marked in legend and "topk(f=0.9)" in legend
    line = next(line for line in ax.lines if line.get_label() == marked)
    assert list(line.get_xdata()) == [10, 20]  # up to where it stopped
    assert marked in render.forest_rows(summary) and marked in render.curve_lines(summary)


def test_mlflow_names_arms_finishes_stopped_seeds_and_names_the_levels(fixed: SimpleNamespace) -> None:
    client, runs = fixed.client, fixed.client.search_runs([fixed.experiment.experiment_id], max_results=200)
    for run in runs:
        tags = run.data.tags
        for key, value in tags.items():
            if key in MACHINE_TAGS or key.startswith("mlflow."):
                continue
            assert not AN_ID.search(value), (run.info.run_name, key, value)
            assert "credibl" not in value, (key, value)
        if tags["tune_dfrl.role"] == "seed":
            arm = next(a for a in ARMS if a["arm_id"] == tags["arm_id"])
            assert {k: json.loads(v) for k, v in run.data.params.items() if k.startswith("param.")} == {
                f"param.{k}": v for k, v in arm["params"].items()
            }
            assert run.data.params["method"] == arm["method"] and run.data.params["seed"] == tags["seed"]
            if arm is STOPPED:
                assert run.info.status == "FINISHED" and tags["stopped"] == "true"
    stopped = fixed.parents[STOPPED["arm_id"]]
    assert stopped.data.tags["interval"] == "unadjusted 95% at step 20"
    assert stopped.data.tags["reason"].startswith("stopped at step 20: ")
    held = set(client.get_run(stopped.info.run_id).data.metrics)
    assert {"curve/ci95_low_db", "curve/ci95_high_db"} <= held and "curve/ci_low_db" not in held
    figures = re.compile(r"[-+]?\d+\.\d+")  # the figures a person reads in a tag: rounded
    for run in fixed.parents.values():
        for key in ("paired_db", "reason", "interval"):
            assert all(len(f.split(".")[1]) <= 2 for f in figures.findall(run.data.tags.get(key, ""))), key


def test_the_rung_tag_names_the_leader(tmp_path) -> None:
    searched = build_search(tmp_path / "rung")
    tracker = open_tracker(searched.out, resume=True)
    decided = ArmDecision("a3", 20, (0, 1, 2, 3), RungDecision(False, STOP_REASON, "a1"))
    tracker.note_decision(decided)
    tag = searched.client.get_run(searched.parents["a3"].info.run_id).data.tags["rung20"]
    assert tag == "stop: 80% interval of Δ against the leader topk(f=0.9) [-5.2, -3.1] over 4 seeds, below 0"
    tracker.close("FINISHED")


def test_after_the_last_look_an_open_arm_is_unsettled(sequential: SimpleNamespace, tmp_path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(sequential.out, folder)
    record = SearchRecord.read(folder)
    assert record.looks["finished"]
    last = record.looks["looks"][-1]
    arm_id = next(iter(last["states"]))
    last["states"][arm_id]["status"] = "open"  # as if the last look had left it open
    summary = analyze_search(load_results(folder), record)
    label = record.looks["labels"][arm_id]
    assert summary.statuses[label].verdict == "unsettled" and summary.verdicts[label] == "unsettled"
    section = render.sequential_section(record.looks)
    looks, verdicts = section.tables[0], section.tables[-1]
    assert f"{label}: unsettled" in looks.rows[-1][4] and f"{label}: open" not in looks.rows[-1][4]
    assert next(row for row in verdicts.rows if row[0] == label)[1] == "unsettled"
    rows = render.status_table(summary).rows
    assert next(r for r in rows if r[0] == label)[5].startswith("sequential boundary ")
