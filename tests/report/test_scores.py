"""Score tables and aggregates: hand-computed aggregates, CSV / results.jsonl / MLflow loading, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow_helpers import SearchStore
from repo_files import DATAFLEX_CSV

from tune_dfrl.backends.benchmarks import (
    BenchmarkInfo,
    BenchmarkSet,
    aggregate,
    aggregation_list,
    check_aggregations,
    default_aggregations,
    weights,
)
from tune_dfrl.report.scores import ScoreTable, dataflex_benchmarks, load_csv, load_results
from tune_dfrl.tracking.reader import load_mlflow

MAIN_7B = {"campaign": "main", "model": "Qwen2.5-7B-Instruct"}

# Three benchmarks: two math (100 and 300 items), one logic (100 items); subset pair = {m1, l1}.
TINY = BenchmarkSet(
    (BenchmarkInfo("m1", "math", 100), BenchmarkInfo("m2", "math", 300), BenchmarkInfo("l1", "logic", 100)),
    {"pair": ("m1", "l1")},
)
ACC = np.array([60.0, 80.0, 30.0])
LEN = np.array([100.0, 200.0, 50.0])


# ------------------------------------------------------------------------------ aggregates


def test_aggregates_hand_computed():
    assert aggregate(ACC, "db", TINY) == pytest.approx((70 + 30) / 2)  # math mean 70, logic 30
    assert aggregate(ACC, "macro", TINY) == pytest.approx(170 / 3)
    assert aggregate(ACC, "item", TINY) == pytest.approx((60 * 100 + 80 * 300 + 30 * 100) / 500)  # 66
    assert aggregate(ACC, "pair", TINY) == pytest.approx(45.0)
    # correct answers 60 + 240 + 30 = 330 over 100*100 + 300*200 + 100*50 = 75000 characters
    assert aggregate(ACC, "efficiency", TINY, LEN) == pytest.approx(1000 * 330 / 75000)


def test_aggregates_leave_out():
    assert aggregate(ACC, "db", TINY, drop=["m2"]) == pytest.approx((60 + 30) / 2)
    assert aggregate(ACC, "db", TINY, drop=["l1"]) == pytest.approx(70.0)  # the logic domain vanishes
    assert aggregate(ACC, "item", TINY, drop=["m1"]) == pytest.approx((80 * 300 + 30 * 100) / 400)
    assert aggregate(ACC, "efficiency", TINY, LEN, drop=["m2"]) == pytest.approx(1000 * 90 / 15000)
    with pytest.raises(ValueError, match="keeps no benchmark"):
        weights("pair", TINY, drop=["m1", "l1"])


def test_aggregates_are_vectorised_over_runs():
    runs = np.stack([ACC, ACC[::-1], ACC + 1])
    assert aggregate(runs, "db", TINY) == pytest.approx(
        [50.0, (55 + 60) / 2, 51.0]
    )  # reversed: math (30, 80), logic 60


def test_aggregation_names_checked():
    assert default_aggregations(TINY, has_lengths=False) == ["db", "macro", "item", "pair"]
    assert default_aggregations(TINY, has_lengths=True)[-1] == "efficiency"
    with pytest.raises(ValueError, match=r"unknown aggregations \['dbb'\]; allowed: db, macro, item, pair$"):
        check_aggregations(["dbb"], TINY, False)  # efficiency is not offered without lengths
    with pytest.raises(
        ValueError, match=r"unknown aggregations \['dbb'\]; allowed: db, macro, item, pair, efficiency$"
    ):
        check_aggregations(["dbb"], TINY, True)
    with pytest.raises(ValueError, match="needs response lengths .* lacks; allowed: db, macro, item, pair$"):
        check_aggregations(["db", "efficiency"], TINY, False)
    assert (
        aggregation_list("db") == ["db"]
        and aggregation_list(("db", "pair")) == ["db", "pair"]
        and aggregation_list(None) == []
    )
    with pytest.raises(ValueError, match=r"aggregations must be names"):
        aggregation_list([1, 2])


# ------------------------------------------------------------------------- metadata


def test_dataflex_metadata_matches_the_data_readme():
    bench = dataflex_benchmarks()
    assert len(bench.names) == 12
    assert {d: sum(b.domain == d for b in bench.benchmarks) for d in bench.domains} == {
        "math": 5,
        "logic": 4,
        "science": 3,
    }
    assert sum(b.items for b in bench.benchmarks) == 6194
    assert bench.subsets["math_heavy"] == (
        "math500",
        "aime24",
        "olympiadbench",
        "minerva_math",
        "gsm8k",
        "gpqa_diamond",
    )
    readme = (DATAFLEX_CSV.parent / "README.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (math|logic|science) \| (\d+) \|$", readme, flags=re.MULTILINE)
    assert [(b.name, b.domain, b.items) for b in bench.benchmarks] == [(n, d, int(k)) for n, d, k in rows]
    assert pd.read_csv(DATAFLEX_CSV).columns[7:].tolist() == list(bench.names)


def test_benchmark_set_errors():
    with pytest.raises(ValueError, match=r"subset 'x' names unknown benchmarks \['zz'\]"):
        BenchmarkSet(TINY.benchmarks, {"x": ("m1", "zz")})
    with pytest.raises(ValueError, match="clashes with a built-in aggregation"):
        BenchmarkSet(TINY.benchmarks, {"db": ("m1",)})
    with pytest.raises(ValueError, match="unique"):
        BenchmarkSet(TINY.benchmarks + (BenchmarkInfo("m1", "math", 5),))
    with pytest.raises(ValueError, match="positive integer"):
        BenchmarkSet((BenchmarkInfo("m1", "math", 0),))


@pytest.mark.parametrize(
    "text, message",
    [
        ("benchmarks: [{name: m1, domain: math, items: 100}\n", r"is not valid YAML/JSON: .*line 2"),
        ("just a string\n", r"needs a 'benchmarks' list; got 'just a string'"),
        ("benchmarks: {m1: math}\n", r"'benchmarks' must be a list of \{name, domain, items\} records"),
        ("benchmarks: [m1, m2]\n", r"benchmark record 'm1' is not a mapping"),
        ("benchmarks: [{name: m1, domain: math}]\n", r"lacks \['items'\]"),
        (
            "benchmarks: [{name: m1, domain: math, items: 2.5}]\n",
            r"benchmark 'm1': item count must be a positive integer; got 2.5",
        ),
        (
            "benchmarks: [{name: m1, domain: math, items: 5}]\nsubsets: {s: m1}\n",
            r"'subsets' must map each subset name to a list",
        ),
    ],
)
def test_malformed_benchmark_files_name_the_file_and_the_problem(tmp_path, text, message):
    path = write(tmp_path / "bench.yaml", text)
    with pytest.raises(ValueError, match=f"benchmark metadata {re.escape(str(path))}.*{message}"):
        BenchmarkSet.from_file(path)


def test_missing_benchmark_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="benchmark metadata .*nope.yaml: no such file"):
        BenchmarkSet.from_file(tmp_path / "nope.yaml")


# ------------------------------------------------------------------------------- tables


def tiny_frame(arms=("ctl", "a"), seeds=(1, 2), step=None) -> pd.DataFrame:
    rows = [
        {"arm": arm, "seed": seed, "benchmark": b, "score": 50.0 + i + seed}
        for arm in arms
        for seed in seeds
        for i, b in enumerate(TINY.names)
    ]
    frame = pd.DataFrame(rows)
    return frame if step is None else frame.assign(step=step)


def test_score_table_rejects_incomplete_duplicated_and_out_of_range():
    frame = tiny_frame()
    with pytest.raises(
        ValueError, match=r"every run needs a score on every benchmark; \{'arm': 'a', 'seed': 2\} lacks \['l1'\]"
    ):
        ScoreTable(frame.iloc[:-1], TINY)
    with pytest.raises(ValueError, match="duplicated: arm=a seed=2 benchmark=l1"):
        ScoreTable(pd.concat([frame, frame.iloc[-1:]]), TINY)
    with pytest.raises(ValueError, match=r"percent \(0-100\); got a/seed 2/l1: 130.5"):
        ScoreTable(frame.assign(score=np.where(frame.index == len(frame) - 1, 130.5, frame["score"])), TINY)
    with pytest.raises(ValueError, match=r"benchmarks \['zz'\] are not in the benchmark metadata"):
        ScoreTable(frame.assign(benchmark=frame["benchmark"].replace("l1", "zz")), TINY)
    with pytest.raises(ValueError, match="seed must be an integer; got 1.5"):
        ScoreTable(frame.assign(seed=frame["seed"].replace(1, 1.5)), TINY)


def test_final_takes_each_runs_last_milestone():
    frame = pd.concat([tiny_frame(step=10), tiny_frame(step=20).assign(score=lambda f: f["score"] + 5)])
    frame = frame[~((frame["arm"] == "a") & (frame["seed"] == 2) & (frame["step"] == 20))]  # a/seed 2 stopped at 10
    final = ScoreTable(frame, TINY).final()
    steps = final.frame.groupby(["arm", "seed"])["step"].first().to_dict()
    assert steps == {("a", 1): 20, ("a", 2): 10, ("ctl", 1): 20, ("ctl", 2): 20}
    assert any("arm 'a': its seeds end at different steps (10..20)" in note for note in final.notes)


# ---------------------------------------------------------------------------------- CSV


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


WIDE = "run_id,method,seed,m1,m2,l1\nr1,ctl,1,60,80,30\nr2,ctl,2,61,81,31\nr3,a,1,62,79,35\nr4,a,2,60,82,33\n"


def test_wide_and_long_csv_give_the_same_table(tmp_path):
    wide = load_csv(write(tmp_path / "w.csv", WIDE), TINY)
    long_rows = ["arm,seed,benchmark,score"] + [
        f"{r.arm},{r.seed},{r.benchmark},{r.score}" for r in wide.frame.itertuples()
    ]
    long = load_csv(write(tmp_path / "l.csv", "\n".join(long_rows)), TINY)
    pd.testing.assert_frame_equal(wide.frame, long.frame)
    cell = wide.frame.set_index(["arm", "seed", "benchmark"])["score"]
    assert cell[("a", 2, "m2")] == 82.0 and cell[("ctl", 1, "l1")] == 30.0
    assert wide.arms == ["a", "ctl"] and not wide.has_lengths


def test_csv_lengths(tmp_path):
    text = "method,seed,m1,m2,l1,len/m1,len/m2,len/l1\nctl,1,60,80,30,100,200,50\nctl,2,60,80,30,100,200,50\n"
    table = load_csv(write(tmp_path / "len.csv", text), TINY)
    assert table.has_lengths
    runs = table.runs()
    assert aggregate(runs.accuracy, "efficiency", TINY, runs.length_chars) == pytest.approx([4.4, 4.4])


def test_csv_bad_input_errors(tmp_path):
    with pytest.raises(ValueError, match=r"lacks benchmark columns \['l1'\] listed in the benchmark metadata"):
        load_csv(write(tmp_path / "missing.csv", WIDE.replace(",l1", ",x1")), TINY)
    with pytest.raises(ValueError, match=r"line 4 \(run_id=r3\), column m2: 'n/a' is not a number"):
        load_csv(write(tmp_path / "text.csv", WIDE.replace("r3,a,1,62,79", "r3,a,1,62,n/a")), TINY)
    with pytest.raises(ValueError, match=r"line 3 \(run_id=r2\), column m1: is empty"):
        load_csv(write(tmp_path / "empty.csv", WIDE.replace("r2,ctl,2,61", "r2,ctl,2,")), TINY)
    with pytest.raises(ValueError, match="filter column 'campain' is not in"):
        load_csv(write(tmp_path / "w.csv", WIDE), TINY, {"campain": "main"})
    with pytest.raises(ValueError, match="filter method=zz matches no row .* values in the selection so far: a, ctl"):
        load_csv(tmp_path / "w.csv", TINY, {"method": "zz"})
    with pytest.raises(ValueError, match="needs a 'seed' column"):
        load_csv(write(tmp_path / "noseed.csv", WIDE.replace("seed", "sd")), TINY)
    with pytest.raises(
        ValueError,
        match=r"long table .* no 'score' column \(is 'Score ' meant to be 'score'\?\); columns: arm, seed, benchmark, Score ",
    ):
        load_csv(write(tmp_path / "long.csv", "arm,seed,benchmark,Score \nctl,1,m1,50\n"), TINY)
    with pytest.raises(ValueError, match=r"no 'score' column; columns: arm, seed, benchmark, accuracy$"):
        load_csv(write(tmp_path / "long.csv", "arm,seed,benchmark,accuracy\nctl,1,m1,50\n"), TINY)


def test_csv_filter_keeps_the_slice_and_ignores_bad_cells_outside_it(tmp_path):
    text = (
        "campaign,method,seed,m1,m2,l1\n"
        "main,ctl,1,60,80,30\nmain,ctl,2,61,81,31\nmain,a,2,60,82,33\n"
        "other,ctl,2,oops,1,1\n"
    )
    table = load_csv(write(tmp_path / "camp.csv", text), TINY, {"campaign": "main", "seed": "2.0"})
    assert sorted(table.frame[["arm", "seed"]].drop_duplicates().itertuples(index=False)) == [("a", 2), ("ctl", 2)]


def test_dataflex_table_slice():
    table = load_csv(DATAFLEX_CSV, filters=MAIN_7B)
    assert table.arms == ["ar", "baseline", "diffband", "difffilter", "gfpo", "maxvar", "per", "softmax", "topk"]
    assert len(table.frame) == 9 * 3 * 12
    assert set(table.frame.groupby("arm")["seed"].agg(lambda s: tuple(sorted(set(s))))) == {(1, 2, 3)}
    raw = pd.read_csv(DATAFLEX_CSV)
    row = raw[(raw.run_id == "v2_7b__gfpo_s2")].iloc[0]
    cell = table.frame.set_index(["arm", "seed", "benchmark"])["score"]
    assert cell[("gfpo", 2, "bbh_tracking")] == row["bbh_tracking"]


def test_dataflex_table_without_filters_is_ambiguous():
    with pytest.raises(ValueError, match=r"appears in \d+ rows of the selection; add filters"):
        load_csv(DATAFLEX_CSV)


# ------------------------------------------------------------------------ results.jsonl


def results_line(arm_id, label, seed, step, base, method="m"):
    return json.dumps(
        {
            "arm_id": arm_id,
            "label": label,
            "method": method,
            "seed": seed,
            "step": step,
            "final": step == 20,
            "accuracy": {"m1": base, "m2": base + 1, "l1": base + 2},
            "length_chars": {"m1": 100.0, "m2": 100.0, "l1": 100.0},
        }
    )


def test_results_jsonl(tmp_path):
    lines = [
        results_line(a, label, s, step, 40 + step + s)
        for a, label in [("id0", "baseline"), ("id1", "band"), ("id2", "band")]
        for s in (1, 2)
        for step in (10, 20)
    ]
    lines.append(lines[0])  # a resumed trial reporting its milestone again
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(FileNotFoundError, match="no benchmarks.json"):
        load_results(tmp_path)
    (tmp_path / "benchmarks.json").write_text(
        json.dumps([{"name": b.name, "domain": b.domain, "items": b.items} for b in TINY.benchmarks])
    )
    table = load_results(tmp_path)
    assert table.arms == ["band [id1]", "band [id2]", "baseline"]  # a shared label gets the arm id
    assert table.arm_info["band [id2]"] == {"arm_id": "id2", "method": "m"}
    assert table.has_steps and table.has_lengths
    assert any("1 milestone(s) reported more than once" in n for n in table.notes)
    final = table.final().frame.set_index(["arm", "seed", "benchmark"])
    assert final.loc[("baseline", 2, "l1"), "score"] == 40 + 20 + 2 + 2
    with pytest.raises(ValueError, match="line 2: lacks \\['accuracy'\\]"):
        load_results(write(tmp_path / "bad.jsonl", lines[0] + '\n{"arm_id": "x", "seed": 1, "step": 1}\n'), TINY)


# ------------------------------------------------------------------------------- MLflow


def test_mlflow_experiment(tmp_path):
    store = SearchStore.create(tmp_path, "search-x", TINY)
    expected = {}
    for arm_id, label in [("id0", "baseline"), ("id1", "band")]:
        parent = store.client.create_run(store.experiment, tags={"tune_dfrl.role": "arm", "arm_id": arm_id})
        for seed in (1, 2):
            run = store.seed_run(arm_id, label, seed, parent=parent.info.run_id)
            for step in (5, 10):
                for i, name in enumerate(TINY.names):
                    value = 30.0 + 10 * i + step + seed + (arm_id == "id1")
                    store.client.log_metric(run, f"acc/{name}", value, step=step)
                    expected[(label, seed, step, name)] = value
    table = load_mlflow("search-x", store.uri)
    got = table.frame.set_index(["arm", "seed", "step", "benchmark"])["score"].to_dict()
    assert got == expected
    assert table.origin["search_run_id"] == store.search_run
    assert table.arm_info["band"]["arm_id"] == "id1" and table.arm_info["band"]["method"] == "band"
    assert not table.has_lengths
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'.*search-x"):
        load_mlflow("nope", store.uri)
