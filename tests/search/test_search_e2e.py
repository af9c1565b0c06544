"""End to end on the embedded backend: a real local Ray cluster, Optuna, MLflow on sqlite, tiny budgets.

Plus the bad-input contract: each error is clear, comes before any trial, and leaves the disk as it was.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import optuna
import pytest
from mlflow import MlflowClient
from reliability_helpers import FIRST_OF_DOMAIN, TINY, records
from search_helpers import search_cfg

from tune_dfrl.search.cli import OPTUNA_STUDY, SearchError, plan_search, run_search

EVALUATED = list(FIRST_OF_DOMAIN.values())  # TINY's benchmarks: the first of each domain (db needs all three)


@pytest.fixture(scope="module")
def cache(embedded_cache: Path) -> str:
    return f"backend.cache_dir={embedded_cache}"


@pytest.fixture(scope="module")
def searched(ray_session, cache: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """difffilter_band, 3 arms x 3 seeds; a near-zero-width rung interval and eta=100 so that arms do stop."""
    out = tmp_path_factory.mktemp("e2e") / "out"
    cfg = search_cfg(
        "space=difffilter_band",
        "seeds=3",
        "arms=3",
        *TINY,
        cache,
        "scheduler.eta=100",
        "scheduler.confidence=0.05",
        f"out={out}",
    )
    run_search(plan_search(cfg))
    return out


@pytest.mark.integration
def test_control_and_arms_ran_on_identical_seed_lists_with_one_thread_each(searched: Path) -> None:
    written = records(searched / "results.jsonl")
    seeds: dict[str, set[int]] = {}
    for r in written:
        seeds.setdefault(r["arm_id"], set()).add(r["seed"])
    assert len(seeds) >= 2 and all(s == {0, 1, 2} for s in seeds.values())
    assert {r["threads"] for r in written} == {1}  # cpus_per_trial=1 -> exactly one torch thread
    assert set(written[0]["accuracy"]) == set(EVALUATED)


@pytest.mark.integration
def test_duplicate_canonical_arms_ran_once(searched: Path) -> None:
    trial_dirs = [p.name for p in (searched / "ray" / "tune").iterdir() if p.is_dir() and "-seed" in p.name]
    cells = Counter(name.rsplit("-", 1)[0] for name in trial_dirs)  # <arm_id>-seed<k>
    assert cells and set(cells.values()) == {1}
    study = optuna.load_study(study_name=OPTUNA_STUDY, storage=f"sqlite:///{searched / 'optuna.db'}")
    assert len(study.trials) >= len({r["arm_id"] for r in records(searched / "results.jsonl")}) - 1


@pytest.mark.integration
def test_paired_scheduler_stopped_whole_arms_and_optuna_got_paired_deltas(searched: Path) -> None:
    written = records(searched / "results.jsonl")
    last: dict[str, dict[int, int]] = {}
    score = {(r["arm_id"], r["seed"], r["step"]): r["aggregates"]["db"] for r in written}
    for r in written:
        last.setdefault(r["arm_id"], {})[r["seed"]] = max(r["step"], last.get(r["arm_id"], {}).get(r["seed"], 0))
    ends = {arm: set(by_seed.values()) for arm, by_seed in last.items()}
    assert all(len(steps) == 1 for steps in ends.values()), ends  # never single seeds
    stopped = {arm for arm, steps in ends.items() if steps == {2}}
    finished = {arm for arm, steps in ends.items() if steps == {4}}
    assert stopped and finished and stopped | finished == set(ends)
    control = json.loads((searched / "search.json").read_text())["control"]["arm_id"]
    assert control in finished

    def mean_delta(arm: str, step: int) -> float:
        return float(np.mean([score[(arm, s, step)] - score[(control, s, step)] for s in (0, 1, 2)]))

    study = optuna.load_study(study_name=OPTUNA_STUDY, storage=f"sqlite:///{searched / 'optuna.db'}")
    summary = json.loads((searched / "summary.json").read_text())
    told = 0
    for arm in set(ends) - {control}:
        expected = mean_delta(arm, 4) if arm in finished else mean_delta(arm, 2)
        matching = [
            t
            for t in study.trials
            if (t.value is not None and np.isclose(t.value, expected))
            or (
                t.state == optuna.trial.TrialState.PRUNED and np.isclose(t.intermediate_values.get(2, np.nan), expected)
            )
        ]
        assert matching, f"no Optuna trial holds the paired delta {expected} of arm {arm}"
        told += len(matching)
    assert told >= len(ends) - 1
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in study.trials)
    assert set(summary["stopped"]) == {r["label"] for r in written if r["arm_id"] in stopped}


@pytest.mark.integration
def test_mlflow_and_report(searched: Path) -> None:
    summary = json.loads((searched / "summary.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and summary["primary"] == "db" and summary["recommendation"]["recommended"]
    # The full report needs an arm that ran its whole budget; if the scheduler stopped them all, the control is kept.
    assert (searched / "report" / "summary.json").exists() == bool(summary["arms"])
    client = MlflowClient(f"sqlite:///{searched / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"tune_dfrl/{searched.name}")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    parents = {r.info.run_id: r for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    children = [r for r in runs if r.data.tags["tune_dfrl.role"] == "seed"]
    assert len(children) == 3 * len(parents)
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] in parents
        assert [m.step for m in client.get_metric_history(child.info.run_id, f"acc/{EVALUATED[0]}")][0] == 2
    for parent in parents.values():
        label = parent.data.tags["arm_label"]
        if label in summary["arms"]:
            figures = summary["arms"][label]["db"]
            assert parent.data.metrics["paired_delta_db"] == pytest.approx(figures["delta"])
            assert parent.data.metrics["ci_low_db"] == pytest.approx(figures["ci_low"])
            assert parent.data.tags["verdict"] == figures["verdict"]
        elif label in summary["stopped"]:
            assert parent.data.tags["verdict"] == "stopped"
        else:
            assert label == summary["control"] and parent.data.tags["is_control"] == "true"


# ------------------------------------------------------------------------------------------- bad input


def refuses(out: Path, *overrides: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_search(search_cfg(*overrides, f"out={out}"))
    assert not out.exists()


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    refuses(
        out,
        *TINY,
        "seeds=0",
        match=r"seeds=0: allowed: auto, a count >= 2 or a list of at least 2 distinct integers >= 0",
    )
    refuses(
        out, *TINY, "seeds=[1,1]", match=r"seeds=\[1, 1\]: allowed: auto, a count >= 2 or a list of at least 2 distinct"
    )
    refuses(out, *TINY, "seeds=auto", "sequential.start=1", match=r"sequential.start=1: allowed: an integer >= 2")
    refuses(
        out,
        *TINY,
        "seeds=auto",
        "sequential.max=3",
        match=r"sequential.max=3: allowed: an integer >= sequential.start=4",
    )
    refuses(out, *TINY, "arms=0", match="arms=0: allowed: an integer >= 1")
    refuses(out, "steps=3", "milestone_every=5", match=r"'steps' \(3\) is smaller than 'milestone_every' \(5\)")
    refuses(
        out,
        *TINY,
        "space.methods.difffilter.search.low=[0.6,0.9]",
        "space.methods.difffilter.search.high=[0.1,0.5]",
        match="impossible search range for difffilter",
    )
    refuses(
        out,
        *TINY,
        "scheduler.name=hyperband",
        match="scheduler.name='hyperband': allowed: one of paired_asha, race, asha, fifo",
    )
    refuses(out, *TINY, "+backend.learning_rate=0.1", match=r"unknown embedded recipe key\(s\) \['learning_rate'\]")


def test_a_non_empty_output_directory_is_left_untouched(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SearchError, match="is not empty; choose another out=DIR"):
        plan_search(search_cfg(*TINY, f"out={tmp_path}"))
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"] and (tmp_path / "summary.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("space=difffilter", "Available options in 'space':\n\tall_mixers"),
        ("seeds=0", "error: seeds=0: allowed: auto, a count >= 2"),
    ],
)
def test_cli_errors_exit_non_zero_with_the_reason(tmp_path: Path, override: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.search", override, f"out={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and message in done.stderr
    assert not (tmp_path / "out").exists()
