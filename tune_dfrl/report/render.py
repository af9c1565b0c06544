"""Rendering of a report summary (`tune_dfrl.report.schema.Summary`, from `tune_dfrl.report.analysis.analyze`).

Markdown, self-contained HTML (figures embedded as base64 PNG) and the rich console summary
share one document model: sections of paragraphs, tables and figures. Figures: a forest plot of
the paired deltas with the intervals that decide per arm and aggregation, and, when the table has
milestones, learning curves of the paired delta vs training step.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table as RichTable  # noqa: E402

from tune_dfrl.report.schema import (  # noqa: E402
    EQUIVALENT,
    HOLM,
    INTERVAL_KINDS,
    SEQUENTIAL,
    UNADJUSTED,
    UNSETTLED,
    ArmStats,
    ArmStatus,
    Recommendation,
    Summary,
)
from tune_dfrl.report.scores import ScoreTable  # noqa: E402
from tune_dfrl.state.folder import SUMMARY

VERDICT_COLORS = {"better": "#1a9850", "worse": "#d73027", "equivalent": "#4575b4", "inconclusive": "#7f7f7f"}


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""
    notes: list[str] = field(default_factory=list)  # below the table: what its figures are (one line per kind)


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # keys into the figure paths


def _num(value: float | None, spec: str = "+.2f") -> str:
    return "—" if value is None else format(value, spec)


def _interval(low: float | None, high: float | None, missing: str = "—") -> str:
    """[low, high], or `missing` when the ends are None (undefined; for a deciding interval: unbounded)."""
    return missing if low is None or high is None else f"[{low:+.2f}, {high:+.2f}]"


UNBOUNDED = "(−∞, +∞)"  # a deciding interval of an arm without spread at too few seeds (exact sign-flip test)


def _seeds_cell(s: ArmStats, control_seeds: list[int]) -> str:
    """n, and the seeds themselves when the arm lacks some of the control's."""
    return str(s.n) if s.seeds == control_seeds else f"{s.n} ({', '.join(map(str, s.seeds))})"


def verdict_table(summary: Summary, name: str, compact: bool = False) -> Table:
    """Control and arms (best mean first) under one aggregation."""
    control = summary.control
    alpha, margin = summary.alpha, summary.equivalence_margin
    t_ci, eq_ci = f"t {1 - alpha:.0%} CI (unadjusted)", f"TOST {1 - 2 * alpha:.0%} CI (unadjusted)"
    bca_ci = f"BCa {1 - alpha:.0%} CI (nominal)"
    detect, equivalence = f"seeds to detect +{margin:g}", f"seeds for ±{margin:g} equivalence"
    full = [
        "arm",
        "mean",
        "Δ",
        "seeds",
        "Holm CI (level)",
        t_ci,
        eq_ci,
        bca_ci,
        "p",
        "p Holm",
        "p perm",
        "p perm Holm",
        "TOST p",
        "MDE",
        detect,
        equivalence,
        "verdict",
    ]
    short = ["arm", "mean", "Δ", "Holm CI (level)", t_ci, "p Holm", "verdict"]
    rows = []
    for arm in summary.ranking[name]:
        if arm == control:
            cells = {
                "arm": f"{arm} (control)",
                "mean": _num(summary.means[name][arm], ".2f"),
                "seeds": str(len(summary.seeds)),
            }
        else:
            s = summary.arms[arm][name]
            cells = {
                "arm": arm,
                "mean": _num(s.mean, ".2f"),
                "Δ": _num(s.delta),
                "seeds": _seeds_cell(s, summary.seeds),
                "Holm CI (level)": f"{_interval(s.ci_low, s.ci_high, UNBOUNDED)} ({s.level:.2%})",
                t_ci: _interval(s.t_low, s.t_high, UNBOUNDED),
                eq_ci: _interval(s.eq_low, s.eq_high, UNBOUNDED),
                bca_ci: _interval(s.bca_low, s.bca_high),
                "p": _num(s.p, ".3g"),
                "p Holm": _num(s.p_holm, ".3g"),
                "p perm": _num(s.p_perm, ".3g"),
                "p perm Holm": _num(s.p_perm_holm, ".3g"),
                "TOST p": _num(s.tost_p, ".3g"),
                "MDE": _num(s.mde, ".2f") if s.mde is not None else "∞",
                detect: str(s.seeds_to_detect),
                equivalence: str(s.seeds_for_equivalence),
                "verdict": s.verdict,
            }
        columns = short if compact else full
        rows.append([cells.get(c, "") for c in columns])
    return Table(short if compact else full, rows, caption=f"aggregation `{name}`")


