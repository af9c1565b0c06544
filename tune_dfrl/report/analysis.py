"""The report: which arms beat the control (Holm-adjusted), and how robust any ranking is (DESIGN §6-§7).

    python -m tune_dfrl.report runs=data/dataflex_rl/dataflex_rl_all_runs_171.csv control=baseline \\
        filter.campaign=main filter.model=Qwen2.5-7B-Instruct out=report_main_7b
    python -m tune_dfrl.report runs=OUT                  # a search's output directory (results.jsonl)
    python -m tune_dfrl.report experiment=NAME mlflow.tracking_uri=sqlite:////abs/mlflow.db

`analyze(table, control, ...)` returns the `summary.json` content (`tune_dfrl.report.schema.Summary`). Per arm and aggregation it holds
the paired statistics of `tune_dfrl.paired.stats.paired_verdicts` and the power figures; the Holm family
is every arm of the table (excluded ones too) or the whole search (`family_size`), separately per
aggregation, and the leave-one-out re-tests use that same family. The recommendation follows
DESIGN §7 on the primary (first) aggregation. The joint analyses (probability of being best,
winner-flip rate) use the seeds every compared arm shares with the control. An arm's mean and its
Δ are taken over the seeds it shares with the control (`seeds`, with the control's mean on those
seeds, `control_mean`: mean - control_mean = Δ); the control's own mean over all its seeds.

An arm sharing fewer than 2 seeds with the control is excluded and listed in `excluded`; seeds
of an arm without a control run are ignored and listed in `notes`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tune_dfrl.backends.base import SCORE
from tune_dfrl.backends.benchmarks import (
    BenchmarkSet,
    aggregate,
    aggregation_list,
    check_aggregations,
    default_aggregations,
    members,
)
from tune_dfrl.errors import NothingToCompare
from tune_dfrl.paired.ledger import PairedLedger
from tune_dfrl.paired.rungs import name_leader
from tune_dfrl.paired.stats import (
    BCA_COVERAGE_95,
    paired_verdicts,
    power_figures,
    prob_best,
    rank_agreement,
    recommend,
    winner_flip_rate,
)
from tune_dfrl.report.render import print_summary, write_report
from tune_dfrl.report.schema import (
    EQUIVALENT,
    HOLM,
    SEQUENTIAL,
    UNADJUSTED,
    UNSETTLED,
    ArmStatus,
    Recommendation,
    SeriesPoint,
    Summary,
)
from tune_dfrl.report.scores import Runs, ScoreTable

if TYPE_CHECKING:
    from tune_dfrl.state.records import SearchRecord

__all__ = ["analyze", "analyze_search", "write_report", "print_summary", "default_control"]

CONTROL_METHODS = ("baseline", "static")
OLD_STOP_WORDS = re.compile(  # a rung reason in the words of an older stops.jsonl (a verdict word for a rule)
    r"^(?P<negated>not )?credibly worse than the leader: (?P<level>\d+%) interval of \(candidate - (?P<leader>.+)\) "
    r"over (?P<seeds>\d+) seeds \[(?P<low>[^,]+), (?P<high>[^\]]+)\]$"
)
MIN_PAIRED_SEEDS = 2  # a paired interval needs 2 seeds shared with the control
DECISION_RULE = (
    "better/worse: the Holm-adjusted paired t-interval (ci_low, ci_high) lies above/below 0, equivalently "
    "p_holm < alpha; equivalent: TOST, the (1 - 2 alpha) paired t-interval (eq_low, eq_high) lies inside "
    "+-margin (per arm at alpha, not adjusted for the m arms); otherwise inconclusive. An arm with the same difference at every seed (no spread) is judged "
    "by the exact sign-flip test instead (smallest p 2^(1-n) at n seeds). Among better arms the one with the "
    "highest lower bound at the common level 1 - alpha/m is recommended. BCa intervals and permutation "
    "p-values are reported, not deciding."
)


def default_control(table: ScoreTable) -> str:
    """The one arm whose method (or name) is baseline or static; else an error asking for control=."""
    found = [
        arm
        for arm in table.arms
        if arm in CONTROL_METHODS or table.arm_info.get(arm, {}).get("method") in CONTROL_METHODS
    ]
    if len(found) != 1:
        raise ValueError(f"cannot infer the control arm ({len(found)} candidates among {table.arms}); set control=NAME")
    return found[0]


class ArmScores:
    """Aggregated score matrices [arm x control seed] of the final milestones, NaN where a run is missing."""

    def __init__(self, bench: BenchmarkSet, runs: Runs, control: str, arms: list[str], seeds: list[int]):
        self.bench, self.runs = bench, runs
        self.index, self.seeds = [control, *arms], seeds
        self.ran = self._pivot(np.ones(len(runs.keys))).notna()  # [arm x seed]: a run exists

    def matrix(self, name: str, drop: tuple[str, ...] = ()) -> pd.DataFrame:
        return self._pivot(aggregate(self.runs.accuracy, name, self.bench, self.runs.length_chars, drop))

    def undefined(self, matrix: pd.DataFrame) -> list[tuple[str, int]]:
        """(arm, seed) of runs that exist but score NaN in `matrix`, e.g. efficiency with no response characters (0/0)."""
        flags = (matrix.isna() & self.ran).stack()
        return list(flags[flags].index)

    def _pivot(self, values: np.ndarray) -> pd.DataFrame:
        frame = self.runs.keys.assign(score=values)
        return frame.pivot(index="arm", columns="seed", values="score").reindex(index=self.index, columns=self.seeds)


def pair_arms(keys: pd.DataFrame, control: str) -> tuple[list[int], list[str], dict[str, str], list[str]]:
    """(control seeds, compared arms, excluded {arm: reason}, notes) from the runs' (arm, seed) keys."""
    seeds_of = keys.groupby("arm")["seed"].agg(lambda s: sorted(set(s)))
    control_seeds = seeds_of[control]
    arms, excluded, notes = [], {}, []
    for arm, seeds in seeds_of.items():
        if arm == control:
            continue
        shared = sorted(set(seeds) & set(control_seeds))
        if len(shared) < 2:
            excluded[arm] = (
                f"shares {len(shared)} seed(s) with the control {control!r} (arm seeds {seeds}, control seeds "
                f"{control_seeds}); a paired comparison needs at least 2"
            )
            continue
        arms.append(arm)
        if unpaired := sorted(set(seeds) - set(control_seeds)):
            notes.append(f"arm {arm!r}: seeds {unpaired} have no control run and are ignored")
        if lacking := sorted(set(control_seeds) - set(seeds)):
            notes.append(f"arm {arm!r}: no run at control seeds {lacking}; compared on {len(shared)} seeds")
    if not arms:
        raise ValueError(
            f"no arm shares at least 2 seeds with the control {control!r}: {excluded or 'the table has no other arm'}"
        )
    return control_seeds, arms, excluded, notes


