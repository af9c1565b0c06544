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
from hydra import compose, initialize_config_module
from mlflow_helpers import SearchStore
from repo_files import DATAFLEX_CSV
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tune_dfrl.backends.benchmarks import BenchmarkInfo, BenchmarkSet
from tune_dfrl.config.settings import register_settings
from tune_dfrl.report import render
from tune_dfrl.report.analysis import analyze, default_control, write_report
from tune_dfrl.report.cli import report_from_config
from tune_dfrl.report.scores import ScoreTable, load_csv, load_results

MAIN_7B = {"campaign": "main", "model": "Qwen2.5-7B-Instruct"}

# The study's definitions, written out independently of tune_dfrl (data/dataflex_rl/README.md).
DOMAINS = {
    "math": ["math500", "aime24", "olympiadbench", "minerva_math", "gsm8k"],
    "logic": ["kk_hard", "bbh_logical_deduction", "bbh_tracking", "zebra_logic_mc"],
    "science": ["gpqa_diamond", "mmlu_pro_chemistry", "mmlu_pro_physics"],
}
ITEMS = {
    "math500": 500,
    "aime24": 30,
    "olympiadbench": 675,
    "minerva_math": 272,
    "gsm8k": 1319,
    "kk_hard": 200,
    "bbh_logical_deduction": 750,
    "bbh_tracking": 750,
    "zebra_logic_mc": 500,
    "gpqa_diamond": 198,
    "mmlu_pro_chemistry": 500,
    "mmlu_pro_physics": 500,
}
MATH_HEAVY = DOMAINS["math"] + ["gpqa_diamond"]

# Pinned once from this implementation, cross-checked below by an independent pandas computation.
# 9 methods, no ties: Spearman = 1 - 6 sum d^2 / 720, Kendall tau = (C - D) / 36.
REFERENCE_RANK_CORRELATION = {
    "db~macro": {"spearman": 53 / 60, "kendall": 13 / 18},
    "db~item": {"spearman": 53 / 60, "kendall": 7 / 9},
    "db~math_heavy": {"spearman": -1 / 3, "kendall": -5 / 18},
}
REFERENCE_RANGE = {
    "db": 3.3124167601945373,
    "macro": 2.7923681257014508,
    "item": 2.1661930900871766,
    "math_heavy": 0.8985970819304185,
}


@pytest.fixture(scope="module")
def dataflex_summary():
    return analyze(load_csv(DATAFLEX_CSV, filters=MAIN_7B), "baseline")


def independent_method_means() -> pd.DataFrame:
    runs = pd.read_csv(DATAFLEX_CSV)
    runs = runs[(runs.campaign == "main") & (runs.model == "Qwen2.5-7B-Instruct")]
    domain_means = pd.DataFrame({d: runs[cols].mean(axis=1) for d, cols in DOMAINS.items()})
    columns = list(ITEMS)
    per_run = pd.DataFrame(
        {
            "method": runs["method"],
            "db": domain_means.mean(axis=1),
            "macro": runs[columns].mean(axis=1),
            "item": (runs[columns] * pd.Series(ITEMS)).sum(axis=1) / sum(ITEMS.values()),
            "math_heavy": runs[MATH_HEAVY].mean(axis=1),
            "db_without_logic": domain_means[["math", "science"]].mean(axis=1),
        }
    )
    return per_run.groupby("method").mean()


def independent_db_by_seed() -> pd.DataFrame:
    """db score [method x seed] of the main 7B slice, from the study's definition."""
    runs = pd.read_csv(DATAFLEX_CSV).query("campaign == 'main' and model == 'Qwen2.5-7B-Instruct'")
    db = pd.DataFrame({d: runs[cols].mean(axis=1) for d, cols in DOMAINS.items()}).mean(axis=1)
    return runs.assign(db=db).pivot(index="method", columns="seed", values="db")