def interval_kind(summary: Summary, s: ArmStatus) -> str:
    """The kind of an arm's interval: holm | unadjusted | sequential ("" without one); a summary.json written before
    the kinds were recorded by the arm's status and the search's rule."""
    if s.delta is None or s.level is None:
        return ""
    if s.interval:
        return s.interval
    if s.status == "stopped":
        return UNADJUSTED
    return SEQUENTIAL if summary.rule == "sequential" else HOLM


def interval_words(summary: Summary, s: ArmStatus) -> str:
    """What a row's interval is, in a few words: "Holm 99.17%", "unadjusted 95% at step 20", "sequential boundary
    98.75%"."""
    kind = interval_kind(summary, s)
    if kind == HOLM:
        return f"Holm {s.level:.2%}"
    if kind == UNADJUSTED:
        return f"unadjusted {s.level:.0%} at step {s.step}"
    if kind == SEQUENTIAL:
        return f"sequential boundary {s.level:.2%}"
    return ""


def _kind_notes(summary: Summary, kinds: set[str]) -> list[str]:
    """One line per kind of interval in the arms table."""
    alpha, m = summary.alpha, summary.holm_family
    lines = {
        HOLM: f"Holm (at the row's level): {INTERVAL_KINDS[HOLM]} (family of m = {m} arm(s), α = {alpha}); at the last step, its mean and "
        "the control's over the seeds both finished.",
        UNADJUSTED: f"unadjusted {1 - alpha:.0%} at step N: {INTERVAL_KINDS[UNADJUSTED]}. A stopped arm's mean and "
        "the control's mean are both at that step, over those seeds (their difference is the Δ); the rung stopped "
        "it (a rule that spends seeds, `why`), the analysis did not judge it.",
        SEQUENTIAL: f"sequential boundary (at the row's level): {INTERVAL_KINDS[SEQUENTIAL]}; the means are the fixed-sample analysis' "
        "at the last step (descriptive).",
    }
    return [lines[kind] for kind in (HOLM, UNADJUSTED, SEQUENTIAL) if kind in kinds]


def status_table(summary: Summary) -> Table:
    """Every arm of a search: how it ended (`ArmStatus`) and its answer under the search's rule; each row's Δ, mean
    and the control's mean at the row's step, its interval's kind named in the row (one note per kind below)."""
    rows, kinds = [], set()
    for arm, s in summary.statuses.items():
        kind = interval_kind(summary, s)
        kinds.add(kind)
        figures = (
            (_num(s.delta), _interval(s.ci_low, s.ci_high, UNBOUNDED), interval_words(summary, s))
            if kind
            else ("", "", "")
        )
        control_mean = "" if s.status == "control" or s.control_mean is None else _num(s.control_mean, ".2f")
        why = f"stopped at step {s.step}: {s.reason}" if s.status == "stopped" else s.reason
        rows.append(
            [
                arm + (" (control)" if s.status == "control" else ""),
                s.text,
                s.verdict,
                *figures,
                _num(s.mean, ".2f"),
                control_mean,
                str(len(s.seeds)) if s.seeds else "",
                why,
            ]
        )
    rule = {
        "fixed": "verdicts (better / worse / equivalent / inconclusive) by the Holm-adjusted fixed-sample analysis at "
        "the last step",
        "sequential": "verdicts (better / worse / futile / open, or unsettled once the looks ended) by the sequential "
        "looks",
    }[summary.rule]
    return Table(
        [
            "arm",
            "status",
            "verdict",
            f"Δ on {summary.primary}",
            "interval",
            "interval kind (level)",
            "mean",
            "control mean (same step, same seeds)",
            "seeds",
            "why",
        ],
        rows,
        caption=f"every arm the search tried; {rule}; a stopped arm has no verdict",
        notes=_kind_notes(summary, kinds),
    )


