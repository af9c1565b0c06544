"""The report: reference figures on the DataFlex-RL run table, the command, exclusions, milestones, MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize
from scipy import stats

from tune_dfrl.backend import BenchmarkInfo
from tune_dfrl.report import _main, analyze, default_control, write_report
from tune_dfrl.scores import BenchmarkSet, ScoreTable, load_csv, load_results

from repo_files import DATAFLEX_CSV

MAIN_7B = {"campaign": "main", "model": "Qwen2.5-7B-Instruct"}

# The study's definitions, written out independently of tune_dfrl (data/dataflex_rl/README.md).
DOMAINS = {"math": ["math500", "aime24", "olympiadbench", "minerva_math", "gsm8k"],
           "logic": ["kk_hard", "bbh_logical_deduction", "bbh_tracking", "zebra_logic_mc"],
           "science": ["gpqa_diamond", "mmlu_pro_chemistry", "mmlu_pro_physics"]}
ITEMS = {"math500": 500, "aime24": 30, "olympiadbench": 675, "minerva_math": 272, "gsm8k": 1319, "kk_hard": 200,
         "bbh_logical_deduction": 750, "bbh_tracking": 750, "zebra_logic_mc": 500, "gpqa_diamond": 198,
         "mmlu_pro_chemistry": 500, "mmlu_pro_physics": 500}
MATH_HEAVY = DOMAINS["math"] + ["gpqa_diamond"]

# Pinned once from this implementation, cross-checked below by an independent pandas computation.
# 9 methods, no ties: Spearman = 1 - 6 sum d^2 / 720, Kendall tau = (C - D) / 36.
REFERENCE_RANK_CORRELATION = {
    "db~macro": {"spearman": 53 / 60, "kendall": 13 / 18},
    "db~item": {"spearman": 53 / 60, "kendall": 7 / 9},
    "db~math_heavy": {"spearman": -1 / 3, "kendall": -5 / 18},
}
REFERENCE_RANGE = {"db": 3.3124167601945373, "macro": 2.7923681257014508, "item": 2.1661930900871766,
                   "math_heavy": 0.8985970819304185}


@pytest.fixture(scope="module")
def dataflex_summary():
    return analyze(load_csv(DATAFLEX_CSV, filters=MAIN_7B), "baseline")


def independent_method_means() -> pd.DataFrame:
    runs = pd.read_csv(DATAFLEX_CSV)
    runs = runs[(runs.campaign == "main") & (runs.model == "Qwen2.5-7B-Instruct")]
    domain_means = pd.DataFrame({d: runs[cols].mean(axis=1) for d, cols in DOMAINS.items()})
    columns = list(ITEMS)
    per_run = pd.DataFrame({
        "method": runs["method"],
        "db": domain_means.mean(axis=1),
        "macro": runs[columns].mean(axis=1),
        "item": (runs[columns] * pd.Series(ITEMS)).sum(axis=1) / sum(ITEMS.values()),
        "math_heavy": runs[MATH_HEAVY].mean(axis=1),
        "db_without_logic": domain_means[["math", "science"]].mean(axis=1),
    })
    return per_run.groupby("method").mean()


def test_reference_rank_correlations_and_ranges(dataflex_summary):
    s = dataflex_summary
    assert s["seeds"] == [1, 2, 3] and len(s["arms"]) == 8 and not s["excluded"]
    for pair, expected in REFERENCE_RANK_CORRELATION.items():
        assert s["rank_correlation"][pair]["spearman"] == pytest.approx(expected["spearman"], abs=1e-12)
        assert s["rank_correlation"][pair]["kendall"] == pytest.approx(expected["kendall"], abs=1e-12)
    assert s["range"] == pytest.approx(REFERENCE_RANGE, abs=1e-9)

    means = independent_method_means()
    for other in ("macro", "item", "math_heavy"):
        assert s["rank_correlation"][f"db~{other}"]["spearman"] == pytest.approx(stats.spearmanr(means["db"], means[other]).statistic)
        assert s["rank_correlation"][f"db~{other}"]["kendall"] == pytest.approx(stats.kendalltau(means["db"], means[other]).statistic)
    for name in REFERENCE_RANGE:
        assert s["range"][name] == pytest.approx(means[name].max() - means[name].min())
        assert s["means"][name] == pytest.approx(means[name].to_dict())
    lodo_logic = s["robustness"]["db"]["lodo"]["left_out"]["logic"]
    assert lodo_logic["kendall"] == pytest.approx(stats.kendalltau(means["db"], means["db_without_logic"]).statistic)


def test_dataflex_table_verdicts_and_recommendation(dataflex_summary):
    s = dataflex_summary
    assert set(s["verdicts"].values()) == {"inconclusive"}  # 3 seeds, 8 arms: nothing credible on db
    rec = s["recommendation"]
    assert (rec["recommended"], rec["is_control"], rec["point_best"]) == ("baseline", True, "gfpo")
    assert rec["seeds_needed"] == max(a["db"]["seeds_needed"] for a in s["arms"].values())
    assert s["winner_flip_rate"]["db"] is None  # k = 3 of 3 seeds is no subset
    assert any("winner-flip rate needs more than flip_k=3 seeds" in n for n in s["notes"])
    assert sum(s["prob_best"]["db"].values()) == pytest.approx(1.0)


def test_command_on_dataflex_table(tmp_path):
    out = tmp_path / "report"
    command = [sys.executable, "-m", "tune_dfrl.report", f"runs={DATAFLEX_CSV}", "control=baseline",
               "filter.campaign=main", "filter.model=Qwen2.5-7B-Instruct", "aggregations=[db,macro,item,math_heavy]", f"out={out}"]
    env = {**os.environ, "COLUMNS": "160"}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "recommended: baseline" in done.stdout and "db~math_heavy" in done.stdout
    assert {p.name for p in out.iterdir()} == {"summary.json", "report.md", "report.html", "forest.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["control"] == "baseline" and summary["seeds"] == [1, 2, 3]
    for arm in summary["arms"].values():
        for name in ("db", "macro", "item", "math_heavy"):
            assert {"mean", "delta", "ci_low", "ci_high", "p_holm", "verdict"} <= set(arm[name])
    assert set(summary["rank_correlation"]) >= {"db~macro", "db~item", "db~math_heavy"}
    assert {"recommendation", "range", "prob_best", "winner_flip_rate"} <= set(summary)
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and 'src="forest.png"' not in page and "http" not in page
    assert "| gfpo |" in (out / "report.md").read_text()
    assert (out / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="add filters to select one slice"):
        _main(report_config([f"runs={DATAFLEX_CSV}", f"out={tmp_path}"]))
    with pytest.raises(ValueError, match="exactly one source"):
        _main(report_config([f"out={tmp_path}"]))
    with pytest.raises(ValueError, match="filter.campaign=nope matches no row|filter campaign=nope matches no row"):
        _main(report_config([f"runs={DATAFLEX_CSV}", "+filter.campaign=nope", f"out={tmp_path}"]))


# ------------------------------------------------------------------------- synthetic tables

BENCH = BenchmarkSet((BenchmarkInfo("m1", "math", 100), BenchmarkInfo("m2", "math", 300), BenchmarkInfo("l1", "logic", 100)))


def table_of(runs: dict[tuple[str, int], float], noise: float = 0.5, step: int | None = None) -> ScoreTable:
    """Benchmark i of run (arm, seed) scores level + 10 cos(seed) (shared seed effect) + noise * sin(3 seed + 7 i + len(arm))."""
    rows = [{"arm": arm, "seed": seed, "benchmark": b, "score": level + 10 * np.cos(seed) + noise * np.sin(3 * seed + 7 * i + len(arm))}
            for (arm, seed), level in runs.items() for i, b in enumerate(BENCH.names)]
    frame = pd.DataFrame(rows)
    return ScoreTable(frame if step is None else frame.assign(step=step), BENCH)


def test_credible_winner_is_selected_by_lower_bound_and_summary_is_deterministic():
    seeds = range(1, 9)
    runs = {("baseline", s): 50.0 for s in seeds}
    runs |= {("steady", s): 53.0 + 0.2 * (s % 2) for s in seeds}
    runs |= {("lucky", s): 50.0 + (12.0 if s == 1 else 0.5) for s in seeds}
    table = table_of(runs, noise=0.1)
    summary = analyze(table, "baseline", seed=0)
    assert summary["verdicts"] == {"lucky": "inconclusive", "steady": "better"}
    assert summary["recommendation"]["recommended"] == "steady"
    assert summary["ranking"]["db"][0] == "steady"
    assert summary == analyze(table, "baseline", seed=0)
    again = analyze(table, "baseline", seed=1)
    assert again["arms"]["steady"]["db"]["bca_low"] != summary["arms"]["steady"]["db"]["bca_low"]
    assert again["verdicts"] == summary["verdicts"]  # the bootstrap seed never changes a verdict
    assert summary["winner_flip_rate"]["db"] is not None and summary["flip_subsets"] == 56  # C(8, 3)
    json.dumps(summary)  # JSON-safe


def test_exclusions_are_reported_not_silent():
    runs = {("baseline", s): 50.0 + s for s in (1, 2, 3, 4)}
    runs |= {("a", s): 51.0 + s for s in (1, 2, 3, 4, 9)}  # seed 9 has no control run
    runs |= {("lonely", s): 60.0 for s in (7, 8)}  # no seed in common
    runs |= {("single", s): 60.0 for s in (1, 8)}  # one seed in common
    summary = analyze(table_of(runs), "baseline")
    assert list(summary["arms"]) == ["a"]
    assert "shares 0 seed(s) with the control 'baseline'" in summary["excluded"]["lonely"]
    assert "shares 1 seed(s)" in summary["excluded"]["single"] and "at least 2" in summary["excluded"]["single"]
    assert "arm 'a': seeds [9] have no control run and are ignored" in summary["notes"]
    assert summary["arms"]["a"]["db"]["n"] == 4
    with pytest.raises(ValueError, match="no arm shares at least 2 seeds with the control 'baseline'"):
        analyze(table_of({k: v for k, v in runs.items() if k[0] in ("baseline", "lonely")}), "baseline")


def _two_benchmark_table(logic_chars: float) -> ScoreTable:
    """math scores differ between arms; logic runs answer nothing correct with `logic_chars` characters."""
    bench = BenchmarkSet((BenchmarkInfo("m1", "math", 100), BenchmarkInfo("l1", "logic", 100)))
    rows = [row for arm, level in [("baseline", 40.0), ("a", 42.0)] for s in range(1, 6) for row in (
        {"arm": arm, "seed": s, "benchmark": "m1", "score": level + np.sin(s + len(arm)), "length_chars": 3.0},
        {"arm": arm, "seed": s, "benchmark": "l1", "score": 0.0, "length_chars": logic_chars})]
    return ScoreTable(pd.DataFrame(rows), bench)


def test_leave_out_subset_with_an_undefined_score_is_skipped_with_a_note():
    """Leaving out math leaves only logic, whose responses are empty: efficiency there is 0/0."""
    summary = analyze(_two_benchmark_table(logic_chars=0.0), "baseline")
    efficiency = summary["robustness"]["efficiency"]
    assert list(efficiency["lobo"]["left_out"]) == ["l1"] and list(efficiency["lodo"]["left_out"]) == ["logic"]
    assert any("robustness of 'efficiency' without 'm1' skipped" in n and "10 run(s)" in n for n in summary["notes"])
    assert any("without 'math' skipped" in n for n in summary["notes"])
    assert summary["verdicts"]["a"] == "better"
    assert list(analyze(_two_benchmark_table(logic_chars=2.0), "baseline")["robustness"]["efficiency"]["lobo"]["left_out"]) == ["m1", "l1"]


def test_an_aggregation_undefined_on_the_full_table_is_a_clear_error():
    table = _two_benchmark_table(logic_chars=0.0)
    table.frame.loc[table.frame["benchmark"] == "m1", "length_chars"] = 0.0
    with pytest.raises(ValueError, match=r"aggregation 'efficiency' is undefined \(NaN\) for 10 run\(s\).*aggregations="):
        analyze(table, "baseline")
    assert analyze(table, "baseline", aggregations=["db"])["verdicts"] == {"a": "better"}


def test_analyze_bad_arguments():
    table = table_of({(arm, s): 50.0 for arm in ("baseline", "a") for s in (1, 2, 3)})
    with pytest.raises(ValueError, match="control 'basline' is not an arm of the score table; arms: a, baseline"):
        analyze(table, "basline")
    with pytest.raises(ValueError, match="unknown aggregations"):
        analyze(table, "baseline", aggregations=["db", "median"])
    with pytest.raises(ValueError, match="needs response lengths"):
        analyze(table, "baseline", aggregations=["efficiency"])
    assert default_control(table) == "baseline"


def write_search_output(out: Path, steps=(10, 20, 30), seeds=(1, 2, 3, 4)) -> dict:
    """A search output directory: results.jsonl (+ benchmarks.json) with lengths; returns the db values."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps([{"name": b.name, "domain": b.domain, "items": b.items} for b in BENCH.benchmarks]))
    lines, db = [], {}
    for arm_id, label, gain in [("c0", "baseline", 0.0), ("a1", "band", 1.0), ("a2", "soft", -0.5)]:
        for seed in seeds:
            for step in steps:
                acc = {b: 40.0 + step / 10 * gain + seed + i for i, b in enumerate(BENCH.names)}
                db[(label, seed, step)] = ((acc["m1"] + acc["m2"]) / 2 + acc["l1"]) / 2
                lines.append(json.dumps({"arm_id": arm_id, "label": label, "method": label, "seed": seed, "step": step,
                                         "accuracy": acc, "length_chars": {b: 200.0 + seed for b in BENCH.names}}))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    return db


