"""Score tables: arms x seeds x benchmarks (x milestones), and the sources they are loaded from.

A `ScoreTable` is a long-form frame with one row per (arm, seed, [step,] benchmark):

    arm (str) | seed (int) | benchmark (str) | score (accuracy, %) | [step (int)] | [length_chars]

`step` is the training step of an evaluation milestone; `length_chars` the mean response length
in characters. Every (arm, seed, step) must have a score on every benchmark of the table's
`BenchmarkSet` exactly once: a missing, duplicated or non-numeric cell is an error naming the
cell, never a silently averaged or dropped number.

Sources:
- `load_csv`: an external run table, wide (one row per run, one column per benchmark, optional
  `len/<benchmark>` columns) or long (`benchmark` and `score` columns), sliced by `key=value`
  filters on any column;
- `load_results`: a search's output directory (`results.jsonl`, one JSON line per milestone, and
  `benchmarks.json`);
- `tune_dfrl.tracking.reader.load_mlflow`: a search's MLflow experiment, read beside the code that writes it
  (`table_from_arm_rows` builds its table).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tune_dfrl.backends.base import LENGTH
from tune_dfrl.backends.benchmarks import BenchmarkSet
from tune_dfrl.paired.ledger import milestone
from tune_dfrl.state.folder import BENCHMARKS, RESULTS

DATAFLEX_BENCHMARKS = Path(__file__).with_name("benchmarks_dataflex.yaml")
MAX_LISTED = 8  # how many offending cells an error message lists


def listing(items: Iterable[Any]) -> str:
    """The first MAX_LISTED items, comma-separated, and how many there are in all when there are more."""
    items = list(items)
    shown = ", ".join(str(i) for i in items[:MAX_LISTED])
    return shown + (f", ... ({len(items)} in all)" if len(items) > MAX_LISTED else "")


def dataflex_benchmarks() -> BenchmarkSet:
    """The twelve DataFlex-RL benchmarks and the study's `math_heavy` subset (packaged YAML)."""
    return BenchmarkSet.from_file(DATAFLEX_BENCHMARKS)


@dataclass(frozen=True)
class Runs:
    """A score table pivoted to one row per run: `keys` (arm, seed[, step]) and [R, B] matrices."""

    keys: pd.DataFrame
    accuracy: np.ndarray  # [R, B], columns in BenchmarkSet order, %
    length_chars: np.ndarray | None  # [R, B] or None when the table has no lengths


@dataclass(frozen=True)
class ScoreTable:
    """Long-form scores (see the module docstring) with their benchmark metadata.

    `arm_info` maps an arm to what its source knows about it (`arm_id`, `method`, parent run id);
    `origin` says where the table came from; `notes` lists what loading excluded or noticed.
    """

    frame: pd.DataFrame
    bench: BenchmarkSet
    arm_info: dict[str, dict[str, str]] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "frame", _validated(self.frame, self.bench))

    @property
    def arms(self) -> list[str]:
        return sorted(self.frame["arm"].unique())

    @property
    def has_steps(self) -> bool:
        return "step" in self.frame

    @property
    def has_lengths(self) -> bool:
        return "length_chars" in self.frame

    @property
    def run_keys(self) -> list[str]:
        return ["arm", "seed", "step"] if self.has_steps else ["arm", "seed"]

    def final(self) -> ScoreTable:
        """One milestone per (arm, seed): its last step. Notes arms whose seeds end at different steps."""
        if not self.has_steps:
            return self
        last = self.frame.groupby(["arm", "seed"])["step"].transform("max")
        frame = self.frame[self.frame["step"] == last]
        ends = frame.groupby("arm")["step"].agg(["min", "max"])
        uneven = ends[ends["min"] != ends["max"]]
        notes = [
            f"arm {arm!r}: its seeds end at different steps ({row['min']}..{row['max']}); each seed's last milestone is used"
            for arm, row in uneven.iterrows()
        ]
        return replace(self, frame=frame, notes=self.notes + tuple(notes))

    def runs(self) -> Runs:
        """Pivot to one row per run (arm, seed[, step]) with benchmark columns in metadata order."""
        keys = self.run_keys
        accuracy = self.frame.pivot(index=keys, columns="benchmark", values="score")[self.bench.names]
        lengths = None
        if self.has_lengths:
            lengths = self.frame.pivot(index=keys, columns="benchmark", values="length_chars")[
                self.bench.names
            ].to_numpy(float)
        return Runs(accuracy.index.to_frame(index=False), accuracy.to_numpy(float), lengths)