def _family(summary: Summary) -> str:
    """The Holm family in words, naming its arms when the search's statuses are known."""
    named = [arm for arm, s in summary.statuses.items() if s.status not in ("control", EQUIVALENT)]
    return f"{summary.holm_family} arm(s)" + (f": {', '.join(named)}" if named else "")


def _verdict_notes(summary: Summary) -> list[str]:
    """What the verdict tables' columns are, and what the BCa intervals are worth at these seed counts."""
    alpha, family = summary.alpha, summary.holm_family
    coverage = ", ".join(f"{share:.0%} at {seeds} seeds" for seeds, share in summary.bca_coverage_95.items())
    descriptive = (
        [
            "Descriptive only: these fixed-sample p-values and intervals treat each arm's seeds as if their number "
            "had been fixed in advance; under seeds=auto the number of seeds depended on the data (optional "
            "stopping), so the answer is the sequential looks' (section Arms, section Sequential seeds)."
        ]
        if summary.rule == "sequential"
        else []
    )
    return descriptive + [
        f"Holm family: {_family(summary)} (every arm of the search, excluded, stopped or failed ones included). `seeds`: the "
        "seeds an arm's mean and Δ both use (those it shares with the control; listed when fewer than the control's); "
        "the control row's mean uses all its seeds, and `control_mean` in summary.json is its mean on each arm's seeds.",
        f"Equivalence is not in the Holm family: TOST at α = {alpha} per arm (the {1 - 2 * alpha:.0%} interval inside "
        f"±{summary.equivalence_margin:g}), unadjusted for the {family} arm(s), because it answers a different "
        "question per arm (is this arm within the margin?) and adjusting it would only make equivalence harder to "
        "show; better / worse are Holm-adjusted. Across the arms, up to α of the truly non-equivalent ones may each "
        "read equivalent.",
        f"`MDE` and seeds to detect: 80% power of the two-sided paired t-test at α/m = {alpha / family:.4g} (Holm's "
        f"first step), at the arm's observed paired SD; seeds for equivalence: 80% power of TOST at α = {alpha} "
        "if the true Δ were 0; both take the SD observed at the arm's seeds as known (an estimate, itself "
        "uncertain at few seeds). (−∞, +∞): an arm with the same Δ at every seed, where the exact sign-flip test "
        "cannot decide at this many seeds.",
        f"BCa intervals are reported, never deciding, and under-cover at few seeds: a nominal 95% BCa interval "
        f"covered the true Δ in {coverage} (simulated normal paired differences, tests/paired/test_stats_simulation.py).",
    ]


def attainable(k: int) -> tuple[list[float], list[float]]:
    """Every value Spearman ρ and Kendall τ can take between two rankings of k items without ties (k <= 6)."""
    base = list(range(k))
    rho, tau = set(), set()
    for perm in itertools.permutations(base):
        rho.add(round(1 - 6 * sum((a - b) ** 2 for a, b in zip(base, perm)) / (k * (k * k - 1)), 6))
        pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
        tau.add(round(sum(1 if perm[i] < perm[j] else -1 for i, j in pairs) / len(pairs), 6))
    return sorted(rho, reverse=True), sorted(tau, reverse=True)


def _few(summary: Summary) -> tuple[int, str]:
    """How many arms the joint tables rest on, and which: the control and the arms analysed at the last step."""
    k = len(summary.ranking.get(summary.primary, []))
    stopped = sum(1 for s in summary.statuses.values() if s.status == "stopped")
    left = f"; the {stopped} stopped arm(s) are not in it" if stopped else ""
    return k, f"{k} arms (the control and the {k - 1} arm(s) analysed at the last step{left})"