def test_reference_rank_correlations_and_ranges(dataflex_summary):
    s = dataflex_summary
    assert s.seeds == [1, 2, 3] and len(s.arms) == 8 and not s.excluded
    for pair, expected in REFERENCE_RANK_CORRELATION.items():
        assert s.rank_correlation[pair].spearman == pytest.approx(expected["spearman"], abs=1e-12)
        assert s.rank_correlation[pair].kendall == pytest.approx(expected["kendall"], abs=1e-12)
    assert s.range == pytest.approx(REFERENCE_RANGE, abs=1e-9)

    means = independent_method_means()
    for other in ("macro", "item", "math_heavy"):
        assert s.rank_correlation[f"db~{other}"].spearman == pytest.approx(
            stats.spearmanr(means["db"], means[other]).statistic
        )
        assert s.rank_correlation[f"db~{other}"].kendall == pytest.approx(
            stats.kendalltau(means["db"], means[other]).statistic
        )
    for name in REFERENCE_RANGE:
        assert s.range[name] == pytest.approx(means[name].max() - means[name].min())
        assert s.means[name] == pytest.approx(means[name].to_dict())
    lodo_logic = s.robustness["db"]["lodo"].left_out["logic"]
    assert lodo_logic.kendall == pytest.approx(stats.kendalltau(means["db"], means["db_without_logic"]).statistic)


def test_dataflex_table_verdicts_and_recommendation(dataflex_summary):
    s = dataflex_summary
    assert set(s.verdicts.values()) == {"inconclusive"}  # 3 seeds, 8 arms: nothing credible on db
    rec = s.recommendation
    assert (rec.recommended, rec.is_control, rec.point_best) == ("baseline", True, ["gfpo"])
    for figure in ("seeds_to_detect", "seeds_for_equivalence"):  # every arm is still open
        assert getattr(rec, figure) == max(getattr(a["db"], figure) for a in s.arms.values())
    assert rec.seeds_for_equivalence < rec.seeds_to_detect  # TOST at alpha vs the t-test at alpha / 8
    assert sum(s.prob_best["db"].values()) == pytest.approx(1.0)


def test_winner_flip_rate_adapts_its_subset_size_to_three_seeds(dataflex_summary, tmp_path):
    """3 seeds cannot hold a subset of flip_k=3: subsets of 2 (all C(3, 2) = 3), said in the notes and the table."""
    s = dataflex_summary
    assert (s.flip_k, s.flip_k_used, s.flip_subsets) == (3, 2, 3)
    db = independent_db_by_seed()
    winner = db.mean(axis=1).idxmax()
    pairs = [[1, 2], [1, 3], [2, 3]]
    flipped = np.mean([db[pair].mean(axis=1).idxmax() != winner for pair in pairs])  # no ties in these data
    assert s.winner_flip_rate["db"] == pytest.approx(flipped)
    assert (
        "winner-flip rate over subsets of 2 of the 3 seeds shared by all arms (flip_k=3 needs more than 3 seeds)"
        in s.notes
    )
    table = load_csv(DATAFLEX_CSV, filters=MAIN_7B)
    write_report(s, table, tmp_path)
    assert "| winner-flip rate (subsets of 2 seeds, 3 subsets) |" in (tmp_path / "report.md").read_text()