def _robustness(
    scores: ArmScores,
    name: str,
    means: pd.Series,
    verdicts: dict[str, str],
    delta: float,
    alpha: float,
    family: int,
    notes: list[str],
) -> dict:
    """Leave-one-benchmark-out and leave-one-domain-out: Kendall/Spearman vs the full ranking, verdict changes
    (re-tested with the main analysis's Holm family size).

    A left-out subset under which some run's score is undefined (e.g. `efficiency` with no response
    characters left: 0/0) is skipped, and a note says so.
    """
    used = members(name, scores.bench)
    left_out = {
        "lobo": {b: (b,) for b in used},
        "lodo": {d: tuple(b.name for b in scores.bench.benchmarks if b.domain == d) for d in scores.bench.domains},
    }
    out = {}
    for kind, drops in left_out.items():
        per = {}
        for key, drop in drops.items():
            if set(used) <= set(drop) or not set(used) & set(drop):
                continue  # nothing left, or nothing changes
            matrix = scores.matrix(name, drop)
            if undefined := scores.undefined(matrix):
                notes.append(
                    f"robustness of '{name}' without {key!r} skipped: the score is undefined for "
                    f"{len(undefined)} run(s) on the remaining benchmarks (e.g. no response characters)"
                )
                continue
            reduced = paired_verdicts(
                matrix.iloc[0].to_numpy(),
                {a: matrix.loc[a].to_numpy() for a in verdicts},
                delta,
                alpha,
                family_size=family,
            )
            changes = {a: f"{verdicts[a]} -> {v.verdict}" for a, v in reduced.items() if v.verdict != verdicts[a]}
            reduced_means = matrix.mean(axis=1)
            per[key] = {
                **rank_agreement(means.to_numpy(), reduced_means.to_numpy()),
                "winner": str(reduced_means.idxmax()),
                "verdict_changes": changes,
            }
        if per:
            worst = min(per, key=lambda k: np.nan_to_num(per[k]["kendall"], nan=np.inf))
            out[kind] = {
                "min_kendall": per[worst]["kendall"],
                "min_at": worst,
                "arms_changing_verdict": sorted({a for v in per.values() for a in v["verdict_changes"]}),
                "left_out": per,
            }
    return out