def _rank_note(summary: Summary) -> str:
    """What a rank correlation on this few arms can show."""
    k, which = _few(summary)
    if k < 2:
        return f"Rests on {which}: nothing to rank."
    if k > 6:
        return f"Rests on {which}."
    rho, tau = attainable(k)
    shown = ", ".join(f"{v:+.3g}" for v in rho)
    return (
        f"Rests on {which}: on {k} items Spearman ρ can only be {shown} and Kendall τ only "
        f"{', '.join(f'{v:+.3g}' for v in tau)}; one swap of two neighbours moves them a long way, so these figures "
        "show little."
    )


def _best_note(summary: Summary) -> str:
    k, which = _few(summary)
    return (
        f"Rests on {which}, over the seeds all of them share: 1/{k} = {1 / max(k, 1):.0%} is what a probability of "
        "being best reads when the data cannot tell the arms apart; it is no test, and a winner-flip rate on few "
        "seeds is coarse."
    )


def _rank_tables(summary: Summary) -> list[Table]:
    pairs = Table(
        ["aggregations", "Spearman ρ", "Kendall τ"],
        [[pair, _num(r.spearman, "+.3f"), _num(r.kendall, "+.3f")] for pair, r in summary.rank_correlation.items()],
        caption="rank agreement of the arm means (control included) between aggregations",
        notes=[_rank_note(summary)],
    )
    ranges = Table(
        ["aggregation", "range (max − min of arm means)", "ranking (best first)"],
        [[name, _num(summary.range[name], ".3f"), ", ".join(summary.ranking[name])] for name in summary.aggregations],
    )
    return [pairs, ranges]


def _leave_out_table(summary: Summary) -> Table:
    rows = []
    for name, kinds in summary.robustness.items():
        for kind, r in kinds.items():
            changes = {a: c for per in r.left_out.values() for a, c in per.verdict_changes.items()}
            rows.append(
                [
                    name,
                    {"lobo": "one benchmark", "lodo": "one domain"}[kind],
                    _num(r.min_kendall, "+.3f"),
                    r.min_at,
                    ", ".join(f"{a} ({c})" for a, c in changes.items()) or "none",
                ]
            )
    return Table(
        ["aggregation", "left out", "min Kendall τ", "at", "arms whose verdict changes"],
        rows,
        caption="Kendall τ between the full ranking and the ranking with one benchmark / domain left out",
        notes=[_rank_note(summary)],
    )


def _best_table(summary: Summary) -> Table:
    names = summary.aggregations
    arms = summary.ranking[summary.primary]
    prob = summary.prob_best
    rows = [[arm] + [_num(prob[n][arm], ".1%") if prob[n] else "—" for n in names] for arm in arms]
    k = summary.flip_k_used
    label = (
        f"winner-flip rate (subsets of {k} seeds, {summary.flip_subsets} subsets)"
        if k
        else "winner-flip rate (not computable: fewer than 2 seeds shared by all arms)"
    )
    rows.append([label] + [_num(summary.winner_flip_rate[n], ".1%") for n in names])
    return Table(
        ["arm"] + names,
        rows,
        caption="probability of being best (joint seed bootstrap) and winner-flip rate",
        notes=[_best_note(summary)],
    )


def _point_best(rec: Recommendation, control: str) -> str:
    """Which arms have the highest mean Δ: every one of them when several tie, or the control."""
    top = rec.point_best
    where = f"on `{rec.aggregation}`"
    if top == [control]:
        return f"No arm has a higher mean than the control {where}."
    named = ", ".join(f"`{a}`" + (" (control)" if a == control else "") for a in top)
    if len(top) > 1:
        return f"Highest mean {where}: a tie between {named} (never selected on the mean alone)."
    return f"Highest mean {where}: {named} (never selected on the mean alone)."