def _validated(frame: pd.DataFrame, bench: BenchmarkSet) -> pd.DataFrame:
    """Check types, benchmark names, uniqueness and completeness; return a sorted copy."""
    required = ["arm", "seed", "benchmark", "score"]
    optional = ["step", "length_chars"]
    missing = [c for c in required if c not in frame]
    extra = [c for c in frame if c not in required + optional]
    if missing or extra:
        raise ValueError(
            f"score table columns: missing {missing}, unexpected {extra}; "
            f"required: {', '.join(required)}; optional: {', '.join(optional)}"
        )
    frame = frame.copy()
    frame["arm"] = frame["arm"].astype(str)
    frame["benchmark"] = frame["benchmark"].astype(str)
    for column in ["seed", "step"]:
        if column in frame:
            values = pd.to_numeric(frame[column], errors="coerce")
            bad = frame.loc[values.isna() | (values != values.round()), column]
            if len(bad):
                raise ValueError(f"{column} must be an integer; got {listing(bad.unique())}")
            frame[column] = values.astype(int)
    for column in ["score", "length_chars"]:
        if column in frame:
            values = pd.to_numeric(frame[column], errors="coerce").astype(float)
            bad = frame[~np.isfinite(values)]
            if len(bad):
                cells = [f"{r.arm}/seed {r.seed}/{r.benchmark}: {getattr(r, column)!r}" for r in bad.itertuples()]
                raise ValueError(f"{column} must be a finite number; got {listing(cells)}")
            frame[column] = values
    out_of_range = frame[(frame["score"] < 0) | (frame["score"] > 100)]
    if len(out_of_range):
        cells = [f"{r.arm}/seed {r.seed}/{r.benchmark}: {r.score}" for r in out_of_range.itertuples()]
        raise ValueError(f"scores are accuracies in percent (0-100); got {listing(cells)}")
    unknown = sorted(set(frame["benchmark"]) - set(bench.names))
    if unknown:
        raise ValueError(f"benchmarks {unknown} are not in the benchmark metadata; known: {', '.join(bench.names)}")
    run = ["arm", "seed", "step"] if "step" in frame else ["arm", "seed"]
    duplicated = frame[frame.duplicated(run + ["benchmark"], keep=False)]
    if len(duplicated):
        cells = sorted({" ".join(f"{k}={getattr(r, k)}" for k in run + ["benchmark"]) for r in duplicated.itertuples()})
        raise ValueError(f"each (run, benchmark) needs exactly one score; duplicated: {listing(cells)}")
    counts = frame.groupby(run).size()
    incomplete = counts[counts != len(bench.names)]
    if len(incomplete):
        present = frame.groupby(run)["benchmark"].agg(set)
        cells = [f"{dict(zip(run, key))} lacks {sorted(set(bench.names) - present[key])}" for key in incomplete.index]
        raise ValueError(f"every run needs a score on every benchmark; {listing(cells)}")
    order = {name: i for i, name in enumerate(bench.names)}
    frame = frame.sort_values(run + ["benchmark"], key=lambda c: c.map(order) if c.name == "benchmark" else c)
    return frame.reset_index(drop=True)


# ---------------------------------------------------------------------------------------- CSV


def _select(frame: pd.DataFrame, filters: Mapping[str, Any], source: str) -> pd.DataFrame:
    """Keep the rows where every filter column equals its value (numerically when both are numbers)."""
    for column, wanted in filters.items():
        if column not in frame:
            raise ValueError(f"filter column {column!r} is not in {source}; columns: {', '.join(frame.columns)}")
        values = frame[column]
        match = values.astype(str) == str(wanted)
        as_number = pd.to_numeric(values, errors="coerce")
        try:
            match |= as_number == float(wanted)
        except (TypeError, ValueError):
            pass
        if not match.any():
            raise ValueError(
                f"filter {column}={wanted} matches no row of {source}; "
                f"values in the selection so far: {listing(sorted(values.astype(str).unique()))}"
            )
        frame = frame[match]
    return frame