def _ledger(table: ScoreTable, name: str, control: str) -> PairedLedger:
    """Scores of aggregation `name` at every milestone of `table`, paired against `control` (undefined ones left out)."""
    runs = table.runs()
    ledger = PairedLedger(control)
    scores = aggregate(runs.accuracy, name, table.bench, runs.length_chars)
    for (arm, seed, step), score in zip(runs.keys.itertuples(index=False), scores):
        if np.isfinite(score):  # undefined (e.g. efficiency without characters): no point
            ledger.record(arm, seed, step, score)
    return ledger


def _curves(table: ScoreTable, name: str, control: str, arms: list[str], alpha: float) -> dict[str, list[dict]]:
    """Paired delta vs step (primary aggregation) with its (1 - alpha) interval (`PairedLedger.estimate`), at the
    steps with >= 2 paired seeds."""
    if not table.has_steps or table.frame["step"].nunique() < 2:
        return {}
    ledger = _ledger(table, name, control)
    curves: dict[str, list[dict]] = {}
    for arm in arms:
        for step in sorted(table.frame["step"].unique()):
            e = ledger.estimate(arm, int(step), 1 - alpha)
            if len(e.seeds) >= 2:
                curves.setdefault(arm, []).append(
                    {"step": e.step, "delta": e.mean, "ci_low": e.low, "ci_high": e.high, "n": len(e.seeds)}
                )
    return curves


def _flip_size(flip_k: int, common: int, notes: list[str]) -> int | None:
    """Seed-subset size of the winner-flip rate: flip_k, reduced to common - 1 when the arms share too few
    seeds (a note says so); None when they share fewer than 2."""
    if common < 2:
        notes.append(f"winner-flip rate needs at least 2 seeds shared by all arms; there are {common}")
        return None
    if flip_k >= common:
        notes.append(
            f"winner-flip rate over subsets of {common - 1} of the {common} seeds shared by all arms "
            f"(flip_k={flip_k} needs more than {flip_k} seeds)"
        )
        return common - 1
    return flip_k