def sections(summary: Summary, table: ScoreTable, figures: dict[str, Path]) -> list[Section]:
    """The report document, top to bottom."""
    rec = summary.recommendation
    source = ", ".join(f"{k}={v}" for k, v in summary.source.items() if v)
    by = " by the sequential looks" if summary.rule == "sequential" else ""
    selected = (
        [
            "The arms compared at the last step were selected on these same seeds (the rungs stopped the others on "
            "them, and the search suggested arms from their scores), so the winner's Δ is optimistic: confirm it on "
            "fresh seeds with a confirm stage (`confirm.screen=` this search's folder)."
        ]
        if summary.statuses and not rec.is_control
        else []
    )
    head = Section(
        "Recommendation",
        ([f"**{summary.rerender}.**"] if summary.rerender else [])
        + [
            f"**Recommended{by}: `{rec.recommended}`** "
            f"({'the control' if rec.is_control else 'better than the control'}) — {rec.reason}.",
            *selected,
            _point_best(rec, summary.control),
            f"Control `{summary.control}`; seeds {', '.join(map(str, summary.seeds))}; aggregations "
            f"{', '.join(summary.aggregations)} (primary `{summary.primary}`); equivalence margin "
            f"±{summary.equivalence_margin:g} points; α = {summary.alpha}.",
            (
                "Decision rule (the search's, seeds=auto): the group-sequential looks (section Sequential seeds); "
                f"the fixed-sample rule of the verdict tables is descriptive: {summary.decision_rule}"
                if summary.rule == "sequential"
                else f"Decision rule: {summary.decision_rule}"
            ),
            f"Source: {source}.",
        ],
    )
    alpha = summary.alpha
    arms = [Section("Arms", tables=[status_table(summary)])] if summary.statuses else []
    title = "Verdicts (descriptive fixed-sample analysis)" if summary.rule == "sequential" else "Verdicts"
    out = [
        head,
        *arms,
        Section(title, _verdict_notes(summary), tables=[verdict_table(summary, n) for n in summary.aggregations]),
        Section(
            "Forest plot",
            [
                f"Paired Δ vs the control, the intervals that decide: thin line the Holm-adjusted "
                f"interval at its level (better / worse when it excludes 0); thick bar the "
                f"{1 - 2 * alpha:.0%} interval (equivalent when inside the shaded ±margin band); an "
                f"arrow marks an unbounded end. The unadjusted t and BCa intervals are in the tables "
                f"only. Stopped arms (grey, hollow, dashed; primary aggregation only) at their stop step with the "
                f"unadjusted {1 - alpha:.0%} interval there: no verdict."
            ],
            figures=["forest"],
        ),
    ]
    if "curves" in figures:
        out.append(
            Section(
                "Learning curves",
                [
                    f"Paired Δ on `{summary.primary}` vs training step with its unadjusted {1 - summary.alpha:.0%} "
                    "t-interval band; stopped arms dashed, up to the step where they stopped."
                ],
                figures=["curves"],
            )
        )
    out += [
        Section("Probability of being best and winner flips", tables=[_best_table(summary)]),
        Section("Rank robustness across aggregations", tables=_rank_tables(summary)),
        Section("Leave-one-out robustness", tables=[_leave_out_table(summary)]),
        Section(
            "Benchmarks",
            [f"Subset `{s}`: {', '.join(m)}" for s, m in table.bench.subsets.items()],
            tables=[
                Table(
                    ["benchmark", "domain", "items"], [[b.name, b.domain, str(b.items)] for b in table.bench.benchmarks]
                )
            ],
        ),
    ]
    if summary.sequential:
        out.append(sequential_section(summary.sequential))
    if summary.notes:
        out.append(Section("Notes and exclusions", list(summary.notes)))
    return out