def test_leave_out_verdicts_use_the_main_holm_family():
    """Without gsm8k, gfpo's item-weighted p is 0.0062: Holm p 0.049 in a family of 8, but 0.247 in the search's 40."""
    table = load_csv(DATAFLEX_CSV, filters=MAIN_7B)
    alone = analyze(table, "baseline", aggregations=["item"]).robustness["item"]["lobo"].left_out["gsm8k"]
    assert alone.verdict_changes == {"gfpo": "inconclusive -> better"}
    in_search = analyze(table, "baseline", aggregations=["item"], family_size=40)
    assert in_search.holm_family == 40 and in_search.arms["gfpo"]["item"].level == pytest.approx(1 - 0.05 / 40)
    assert "gfpo" not in in_search.robustness["item"]["lobo"].left_out["gsm8k"].verdict_changes
    runs = pd.read_csv(DATAFLEX_CSV).query("campaign == 'main' and model == 'Qwen2.5-7B-Instruct'")
    kept = {b: n for b, n in ITEMS.items() if b != "gsm8k"}
    item = runs.assign(score=(runs[list(kept)] * pd.Series(kept)).sum(axis=1) / sum(kept.values()))
    by_seed = item.pivot(index="method", columns="seed", values="score")
    p = [stats.ttest_rel(by_seed.loc[a], by_seed.loc["baseline"]).pvalue for a in by_seed.index if a != "baseline"]
    assert multipletests(p + [1.0] * 32, method="holm")[1][
        by_seed.index.drop("baseline").get_loc("gfpo")
    ] == pytest.approx(0.2465, abs=1e-4)


def test_command_on_dataflex_table(tmp_path):
    out = tmp_path / "report"
    command = [
        sys.executable,
        "-m",
        "tune_dfrl.report",
        f"runs={DATAFLEX_CSV}",
        "control=baseline",
        "filter.campaign=main",
        "filter.model=Qwen2.5-7B-Instruct",
        "aggregations=[db,macro,item,math_heavy]",
        f"out={out}",
    ]
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
        report_from_config(report_config([f"runs={DATAFLEX_CSV}", f"out={tmp_path}"]))
    with pytest.raises(ValueError, match="exactly one source"):
        report_from_config(report_config([f"out={tmp_path}"]))
    with pytest.raises(ValueError, match="filter.campaign=nope matches no row|filter campaign=nope matches no row"):
        report_from_config(report_config([f"runs={DATAFLEX_CSV}", "+filter.campaign=nope", f"out={tmp_path}"]))


def test_bad_report_input_is_a_clear_error_naming_it(tmp_path):
    """Malformed benchmark metadata, a long CSV whose score column is misspelt, aggregations=db without brackets."""
    csv = tmp_path / "long.csv"
    csv.write_text("arm,seed,benchmark,scroe\nbaseline,1,m1,50\n")
    bad_yaml = tmp_path / "bench.yaml"
    bad_yaml.write_text("benchmarks: [{name: m1, domain: math, items: 100}\n")
    with pytest.raises(ValueError, match=r"bench.yaml is not valid YAML/JSON: .*line"):
        report_from_config(report_config([f"runs={csv}", f"benchmarks={bad_yaml}", f"out={tmp_path / 'out'}"]))
    bad_yaml.write_text("benchmarks: {m1: math}\n")
    with pytest.raises(ValueError, match=r"bench.yaml: 'benchmarks' must be a list of \{name, domain, items\} records"):
        report_from_config(report_config([f"runs={csv}", f"benchmarks={bad_yaml}", f"out={tmp_path / 'out'}"]))
    bad_yaml.write_text("benchmarks: [{name: m1, domain: math, items: many}]\n")
    with pytest.raises(ValueError, match=r"benchmark 'm1': item count must be a positive integer; got 'many'"):
        report_from_config(report_config([f"runs={csv}", f"benchmarks={bad_yaml}", f"out={tmp_path / 'out'}"]))
    bad_yaml.write_text(json.dumps([{"name": b.name, "domain": b.domain, "items": b.items} for b in BENCH.benchmarks]))
    with pytest.raises(ValueError, match=r"no 'score' column \(is 'scroe' meant to be 'score'\?\)"):
        report_from_config(report_config([f"runs={csv}", f"benchmarks={bad_yaml}", f"out={tmp_path / 'out'}"]))
    with pytest.raises(ValueError, match=r"aggregations=db is one string, not a list; write aggregations=\[db\]"):
        report_from_config(report_config([f"runs={csv}", "aggregations=db", f"out={tmp_path / 'out'}"]))
    assert not (tmp_path / "out").exists()