def analyze(
    table: ScoreTable,
    control: str,
    aggregations: list[str] | str | None = None,
    delta: float = 1.0,
    alpha: float = 0.05,
    seed: int = 0,
    flip_k: int = 3,
    family_size: int | None = None,
) -> Summary:
    """The summary.json content of a score table (module docstring); deterministic under `seed`.

    `family_size`: the Holm family when the table holds only some arms of a search (the others
    stopped early); by default every arm of the table but the control, excluded ones included.
    `flip_k`: the winner-flip subset size, reduced when the arms share no more than flip_k seeds.
    """
    if not isinstance(flip_k, int) or flip_k < 1:
        raise ValueError(f"flip_k (the winner-flip subset size) must be an integer >= 1; got {flip_k!r}")
    rng = np.random.default_rng(seed)
    final = table.final()
    aggregations = aggregation_list(aggregations) or default_aggregations(table.bench, table.has_lengths)
    check_aggregations(aggregations, table.bench, table.has_lengths)
    if control not in final.arms:
        raise ValueError(f"control {control!r} is not an arm of the score table; arms: {', '.join(final.arms)}")
    runs = final.runs()
    seeds, arms, excluded, notes = pair_arms(runs.keys, control)
    family = max(len(arms) + len(excluded), family_size or 0)  # DESIGN §7: the family is the whole search
    scores = ArmScores(final.bench, runs, control, arms, seeds)
    notes = (
        list(final.notes)
        + notes
        + [f"excluded arm {a!r}: {why}; it stays in the Holm family" for a, why in excluded.items()]
    )
    if final.has_steps:
        last = final.frame.groupby("arm")["step"].max()
        notes += [
            f"arm {a!r} ends at step {last[a]}, the control at {last[control]}: its deltas compare different "
            f"training lengths"
            for a in arms
            if last[a] != last[control]
        ]

    per_arm: dict[str, dict[str, dict]] = {arm: {} for arm in arms}
    means, verdicts_by_agg, prob, flips, ranking, joints, robustness = {}, {}, {}, {}, {}, {}, {}
    for name in aggregations:
        matrix = scores.matrix(name)
        if undefined := scores.undefined(matrix):
            arm, seed = undefined[0]
            raise ValueError(
                f"aggregation {name!r} is undefined (NaN) for {len(undefined)} run(s), e.g. arm {arm!r} seed "
                f"{seed} (efficiency needs response characters); choose other aggregations="
            )
        control_row = matrix.loc[control].to_numpy()
        verdicts = paired_verdicts(
            control_row,
            {a: matrix.loc[a].to_numpy() for a in arms},
            delta,
            alpha,
            bootstrap=True,
            rng=rng,
            family_size=family,
        )
        arm_means = matrix.mean(axis=1)
        for arm, v in verdicts.items():
            shared = matrix.loc[arm].notna()
            per_arm[arm][name] = {
                "mean": arm_means[arm],
                "control_mean": matrix.loc[control, shared].mean(),
                "seeds": [s for s, ran in shared.items() if ran],
                **asdict(v),
                **power_figures(v, delta, alpha, family),
            }
        means[name] = arm_means.to_dict()
        ranking[name] = list(arm_means.sort_values(ascending=False, kind="stable").index)
        verdicts_by_agg[name] = verdicts
        joints[name] = joint = matrix.loc[:, matrix.notna().all(axis=0)].to_numpy()
        prob[name] = dict(zip(matrix.index, prob_best(joint, rng))) if joint.shape[1] >= 2 else None
        robustness[name] = _robustness(
            scores, name, arm_means, {a: v.verdict for a, v in verdicts.items()}, delta, alpha, family, notes
        )

    common = joint.shape[1]  # seeds shared by every compared arm and the control (the same under every aggregation)
    flip_used = _flip_size(flip_k, common, notes)
    for name in aggregations:
        flips[name], flip_subsets = winner_flip_rate(joints[name], flip_used, rng) if flip_used else (None, None)
    if common < 2:
        notes.append(f"probability of being best needs at least 2 seeds shared by all arms; there are {common}")
    primary = aggregations[0]
    open_arms = [a for a in arms if per_arm[a][primary]["verdict"] == "inconclusive"]
    pairs = [(a, b) for i, a in enumerate(aggregations) for b in aggregations[i + 1 :]]
    recommendation = recommend(
        verdicts_by_agg[primary],
        control,
        delta,
        max((per_arm[a][primary]["seeds_to_detect"] for a in open_arms), default=None),
        max((per_arm[a][primary]["seeds_for_equivalence"] for a in open_arms), default=None),
    )
    summary = {
        "source": dict(table.origin),
        "control": control,
        "seeds": seeds,
        "aggregations": aggregations,
        "primary": primary,
        "equivalence_margin": delta,
        "alpha": alpha,
        "holm_family": family,
        "seed": seed,
        "flip_k": flip_k,
        "flip_k_used": flip_used,
        "decision_rule": DECISION_RULE,
        "bca_coverage_95": BCA_COVERAGE_95,
        "arms": per_arm,
        "verdicts": {arm: per_arm[arm][primary]["verdict"] for arm in arms},
        "control_mean": {name: means[name][control] for name in aggregations},
        "means": means,
        "ranking": ranking,
        "recommendation": {"aggregation": primary, **recommendation},
        "prob_best": prob,
        "winner_flip_rate": flips,
        "flip_subsets": flip_subsets,
        "rank_correlation": {
            f"{a}~{b}": rank_agreement(pd.Series(means[a]).to_numpy(), pd.Series(means[b]).to_numpy()) for a, b in pairs
        },
        "range": {name: max(means[name].values()) - min(means[name].values()) for name in aggregations},
        "robustness": robustness,
        "curves": _curves(table, primary, control, arms, alpha),
        "arm_seeds": {
            arm: sorted(final.frame.loc[final.frame["arm"] == arm, "seed"].unique().tolist())
            for arm in [control, *arms]
        },
        "arm_steps": (
            {arm: int(s) for arm, s in final.frame.groupby("arm")["step"].max().items()} if final.has_steps else {}
        ),
        "arm_info": table.arm_info,
        "benchmarks": table.bench.to_mapping(),
        "excluded": excluded,
        "notes": notes,
    }
    return Summary.from_dict(summary)