def _numeric(frame: pd.DataFrame, columns: list[str], source: str, label: str | None) -> pd.DataFrame:
    """Convert `columns` to float; any empty or non-numeric cell is an error naming its CSV line."""
    out = frame.copy()
    problems = []
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce")
        for index in frame.index[values.isna()]:
            who = f" ({label}={frame.at[index, label]})" if label else ""
            raw = frame.at[index, column]
            what = "is empty" if pd.isna(raw) or not str(raw).strip() else f"{raw!r} is not a number"
            problems.append(f"line {index + 2}{who}, column {column}: {what}")
        out[column] = values.astype(float)
    if problems:
        raise ValueError(f"{source}: non-numeric score cells in the selected rows: {listing(problems)}")
    return out


def load_csv(
    path: str | Path,
    bench: BenchmarkSet | None = None,
    filters: Mapping[str, Any] | None = None,
    arm_column: str | None = None,
) -> ScoreTable:
    """Load a run table, wide or long, sliced by `filters` ({column: value}).

    Wide: one row per run; columns `arm_column` (default: the first of arm, method, label present),
    `seed`, optional `step`, one column per benchmark of `bench` (default: the DataFlex-RL set) and
    optional `len/<benchmark>`. Long: columns arm, seed, benchmark, score (+ step, length_chars).
    A run that appears in several rows after filtering is an error: add filters to pick one slice.
    """
    path = Path(path)
    bench = bench or dataflex_benchmarks()
    source = str(path)
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)  # "n/a", "NaN": reported, not dropped
    raw = _select(raw, filters or {}, source)
    arm_column = arm_column or next((c for c in ("arm", "method", "label") if c in raw), None)
    if arm_column is None or arm_column not in raw:
        raise ValueError(
            f"{source} needs an arm column (arm, method or label, or name one with arm_column); columns: {', '.join(raw.columns)}"
        )
    if "seed" not in raw:
        raise ValueError(f"{source} needs a 'seed' column to pair runs; columns: {', '.join(raw.columns)}")
    long_form = "benchmark" in raw
    if long_form and "score" not in raw:
        close = difflib.get_close_matches("score", list(raw.columns), n=1)
        hint = f" (is {close[0]!r} meant to be 'score'?)" if close else ""
        raise ValueError(
            f"{source} has a 'benchmark' column, so it is read as a long table (arm, seed, benchmark, score), "
            f"but it has no 'score' column{hint}; columns: {', '.join(raw.columns)}"
        )
    run = [arm_column, "seed"] + (["step"] if "step" in raw else [])
    label = "run_id" if "run_id" in raw else None
    if long_form:
        extra = ["length_chars"] if "length_chars" in raw else []
        frame = _numeric(raw, ["score"] + extra, source, label)[run + ["benchmark", "score"] + extra]
    else:
        absent = [b for b in bench.names if b not in raw]
        if absent:
            raise ValueError(
                f"{source} lacks benchmark columns {absent} listed in the benchmark metadata "
                f"({', '.join(bench.names)}); columns present: {', '.join(raw.columns)}"
            )
        duplicated = raw[raw.duplicated(run, keep=False)]
        if len(duplicated):
            example = duplicated.iloc[0]
            count = int((raw[run] == example[run]).all(axis=1).sum())
            raise ValueError(
                f"{source}: run {dict(example[run])} appears in {count} rows of the selection; "
                f"add filters to select one slice (columns: {', '.join(raw.columns)})"
            )
        length_columns = [LENGTH + b for b in bench.names if LENGTH + b in raw]
        if length_columns and len(length_columns) != len(bench.names):
            raise ValueError(
                f"{source} has length columns for some benchmarks only ({length_columns}); give all or none"
            )
        wide = _numeric(raw, bench.names + length_columns, source, label)
        frame = wide.melt(id_vars=run, value_vars=bench.names, var_name="benchmark", value_name="score")
        if length_columns:
            lengths = wide.melt(id_vars=run, value_vars=length_columns, var_name="benchmark", value_name="length_chars")
            lengths["benchmark"] = lengths["benchmark"].str.removeprefix(LENGTH)
            frame = frame.merge(lengths, on=run + ["benchmark"])
    frame = frame.rename(columns={arm_column: "arm"})
    origin = {"kind": "csv", "path": source, "filters": " ".join(f"{k}={v}" for k, v in (filters or {}).items())}
    return ScoreTable(frame, bench, origin=origin)


