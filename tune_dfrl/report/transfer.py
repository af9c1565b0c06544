"""The transfer check on run tables: does the screen (a cheap proxy) rank the arms as the target does?

    python -m tune_dfrl.report runs=data/dataflex_rl/dataflex_rl_all_runs_171.csv control=baseline \\
        transfer.screen.campaign=main transfer.screen.model=Qwen2.5-0.5B-Instruct \\
        transfer.target.campaign=main transfer.target.model=Qwen2.5-7B-Instruct out=DIR

Each stage is one slice of the table (`load_csv` filters; `filter.*` given too applies to both). Its per-seed paired
Δs are built as `analyze` builds them (`pair_arms`, `ArmScores`: the final milestone, the control's seeds, the
aggregation), on the primary aggregation (the first of `aggregations`, default db). The statistics are
`tune_dfrl.paired.transfer.transfer_check`. Written: transfer.md, transfer.json (`TransferCheck.to_dict` with the
source), transfer.png (screen Δ against target Δ with the intervals).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tune_dfrl.backends.benchmarks import BenchmarkSet, aggregation_list, check_aggregations  # noqa: E402
from tune_dfrl.paired.transfer import TRANSFERS, TransferCheck, transfer_check  # noqa: E402
from tune_dfrl.report.analysis import ArmScores, default_control, pair_arms  # noqa: E402
from tune_dfrl.report.scores import ScoreTable, load_csv  # noqa: E402

STAGES = ("screen", "target")
FILES = {"md": "transfer.md", "json": "transfer.json", "png": "transfer.png"}


def slice_label(filters: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in filters.items())


def load_stage(path: str | Path, filters: Mapping[str, Any], stage: str, **options: Any) -> ScoreTable:
    """The slice `filters` of the CSV run table at `path` (`load_csv`); errors name the stage."""
    if not filters:
        raise ValueError(f"transfer.{stage}: give the {stage}'s slice, e.g. transfer.{stage}.model=NAME")
    try:
        return load_csv(path, filters=dict(filters), **options)
    except ValueError as error:
        raise ValueError(f"transfer.{stage} ({slice_label(filters)}): {error}") from None


def stage_deltas(table: ScoreTable, control: str, aggregation: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """({arm: paired Δ at each control seed, NaN where the arm has no run}, notes) of `table` on `aggregation`, as
    `analyze` pairs them; arms sharing fewer than 2 seeds with the control are kept (the check then names them)."""
    final = table.final()
    check_aggregations([aggregation], final.bench, final.has_lengths)
    if control not in final.arms:
        raise ValueError(f"control {control!r} is not an arm of the slice; arms: {', '.join(final.arms)}")
    runs = final.runs()
    if len(final.arms) < 2:
        raise ValueError(f"the slice holds the control {control!r} only")
    try:
        seeds, arms, excluded, notes = pair_arms(runs.keys, control)
    except ValueError:  # no arm shares 2 seeds with the control: the check names the arms and their seeds
        seeds = sorted(set(runs.keys.loc[runs.keys["arm"] == control, "seed"]))
        arms, excluded, notes = [], {a: "" for a in final.arms if a != control}, []
    scores = ArmScores(final.bench, runs, control, [*arms, *excluded], seeds)
    matrix = scores.matrix(aggregation)
    if undefined := scores.undefined(matrix):
        arm, seed = undefined[0]
        raise ValueError(f"aggregation {aggregation!r} is undefined (NaN) for arm {arm!r} seed {seed}")
    deltas = matrix.drop(index=control) - matrix.loc[control]
    return {arm: row.to_numpy() for arm, row in deltas.iterrows()}, list(final.notes) + notes


def transfer_report(
    runs: str | Path,
    screen: Mapping[str, Any],
    target: Mapping[str, Any],
    out: str | Path,
    control: str | None = None,
    aggregations: list[str] | str | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    bench: BenchmarkSet | None = None,
    arm_column: str | None = None,
) -> tuple[TransferCheck, dict[str, Path]]:
    """The transfer check between the slices `screen` and `target` ({column: value}) of the CSV run table `runs`,
    written to `out` (transfer.md, .json, .png). `control`: default the one baseline/static arm of the screen."""
    path = Path(runs)
    if path.is_dir() or path.suffix == ".jsonl":
        raise ValueError("transfer.* compares two slices of a CSV run table; runs= must name a CSV file")
    if not path.exists():
        raise FileNotFoundError(f"runs={path}: no such file")
    tables = {
        stage: load_stage(path, filters, stage, bench=bench, arm_column=arm_column)
        for stage, filters in zip(STAGES, (screen, target))
    }
    control = control or default_control(tables["screen"])
    aggregation = (aggregation_list(aggregations) or ["db"])[0]
    deltas, notes = {}, []
    for stage, table in tables.items():
        try:
            deltas[stage], stage_notes = stage_deltas(table, control, aggregation)
        except ValueError as error:
            raise ValueError(f"transfer.{stage}: {error}") from None
        notes += [f"{stage}: {n}" for n in stage_notes]
    labels = {stage: slice_label(f) for stage, f in zip(STAGES, (screen, target))}
    check = transfer_check(
        deltas["screen"],
        deltas["target"],
        control,
        alpha,
        seed,
        screen_label=labels["screen"],
        target_label=labels["target"],
        aggregation=aggregation,
    )
    notes += [f"in the {stage} only, not compared: {', '.join(arms)}" for stage, arms in _one_stage(check) if arms]
    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in FILES.items()}
    seeds = {stage: len(next(iter(d.values()))) for stage, d in deltas.items()}
    record = {**check.to_dict(), "source": str(path), "notes": notes}
    paths["json"].write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    transfer_figure(check, paths["png"])
    paths["md"].write_text(transfer_markdown(check, str(path), seeds, notes, paths["png"].name))
    return check, paths


def _one_stage(check: TransferCheck) -> list[tuple[str, tuple[str, ...]]]:
    return [("screen", check.screen_only), ("target", check.target_only)]


def _cell(delta: float, low: float, high: float) -> str:
    ends = "(−∞, +∞)" if not (np.isfinite(low) and np.isfinite(high)) else f"[{low:+.2f}, {high:+.2f}]"
    return f"{delta:+.2f} {ends}"


def _rank(rank: float) -> str:
    return f"{rank:g}"


def verdict_text(check: TransferCheck) -> str:
    """The verdict in words: what the check found on these arms, and what to do when it does not transfer."""
    k = check.k
    if check.verdict == TRANSFERS:
        return (
            f"**Verdict: transfers.** On these {k} arms the screen ranked as the target did: the "
            f"{1 - check.alpha:.0%} bootstrap interval of Spearman ρ lies above 0 and {check.pick_note}. This "
            "concerns these arms under seed-to-seed noise; it does not show that the screen will rank untried arms "
            "as the target would."
        )
    return (
        f"**Verdict: does not transfer.** The screen did not predict the target on these {k} arms: "
        + "; ".join(check.reasons)
        + f". What to do: {check.advice}."
    )


def transfer_markdown(check: TransferCheck, source: str, seeds: dict[str, int], notes: list[str], png: str) -> str:
    level = f"{1 - check.alpha:.0%}"
    lines = [
        "# Transfer check: does the screen predict the target?",
        "",
        f"Run table `{source}`. Paired Δ = arm − control `{check.control}` on the `{check.aggregation}` "
        f"aggregation (points), mean over the seeds the arm shares with the control. Screen: {check.screen_label} "
        f"({seeds['screen']} seeds). Target: {check.target_label} ({seeds['target']} seeds). "
        f"K = {check.k} arms trained in both, the control included (Δ ≡ 0).",
        "",
        verdict_text(check),
        "",
        f"| arm | screen Δ [{level} interval] | target Δ [{level} interval] | screen rank | target rank |",
        "|---|---|---|---|---|",
    ]
    for arm in sorted(check.arms, key=lambda a: check.screen[a].rank):
        s, t = check.screen[arm], check.target[arm]
        name = f"{arm} (control)" if arm == check.control else arm
        lines.append(
            f"| {name} | {_cell(s.delta, s.low, s.high)} | {_cell(t.delta, t.low, t.high)} | {_rank(s.rank)} | "
            f"{_rank(t.rank)} |"
        )
    lines += [
        "",
        f"*Intervals: unadjusted {level} paired t-intervals over seeds (no multiplicity correction). Rank 1 = the "
        "highest Δ at that stage (ties share the average rank).*",
        "",
        "## Rank agreement",
        "",
        f"| statistic | estimate | {level} bootstrap interval |",
        "|---|---|---|",
        f"| Spearman ρ | {check.spearman:+.2f} | {_ends(check.spearman_low, check.spearman_high)} |",
        f"| Kendall τ-b | {check.kendall:+.2f} | {_ends(check.kendall_low, check.kendall_high)} |",
        "",
        f"Bootstrap: {check.n_resamples} resamples ({check.resamples_used} used), seed {check.seed}; each draws "
        "the seeds with replacement within each stage independently (the stages are independent runs), one draw "
        "shared by all arms of a stage; percentile interval of the recomputed correlations. Pick: "
        f"{check.pick_note}.",
        "",
        f"## What {check.k} arms can show",
        "",
        check.caveat,
        "",
        f"![screen Δ against target Δ]({png})",
        "",
    ]
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def _ends(low: float, high: float) -> str:
    return "—" if not (np.isfinite(low) and np.isfinite(high)) else f"[{low:+.2f}, {high:+.2f}]"


def transfer_figure(check: TransferCheck, path: Path) -> Path:
    """Screen Δ (x) against target Δ (y) per arm, error bars = the intervals (an unbounded one is not drawn), dashed
    zero lines and the y = x line."""
    arms = list(check.arms)
    x = np.array([check.screen[a].delta for a in arms])
    y = np.array([check.target[a].delta for a in arms])

    def errors(stage: dict) -> np.ndarray:
        e = np.array([[stage[a].delta - stage[a].low, stage[a].high - stage[a].delta] for a in arms]).T
        return np.where(np.isfinite(e), e, np.nan)

    xerr, yerr = errors(check.screen), errors(check.target)
    fig, ax = plt.subplots(figsize=(6.8, 5.6))
    ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", color="#4575b4", ecolor="#9ecae1", elinewidth=1, capsize=2)
    at = arms.index(check.control)
    ax.plot(x[at], y[at], "s", color="black", ms=6, label=f"control ({check.control})")
    for arm, xi, yi in zip(arms, x, y):
        ax.annotate(arm, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    limits = [_span(v, e) for v, e in ((x, xerr), (y, yerr))]  # each axis its own: the stages differ in spread
    ax.set_xlim(*limits[0])
    ax.set_ylim(*limits[1])
    line = [min(limits[0][0], limits[1][0]), max(limits[0][1], limits[1][1])]
    ax.plot(line, line, ":", color="#7f7f7f", lw=1, label="y = x")
    ax.axhline(0.0, color="black", lw=0.8, ls="--")
    ax.axvline(0.0, color="black", lw=0.8, ls="--")
    ax.set_xlabel(f"screen Δ vs {check.control} ({check.screen_label}), points")
    ax.set_ylabel(f"target Δ vs {check.control} ({check.target_label}), points")
    ax.set_title(
        f"{check.aggregation}: Spearman ρ {check.spearman:+.2f} {_ends(check.spearman_low, check.spearman_high)}, "
        f"K = {check.k}: {check.verdict}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _span(values: np.ndarray, errors: np.ndarray) -> tuple[float, float]:
    """Axis limits covering the points, their finite interval ends and 0, padded."""
    ends = np.concatenate([values, values - errors[0], values + errors[1], [0.0]])
    ends = ends[np.isfinite(ends)]
    low, high = float(ends.min()), float(ends.max())
    pad = 0.08 * (high - low or 1.0)
    return low - pad, high + pad


def print_transfer(check: TransferCheck, paths: dict[str, Path]) -> None:
    """The verdict and the files, on stdout."""
    level = f"{1 - check.alpha:.0%}"
    print(
        f"transfer check ({check.aggregation}, control {check.control}, K = {check.k} arms): screen "
        f"{check.screen_label} -> target {check.target_label}"
    )
    print(
        f"Spearman ρ {check.spearman:+.2f} ({level} bootstrap {_ends(check.spearman_low, check.spearman_high)}), "
        f"Kendall τ-b {check.kendall:+.2f} ({_ends(check.kendall_low, check.kendall_high)})"
    )
    print(f"verdict: {check.verdict}" + (f": {'; '.join(check.reasons)}" if check.reasons else f": {check.pick_note}"))
    if check.advice:
        print(f"what to do: {check.advice}")
    print(check.caveat)
    for kind, path in paths.items():
        print(f"{kind:>8}: {path}")
