"""Evaluation aggregates of per-benchmark accuracies (DESIGN §6).

For one run with accuracy a_b (%) on benchmark b of domain D(b) with n_b items:

- `db` (domain-balanced, primary): mean over domains d of (mean of a_b over the b in d);
- `macro`: mean of a_b over all benchmarks;
- `item`: sum_b n_b a_b / sum_b n_b (pooled over items);
- a named subset (e.g. `math_heavy`): mean of a_b over its member benchmarks (equal weights);
- `efficiency`: correct answers per 1000 response characters,
  1000 * sum_b n_b a_b / 100 / sum_b n_b l_b with l_b the mean response length (characters);
  undefined (NaN) when no response characters were produced.

All but `efficiency` are linear, score = A @ w. Leaving benchmarks out (`drop`) recomputes the
weights on the remaining ones; `db` then averages only the domains that keep a benchmark.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from tune_dfrl.scores import BUILTIN_AGGREGATIONS, BenchmarkSet


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
        raise ValueError("aggregation 'efficiency' needs response lengths (length_chars), which this score table lacks; "
                         f"allowed: {', '.join(default_aggregations(bench, has_lengths))}")
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


def aggregate(accuracy: np.ndarray, name: str, bench: BenchmarkSet, length_chars: np.ndarray | None = None,
              drop: Collection[str] = ()) -> np.ndarray:
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
