"""The result schema: metric names, the aggregates of DESIGN §6 (for both backends and the report), `summary.json`.

A milestone is reported flat to Ray Tune and MLflow as `step` plus `PREFIX + name` per figure (`RESULT_PREFIXES`);
the search metric is `SCORE + aggregation`. Aggregates of one run with accuracy a_b (%) on benchmark b of domain
D(b) with n_b items and mean response length l_b (characters):

- `db` (domain-balanced, primary): mean over domains d of (mean of a_b over the b in d);
- `macro`: mean of a_b; `item`: sum_b n_b a_b / sum_b n_b; a named subset: mean of a_b over its members;
- `efficiency` (correct answers per 1000 characters): 1000 * sum_b n_b a_b / 100 / sum_b n_b l_b, NaN without characters.

All but `efficiency` are linear, score = A @ w. Leaving benchmarks out (`drop`) recomputes the weights on the
remaining ones; `db` then averages only the domains that keep a benchmark. `Summary` is what `summary.json`
holds (`tune_dfrl.report.analyze`), NaN and infinite figures as null.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tune_dfrl.stats import ArmVerdict

if TYPE_CHECKING:
    from tune_dfrl.scores import BenchmarkSet

SCORE, ACCURACY, LENGTH, FORMAT_FAILURE, TRAIN = "score/", "acc/", "len/", "fmt_fail/", "train/"
RESULT_PREFIXES = {
    ACCURACY: "accuracy",
    LENGTH: "length_chars",
    FORMAT_FAILURE: "format_failure",
    SCORE: "aggregates",
    TRAIN: "train",
}  # flat key prefix -> field of a Milestone and of a results line
BUILTIN_AGGREGATIONS = ("db", "macro", "item", "efficiency")  # named benchmark subsets add their own


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


def json_safe(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to None."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value


@dataclass(frozen=True, kw_only=True)
class ArmStats(ArmVerdict):
    """One arm on one aggregation: its paired verdict against the control, its mean and the control's over the
    seeds they share (mean - control_mean = delta), and the power figures of `stats.power_figures`."""

    mean: float
    control_mean: float
    seeds: list[int]
    mde: float | None  # None: infinite
    seeds_to_detect: int | None
    seeds_for_equivalence: int | None


@dataclass(frozen=True)
class Recommendation:
    """DESIGN §7's choice on `aggregation` (`stats.recommend`); without a comparison only the first four."""

    recommended: str
    is_control: bool
    reason: str
    aggregation: str
    delta: float | None = None
    ci_low: float | None = None
    common_low: float | None = None
    common_level: float | None = None
    point_best: list[str] = field(default_factory=list)
    seeds_to_detect: int | None = None
    seeds_for_equivalence: int | None = None


@dataclass(frozen=True)
class RankAgreement:
    """Spearman rho and Kendall tau-b between two rankings of the arm means (`stats.rank_agreement`; None: constant)."""

    spearman: float | None
    kendall: float | None


@dataclass(frozen=True, kw_only=True)
class LeftOut(RankAgreement):
    """The full ranking vs the one with some benchmarks left out, its winner, and verdict changes ("before -> after")."""

    winner: str
    verdict_changes: dict[str, str]


@dataclass(frozen=True)
class Robustness:
    """Leaving out one benchmark (lobo) or domain (lodo) at a time: the least agreeing one and each one's figures."""

    min_kendall: float | None
    min_at: str
    arms_changing_verdict: list[str]
    left_out: dict[str, LeftOut]


@dataclass(frozen=True)
class CurvePoint:
    """An arm's paired Δ at one training step with its (1 - alpha) t-interval over n seeds (None: unbounded)."""

    step: int
    delta: float
    ci_low: float | None
    ci_high: float | None
    n: int


EQUIVALENT = "control-equivalent"  # the status of a suggestion whose canonical form is the control (never trained)