def search_options(record: SearchRecord, table: ScoreTable) -> dict[str, Any]:
    """The report options a search ran with: its metric first among the default aggregations, its report settings."""
    own = record.plan["metric"].removeprefix(SCORE)
    report = record.plan["report"]
    defaults = default_aggregations(table.bench, table.has_lengths)
    return {
        "aggregations": [own] + [a for a in defaults if a != own],
        **{k: report[k] for k in ("delta", "alpha", "seed", "flip_k")},
    }


def analyze_search(table: ScoreTable, record: SearchRecord, **options: Any) -> Summary:
    """The one analysis of a search: its milestones (`table`, from results.jsonl or MLflow) and its record.

    Every arm the search tried gets an `ArmStatus`: the control; analysed (ran the full budget on >= 2 seeds shared
    with the control); excluded (fewer); stopped at a rung (figures at the rung: paired Δ over the seeds both
    reached, unadjusted (1 - alpha) interval); failed (every seed it ran failed after its last retry; its
    milestones are dropped, like those of every failed cell); control-equivalent (a suggestion whose canonical form
    is the control, never trained: `record.equivalents`). The Holm family m is every searched arm, whatever its
    status; a control-equivalent suggestion is no arm (it tests nothing). The rule is the search's: fixed seeds ->
    the Holm-adjusted fixed-sample analysis decides; seeds=auto -> the group-sequential looks decide (valid under
    optional stopping) and the fixed-sample figures are descriptive.
    `options` (aggregations, delta, alpha, seed, flip_k; None: the search's) other than the search's make a
    re-render, named in `rerender`; with none, the analysis is the search's own, number for number.
    """
    own = search_options(record, table)
    given = {k: (aggregation_list(v) if k == "aggregations" else v) for k, v in options.items() if v is not None}
    opts = {**own, **given}
    other = {k: v for k, v in given.items() if v != own[k]}
    final = max(record.plan["milestones"])
    control_id = record.plan["control"]["arm_id"]
    table, failed, errors = _without_failed_cells(table, record.failures, final)
    names = {info["arm_id"]: arm for arm, info in table.arm_info.items() if info.get("arm_id")}
    for r in record.failures:  # an arm that failed before its first milestone is in the failures only
        names.setdefault(r["arm_id"], r["label"])
    present = set(table.frame["arm"])
    control = names.get(control_id)
    if control not in present:
        raise NothingToCompare("the control has no milestone left to compare with")
    primary, alpha = opts["aggregations"][0], opts["alpha"]
    ledger = _ledger(table, primary, control)
    steps = table.frame.groupby("arm")["step"].agg(set)
    reached = steps.map(max)
    stops: dict[str, dict] = {}
    for r in record.stops:
        stops.setdefault(r["arm_id"], r)
    searched = [arm for arm_id, arm in names.items() if arm_id != control_id]
    complete = [arm for arm in searched if arm in present and reached[arm] >= final]
    statuses, stop_notes = {control: _control_status(ledger, control, control_id, final)}, {}
    for arm_id, arm in names.items():
        if arm == control:
            continue
        if arm not in present:
            statuses[arm] = ArmStatus(
                "failed",
                f"failed at seeds {failed[arm]}",
                "failed",
                arm_id,
                failed_seeds=failed[arm],
                reason=errors[arm],
            )
        elif arm not in complete:
            step = int(reached[arm])
            why = _stop_reason(stops.get(arm_id), names)
            stop_notes[arm] = (
                f"arm {arm!r} was stopped at a rung, step {step} ({why}): its Δ at the stop step is shown unadjusted, "
                "no verdict"
            )
            statuses[arm] = _stopped_status(ledger, arm, arm_id, step, 1 - alpha, why, failed.get(arm, []))
    family = len(searched)
    if complete:
        summary = _fixed_analysis(table, control, complete, opts, family, failed)
    else:
        summary = Summary(control, sorted(ledger.scores(control, final)), primary, _keep_control(control, primary))
    for arm in complete:
        statuses[arm] = _analysed_status(summary, arm, names, final, failed.get(arm, []))
    rule = "sequential" if record.sequential else "fixed"
    recommendation = summary.recommendation
    if record.sequential:
        statuses, recommendation = _sequential_answer(record.looks, statuses, summary, names, primary)
    for label, times in Counter(r["label"] for r in record.equivalents).items():
        why = f"acts exactly as the control {control!r} (canonical form); suggested {times} time(s)"
        statuses.setdefault(
            label, ArmStatus(EQUIVALENT, f"{EQUIVALENT} (never trained)", EQUIVALENT, control_id, reason=why)
        )
    return replace(
        summary,
        recommendation=recommendation,
        stopped=stop_notes,
        failed=failed,
        notes=list(stop_notes.values()) + summary.notes,
        holm_family=family,
        alpha=alpha,
        equivalence_margin=opts["delta"],
        sequential=record.looks,
        rule=rule,
        statuses=statuses,
        verdicts={arm: s.verdict for arm, s in statuses.items() if arm != control},
        series={
            arm: _series(ledger, arm, sorted(steps[arm]), arm == control, 1 - alpha)
            for arm in statuses
            if arm in present
        },
        rerender=(
            "re-rendered with options other than the search's: "
            + ", ".join(f"{k}={v} (the search: {own[k]})" for k, v in other.items())
            + "; these verdicts are not the search's"
            if other
            else ""
        ),
    )


