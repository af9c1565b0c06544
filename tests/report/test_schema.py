"""The result schema: metric names live in tune_dfrl/report/schema.py only; the embedded backend, the verl backend and
the report give the same aggregates on the same per-benchmark inputs (efficiency without characters: NaN in
all three); the summary round-trips through summary.json."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tune_dfrl.backends.base import RESULT_PREFIXES, SCORE, Milestone
from tune_dfrl.backends.benchmarks import BenchmarkSet
from tune_dfrl.report.analysis import analyze, write_report
from tune_dfrl.report.schema import Recommendation, Summary
from tune_dfrl.report.scores import ScoreTable
from tune_dfrl.state.records import flat_result, milestone_record
from tune_dfrl.trainers.embedded.benchmarks import get_benchmarks
from tune_dfrl.trainers.embedded.evaluate import Scored
from tune_dfrl.trainers.embedded.evaluate import aggregate as embedded_aggregate
from tune_dfrl.trainers.verl.launcher import MilestoneReader
from tune_dfrl.trainers.verl.recipe import BenchmarkSource

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = get_benchmarks()  # the embedded backend's twelve, three domains, sizes 150-300
BENCH = BenchmarkSet(tuple(b.info() for b in BENCHMARKS))
ARMS, SEEDS = ("control", "a"), (1, 2, 3)


def scored_run(rng: np.random.Generator, skill: float, empty: bool = False) -> list[Scored]:
    """One evaluation: per benchmark, random correctness around `skill` and response lengths (0 when `empty`)."""
    return [
        Scored(
            correct=rng.random(b.size) < skill * rng.uniform(0.5, 1.0),
            well_formed=np.ones(b.size, bool),
            chars=np.zeros(b.size) if empty else rng.integers(1, 80, b.size).astype(float),
        )
        for b in BENCHMARKS
    ]


def verl_aggregates(scored: list[Scored]) -> dict[str, float]:
    """The verl backend's path: a validation record (means per data_source) read by `MilestoneReader`."""
    sources = [BenchmarkSource(f"src/{b.name}", b.name, b.domain, b.size) for b in BENCHMARKS]
    data = {}
    for b, s in zip(BENCHMARKS, scored):
        data |= {
            f"val-core/src/{b.name}/acc/mean@1": float(s.correct.mean()),
            f"val-aux/src/{b.name}/length_chars/mean@1": float(s.chars.mean()),
        }
    return MilestoneReader(sources, BENCH).read({"step": 2, "data": data}).aggregates


def by_hand(scored: list[Scored]) -> dict[str, float]:
    """DESIGN §6 from the raw responses, independently of any aggregate code."""
    accuracy = {b.name: 100.0 * s.correct.mean() for b, s in zip(BENCHMARKS, scored)}
    domains = {b.domain for b in BENCHMARKS}
    correct, chars = sum(float(s.correct.sum()) for s in scored), sum(float(s.chars.sum()) for s in scored)
    items = sum(len(s.correct) for s in scored)
    return {
        "db": np.mean([np.mean([accuracy[b.name] for b in BENCHMARKS if b.domain == d]) for d in domains]),
        "macro": np.mean(list(accuracy.values())),
        "item": 100.0 * correct / items,
        "efficiency": 1000.0 * correct / chars if chars else np.nan,
    }


def score_rows(runs: dict) -> list[dict]:
    """Long-form report rows (accuracy %, mean characters) of scored runs keyed by (arm, seed)."""
    return [
        {
            "arm": arm,
            "seed": seed,
            "benchmark": b.name,
            "score": 100.0 * s.correct.mean(),
            "length_chars": s.chars.mean(),
        }
        for (arm, seed), scored in runs.items()
        for b, s in zip(BENCHMARKS, scored)
    ]


def test_both_backends_and_the_report_give_the_same_aggregates():
    rng = np.random.default_rng(7)
    runs = {(arm, seed): scored_run(rng, 0.5 + 0.1 * i) for i, arm in enumerate(ARMS) for seed in SEEDS}
    embedded = {key: embedded_aggregate(BENCHMARKS, scored).aggregates for key, scored in runs.items()}
    for key, scored in runs.items():
        assert embedded[key] == pytest.approx(by_hand(scored), rel=1e-12)
        assert verl_aggregates(scored) == pytest.approx(embedded[key], rel=1e-12)
    rows = score_rows(runs)
    summary = analyze(ScoreTable(pd.DataFrame(rows), BENCH), "control")
    assert summary.aggregations == ["db", "macro", "item", "efficiency"]
    for name in summary.aggregations:
        for arm in ARMS:
            assert summary.means[name][arm] == pytest.approx(
                np.mean([embedded[arm, s][name] for s in SEEDS]), rel=1e-12
            )


def test_efficiency_without_characters_is_undefined_everywhere():
    """0 / 0 is NaN in both backends (the embedded one said 0 before) and the report refuses to rank on it."""
    rng = np.random.default_rng(3)
    empty = scored_run(rng, 0.5, empty=True)
    assert np.isnan(embedded_aggregate(BENCHMARKS, empty).aggregates["efficiency"])
    assert np.isnan(verl_aggregates(empty)["efficiency"])
    runs = {(arm, seed): scored_run(rng, 0.5, empty=seed == 1) for arm in ARMS for seed in SEEDS}
    rows = score_rows(runs)
    table = ScoreTable(pd.DataFrame(rows), BENCH)
    with pytest.raises(ValueError, match=r"aggregation 'efficiency' is undefined \(NaN\) for 2 run\(s\)"):
        analyze(table, "control")
    assert analyze(table, "control", aggregations=["db"]).aggregations == ["db"]