def sequential_section(history: dict) -> Section:
    """seeds=auto (OUT/sequential.json, `tune_dfrl.paired.seed_batches`): each look, the seeds each arm received, final verdicts."""
    rule, looks, label = history["rule"], history["looks"], history["labels"].get
    last = looks[-1] if looks else {"states": {}, "out": {}, "handed": {}}

    def status(state: dict, look: dict) -> str:  # after the last look, an arm still open is unsettled
        return UNSETTLED if state["status"] == "open" and history["finished"] and look is last else state["status"]

    text = [
        f"Seeds in batches: start {rule['start']}, batch {rule['batch']}, max {rule['max']}; group-sequential "
        f"O'Brien-Fleming-type alpha spending at α = {rule['alpha']} over the searched arms with Holm recycling, "
        f"non-binding futility (upper {rule['futility_confidence']:.0%} bound below {rule['futility_margin']:g} "
        "points); docs/readme_decisions.md. These verdicts hold under the optional stopping; the tables above "
        "analyse every seed as if their number had been fixed.",
        f"**Recommended by the sequential looks: `{label(history['recommended'])}`**"
        + ("" if history["finished"] else " (the looks have not ended)")
        + ".",
    ]
    rows = [
        [
            str(k["number"]),
            str(k["seeds"]),
            f"{k['boundary']:.3f}",
            f"{k['level']:.2g}",
            ", ".join(
                [f"{label(arm)}: {status(state, k)}" for arm, state in k["states"].items()]
                + [f"{label(arm)}: out" for arm in k["out"]]
            )
            or "—",
            ", ".join(map(str, k["next_seeds"])) or "— (end)",
        ]
        for k in looks
    ]
    verdicts = [
        [
            label(arm),
            status(state, last),
            str(state["seeds"]),
            str(state["look"]),
            _num(state["mean"]),
            _interval(state["low"], state["high"]),
        ]
        for arm, state in last["states"].items()
    ]
    verdicts += [[label(arm), f"out: {why}", "", "", "", ""] for arm, why in last["out"].items()]
    return Section(
        "Sequential seeds",
        text,
        tables=[
            Table(
                ["look", "seeds", "boundary z", "nominal p", "arms", "seeds handed next"],
                rows,
                "boundary and nominal two-sided level of an arm tested at α / K (before Holm recycling)",
            ),
            Table(
                ["arm", "seeds received"],
                [[label(arm), ", ".join(map(str, seeds))] for arm, seeds in last["handed"].items()],
            ),
            Table(
                ["arm", "verdict", "seeds", "look", "mean Δ", "interval"],
                verdicts,
                "sequential boundary: intervals at the common nominal level α / K of each arm's last look (repeated "
                "confidence intervals); unsettled: still open when the last look was taken",
            ),
        ],
    )


# ------------------------------------------------------------------------------------ figures


STOPPED_COLOR = "#999999"  # a stopped arm in the figures: no verdict


def stopped_label(arm: str, s: ArmStatus) -> str:
    return f"{arm} (stopped at step {s.step})"


def _stopped(summary: Summary) -> dict[str, ArmStatus]:
    """The arms the scheduler stopped at a rung, with figures at their stop step."""
    return {arm: s for arm, s in summary.statuses.items() if s.status == "stopped" and s.delta is not None}


def forest_rows(summary: Summary) -> list[str]:
    """The forest plot's rows, top to bottom: the analysed arms (best mean first), then the stopped ones (marked)."""
    analysed = [a for a in summary.ranking.get(summary.primary, []) if a in summary.arms]
    return analysed + [stopped_label(arm, s) for arm, s in _stopped(summary).items()]


