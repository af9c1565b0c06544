"""seeds=auto end to end on the embedded backend (real Ray, Optuna, MLflow on sqlite, tiny budgets), and a sequential
search killed with -9 after its first look, then resumed through the CLI.

Both searches start every arm and the control on seeds 0, 1 and hand seeds 2, 3 to the arms still open at the
first look (start=2, batch=2, max=4). The futility bound is made loose (upper 99% bound, margin 0) so that an arm
left running by the scheduler stays open at the first look: the second batch then certainly runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from reliability_helpers import TINY, records, resume_search, search_command, short_tmp, start, stop, wait_for
from search_folder import answer
from search_helpers import search_cfg

from tune_dfrl.search.cli import OPTUNA_STUDY, plan_search, run_search
from tune_dfrl.tune.trial import cell_dir

pytestmark = pytest.mark.integration  # searches on the session's Ray cluster and in a subprocess

SEQUENTIAL = (
    "seeds=auto",
    "sequential.start=2",
    "sequential.batch=2",
    "sequential.max=4",
    "sequential.futility_confidence=0.99",
    "sequential.futility_margin=0",
    *TINY,
)


def seeds_by_arm(lines: list[dict]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for r in lines:
        out.setdefault(r["arm_id"], set()).add(r["seed"])
    return out


@pytest.fixture(scope="module")
def searched(ray_session, embedded_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequential")
    cfg = search_cfg(
        "space=difffilter_band",
        "arms=2",
        *SEQUENTIAL,
        f"backend.cache_dir={embedded_cache}",
        f"control_cache={root / 'control-cache'}",
        f"out={root / 'out'}",
    )
    run_search(plan_search(cfg))
    return root / "out"


def test_looks_handed_new_seeds_to_the_open_arms_and_the_control(searched: Path) -> None:
    history = json.loads((searched / "sequential.json").read_text())
    looks, control = history["looks"], json.loads((searched / "search.json").read_text())["control"]["arm_id"]
    assert [k["seeds"] for k in looks] == [2, 4] and history["finished"] and looks[-1]["next_seeds"] == []
    assert looks[0]["next_seeds"] == [2, 3]
    opened = [arm for arm, state in looks[0]["states"].items() if state["status"] == "open"]
    assert opened  # the scheduler left an arm running and the loose futility bound kept it open
    ran = seeds_by_arm(records(searched / "results.jsonl"))
    assert ran[control] == {0, 1, 2, 3}  # the control got the new seeds too: paired
    for arm, seeds in ran.items():
        assert seeds == ({0, 1, 2, 3} if arm in opened or arm == control else {0, 1})
        assert seeds == set(looks[-1]["handed"][arm])
    for arm in looks[0]["out"]:  # stopped by the scheduler within the starting seeds: no verdict, no new seed
        assert looks[0]["out"][arm] == "stopped by the scheduler"
    for arm in opened:  # the second look used all four paired seeds
        assert looks[1]["states"][arm]["seeds"] == 4
    cached = sorted(p.name for p in (searched.parent / "control-cache").rglob("seed*.jsonl"))
    assert cached == [f"seed{s}.jsonl" for s in range(4)]  # the control cache stored the new control seeds too


def test_after_the_last_look_no_arm_reads_open(searched: Path) -> None:
    """An arm still open at the last look is "unsettled": no more seeds are coming, so "open" would promise more."""
    history = json.loads((searched / "sequential.json").read_text())
    left_open = {arm for arm, state in history["looks"][-1]["states"].items() if state["status"] == "open"}
    summary = json.loads((searched / "summary.json").read_text())
    verdicts = {status["arm_id"]: status["verdict"] for status in summary["statuses"].values()}
    assert history["finished"] and "open" not in verdicts.values()
    assert all(verdicts[arm] == "unsettled" for arm in left_open)
    assert "| open |" not in (searched / "report" / "report.md").read_text()


def test_optuna_was_told_once_per_arm_on_the_starting_seeds(searched: Path) -> None:
    study = optuna.load_study(study_name=OPTUNA_STUDY, storage=f"sqlite:///{searched / 'optuna.db'}")
    history = json.loads((searched / "sequential.json").read_text())
    lines = records(searched / "results.jsonl")
    control = json.loads((searched / "search.json").read_text())["control"]["arm_id"]
    final = {(r["arm_id"], r["seed"]): r["aggregates"]["db"] for r in lines if r["final"]}
    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    for arm, _state in history["looks"][0]["states"].items():  # arms that ran their budget on the starting seeds
        starting = (final[(arm, 0)] - final[(control, 0)] + final[(arm, 1)] - final[(control, 1)]) / 2
        assert any(t.value == pytest.approx(starting) for t in completed), arm
    assert len(study.trials) >= len(history["looks"][0]["states"]) + len(history["looks"][0]["out"])  # + duplicates


def test_report_and_mlflow_show_the_looks(searched: Path, tmp_path: Path) -> None:
    report = (searched / "report" / "report.md").read_text()
    assert "## Sequential seeds" in report and "| look | seeds | boundary z |" in report
    again = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.report", f"runs={searched}", f"out={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "## Sequential seeds" in (tmp_path / "report.md").read_text()  # re-rendered too
    summary = json.loads((searched / "summary.json").read_text())
    assert answer(json.loads((tmp_path / "summary.json").read_text())) == answer(summary)  # the search's answer
    assert summary["rule"] == "sequential"
    history = json.loads((searched / "sequential.json").read_text())
    assert summary["recommendation"]["recommended"] == history["labels"].get(history["recommended"], summary["control"])
    assert summary["sequential"]["looks"] == json.loads((searched / "sequential.json").read_text())["looks"]
    client = MlflowClient(f"sqlite:///{searched / 'mlflow.db'}")
    runs = client.search_runs(
        [client.get_experiment_by_name(f"tune_dfrl/{searched.name}").experiment_id], max_results=500
    )
    parents = {r.info.run_id: r.data.tags["arm_id"] for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    seed_runs = Counter(
        (r.data.tags["arm_id"], int(r.data.tags["seed"]), parents[r.data.tags["mlflow.parentRunId"]])
        for r in runs
        if r.data.tags["tune_dfrl.role"] == "seed"
    )
    ran = {
        (arm, seed, arm) for arm, seeds in seeds_by_arm(records(searched / "results.jsonl")).items() for seed in seeds
    }
    assert set(seed_runs) == ran and set(seed_runs.values()) == {1}  # every new seed a child run of its arm's run
    search = next(r for r in runs if r.data.tags["tune_dfrl.role"] == "search")
    assert "sequential.json" in [a.path for a in client.list_artifacts(search.info.run_id)]
    looked = [r for r in runs if r.data.tags["tune_dfrl.role"] == "arm" and "look1" in r.data.tags]
    assert looked and all(
        r.data.tags["look1"].split(" at ")[0] in ("open", "better", "worse", "futile") for r in looked
    )


# ------------------------------------------------------------------------------ killed after a look, resumed


@pytest.fixture(scope="module")
def resumed(embedded_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("sequential-resume")
    out, ray_tmp = root / "out", short_tmp("rt-seq-")
    command = search_command(
        "space=difffilter_band",
        "arms=1",
        *SEQUENTIAL,
        "scheduler.name=fifo",
        f"backend.cache_dir={embedded_cache}",
        f"out={out}",
        "control_cache=null",
        "ray.num_cpus=2",
    )
    env = {"RAY_TMPDIR": str(ray_tmp)}
    driver = start(command, cwd=root, env=env, log=root / "interrupted.log")
    try:
        wait_for(lambda: driver.poll() is not None or (out / "sequential.json").exists(), 900, "the first look")
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        stop(driver, marker=str(ray_tmp), sig=signal.SIGKILL)
    assert driver.returncode == -signal.SIGKILL, (root / "interrupted.log").read_text()[-3000:]
    lines = records(out / "results.jsonl")
    looks = len(json.loads((out / "sequential.json").read_text())["looks"])  # written after the look's log line
    before = {
        "lines": lines,
        "finished": {(r["arm_id"], r["seed"]) for r in lines if r["final"]},
        "looks": looks,
        "stamps": {
            (r["arm_id"], r["seed"]): (cell_dir(out / "cells", r["arm_id"], r["seed"]) / "checkpoint" / "trial.pt")
            .stat()
            .st_mtime_ns
            for r in lines
            if r["final"]
        },
    }
    resume_search(command, root, env, ray_tmp, 900)
    return out, before


def test_a_killed_sequential_search_resumes_with_its_looks_and_trains_no_cell_twice(resumed: tuple[Path, dict]) -> None:
    out, before = resumed
    assert before["looks"] == 1 and len(before["finished"]) < 8  # killed after the first look, before the end
    after = records(out / "results.jsonl")
    assert after[: len(before["lines"])] == before["lines"]
    assert set(Counter((r["arm_id"], r["seed"], r["step"]) for r in after).values()) == {1}  # each milestone once
    for arm, seed in before["finished"]:
        assert not [r for r in after if (r["arm_id"], r["seed"]) == (arm, seed) and r["attempt"] > 0]
        assert (cell_dir(out / "cells", arm, seed) / "checkpoint" / "trial.pt").stat().st_mtime_ns == before["stamps"][
            (arm, seed)
        ]
    history = json.loads((out / "sequential.json").read_text())
    assert [k["number"] for k in history["looks"]] == [1, 2] and history["finished"]
    ran = seeds_by_arm(after)
    assert all(seeds == {0, 1, 2, 3} for seeds in ran.values()) and len(ran) == 2  # fifo, open at look 1: paired to 4
    assert all(r["final"] for r in after if r["step"] == 4) and len([r for r in after if r["final"]]) == 8
    assert "## Sequential seeds" in (out / "report" / "report.md").read_text()
