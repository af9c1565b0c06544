"""Benchmarks and their aggregates: what a milestone's per-benchmark figures are summed into.

`BenchmarkInfo` is one benchmark (name, domain, item count), `BenchmarkSet` the benchmarks of a search with its
named subsets. The aggregates of one run with accuracy a_b (%) on benchmark b of domain D(b) with n_b items and
mean response length l_b (characters):

- `db` (domain-balanced, primary): mean over domains d of (mean of a_b over the b in d);
- `macro`: mean of a_b; `item`: sum_b n_b a_b / sum_b n_b; a named subset: mean of a_b over its members;
- `efficiency` (correct answers per 1000 characters): 1000 * sum_b n_b a_b / 100 / sum_b n_b l_b, NaN without
  characters.

All but `efficiency` are linear, score = A @ w. Leaving benchmarks out (`drop`) recomputes the weights on the
remaining ones; `db` then averages only the domains that keep a benchmark.

Light on purpose (numpy and yaml only): the trainers compute their milestones' aggregates with it, and the report
side (`scores.py`, `schema.py`, `report.py`) reads the same definitions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BUILTIN_AGGREGATIONS = ("db", "macro", "item", "efficiency")  # named benchmark subsets add their own


@dataclass(frozen=True)
class BenchmarkInfo:
    """One evaluation benchmark: its name, domain (math | logic | science) and item count."""

    name: str
    domain: str
    items: int


@dataclass(frozen=True)
class BenchmarkSet:
    """Benchmark metadata: name, domain and item count of each benchmark, plus named subsets.

    A subset is an equal-weight aggregation over its member benchmarks (e.g. `math_heavy`).
    """

    benchmarks: tuple[BenchmarkInfo, ...]
    subsets: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.benchmarks:
            raise ValueError("benchmark metadata lists no benchmark")
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique; got {names}")
        for b in self.benchmarks:
            if not isinstance(b.items, int) or b.items <= 0:
                raise ValueError(f"benchmark {b.name!r}: item count must be a positive integer; got {b.items!r}")
            if not b.domain:
                raise ValueError(f"benchmark {b.name!r}: domain must be a non-empty name")
        for subset, members in self.subsets.items():
            if subset in BUILTIN_AGGREGATIONS:
                raise ValueError(
                    f"subset name {subset!r} clashes with a built-in aggregation ({', '.join(BUILTIN_AGGREGATIONS)})"
                )
            unknown = [m for m in members if m not in names]
            if unknown or not members:
                raise ValueError(f"subset {subset!r} names unknown benchmarks {unknown}; allowed: {', '.join(names)}")

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.benchmarks]

    @property
    def domains(self) -> list[str]:
        """Domain names in order of first appearance."""
        return list(dict.fromkeys(b.domain for b in self.benchmarks))

    @classmethod
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], subsets: Mapping[str, Iterable[str]] | None = None
    ) -> BenchmarkSet:
        """From `[{"name", "domain", "items"}, ...]` and `{subset: [benchmark, ...]}`; any other shape is an error."""
        if not isinstance(records, list):
            raise ValueError(f"'benchmarks' must be a list of {{name, domain, items}} records; got {records!r}")
        infos = []
        for record in records:
            if not isinstance(record, Mapping):
                raise ValueError(f"benchmark record {record!r} is not a mapping; each needs name, domain, items")
            missing = {"name", "domain", "items"} - set(record)
            if missing:
                raise ValueError(
                    f"benchmark record {dict(record)} lacks {sorted(missing)}; each needs name, domain, items"
                )
            items = record["items"]
            if isinstance(items, bool) or not isinstance(items, int):
                raise ValueError(f"benchmark {record['name']!r}: item count must be a positive integer; got {items!r}")
            infos.append(BenchmarkInfo(str(record["name"]), str(record["domain"]), items))
        subsets = subsets or {}
        if not isinstance(subsets, Mapping) or not all(isinstance(m, list) for m in subsets.values()):
            raise ValueError(f"'subsets' must map each subset name to a list of benchmarks; got {subsets!r}")
        return cls(tuple(infos), {str(name): tuple(str(m) for m in members) for name, members in subsets.items()})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | list[Any]) -> BenchmarkSet:
        """From `{"benchmarks": [...], "subsets": {...}}` or a bare list of benchmark records."""
        if isinstance(data, list):
            return cls.from_records(data)
        if not isinstance(data, Mapping) or "benchmarks" not in data:
            got = f"keys {sorted(data)}" if isinstance(data, Mapping) else repr(data)
            raise ValueError(f"benchmark metadata needs a 'benchmarks' list; got {got}")
        return cls.from_records(data["benchmarks"], data.get("subsets"))

    @classmethod
    def from_file(cls, path: str | Path) -> BenchmarkSet:
        """From a YAML or JSON file (JSON is YAML); unreadable or malformed metadata is an error naming the file."""
        try:
            with open(path) as handle:
                data = yaml.safe_load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(f"benchmark metadata {path}: no such file") from None
        except yaml.YAMLError as error:
            raise ValueError(
                f"benchmark metadata {path} is not valid YAML/JSON: {' '.join(str(error).split())}"
            ) from None
        try:
            return cls.from_mapping(data)
        except ValueError as error:
            raise ValueError(f"benchmark metadata {path}: {error}") from None

    def to_mapping(self) -> dict[str, Any]:
        return {
            "benchmarks": [{"name": b.name, "domain": b.domain, "items": b.items} for b in self.benchmarks],
            "subsets": {name: list(members) for name, members in self.subsets.items()},
        }


def default_aggregations(bench: BenchmarkSet, has_lengths: bool) -> list[str]:
    """db, macro, item, every named subset, and efficiency when response lengths are known."""
    return ["db", "macro", "item", *bench.subsets, *(["efficiency"] if has_lengths else [])]


def aggregation_list(names: Collection[str] | str | None) -> list[str]:
    """Aggregation names as a list: a single name ("db", e.g. `aggregations=db` on the command line) or a
    sequence of names; None or empty gives []. Anything else is an error naming what was given."""
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    names = list(names)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"aggregations must be names, e.g. [db,macro]; got {names}")
    return names


def check_aggregations(names: list[str], bench: BenchmarkSet, has_lengths: bool) -> None:
    """Raise ValueError naming any aggregation that is unknown or (efficiency) lacks lengths; the allowed
    names listed are the ones this table offers (efficiency only with response lengths)."""
    if "efficiency" in names and not has_lengths:
        raise ValueError(
            "aggregation 'efficiency' needs response lengths (length_chars), which this score table lacks; "
            f"allowed: {', '.join(default_aggregations(bench, has_lengths))}"
        )
    allowed = default_aggregations(bench, has_lengths)
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"unknown aggregations {unknown}; allowed: {', '.join(allowed)}")
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"aggregations must be a non-empty list without repeats; got {names}")


def members(name: str, bench: BenchmarkSet) -> list[str]:
    """The benchmarks an aggregation reads."""
    return list(bench.subsets[name]) if name in bench.subsets else bench.names


def weights(name: str, bench: BenchmarkSet, drop: Collection[str] = ()) -> np.ndarray:
    """Weights w [B] (summing to 1, zero on dropped benchmarks) with score = accuracy @ w."""
    if name not in BUILTIN_AGGREGATIONS and name not in bench.subsets:
        raise ValueError(f"unknown aggregation {name!r}; allowed: {', '.join(default_aggregations(bench, True))}")
    if name == "efficiency":
        raise ValueError("efficiency is a ratio of sums, not a weighted mean; use aggregate()")
    kept = np.array([b.name in members(name, bench) and b.name not in drop for b in bench.benchmarks])
    if not kept.any():
        raise ValueError(f"aggregation {name!r} keeps no benchmark after dropping {sorted(drop)}")
    if name == "item":
        w = np.array([b.items for b in bench.benchmarks], dtype=float) * kept
    elif name == "db":
        domain = np.array([b.domain for b in bench.benchmarks])
        per_domain = {d: kept[domain == d].sum() for d in set(domain[kept])}
        w = np.array([1.0 / per_domain[d] if k else 0.0 for d, k in zip(domain, kept)])
    else:  # macro and named subsets: equal weights over the kept members
        w = kept.astype(float)
    return w / w.sum()


def aggregate(
    accuracy: np.ndarray,
    name: str,
    bench: BenchmarkSet,
    length_chars: np.ndarray | None = None,
    drop: Collection[str] = (),
) -> np.ndarray:
    """Aggregate [..., B] accuracies (%) to [...] scores under `name` (see the module docstring)."""
    if name != "efficiency":
        return accuracy @ weights(name, bench, drop)
    if length_chars is None:
        raise ValueError("aggregation 'efficiency' needs response lengths (length_chars)")
    items = np.array([b.items if b.name not in drop else 0 for b in bench.benchmarks], dtype=float)
    if not items.any():
        raise ValueError(f"aggregation 'efficiency' keeps no benchmark after dropping {sorted(drop)}")
    correct = accuracy / 100.0 @ items
    characters = length_chars @ items
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(characters > 0, 1000.0 * correct / characters, np.nan)  # no characters: undefined, not 0


def milestone_aggregates(
    accuracy: Mapping[str, float], length_chars: Mapping[str, float], bench: BenchmarkSet
) -> dict[str, float]:
    """A backend's milestone aggregates: every default aggregation of one run's per-benchmark accuracies (%),
    efficiency when `length_chars` covers every benchmark."""
    has_lengths = set(length_chars) >= set(bench.names)
    acc = np.array([accuracy[name] for name in bench.names])
    chars = np.array([length_chars[name] for name in bench.names]) if has_lengths else None
    return {name: float(aggregate(acc, name, bench, chars)) for name in default_aggregations(bench, has_lengths)}