def _fixed_analysis(
    table: ScoreTable, control: str, complete: list[str], opts: dict[str, Any], family: int, failed: dict
) -> Summary:
    """`analyze` of the arms that ran their full budget, in the Holm family of the whole search."""
    seeds = table.frame.groupby("arm")["seed"].agg(set)
    if not any(len(seeds[arm] & seeds[control]) >= MIN_PAIRED_SEEDS for arm in complete):
        why = f"the control failed at seeds {failed[control]}" if control in failed else "too few seeds finished"
        raise NothingToCompare(f"no arm shares {MIN_PAIRED_SEEDS} finished seeds with the control", why)
    kept = replace(table, frame=table.frame[table.frame["arm"].isin([control, *complete])])
    o = opts
    return analyze(kept, control, o["aggregations"], o["delta"], o["alpha"], o["seed"], o["flip_k"], family)


def _keep_control(control: str, primary: str) -> Recommendation:
    reason = "every searched arm was stopped by the scheduler at a rung or failed; keep the control"
    return Recommendation(control, True, reason, primary)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _control_status(ledger: PairedLedger, control: str, control_id: str, final: int) -> ArmStatus:
    scores = ledger.scores(control, final)
    mean = float(np.mean(list(scores.values()))) if scores else None
    return ArmStatus("control", "control", "control", control_id, final, sorted(scores), mean, 0.0, control_mean=mean)


