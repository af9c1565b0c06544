"""Screen cheap, confirm on the target, end to end on the embedded backend: a screen at 2 steps, then a confirm of its
top 2 arms at 4 steps on other seeds (a real local Ray cluster, MLflow on sqlite); then a resume of the finished
confirm, which replays its fixed arms and trains nothing."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient
from reliability_helpers import TINY, records, tree_bytes
from search_helpers import search_cfg

from tune_dfrl.search.cli import plan_search, run_search

pytestmark = pytest.mark.integration

SHORT = tuple(o for o in TINY if not o.startswith("steps="))  # the recipe without its step budget


def searched(*overrides: str) -> str:
    """Plan and run a search; returns what it printed (also echoed, for the docs)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run_search(plan_search(search_cfg(*overrides)))
    print(printed.getvalue())
    return printed.getvalue()


@pytest.fixture(scope="module")
def stages(ray_session, embedded_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("confirm")
    screen, out = root / "screen", root / "confirm"
    common = (
        *SHORT,
        f"backend.cache_dir={embedded_cache}",
        "space=difffilter_band",
        "scheduler.name=fifo",  # every arm runs to the end: a fixed number of candidates
        f"control_cache={root / 'controls'}",
    )
    screen_printed = searched(*common, "steps=2", "seeds=2", "arms=3", f"out={screen}")
    before = tree_bytes(screen)
    confirm_printed = searched(*common, "steps=4", "seeds=2", f"confirm.screen={screen}", "confirm.top=2", f"out={out}")
    after = tree_bytes(screen)
    results = records(out / "results.jsonl")
    resumed = searched(
        *common, "steps=4", "seeds=2", f"confirm.screen={screen}", "confirm.top=2", f"out={out}", "resume=true"
    )
    return SimpleNamespace(
        screen=screen,
        out=out,
        screen_printed=screen_printed,
        printed=confirm_printed,
        resumed=resumed,
        before=before,
        after=after,
        results=results,
    )


def test_the_confirm_trained_the_control_and_the_top_2_on_disjoint_seeds(stages: SimpleNamespace) -> None:
    screen_summary = json.loads((stages.screen / "summary.json").read_text())
    analysed = {label: s for label, s in screen_summary["statuses"].items() if s["status"] == "analysed"}
    top = sorted(analysed, key=lambda label: (-analysed[label]["delta"], label))[:2]
    plan = json.loads((stages.out / "search.json").read_text())
    control = plan["control"]["arm_id"]
    cells = {(r["arm_id"], r["seed"]) for r in stages.results}
    arms = {arm for arm, _ in cells}
    assert len(arms) == 3 and control in arms
    assert [a["label"] for a in plan["confirm"]["arms"].values()] == top
    assert set(plan["confirm"]["arms"]) == arms - {control}
    screen_seeds = {r["seed"] for r in records(stages.screen / "results.jsonl")}
    assert screen_seeds == {0, 1} and {seed for _, seed in cells} == {2, 3}
    assert len(cells) == 6 and all(r["step"] in (2, 4) for r in stages.results)
    assert not (stages.out / "optuna.db").exists()  # no study: the arms are fixed
    summary = json.loads((stages.out / "summary.json").read_text())
    assert summary["holm_family"] == 2 and summary["seeds"] == [2, 3]


def test_confirm_files_hold_both_stages_of_the_same_arms(stages: SimpleNamespace) -> None:
    record = json.loads((stages.out / "confirm.json").read_text())
    screen_summary = json.loads((stages.screen / "summary.json").read_text())
    summary = json.loads((stages.out / "summary.json").read_text())
    screen_by_id = {s["arm_id"]: s for s in screen_summary["statuses"].values()}
    by_id = {s["arm_id"]: s for s in summary["statuses"].values()}
    assert len(record["arms"]) == 2 and record["pick"] == record["arms"][0]["label"]
    for arm in record["arms"]:
        assert arm["screen"]["delta"] == pytest.approx(screen_by_id[arm["screen_arm_id"]]["delta"])
        assert arm["confirm"]["delta"] == pytest.approx(by_id[arm["arm_id"]]["delta"])
        assert arm["shrinkage"] == pytest.approx(arm["confirm"]["delta"] - arm["screen"]["delta"])
    costs = record["costs"]
    assert costs["screen"]["cell_steps"] == 4 * 2 * 2 and costs["confirm"]["cell_steps"] == 3 * 2 * 4
    assert costs["one_stage"]["cell_steps"] == (3 + 1) * 2 * 4
    assert costs["screen"]["seconds"] > 0 and costs["confirm"]["seconds"] > 0
    report = stages.out / "report"
    for name in ("confirm.md", "transfer.md", "transfer.json", "transfer.png", "report.md"):
        assert (report / name).is_file(), name
    transfer = json.loads((report / "transfer.json").read_text())
    assert sorted(transfer["arms"]) == sorted([transfer["control"], *(a["label"] for a in record["arms"])])
    page = (report / "confirm.md").read_text()
    assert all(a["label"] in page for a in record["arms"]) and "one-stage search" in page
    assert "transfer check:" in stages.printed and "shrinkage" in stages.printed


def test_mlflow_links_the_stages(stages: SimpleNamespace) -> None:
    record = json.loads((stages.out / "confirm.json").read_text())
    client = MlflowClient(f"sqlite:///{stages.out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune_dfrl/{stages.out.name}")
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    search = next(r for r in runs if r.data.tags["tune_dfrl.role"] == "search")
    assert search.data.tags["confirm.screen_folder"] == str(stages.screen)
    assert search.data.tags["confirm.screen_experiment"] == f"tune_dfrl/{stages.screen.name}"
    arms = {r.data.tags["arm_id"]: r for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    for arm in record["arms"]:
        tags = arms[arm["arm_id"]].data.tags
        assert tags["screen_arm_id"] == arm["screen_arm_id"]
        assert float(tags["screen_delta"]) == pytest.approx(arm["screen"]["delta"], abs=1e-4)


def test_the_screen_is_left_byte_identical_and_a_resume_trains_nothing(stages: SimpleNamespace) -> None:
    assert stages.after == stages.before
    assert tree_bytes(stages.screen) == stages.before
    assert records(stages.out / "results.jsonl") == stages.results
    assert "confirm:" in stages.resumed and not (stages.out / "optuna.db").exists()