def forest_plot(summary: Summary, path: Path) -> Path:
    """Per aggregation (panel) and arm (row): Δ, the Holm-adjusted interval and the (1 - 2 alpha) TOST interval;
    then, on the primary aggregation's panel, each stopped arm at its stop step (grey, hollow marker, dashed) with its
    unadjusted (1 - alpha) interval (`forest_rows`).

    The x-axis spans every finite end of both and the ±margin band; an unbounded end (None) is drawn
    to the panel's edge with an arrow.
    """
    names = summary.aggregations or [summary.primary]
    arms = [a for a in summary.ranking.get(summary.primary, []) if a in summary.arms]
    stopped = _stopped(summary)
    rows = forest_rows(summary)
    margin = summary.equivalence_margin or 1.0
    fig, axes = plt.subplots(
        1, len(names), figsize=(2.8 * len(names) + 1.6, 0.42 * len(rows) + 1.5), sharey=True, squeeze=False
    )
    for ax, name in zip(axes[0], names):
        stats = [summary.arms[arm][name] for arm in arms]
        bars = [(s.ci_low, s.ci_high, s.eq_low, s.eq_high, s.delta, VERDICT_COLORS[s.verdict], False) for s in stats]
        if name == summary.primary:
            bars += [(s.ci_low, s.ci_high, None, None, s.delta, STOPPED_COLOR, True) for s in stopped.values()]
        shown = [v for bar in bars for v in bar[:5] if v is not None]
        low, high = min(shown + [-margin]), max(shown + [margin])
        pad = 0.12 * (high - low)
        edges = (low - pad, high + pad)
        for y, (ci_low, ci_high, eq_low, eq_high, delta, color, rung) in enumerate(bars):
            spans = [((ci_low, ci_high), 1)] + ([] if rung else [((eq_low, eq_high), 5)])
            for (a, b), width in spans:
                ends = (edges[0] if a is None else a, edges[1] if b is None else b)
                ax.plot(
                    ends,
                    [y, y],
                    color=color,
                    lw=width,
                    alpha=1.0 if width == 1 else 0.45,
                    solid_capstyle="butt",
                    ls="--" if rung else "-",
                )
                for end, missing, marker in ((ends[0], a is None, "<"), (ends[1], b is None, ">")):
                    if missing:
                        ax.plot(end, y, marker, color=color, ms=6)
            ax.plot(delta, y, "o", color=color, ms=5, mfc="white" if rung else color)
        ax.set_xlim(*edges)
        ax.axvspan(-margin, margin, color="#cccccc", alpha=0.35, lw=0)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel("paired Δ vs control (points)")
    axes[0][0].set_yticks(range(len(rows)), rows)
    axes[0][0].invert_yaxis()
    handles = [plt.Line2D([], [], color=c, marker="o", lw=1, label=v) for v, c in VERDICT_COLORS.items()]
    if stopped:
        handles.append(
            plt.Line2D(
                [],
                [],
                color=STOPPED_COLOR,
                marker="o",
                mfc="white",
                lw=1,
                ls="--",
                label="stopped: unadjusted, at its stop step",
            )
        )
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve_lines(summary: Summary) -> dict[str, list[tuple[int, float, float | None, float | None]]]:
    """The learning curves' lines: legend label -> (step, Δ, low, high) points; the analysed arms' (`curves`), then
    each stopped arm's up to its stop step (`series`), marked. Empty: no curves to draw."""
    lines = {arm: [(p.step, p.delta, p.ci_low, p.ci_high) for p in points] for arm, points in summary.curves.items()}
    if not lines:
        return {}  # a table without milestones: no curves, stopped arms or not
    for arm, s in _stopped(summary).items():
        points = [(p.step, p.delta, p.ci_low, p.ci_high) for p in summary.series.get(arm, []) if p.delta is not None]
        if points:
            lines[stopped_label(arm, s)] = points
    return lines