def _stop_reason(stop: dict | None, names: dict[str, str]) -> str:
    """A stop's rung reason as a person reads it: the leader named by its label, any arm id (an older stops.jsonl
    quoted them) replaced by its name."""
    if stop is None:
        return "stopped before its last milestone"
    reason = name_leader(stop["reason"], names.get(stop.get("leader") or "", stop.get("leader")))
    for arm_id, name in names.items():
        reason = reason.replace(repr(arm_id), name)
    if old := OLD_STOP_WORDS.match(reason):  # a record written before the rule's own words: translated
        below = "not below 0" if old["negated"] else "below 0"
        reason = (
            f"{old['level']} interval of Δ against the leader {old['leader']} [{old['low']}, {old['high']}] over "
            f"{old['seeds']} seeds, {below}"
        )
    return reason


def _stopped_status(
    ledger: PairedLedger, arm: str, arm_id: str, step: int, confidence: float, why: str, failed: list[int]
) -> ArmStatus:
    """A stopped arm at its last milestone: paired Δ over the seeds it shares there with the control, unadjusted; its
    mean and the control's at that step over those seeds (all its seeds there when it shares fewer than 2)."""
    e = ledger.estimate(arm, step, confidence)
    scores = ledger.scores(arm, step)
    control = ledger.scores(ledger.control, step)
    paired = [seed for seed in e.seeds if seed in scores and seed in control]
    if len(paired) >= MIN_PAIRED_SEEDS:
        scores = {seed: scores[seed] for seed in paired}
    control_mean = float(np.mean([control[seed] for seed in paired])) if paired else None
    return ArmStatus(
        "stopped",
        f"stopped at step {step}",
        "stopped",
        arm_id,
        step,
        list(e.seeds),
        float(np.mean(list(scores.values()))),
        _finite(e.mean),
        _finite(e.low),
        _finite(e.high),
        confidence,
        why,
        failed,
        control_mean,
        UNADJUSTED,
    )


def _analysed_status(summary: Summary, arm: str, names: dict[str, str], final: int, failed: list[int]) -> ArmStatus:
    arm_id = next(i for i, name in names.items() if name == arm)
    if arm in summary.excluded:
        return ArmStatus("excluded", f"excluded: {summary.excluded[arm]}", "excluded", arm_id, final)
    s = summary.arms[arm][summary.primary]
    text = f"analysed at step {final}" + (f", failed at seeds {failed}" if failed else "")
    return ArmStatus(
        "analysed",
        text,
        s.verdict,
        arm_id,
        final,
        s.seeds,
        s.mean,
        s.delta,
        s.ci_low,
        s.ci_high,
        s.level,
        "",
        failed,
        s.control_mean,
        HOLM,
    )


