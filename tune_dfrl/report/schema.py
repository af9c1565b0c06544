"""The result schema: `summary.json`.

`Summary` is what `summary.json` holds (`tune_dfrl.report.analysis.analyze`), NaN and infinite figures as null; the
milestones' flat metric names are `tune_dfrl.backends.base`'s, their aggregates `tune_dfrl.backends.benchmarks`'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tune_dfrl.paired.stats import ArmVerdict


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
HOLM, UNADJUSTED, SEQUENTIAL = "holm", "unadjusted", "sequential"  # the kinds of an `ArmStatus` interval
INTERVAL_KINDS = {
    HOLM: "Holm-adjusted paired t-interval at the last step (its level 1 - α/(m - k + 1) at Holm step k): decides "
    "better / worse",
    UNADJUSTED: "unadjusted paired t-interval at the stop step, over the seeds the arm and the control both reached: "
    "descriptive, no verdict",
    SEQUENTIAL: "repeated confidence interval of the arm's last sequential look, at that look's boundary (the common "
    "nominal level α/K): decides under seeds=auto",
}
UNSETTLED = "unsettled"  # a sequential arm still open when the looks ended (the last look was taken)


@dataclass(frozen=True)
class ArmStatus:
    """How one arm of a search ended, and its answer under the search's rule (`tune_dfrl.report.analysis.analyze_search`).

    `status`: control | analysed | stopped | failed | excluded | control-equivalent (`EQUIVALENT`: a suggestion
    that acts as the control, keyed by its label as suggested, `arm_id` the control's); `text` says it in words
    ("stopped at step 20"); `verdict`: the answer (fixed rule: better | worse | equivalent | inconclusive; sequential rule: the last look's
    better | worse | futile | open, unsettled once the looks ended, or out), else the status. Figures on the primary aggregation at `step`, over
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
    reason: str = ""  # stopped: the rung decision (the leader named); failed: the last error
    failed_seeds: list[int] = field(default_factory=list)
    control_mean: float | None = None  # the control's mean at `step` over `seeds` (mean - control_mean = delta)
    interval: str = ""  # the kind of the interval: holm | unadjusted | sequential ("" without one); `INTERVAL_KINDS`


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
    sequential: dict[str, Any] | None = (
        None  # seeds=auto: OUT/sequential.json (the looks, `tune_dfrl.paired.seed_batches`)
    )
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