# ---------------------------------------------------------------------- search output directory


def load_results(path: str | Path, bench: BenchmarkSet | None = None) -> ScoreTable:
    """Load a search's `results.jsonl` (a file, or the output directory holding it).

    One JSON object per line per milestone: `arm_id`, `seed`, `step`, `accuracy` {benchmark: %},
    optional `label`, `method`, `length_chars` {benchmark: chars}. Arms are named by `label`
    (suffixed with the arm id when two arms share a label). Benchmark metadata comes from
    `benchmarks.json` beside the file unless `bench` is given.
    """
    path = Path(path)
    file = path / RESULTS if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"no results.jsonl at {file}")
    if bench is None:
        meta = file.with_name(BENCHMARKS)
        if not meta.exists():
            raise FileNotFoundError(f"no benchmarks.json beside {file}; pass the benchmark metadata explicitly")
        bench = BenchmarkSet.from_file(meta)
    seen: set[tuple[str, int, int]] = set()  # the first line of a milestone is kept (the ledger's duplicate rule)
    rows, repeated = [], set()
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file} line {number}: not JSON ({error})") from None
        missing = {"arm_id", "seed", "step", "accuracy"} - set(r)
        if missing:
            raise ValueError(
                f"{file} line {number}: lacks {sorted(missing)}; each line needs arm_id, seed, step, accuracy"
            )
        try:
            key = milestone(r["arm_id"], r["seed"], r["step"])
            scores = {name: float(score) for name, score in r["accuracy"].items()}
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{file} line {number}: seed and step must be integers, accuracies numbers ({error})"
            ) from None
        if key in seen:
            repeated.add(key)
            continue
        seen.add(key)
        rows += [
            {
                "arm_id": key[0],
                "label": str(r.get("label") or r["arm_id"]),
                "method": str(r.get("method", "")),
                "seed": r["seed"],
                "step": r["step"],
                "benchmark": name,
                "score": score,
                "length_chars": (r.get("length_chars") or {}).get(name, np.nan),
            }
            for name, score in scores.items()
        ]
    if not rows:
        raise ValueError(f"{file} holds no milestone")
    notes = (
        (
            f"{file.name}: {len(repeated)} milestone(s) reported more than once (a resumed trial); the first line of each "
            "is used, as by the scheduler and the searcher",
        )
        if repeated
        else ()
    )
    # a search folder's file is named relative to the folder: a summary never names where the folder was
    source = file.name if path.is_dir() else str(file)
    table = table_from_arm_rows(pd.DataFrame(rows), bench, {"kind": "results", "path": source})
    return replace(table, notes=notes + table.notes)


def table_from_arm_rows(rows: pd.DataFrame, bench: BenchmarkSet, origin: dict[str, str]) -> ScoreTable:
    """Name arms by label (label [arm_id] when a label is shared), keep lengths only when complete."""
    ids_per_label = rows.groupby("label")["arm_id"].nunique()
    shared = set(ids_per_label[ids_per_label > 1].index)
    rows["arm"] = [
        f"{label} [{arm_id[:8]}]" if label in shared else label for label, arm_id in zip(rows["label"], rows["arm_id"])
    ]
    info_columns = [c for c in ("arm_id", "method", "parent_run_id") if c in rows]
    arm_info = {
        arm: {k: str(v) for k, v in group.iloc[0][info_columns].items() if v} for arm, group in rows.groupby("arm")
    }
    notes: tuple[str, ...] = ()
    lengths = pd.to_numeric(rows["length_chars"], errors="coerce")
    keep = ["arm", "seed", "step", "benchmark", "score"]
    if lengths.notna().all():
        keep.append("length_chars")
    elif lengths.notna().any():
        notes = ("response lengths are missing for some runs; the efficiency aggregation is unavailable",)
    return ScoreTable(rows[keep], bench, arm_info=arm_info, origin=origin, notes=notes)