def _sequential_answer(
    history: dict | None, statuses: dict[str, ArmStatus], summary: Summary, names: dict[str, str], primary: str
) -> tuple[dict[str, ArmStatus], Recommendation]:
    """seeds=auto: each analysed arm's verdict and interval from its last look (the repeated confidence interval at
    the common level α/K of that look), and the looks' recommendation."""
    looks = (history or {}).get("looks", [])
    if not looks:
        return statuses, _keep_control(summary.control, primary)
    last, out = looks[-1], dict(statuses)
    for arm_id, arm in names.items():
        status = statuses.get(arm)
        if status is None or status.status != "analysed":
            continue
        state = last["states"].get(arm_id)
        if state is None:
            why = last["out"].get(arm_id, "not looked at")
            out[arm] = replace(
                status, verdict="out", reason=why, delta=None, ci_low=None, ci_high=None, level=None, interval=""
            )
            continue
        seeds = last["handed"].get(arm_id, status.seeds)[: state["seeds"]]
        level = 1 - looks[state["look"] - 1]["level"]
        verdict = UNSETTLED if state["status"] == "open" and history["finished"] else state["status"]
        out[arm] = replace(
            status,
            verdict=verdict,
            seeds=list(seeds),
            delta=state["mean"],
            ci_low=state["low"],
            ci_high=state["high"],
            level=level,
            reason=f"look {state['look']} at {state['seeds']} seeds",
            interval=SEQUENTIAL,
        )
    chosen = names.get(history["recommended"], summary.control)
    pending = "" if history["finished"] else " (the looks have not ended)"
    if chosen == summary.control:
        reason = f"no arm was settled better by the sequential looks{pending}; keep the control"
        return out, Recommendation(chosen, True, reason, primary, point_best=summary.recommendation.point_best)
    s = out[chosen]
    reason = (
        f"settled better by the sequential looks ({s.reason}{pending}): Δ {s.delta:+.2f}, repeated "
        f"{s.level:.2%} interval [{s.ci_low:+.2f}, {s.ci_high:+.2f}], the highest lower bound at the common level"
    )
    return out, Recommendation(
        chosen,
        False,
        reason,
        primary,
        s.delta,
        s.ci_low,
        s.ci_low,
        s.level,
        summary.recommendation.point_best,
    )


def _series(ledger: PairedLedger, arm: str, steps: list[int], is_control: bool, confidence: float) -> list[SeriesPoint]:
    """The arm at each milestone it reached (`steps`): mean over its seeds there; paired Δ and its interval at
    `confidence` (>= 2 paired seeds)."""
    points = []
    for step in steps:
        scores = ledger.scores(arm, step)
        e = None if is_control else ledger.estimate(arm, step, confidence)
        paired = e is not None and len(e.seeds) >= MIN_PAIRED_SEEDS
        points.append(
            SeriesPoint(
                step,
                float(np.mean(list(scores.values()))),
                len(scores),
                *((_finite(e.mean), _finite(e.low), _finite(e.high)) if paired else ()),
            )
        )
    return points


def _without_failed_cells(
    table: ScoreTable, failures: list[dict[str, Any]], final: int
) -> tuple[ScoreTable, dict[str, list[int]], dict[str, str]]:
    """Drop the milestones of (arm, seed) cells that failed after their last retry (and did not finish later, on a
    `retry_failed` resume), with a note naming each; each arm is then compared on the seeds it shares with the
    control. Returns (table, {arm: failed seeds}, {arm: its last failure's error})."""
    names = {info.get("arm_id"): name for name, info in table.arm_info.items()}
    for r in failures:
        names.setdefault(r["arm_id"], r["label"])
    finished = set(map(tuple, table.frame.loc[table.frame["step"] >= final, ["arm", "seed"]].to_numpy()))
    failures = [r for r in failures if (names[r["arm_id"]], r["seed"]) not in finished]
    cells = {(names[r["arm_id"]], r["seed"]) for r in failures}
    notes = tuple(
        f"arm {names[r['arm_id']]!r}: seed {r['seed']} failed after {r['failures']} attempt(s), at step {r['step']} "
        f"({r['error'] or 'no error message'}); it is missing from the analysis"
        for r in failures
    )
    keep = ~pd.MultiIndex.from_frame(table.frame[["arm", "seed"]]).isin(cells)
    failed: dict[str, list[int]] = {}
    for arm, seed in sorted(cells):
        failed.setdefault(arm, []).append(seed)
    errors = {names[r["arm_id"]]: r["error"] or "no error message" for r in failures}
    return replace(table, frame=table.frame[keep], notes=table.notes + notes), failed, errors