def learning_curves(summary: Summary, path: Path) -> Path:
    """Paired Δ (primary aggregation) vs step per arm with its unadjusted t-interval band; stopped arms dashed, up to
    where they stopped (`curve_lines`)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    stopped = {stopped_label(arm, s) for arm, s in _stopped(summary).items()}
    for label, points in curve_lines(summary).items():
        steps = [p[0] for p in points]
        rung = label in stopped
        (line,) = ax.plot(
            steps,
            [p[1] for p in points],
            marker="o",
            ms=3,
            label=label,
            ls="--" if rung else "-",
            mfc="white" if rung else None,
        )
        band = [
            [math.nan if v is None else v for v in ends] for ends in ([p[2] for p in points], [p[3] for p in points])
        ]
        ax.fill_between(steps, *band, color=line.get_color(), alpha=0.08 if rung else 0.15)  # None: unbounded
    margin = summary.equivalence_margin
    ax.axhspan(-margin, margin, color="#cccccc", alpha=0.35, lw=0)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"paired Δ {summary.primary} vs {summary.control} (points)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------- documents


def markdown(parts: list[Section], figures: dict[str, Path]) -> str:
    lines = ["# tune_dfrl report", ""]
    for section in parts:
        lines += [f"## {section.title}", ""]
        for paragraph in section.paragraphs:
            lines += [paragraph, ""]
        for table in section.tables:
            if table.caption:
                lines += [f"*{table.caption}*", ""]
            lines.append("| " + " | ".join(table.columns) + " |")
            lines.append("|" + "---|" * len(table.columns))
            lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table.rows]
            lines.append("")
            for note in table.notes:
                lines += [note, ""]
        for key in section.figures:
            lines += [f"![{key}]({figures[key].name})", ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    """Escape, then render the two Markdown marks the report uses (**bold**, `code`)."""
    out = html.escape(text)
    for mark, tag in (("**", "strong"), ("`", "code")):
        pieces = out.split(mark)
        out = "".join(p if i % 2 == 0 else f"<{tag}>{p}</{tag}>" for i, p in enumerate(pieces))
    return out


def html_document(parts: list[Section], figures: dict[str, Path]) -> str:
    body = ["<h1>tune_dfrl report</h1>"]
    for section in parts:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        body += [f"<p>{_inline(p)}</p>" for p in section.paragraphs]
        for table in section.tables:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
            body.append(f"<table><caption>{_inline(table.caption)}</caption><tr>{head}</tr>{rows}</table>")
            body += [f"<p>{_inline(note)}</p>" for note in table.notes]
        for key in section.figures:
            data = base64.b64encode(figures[key].read_bytes()).decode()
            body.append(f'<img alt="{key}" src="data:image/png;base64,{data}">')
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px}"
        "th{background:#f0f0f0}caption{text-align:left;font-style:italic;padding:4px}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>tune_dfrl report</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


def write_report(summary: Summary, table: ScoreTable, out_dir: Path) -> dict[str, Path]:
    """Write summary.json, report.md, report.html, forest.png (+ curves.png) into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {"forest": forest_plot(summary, out_dir / "forest.png")}
    if curve_lines(summary):
        figures["curves"] = learning_curves(summary, out_dir / "curves.png")
    parts = sections(summary, table, figures)
    paths = {"summary": out_dir / SUMMARY, "markdown": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["summary"].write_text(summary.to_json())
    paths["markdown"].write_text(markdown(parts, figures))
    paths["html"].write_text(html_document(parts, figures))
    return {**paths, **figures}


def _terminal(table: Table) -> Table:
    """The arms table for a terminal: Δ, its interval and the interval's kind in one column."""
    first = table.columns.index("interval")
    merged = [
        row[: first - 1]
        + [f"{row[first - 1]} {row[first]} ({row[first + 1]})" if row[first] else ""]
        + row[first + 2 :]
        for row in table.rows
    ]
    columns = (
        table.columns[: first - 1] + [f"{table.columns[first - 1]} [interval] (kind)"] + table.columns[first + 2 :]
    )
    columns = [c.replace(" (same step, same seeds)", " (same step)") for c in columns]
    return Table(columns, merged, table.caption, table.notes)


def print_summary(summary: Summary, console: Console | None = None) -> None:
    """Console summary: every arm's status and answer (a search), verdicts on the primary aggregation (descriptive
    under the sequential rule), rank agreement, ranges, the recommendation."""
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    tables = [_terminal(status_table(summary))] if summary.statuses else []
    if summary.arms:
        compact = verdict_table(summary, summary.primary, compact=True)
        if summary.rule == "sequential":
            compact.caption += " — descriptive fixed-sample analysis"
        tables += [compact, *_rank_tables(summary)]
    if summary.rerender:
        console.print(f"[bold]{escape(summary.rerender)}[/bold]")
    for table in tables:
        rich = RichTable(
            title=table.caption.replace("`", ""),
            caption="\n".join(table.notes).replace("`", "") or None,
            caption_justify="left",
        )
        for i, column in enumerate(table.columns):  # no verdict word cut: its column as wide as its longest word
            longest = max((len(word) for row in table.rows for word in row[i].split()), default=0)
            rich.add_column(escape(column), min_width=longest if column == "verdict" else None)
        for row in table.rows:
            rich.add_row(*(escape(cell) for cell in row))
        console.print(rich)
    rec = summary.recommendation
    by = " (sequential looks)" if summary.rule == "sequential" else ""
    console.print(f"[bold]recommended{by}:[/bold] {escape(rec.recommended)} — {escape(rec.reason)}")