def test_a_milestone_flattens_by_the_schema_prefixes_and_back():
    milestone = Milestone(4, {"m1": 50.0}, {"m1": 12.0}, {"m1": 0.25}, {"db": 50.0, "efficiency": 41.0}, {"loss": 0.5})
    flat = milestone.flat()
    assert flat == {
        "step": 4.0,
        "acc/m1": 50.0,
        "len/m1": 12.0,
        "fmt_fail/m1": 0.25,
        SCORE + "db": 50.0,
        SCORE + "efficiency": 41.0,
        "train/loss": 0.5,
    }
    arm = {"arm_id": "x1", "label": "x", "method": "topk", "params": {}}
    record = milestone_record(arm, 0, {**flat, "final": True, "threads": 1})
    assert {field: record[field] for field in RESULT_PREFIXES.values()} == {
        field: getattr(milestone, field) for field in RESULT_PREFIXES.values()
    }
    assert flat_result(record) == {**flat, "final": True, "threads": 1}


def test_no_module_but_the_backend_contract_spells_a_metric_prefix():
    spelled = re.compile(r"""["']({})""".format("|".join(re.escape(p) for p in RESULT_PREFIXES)))
    sources = [
        p for folder in ("tune_dfrl", "trainers", "policies", "benchmarks") for p in (ROOT / folder).rglob("*.py")
    ]
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sources
        if p != ROOT / "tune_dfrl" / "backends" / "base.py"  # where RESULT_PREFIXES is defined
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert len(sources) > 20 and offenders == []


def summary_of_a_small_table() -> tuple[Summary, ScoreTable]:
    """Two arms at 3 seeds and 2 milestones: every part of the summary is filled, learning curves included."""
    rng = np.random.default_rng(11)
    runs = {
        (arm, seed, step): scored_run(rng, 0.4 + 0.2 * i)
        for i, arm in enumerate(ARMS)
        for seed in SEEDS
        for step in (5, 10)
    }
    rows = [
        {
            "arm": arm,
            "seed": seed,
            "step": step,
            "benchmark": b.name,
            "score": 100.0 * s.correct.mean(),
            "length_chars": s.chars.mean(),
        }
        for (arm, seed, step), scored in runs.items()
        for b, s in zip(BENCHMARKS, scored)
    ]
    table = ScoreTable(pd.DataFrame(rows), BENCH)
    return analyze(table, "control", aggregations=["db", "efficiency"]), table


def test_summary_round_trips_through_summary_json_and_renders_from_it(tmp_path):
    summary, table = summary_of_a_small_table()
    summary = replace(summary, stopped={"b": "arm 'b' was stopped at step 2"}, failed={"a": [4]})
    assert [p.step for p in summary.curves["a"]] == [5, 10] and set(summary.robustness["db"]) == {"lobo", "lodo"}
    assert Summary.from_json(summary.to_json()) == summary
    data = json.loads(summary.to_json())
    assert {"control", "seeds", "primary", "arms", "recommendation", "stopped", "failed", "notes", "verdicts"} <= set(
        data
    )
    assert {"mean", "control_mean", "seeds", "delta", "ci_low", "ci_high", "p_holm", "verdict", "mde"} <= set(
        data["arms"]["a"]["db"]
    )
    assert data["recommendation"]["aggregation"] == "db" and data["failed"] == {"a": [4]}
    assert {"step", "delta", "ci_low", "ci_high", "n"} == set(data["curves"]["a"][0])
    assert {"min_kendall", "min_at", "left_out"} <= set(data["robustness"]["db"]["lodo"])
    paths = write_report(Summary.from_json(summary.to_json()), table, tmp_path)
    assert Summary.from_json(paths["summary"].read_text()) == summary
    assert "| a | " in paths["markdown"].read_text()


def test_the_control_only_summary_has_the_same_shape():
    control_only = Summary(
        "baseline",
        [0, 1],
        "db",
        Recommendation("baseline", True, "every arm stopped", "db"),
        stopped={"x": "stopped"},
        notes=["stopped"],
    )
    data = json.loads(control_only.to_json())
    assert set(data) == set(json.loads(summary_of_a_small_table()[0].to_json()))
    assert data["arms"] == {} and data["recommendation"]["recommended"] == "baseline"
    assert Summary.from_json(control_only.to_json()) == control_only


def test_a_summary_that_does_not_match_the_schema_is_a_clear_error():
    data = json.loads(summary_of_a_small_table()[0].to_json())
    with pytest.raises(ValueError, match="does not match the schema.*'verdict_of'"):
        Summary.from_dict({**data, "verdict_of": {}})
    with pytest.raises(ValueError, match="does not match the schema.*recommendation"):
        Summary.from_dict({k: v for k, v in data.items() if k != "recommendation"})
    with pytest.raises(ValueError, match="does not match the schema"):
        Summary.from_dict({**data, "arms": {"a": {"db": {"mean": 1.0}}}})