def test_command_bad_input_exits_2_with_an_error_line(tmp_path):
    bad_yaml = tmp_path / "bench.yaml"
    bad_yaml.write_text("benchmarks: [name: x\n")
    for option in (f"benchmarks={bad_yaml}", "aggregations=db", "aggregations=[db,efficiency]"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tune_dfrl.report",
                f"runs={DATAFLEX_CSV}",
                "filter.campaign=main",
                "filter.model=Qwen2.5-7B-Instruct",
                option,
                f"out={tmp_path / 'out'}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr, (
            done.stderr
        )
    assert (
        "'efficiency' needs response lengths" in done.stderr and "allowed: db, macro, item, math_heavy\n" in done.stderr
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- synthetic tables

BENCH = BenchmarkSet(
    (BenchmarkInfo("m1", "math", 100), BenchmarkInfo("m2", "math", 300), BenchmarkInfo("l1", "logic", 100))
)


def table_of(runs: dict[tuple[str, int], float], noise: float = 0.5, step: int | None = None) -> ScoreTable:
    """Benchmark i of run (arm, seed) scores level + 10 cos(seed) (shared seed effect) + noise * sin(3 seed + 7 i + len(arm))."""
    rows = [
        {
            "arm": arm,
            "seed": seed,
            "benchmark": b,
            "score": level + 10 * np.cos(seed) + noise * np.sin(3 * seed + 7 * i + len(arm)),
        }
        for (arm, seed), level in runs.items()
        for i, b in enumerate(BENCH.names)
    ]
    frame = pd.DataFrame(rows)
    return ScoreTable(frame if step is None else frame.assign(step=step), BENCH)


def test_credible_winner_is_selected_by_lower_bound_and_summary_is_deterministic():
    seeds = range(1, 9)
    runs = {("baseline", s): 50.0 for s in seeds}
    runs |= {("steady", s): 53.0 + 0.2 * (s % 2) for s in seeds}
    runs |= {("lucky", s): 50.0 + (12.0 if s == 1 else 0.5) for s in seeds}
    table = table_of(runs, noise=0.1)
    summary = analyze(table, "baseline", seed=0)
    assert summary.verdicts == {"lucky": "inconclusive", "steady": "better"}
    assert summary.recommendation.recommended == "steady"
    assert summary.ranking["db"][0] == "steady"
    assert summary == analyze(table, "baseline", seed=0)
    again = analyze(table, "baseline", seed=1)
    assert again.arms["steady"]["db"].bca_low != summary.arms["steady"]["db"].bca_low
    assert again.verdicts == summary.verdicts  # the bootstrap seed never changes a verdict
    assert summary.winner_flip_rate["db"] is not None and summary.flip_subsets == 56  # C(8, 3)
    json.dumps(summary.to_dict())  # JSON-safe


def test_exclusions_are_reported_not_silent():
    runs = {("baseline", s): 50.0 + s for s in (1, 2, 3, 4)}
    runs |= {("a", s): 51.0 + s for s in (1, 2, 3, 4, 9)}  # seed 9 has no control run
    runs |= {("lonely", s): 60.0 for s in (7, 8)}  # no seed in common
    runs |= {("single", s): 60.0 for s in (1, 8)}  # one seed in common
    summary = analyze(table_of(runs), "baseline")
    assert list(summary.arms) == ["a"]
    assert "shares 0 seed(s) with the control 'baseline'" in summary.excluded["lonely"]
    assert "shares 1 seed(s)" in summary.excluded["single"] and "at least 2" in summary.excluded["single"]
    assert "arm 'a': seeds [9] have no control run and are ignored" in summary.notes
    assert summary.arms["a"]["db"].n == 4
    with pytest.raises(ValueError, match="no arm shares at least 2 seeds with the control 'baseline'"):
        analyze(table_of({k: v for k, v in runs.items() if k[0] in ("baseline", "lonely")}), "baseline")


def test_an_excluded_arm_stays_in_the_holm_family():
    """DESIGN §7: the family is the search. 'single' (one paired seed) is excluded from the comparison, not from the family."""
    seeds = range(1, 7)
    runs = {("baseline", s): 50.0 for s in seeds} | {("a", s): 53.0 + 0.2 * (s % 2) for s in seeds}
    runs |= {("b", s): 50.0 + 0.3 * (s % 3) for s in seeds} | {("single", 1): 55.0}
    summary = analyze(table_of(runs, noise=0.1), "baseline")
    assert set(summary.arms) == {"a", "b"} and "single" in summary.excluded
    assert summary.holm_family == 3
    assert summary.arms["a"]["db"].level == pytest.approx(1 - 0.05 / 3)  # first Holm step of 3, not of 2
    assert summary.arms["a"]["db"].common_level == pytest.approx(1 - 0.05 / 3)
    assert any("excluded arm 'single'" in n and "stays in the Holm family" in n for n in summary.notes)
    assert (
        analyze(table_of(runs, noise=0.1), "baseline", family_size=5).holm_family == 5
    )  # a search's own count wins when larger


def test_mean_and_delta_name_the_seeds_they_use(tmp_path):
    """'a' lacks control seed 2: its mean and Δ both use seeds 1, 3, 4, and the report says so."""
    runs = {("baseline", s): 50.0 + 3 * s for s in (1, 2, 3, 4)}
    runs |= {("a", s): 51.0 + 3 * s + 0.1 * s * s for s in (1, 3, 4)}
    table = table_of(runs)
    summary = analyze(table, "baseline")
    a = summary.arms["a"]["db"]
    assert a.seeds == [1, 3, 4] and a.n == 3
    db = table.frame.assign(w=table.frame["benchmark"].map({"m1": 0.25, "m2": 0.25, "l1": 0.5}))
    db = db.assign(s=db["score"] * db["w"]).groupby(["arm", "seed"])["s"].sum()
    assert a.mean == pytest.approx(db["a"].mean()) and a.control_mean == pytest.approx(db["baseline"][[1, 3, 4]].mean())
    assert a.mean - a.control_mean == pytest.approx(a.delta)
    assert summary.control_mean["db"] == pytest.approx(db["baseline"].mean())  # the control row: all its seeds
    write_report(summary, table, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert (
        "| a | " in text and " | 3 (1, 3, 4) | " in text and "`seeds`: the seeds an arm's mean and Δ both use" in text
    )


def test_forest_plot_spans_and_draws_the_intervals_that_decide(tmp_path, monkeypatch):
    """Holm-adjusted (thin) and 90% TOST (thick) intervals drawn and inside the axes; the BCa interval is not drawn."""
    seeds = range(1, 5)
    runs = {("baseline", s): 50.0 for s in seeds} | {("wide", s): 50.5 + 1.5 * (-1) ** s for s in seeds}
    runs |= {(f"n{i}", s): 50.0 + 0.2 * i * (-1) ** s for i in range(1, 6) for s in seeds}
    summary = analyze(table_of(runs, noise=0.1), "baseline", aggregations=["db"])
    wide = summary.arms["wide"]["db"]
    assert wide.ci_high - wide.ci_low > 1.5 * (wide.t_high - wide.t_low)  # Holm level 99.17% at 3 df
    figures = []
    monkeypatch.setattr(render.plt, "close", figures.append)
    render.forest_plot(summary, tmp_path / "forest.png")
    [ax] = figures[0].axes
    low, high = ax.get_xlim()
    drawn = {(round(line.get_xdata()[0], 9), round(line.get_xdata()[-1], 9), line.get_linewidth()) for line in ax.lines}
    assert low < wide.ci_low and wide.ci_high < high
    assert (round(wide.ci_low, 9), round(wide.ci_high, 9), 1) in drawn
    assert (round(wide.eq_low, 9), round(wide.eq_high, 9), 5) in drawn
    assert not any(round(wide.bca_low, 9) in (x0, x1) for x0, x1, _ in drawn)
    text = "\n".join(
        p
        for section in render.sections(summary, table_of(runs), {"forest": tmp_path / "forest.png"})
        for p in section.paragraphs
    )
    assert "BCa intervals are reported, never deciding" in text and "72% at 3 seeds" in text
    assert "BCa 95% CI (nominal)" in render.verdict_table(summary, "db").columns


def test_an_unbounded_interval_is_drawn_and_written(tmp_path):
    """The same shift at each of 3 seeds: no claim (exact floor 0.25); the intervals are (−∞, +∞), drawn to the edges."""
    runs = {("baseline", s): 50.0 for s in (1, 2, 3)} | {("flat", s): 50.3 for s in (1, 2, 3)}
    runs |= {("b", s): 50.0 + s for s in (1, 2, 3)}
    table = table_of(runs, noise=0.0)
    summary = analyze(table, "baseline", aggregations=["db"])
    flat = summary.arms["flat"]["db"]
    assert flat.exact and flat.p == 0.25 and flat.ci_low is None and flat.verdict == "inconclusive"
    paths = write_report(summary, table, tmp_path)
    assert "| flat | " in paths["markdown"].read_text() and "(−∞, +∞) (97.50%)" in paths["markdown"].read_text()


def _two_benchmark_table(logic_chars: float) -> ScoreTable:
    """math scores differ between arms; logic runs answer nothing correct with `logic_chars` characters."""
    bench = BenchmarkSet((BenchmarkInfo("m1", "math", 100), BenchmarkInfo("l1", "logic", 100)))
    rows = [
        row
        for arm, level in [("baseline", 40.0), ("a", 42.0)]
        for s in range(1, 6)
        for row in (
            {"arm": arm, "seed": s, "benchmark": "m1", "score": level + np.sin(s + len(arm)), "length_chars": 3.0},
            {"arm": arm, "seed": s, "benchmark": "l1", "score": 0.0, "length_chars": logic_chars},
        )
    ]
    return ScoreTable(pd.DataFrame(rows), bench)


def test_leave_out_subset_with_an_undefined_score_is_skipped_with_a_note():
    """Leaving out math leaves only logic, whose responses are empty: efficiency there is 0/0."""
    summary = analyze(_two_benchmark_table(logic_chars=0.0), "baseline")
    efficiency = summary.robustness["efficiency"]
    assert list(efficiency["lobo"].left_out) == ["l1"] and list(efficiency["lodo"].left_out) == ["logic"]
    assert any("robustness of 'efficiency' without 'm1' skipped" in n and "10 run(s)" in n for n in summary.notes)
    assert any("without 'math' skipped" in n for n in summary.notes)
    assert summary.verdicts["a"] == "better"
    assert list(
        analyze(_two_benchmark_table(logic_chars=2.0), "baseline").robustness["efficiency"]["lobo"].left_out
    ) == ["m1", "l1"]


def test_an_aggregation_undefined_on_the_full_table_is_a_clear_error():
    table = _two_benchmark_table(logic_chars=0.0)
    table.frame.loc[table.frame["benchmark"] == "m1", "length_chars"] = 0.0
    with pytest.raises(
        ValueError, match=r"aggregation 'efficiency' is undefined \(NaN\) for 10 run\(s\).*aggregations="
    ):
        analyze(table, "baseline")
    assert analyze(table, "baseline", aggregations=["db"]).verdicts == {"a": "better"}


def test_analyze_bad_arguments():
    table = table_of({(arm, s): 50.0 for arm in ("baseline", "a") for s in (1, 2, 3)})
    with pytest.raises(ValueError, match="control 'basline' is not an arm of the score table; arms: a, baseline"):
        analyze(table, "basline")
    with pytest.raises(ValueError, match="unknown aggregations"):
        analyze(table, "baseline", aggregations=["db", "median"])
    with pytest.raises(ValueError, match="needs response lengths"):
        analyze(table, "baseline", aggregations=["efficiency"])
    with pytest.raises(ValueError, match="flip_k .* must be an integer >= 1; got 0"):
        analyze(table, "baseline", flip_k=0)
    assert analyze(table, "baseline", aggregations="macro").aggregations == ["macro"]  # one name is understood
    assert default_control(table) == "baseline"


def write_search_output(out: Path, steps=(10, 20, 30), seeds=(1, 2, 3, 4)) -> dict:
    """A search output directory: results.jsonl (+ benchmarks.json) with lengths; returns the db values."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(
        json.dumps([{"name": b.name, "domain": b.domain, "items": b.items} for b in BENCH.benchmarks])
    )
    lines, db = [], {}
    for arm_id, label, gain in [("c0", "baseline", 0.0), ("a1", "band", 1.0), ("a2", "soft", -0.5)]:
        for seed in seeds:
            for step in steps:
                acc = {b: 40.0 + step / 10 * gain + seed + i for i, b in enumerate(BENCH.names)}
                db[(label, seed, step)] = ((acc["m1"] + acc["m2"]) / 2 + acc["l1"]) / 2
                lines.append(
                    json.dumps(
                        {
                            "arm_id": arm_id,
                            "label": label,
                            "method": label,
                            "seed": seed,
                            "step": step,
                            "accuracy": acc,
                            "length_chars": {b: 200.0 + seed for b in BENCH.names},
                        }
                    )
                )
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    return db


def test_milestones_give_learning_curves_and_efficiency(tmp_path):
    db = write_search_output(tmp_path / "search")
    table = load_results(tmp_path / "search")
    summary = analyze(table, default_control(table))
    assert summary.aggregations == ["db", "macro", "item", "efficiency"]
    assert summary.arm_steps == {"band": 30, "baseline": 30, "soft": 30}
    assert summary.arms["band"]["db"].delta == pytest.approx(
        db[("band", 1, 30)] - db[("baseline", 1, 30)]
    )  # final step
    curve = {p.step: p for p in summary.curves["band"]}
    assert sorted(curve) == [10, 20, 30]
    assert curve[20].delta == pytest.approx(2.0) and curve[20].n == 4  # gain 1 * step / 10
    assert summary.arms["band"]["efficiency"].mean > summary.means["efficiency"]["baseline"]
    paths = write_report(summary, table, tmp_path / "report")
    assert (
        paths["curves"].exists()
        and (tmp_path / "report" / "report.html").read_text().count("data:image/png;base64,") == 2
    )


def report_config(overrides: list[str]):
    register_settings()  # the typed defaults conf/report.yaml selects
    with initialize_config_module(config_module="tune_dfrl.conf", version_base="1.3"):
        return compose("report", overrides=overrides)


def test_experiment_source_logs_the_report_to_the_search_run(tmp_path):
    store = SearchStore.create(tmp_path, "search-y", BENCH)
    for arm_id, label, gain in [("c0", "baseline", 0.0), ("a1", "band", 2.0)]:
        for seed in (1, 2, 3):
            run = store.seed_run(arm_id, label, seed)
            for i, name in enumerate(BENCH.names):
                store.client.log_metric(run, f"acc/{name}", 40.0 + gain + seed * (1 + 0.1 * i), step=50)
    cfg = report_config(["experiment=search-y", f"mlflow.tracking_uri={store.uri}", f"out={tmp_path / 'out'}"])
    report_from_config(cfg)
    logged = {a.path for a in store.client.list_artifacts(store.search_run, "rerender")}
    assert logged == {"rerender/summary.json", "rerender/report.md", "rerender/report.html", "rerender/forest.png"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["control"] == "baseline" and summary["arms"]["band"]["db"]["delta"] == pytest.approx(2.0)
    assert summary["arm_info"]["band"]["arm_id"] == "a1"