@dataclass(frozen=True)
class ArmStatus:
    """How one arm of a search ended, and its answer under the search's rule (`tune_dfrl.report.analyze_search`).

    `status`: control | analysed | stopped | failed | excluded | control-equivalent (`EQUIVALENT`: a suggestion
    that acts as the control, keyed by its label as suggested, `arm_id` the control's); `text` says it in words
    ("stopped at step 20"); `verdict`: the answer (fixed rule: better | worse | equivalent | inconclusive; sequential rule: the last look's
    better | worse | futile | open, or out), else the status. Figures on the primary aggregation at `step`, over
    `seeds`: the arm's mean and its paired Δ against the control with the interval at `level` that the answer
    rests on (fixed: Holm-adjusted; sequential: the repeated confidence interval at the common level; stopped: the
    unadjusted (1 - alpha) interval at the rung)."""

    status: str
    text: str
    verdict: str
    arm_id: str = ""
    step: int | None = None
    seeds: list[int] = field(default_factory=list)
    mean: float | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    level: float | None = None
    reason: str = ""  # stopped: the rung decision; failed: the last error
    failed_seeds: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SeriesPoint:
    """An arm at one milestone step on the primary aggregation: its mean over the `n` seeds that reached the step,
    and (searched arms, >= 2 paired seeds) the paired Δ with its unadjusted (1 - alpha) t-interval."""

    step: int
    mean: float
    n: int
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass(frozen=True)
class Summary:
    """What `summary.json` holds. A search whose every searched arm was stopped compares nothing: then only
    control, seeds, primary, recommendation, rule, statuses, series, stopped, failed and notes are filled."""

    control: str
    seeds: list[int]
    primary: str
    recommendation: Recommendation
    arms: dict[str, dict[str, ArmStats]] = field(default_factory=dict)  # arm -> aggregation -> stats
    stopped: dict[str, str] = field(default_factory=dict)  # arm stopped at a rung -> note
    failed: dict[str, list[int]] = field(default_factory=dict)  # arm -> seeds failed after their last retry
    notes: list[str] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    aggregations: list[str] = field(default_factory=list)
    equivalence_margin: float | None = None
    alpha: float | None = None
    holm_family: int | None = None
    seed: int | None = None
    flip_k: int | None = None
    flip_k_used: int | None = None
    decision_rule: str = ""
    bca_coverage_95: dict[str, float] = field(default_factory=dict)
    verdicts: dict[str, str] = field(default_factory=dict)  # verdict on the primary aggregation
    control_mean: dict[str, float] = field(default_factory=dict)
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # aggregation -> arm -> mean
    ranking: dict[str, list[str]] = field(default_factory=dict)  # aggregation -> arms, best mean first
    prob_best: dict[str, dict[str, float] | None] = field(default_factory=dict)
    winner_flip_rate: dict[str, float | None] = field(default_factory=dict)
    flip_subsets: int | None = None
    rank_correlation: dict[str, RankAgreement] = field(default_factory=dict)  # "a~b" (two aggregations)
    range: dict[str, float] = field(default_factory=dict)
    robustness: dict[str, dict[str, Robustness]] = field(default_factory=dict)  # aggregation -> lobo | lodo
    curves: dict[str, list[CurvePoint]] = field(
        default_factory=dict
    )  # arm -> its points, by step (primary aggregation)
    arm_seeds: dict[str, list[int]] = field(default_factory=dict)
    arm_steps: dict[str, int] = field(default_factory=dict)
    arm_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    benchmarks: dict[str, Any] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # arm -> why it was not compared
    sequential: dict[str, Any] | None = None  # seeds=auto: OUT/sequential.json (the looks, `tune_dfrl.seed_batches`)
    rule: str = ""  # a search's answer: "fixed" (Holm over the fixed-sample analysis) or "sequential" (the looks)
    statuses: dict[str, ArmStatus] = field(default_factory=dict)  # every arm of a search, the control included
    series: dict[str, list[SeriesPoint]] = field(default_factory=dict)  # arm -> its milestones (primary aggregation)
    rerender: str = ""  # a re-render with options other than the search's: which (its verdicts are not the search's)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """From the JSON form (`to_dict`); an unknown or missing key is a ValueError naming it."""
        data = json_safe(dict(data))
        try:
            return cls(
                **{
                    **data,
                    "recommendation": Recommendation(**data["recommendation"]),
                    "arms": {
                        arm: {name: ArmStats(**s) for name, s in by_name.items()}
                        for arm, by_name in data.get("arms", {}).items()
                    },
                    "rank_correlation": {
                        pair: RankAgreement(**r) for pair, r in data.get("rank_correlation", {}).items()
                    },
                    "robustness": {
                        name: {
                            kind: Robustness(**{**r, "left_out": {k: LeftOut(**v) for k, v in r["left_out"].items()}})
                            for kind, r in kinds.items()
                        }
                        for name, kinds in data.get("robustness", {}).items()
                    },
                    "curves": {
                        arm: [CurvePoint(**p) for p in points] for arm, points in data.get("curves", {}).items()
                    },
                    "statuses": {arm: ArmStatus(**s) for arm, s in data.get("statuses", {}).items()},
                    "series": {
                        arm: [SeriesPoint(**p) for p in points] for arm, points in data.get("series", {}).items()
                    },
                }
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"summary does not match the schema: {error}") from error

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Summary:
        return cls.from_dict(json.loads(text))