def test_milestones_give_learning_curves_and_efficiency(tmp_path):
    db = write_search_output(tmp_path / "search")
    table = load_results(tmp_path / "search")
    summary = analyze(table, default_control(table))
    assert summary["aggregations"] == ["db", "macro", "item", "efficiency"]
    assert summary["arm_steps"] == {"band": 30, "baseline": 30, "soft": 30}
    assert summary["arms"]["band"]["db"]["delta"] == pytest.approx(db[("band", 1, 30)] - db[("baseline", 1, 30)])  # final step
    curve = {p["step"]: p for p in summary["curves"]["band"]}
    assert sorted(curve) == [10, 20, 30]
    assert curve[20]["delta"] == pytest.approx(2.0) and curve[20]["n"] == 4  # gain 1 * step / 10
    assert summary["arms"]["band"]["efficiency"]["mean"] > summary["means"]["efficiency"]["baseline"]
    paths = write_report(summary, table, tmp_path / "report")
    assert paths["curves"].exists() and (tmp_path / "report" / "report.html").read_text().count("data:image/png;base64,") == 2


def report_config(overrides: list[str]):
    with initialize(version_base="1.3", config_path="../tune_dfrl/conf"):
        return compose("report", overrides=overrides)


def test_experiment_source_logs_the_report_to_the_search_run(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("search-y", artifact_location=(tmp_path / "artifacts").as_uri())
    search = client.create_run(experiment, tags={"tune_dfrl.role": "search"})
    client.log_dict(search.info.run_id, [{"name": b.name, "domain": b.domain, "items": b.items} for b in BENCH.benchmarks], "benchmarks.json")
    for arm_id, label, gain in [("c0", "baseline", 0.0), ("a1", "band", 2.0)]:
        for seed in (1, 2, 3):
            run = client.create_run(experiment, tags={"tune_dfrl.role": "seed", "arm_id": arm_id, "arm_label": label,
                                                      "method": label, "seed": str(seed)})
            for i, name in enumerate(BENCH.names):
                client.log_metric(run.info.run_id, f"acc/{name}", 40.0 + gain + seed * (1 + 0.1 * i), step=50)
    cfg = report_config(["experiment=search-y", f"mlflow.tracking_uri={uri}", f"out={tmp_path / 'out'}"])
    _main(cfg)
    logged = {a.path for a in client.list_artifacts(search.info.run_id, "report")}
    assert logged == {"report/summary.json", "report/report.md", "report/report.html", "report/forest.png"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["control"] == "baseline" and summary["arms"]["band"]["db"]["delta"] == pytest.approx(2.0)
    assert summary["arm_info"]["band"]["arm_id"] == "a1"
