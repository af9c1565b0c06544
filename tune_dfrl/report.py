"""The report: which arms credibly beat the control, and how robust any ranking is (DESIGN §6-§7).

    python -m tune_dfrl.report runs=data/dataflex_rl/dataflex_rl_all_runs_171.csv control=baseline \\
        filter.campaign=main filter.model=Qwen2.5-7B-Instruct out=report_main_7b
    python -m tune_dfrl.report runs=OUT                  # a search's output directory (results.jsonl)
    python -m tune_dfrl.report experiment=NAME mlflow.tracking_uri=sqlite:////abs/mlflow.db

`analyze(table, control, ...)` returns the `summary.json` content (`tune_dfrl.schema.Summary`). Per arm and aggregation it holds
the paired statistics of `tune_dfrl.stats.paired_verdicts` and the power figures; the Holm family
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

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tune_dfrl.ledger import PairedLedger
from tune_dfrl.render import print_summary, write_report
from tune_dfrl.schema import Summary, aggregate, aggregation_list, check_aggregations, default_aggregations, members
from tune_dfrl.scores import BenchmarkSet, Runs, ScoreTable, load_csv, load_mlflow, load_results
from tune_dfrl.seed_batches import HISTORY_FILE
from tune_dfrl.stats import (
    BCA_COVERAGE_95,
    paired_verdicts,
    power_figures,
    prob_best,
    rank_agreement,
    recommend,
    winner_flip_rate,
)

__all__ = ["analyze", "write_report", "print_summary", "log_report", "default_control"]

CONTROL_METHODS = ("baseline", "static")
DECISION_RULE = (
    "better/worse: the Holm-adjusted paired t-interval (ci_low, ci_high) lies above/below 0, equivalently "
    "p_holm < alpha; equivalent: TOST, the (1 - 2 alpha) paired t-interval (eq_low, eq_high) lies inside "
    "+-margin; otherwise inconclusive. An arm with the same difference at every seed (no spread) is judged "
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


class _Scores:
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


def _pair_arms(keys: pd.DataFrame, control: str) -> tuple[list[int], list[str], dict[str, str], list[str]]:
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
    scores: _Scores,
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


def _curves(table: ScoreTable, name: str, control: str, arms: list[str], alpha: float) -> dict[str, list[dict]]:
    """Paired delta vs step (primary aggregation) with its (1 - alpha) interval (`PairedLedger.estimate`), at the
    steps with >= 2 paired seeds."""
    if not table.has_steps or table.frame["step"].nunique() < 2:
        return {}
    runs = table.runs()
    ledger = PairedLedger(control)
    scores = aggregate(runs.accuracy, name, table.bench, runs.length_chars)
    for (arm, seed, step), score in zip(runs.keys.itertuples(index=False), scores):
        if np.isfinite(score):  # undefined (e.g. efficiency without characters): no point
            ledger.record(arm, seed, step, score)
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
    seeds, arms, excluded, notes = _pair_arms(runs.keys, control)
    family = max(len(arms) + len(excluded), family_size or 0)  # DESIGN §7: the family is the whole search
    scores = _Scores(final.bench, runs, control, arms, seeds)
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


def log_report(paths: dict[str, Path], run_id: str, tracking_uri: str | None = None) -> None:
    """Log the report files as artifacts (folder `report`) of an MLflow run, e.g. the search-level run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    for path in paths.values():
        client.log_artifact(run_id, str(path), artifact_path="report")


def _load(cfg: Any) -> ScoreTable:
    """The score table a report config points at: runs= (CSV or search directory) or experiment=.

    Checked first, before reading anything: `aggregations` must be a list (`aggregations=db` reaches
    the config as the string 'db', which the CLI would split into letters).
    """
    if isinstance(cfg.aggregations, str):
        raise ValueError(
            f"aggregations={cfg.aggregations} is one string, not a list; write aggregations=[{cfg.aggregations}] "
            "(several: aggregations=[db,macro])"
        )
    bench = BenchmarkSet.from_file(cfg.benchmarks) if cfg.benchmarks else None
    if bool(cfg.runs) == bool(cfg.experiment):
        raise ValueError("give exactly one source: runs=PATH (a CSV or a search output directory) or experiment=NAME")
    if cfg.experiment:
        return load_mlflow(cfg.experiment, cfg.mlflow.tracking_uri, bench)
    path = Path(cfg.runs)
    if path.is_dir() or path.suffix == ".jsonl":
        if cfg.filter:
            raise ValueError("filter.* applies to CSV run tables only")
        return load_results(path, bench)
    if not path.exists():
        raise FileNotFoundError(f"runs={path}: no such file")
    return load_csv(path, bench, dict(cfg.filter), cfg.arm_column)


def _main(cfg: Any) -> None:
    table = _load(cfg)
    summary = analyze(
        table,
        cfg.control or default_control(table),
        list(cfg.aggregations or []) or None,
        cfg.delta,
        cfg.alpha,
        cfg.seed,
        cfg.flip_k,
    )
    runs_dir = Path(cfg.runs) if cfg.runs and Path(cfg.runs).is_dir() else None
    if runs_dir is not None and (runs_dir / HISTORY_FILE).exists():  # seeds=auto: the looks' section
        summary = replace(summary, sequential=json.loads((runs_dir / HISTORY_FILE).read_text()))
    out = Path(cfg.out) if cfg.out else (runs_dir / "report" if runs_dir else Path("report"))
    paths = write_report(summary, table, out.absolute())
    print_summary(summary)
    for kind, path in paths.items():
        print(f"{kind:>8}: {path}")
    if table.origin.get("search_run_id") and cfg.mlflow.log_artifacts:
        log_report(paths, table.origin["search_run_id"], cfg.mlflow.tracking_uri)
        print(f"logged to MLflow run {table.origin['search_run_id']}")


def cli() -> None:
    """Entry point: Hydra `key=value` overrides; `filter.COLUMN=VALUE` may omit Hydra's `+`. The statistics
    settings (delta, alpha, flip_k, seed) are checked first (`tune_dfrl.settings.ReportSettings`)."""
    import dataclasses

    import hydra

    from tune_dfrl.settings import ReportSettings, from_mapping, register_settings

    sys.argv = [("+" + a if a.startswith("filter.") else a) for a in sys.argv]
    register_settings()

    @hydra.main(config_path="conf", config_name="report", version_base="1.3")
    def run(cfg: Any) -> None:
        try:
            from_mapping(ReportSettings, {f.name: cfg[f.name] for f in dataclasses.fields(ReportSettings)})
            _main(cfg)
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    run()


if __name__ == "__main__":
    cli()
