"""Two-stage decision benchmark: screen cheap on a proxy, confirm the screen's top K on the target, against known truth.

    python benchmarks/two_stage_decisions.py [--campaigns 300] [--seed 0] [--top 3] [--top-wide 6]
        [--screen-seeds 8] [--confirm-seeds 8] [--proxy-cost 0.1] [--proxy-scale 1.0] [--transfer-resamples 999]

The campaigns are those of benchmarks/search_decisions.py (imported, not copied): its calibration from the
DataFlex-RL runs, its score model (`simulate_scores`), its settings of true target effects theta of the 12 arms
(`SETTINGS`: one_winner, two_winners, null), its scheduler simulation (`run_paired_rungs` with the real
`tune_dfrl.paired.rungs.decide`, RungRule(mode="paired_asha")) and its one-stage search (`run_method`, which ends
with the real report rule over all 12 arms). Per setting and per rho in {1, 0.5, 0, -0.3}:

Proxy effects (per campaign, exact sample correlation rho with the target's over the K_all = 12 arms):

    theta~ = (theta - mean(theta)) / sd(theta)            sd with ddof 0 over the 12 arms (the same every campaign)
    z ~ N(0, I_12), z~ = z centred, made orthogonal to theta~ and scaled to sd 1 (ddof 0)   one draw per campaign
    phi = mean(theta) + proxy_scale * sd(theta) * (rho * theta~ + sqrt(1 - rho^2) * z~)

so mean(phi) = mean(theta), sd(phi) = proxy_scale * sd(theta), corr(phi, theta) = rho exactly; at rho = 1 and
proxy_scale 1, phi = theta; at rho < 0 the proxy's ranking is partly reversed. z is the same for every rho of a
campaign (common random numbers), as are all the noise draws below.

Stages (the control is arm 0, true effect 0 at both stages):
  screen    an ordinary search on the proxy: `simulate_scores(phi, model with --screen-seeds seeds)`, the paired_asha
            scheduler (the real `decide`, rungs from grace_fraction 0.2), arms launched in a random order. The proxy
            has the target's noise and milestones (search_decisions' calibration): only its effects and seeds
            differ, and its cheapness is --proxy-cost.
  candidates the arms the screen ran to the end (not stopped at a rung), ranked by their mean paired delta against
            the control at the last milestone; the top K (fewer when fewer finished).
  confirm   the control and the candidates on the target, full runs, on --confirm-seeds fresh seeds (disjoint from
            the screen's: another random stream): `simulate_scores(theta, ...)` at the last milestone. Verdicts from
            the confirm's data only: the real `tune_dfrl.paired.stats.paired_verdicts` (paired t, Holm over the
            confirmed arms at alpha = 0.05; family = the candidates). Winner: among the arms judged "better"
            (Holm-adjusted interval above 0), the one with the largest mean delta; none: keep the control.
            (`recommend` would take the highest lower bound at the common level instead; the two differ only when
            two or more arms are judged better.)
  transfer  the real `tune_dfrl.paired.transfer.transfer_check` of the screen's per-seed deltas (last milestone)
            against the confirm's, over the control and the candidates (K + 1 items), --transfer-resamples
            bootstrap resamples, seed = campaign index. With K = 3 (4 items) no Spearman rho is significant at 5%
            (even rho = 1 has p = 2/4! = 0.083); the verdict then rests on the bootstrap interval and the pick only;
            with 3 items or fewer (fewer than 3 arms finished the screen) it is "does not transfer" by rule.
  variants  the same campaigns are confirmed a second time with K = --top-wide (default 6: 7 items, where a rho can
            be significant), and a third time with K = --top-wide after a grid screen (every arm of the proxy run
            to the end, no scheduler), since a paired_asha screen seldom runs 6 of the 12 arms to the end.
  one-stage the paired_asha search on the target over all 12 arms at --confirm-seeds seeds, then the report rule
            (Holm over all 12), on the same target draws as the confirm (common random numbers): search_decisions'
            `paired_asha` method.

Compute, in target cell-steps (one arm x one seed x one milestone of the target recipe):
  screen = proxy_cost x the cell-steps the screen ran; confirm = (candidates + 1) x confirm seeds x milestones;
  one-stage = the cell-steps its search ran. compute_vs_one_stage = mean(screen + confirm) / mean(one-stage).

Figures per setting, rho and K: picked_best (P(winner = the truly best arm); settings with a positive arm),
false_winner (P(a winner is claimed whose true effect is <= 0): under null any winner), fwer (P(some confirmed arm
with true effect <= 0 is judged better), what Holm bounds by alpha), best_screened (P(the truly best arm is a
candidate)), confirmed (mean number of candidates), compute_vs_one_stage, screen_share (the screen's part of the
two-stage compute), nontransfer (P(the transfer check says "does not transfer")), cannot_tell (P(it had K + 1 <= 3
items: then "does not transfer" by its rule, whatever the data)), rho_significant (P(the observed
Spearman rho has two-sided p <= alpha under unrelated rankings)); nontransfer, cannot_tell and rho_significant over
the campaigns with at least one candidate. The one-stage rows: picked_best, false_winner and compute_frac_of_grid
(its compute as a fraction of its full paired grid).

The last output line is one JSON object {"one_stage": {...}, "two_stage": [{rho, screen, top, ...}, ...]} with the
headline figures: picked_best, false_winner, compute_vs_one_stage and nontransfer from one_winner, false_winner_null
from null, worst_fwer over all settings.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import search_decisions as one_stage

from tune_dfrl.paired.rungs import RungRule
from tune_dfrl.paired.stats import paired_verdicts
from tune_dfrl.paired.transfer import DOES_NOT_TRANSFER, FEWEST_TELLING_K, transfer_check

RHOS = (1.0, 0.5, 0.0, -0.3)
GRID = "grid"  # a screen that runs every arm to the end (no scheduler)
CONTROL = one_stage.CONTROL
HEADLINE, NULL = one_stage.HEADLINE, one_stage.NULL


@dataclass(frozen=True)
class Design:
    """The two-stage design's knobs (module docstring)."""

    top: int = 3  # K: arms confirmed
    top_wide: int = 6  # a second confirm of more arms, so the transfer check can tell
    screen_seeds: int = 8
    confirm_seeds: int = 8
    proxy_cost: float = 0.1  # one proxy cell-step in target cell-steps
    proxy_scale: float = 1.0  # sd(phi) / sd(theta)
    alpha: float = 0.05
    transfer_resamples: int = 999
    rule: RungRule = RungRule(mode="paired_asha")

    def __post_init__(self) -> None:
        problems = [
            f"{name}={value} (allowed: {allowed})"
            for name, value, ok, allowed in (
                ("top", self.top, self.top >= 1, ">= 1"),
                ("top_wide", self.top_wide, self.top_wide >= 1, ">= 1"),
                ("screen_seeds", self.screen_seeds, self.screen_seeds >= 2, ">= 2"),
                ("confirm_seeds", self.confirm_seeds, self.confirm_seeds >= 2, ">= 2"),
                ("proxy_cost", self.proxy_cost, self.proxy_cost >= 0.0, ">= 0"),
                ("proxy_scale", self.proxy_scale, self.proxy_scale > 0.0, "> 0"),
                ("alpha", self.alpha, 0.0 < self.alpha < 0.5, "(0, 0.5)"),
                ("transfer_resamples", self.transfer_resamples, self.transfer_resamples >= 1, ">= 1"),
            )
            if not ok
        ]
        if problems:
            raise ValueError("bad two-stage design: " + "; ".join(problems))

    @property
    def variants(self) -> tuple[tuple[str, int], ...]:
        """(screen scheduler, K) of every confirm: the design, the wider confirm, the wider confirm of a grid screen."""
        mode = self.rule.mode
        return tuple(dict.fromkeys(((mode, self.top), (mode, self.top_wide), (GRID, self.top_wide))))


def proxy_effects(theta: Sequence[float], rho: float, z: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """phi [C, K] from the target effects theta [K] and standard normal draws z [C, K] (module docstring):
    mean(phi) = mean(theta), sd(phi) = scale * sd(theta), corr(phi, theta) = rho exactly, per campaign."""
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho must lie in [-1, 1]; got {rho}")
    theta = np.asarray(theta, dtype=float)
    mean, sd = theta.mean(), theta.std()
    if not sd > 0.0:
        raise ValueError("the target effects must differ between arms for a correlation to mean anything")
    standard = (theta - mean) / sd
    noise = z - z.mean(axis=1, keepdims=True)
    noise = noise - (noise @ standard)[:, None] * standard / len(theta)
    noise = noise / noise.std(axis=1, keepdims=True)
    return mean + scale * sd * (rho * standard + math.sqrt(1.0 - rho * rho) * noise)


@dataclass(frozen=True)
class Confirmed:
    """One confirm size on every campaign of one (setting, rho)."""

    winner: np.ndarray  # [C] arm index, -1 = the control kept
    false_rejection: np.ndarray  # [C] some candidate with true effect <= 0 judged better
    best_screened: np.ndarray  # [C] the truly best arm is a candidate (False under a null)
    confirmed: np.ndarray  # [C] number of candidates
    cost: np.ndarray  # [C] screen + confirm, target cell-steps
    screen_cost: np.ndarray  # [C]
    nontransfer: np.ndarray  # [C] the transfer check says "does not transfer" (False where it could not run)
    cannot_tell: np.ndarray  # [C] it ran on fewer than FEWEST_TELLING_K items (K + 1 <= 3): "does not transfer" by rule
    rho_significant: np.ndarray  # [C] the observed Spearman rho's p-value <= alpha
    spearman: np.ndarray  # [C] the observed Spearman rho (NaN where the check could not run)
    checked: np.ndarray  # [C] the check ran (at least one candidate)


def confirm(
    theta: np.ndarray,
    screen: np.ndarray,
    finished: np.ndarray,
    screen_steps: np.ndarray,
    target: np.ndarray,
    top: int,
    design: Design,
) -> Confirmed:
    """Candidates from the screen (scores [C, A, S_s, M], finished [C, A]), confirmed on the target's last milestone
    (scores [C, A, S_c, M]); theta [A] with the control's 0 first."""
    n_campaigns, n_arms, _, n_milestones = target.shape
    screen_deltas = screen[:, 1:, :, -1] - screen[:, :1, :, -1]  # [C, K_all, S_s]
    target_deltas = target[:, 1:, :, -1] - target[:, :1, :, -1]  # [C, K_all, S_c]
    ranking = np.where(finished[:, 1:], screen_deltas.mean(axis=2), -np.inf)
    best = int(np.argmax(theta)) if theta.max() > 0 else -1
    out = {
        name: np.zeros(n_campaigns, dtype=dtype)
        for name, dtype in (
            ("winner", int),
            ("false_rejection", bool),
            ("best_screened", bool),
            ("confirmed", int),
            ("nontransfer", bool),
            ("cannot_tell", bool),
            ("rho_significant", bool),
            ("checked", bool),
        )
    }
    out["spearman"] = np.full(n_campaigns, math.nan)
    for c in range(n_campaigns):
        order = np.argsort(-ranking[c], kind="stable")[:top]
        candidates = [int(a) + 1 for a in order if np.isfinite(ranking[c, a])]
        out["confirmed"][c] = len(candidates)
        out["best_screened"][c] = best in candidates
        out["winner"][c] = -1
        if not candidates:
            continue
        names = {one_stage.arm_name(a): a for a in candidates}
        verdicts = paired_verdicts(
            target[c, 0, :, -1], {name: target[c, a, :, -1] for name, a in names.items()}, alpha=design.alpha
        )
        better = [name for name, v in verdicts.items() if v.verdict == "better"]
        if better:
            out["winner"][c] = names[max(better, key=lambda name: verdicts[name].delta)]
        out["false_rejection"][c] = any(theta[names[name]] <= 0 for name in better)
        check = transfer_check(
            {name: screen_deltas[c, a - 1] for name, a in names.items()},
            {name: target_deltas[c, a - 1] for name, a in names.items()},
            CONTROL,
            alpha=design.alpha,
            seed=c,
            n_resamples=design.transfer_resamples,
        )
        out["checked"][c] = True
        out["nontransfer"][c] = check.verdict == DOES_NOT_TRANSFER
        out["cannot_tell"][c] = check.k < FEWEST_TELLING_K
        out["rho_significant"][c] = check.spearman_p <= design.alpha
        out["spearman"][c] = check.spearman
    screen_cost = design.proxy_cost * screen_steps
    confirm_cost = (out["confirmed"] + 1) * target.shape[2] * n_milestones
    return Confirmed(cost=screen_cost + confirm_cost, screen_cost=screen_cost, **out)


@dataclass(frozen=True)
class TwoStageMetrics:
    picked_best: float  # nan under a null
    false_winner: float
    fwer: float
    best_screened: float  # nan under a null
    confirmed: float
    compute_vs_one_stage: float
    screen_share: float
    nontransfer: float
    cannot_tell: float
    rho_significant: float
    spearman: float  # mean observed Spearman rho over the campaigns checked


@dataclass(frozen=True)
class OneStageMetrics:
    picked_best: float
    false_winner: float
    compute_frac: float  # of its full paired grid at the confirm's seeds
    steps: float  # mean target cell-steps


def two_stage_metrics(result: Confirmed, theta: np.ndarray, one_stage_steps: float) -> TwoStageMetrics:
    best = int(np.argmax(theta)) if theta.max() > 0 else None
    claimed = result.winner >= 0
    checked = result.checked
    return TwoStageMetrics(
        picked_best=float(np.mean(result.winner == best)) if best is not None else math.nan,
        false_winner=float(np.mean(claimed & (theta[result.winner] <= 0))),
        fwer=float(np.mean(result.false_rejection)),
        best_screened=float(np.mean(result.best_screened)) if best is not None else math.nan,
        confirmed=float(np.mean(result.confirmed)),
        compute_vs_one_stage=float(result.cost.mean() / one_stage_steps),
        screen_share=float(result.screen_cost.mean() / result.cost.mean()),
        nontransfer=float(np.mean(result.nontransfer[checked])) if checked.any() else math.nan,
        cannot_tell=float(np.mean(result.cannot_tell[checked])) if checked.any() else math.nan,
        rho_significant=float(np.mean(result.rho_significant[checked])) if checked.any() else math.nan,
        spearman=float(np.mean(result.spearman[checked])) if checked.any() else math.nan,
    )


@dataclass(frozen=True)
class Results:
    one_stage: dict[str, OneStageMetrics]  # {setting: ...}
    two_stage: dict[str, dict[float, dict[tuple[str, int], TwoStageMetrics]]]  # {setting: {rho: {variant: ...}}}


def run_benchmark(
    model: one_stage.CampaignModel,
    design: Design,
    campaigns: int,
    seed: int,
    rhos: Sequence[float] = RHOS,
    settings: dict[str, tuple[float, ...]] | None = None,
    progress: bool = False,
) -> Results:
    """Every setting x rho x confirm size on `campaigns` simulated campaigns (module docstring)."""
    started = time.perf_counter()
    settings = one_stage.SETTINGS if settings is None else settings
    rungs = one_stage.Plan.paired_rungs(design.rule, model.milestones)
    plan = one_stage.Plan(rules={"paired_asha": design.rule})
    screen_model = replace(model, seeds=design.screen_seeds)
    target_model = replace(model, seeds=design.confirm_seeds)
    results = Results({}, {})
    for index, (setting, effects) in enumerate(settings.items()):
        theta = np.concatenate([[0.0], effects])
        n_arms = len(theta)
        draws = np.random.default_rng([seed, index, 2])  # proxy-effect noise and launch orders
        z = draws.standard_normal((campaigns, n_arms - 1))
        screen_orders = draws.permuted(np.tile(np.arange(1, n_arms), (campaigns, 1)), axis=1)
        target_orders = draws.permuted(np.tile(np.arange(1, n_arms), (campaigns, 1)), axis=1)
        target = one_stage.simulate_scores(effects, target_model, campaigns, np.random.default_rng([seed, index, 1]))
        searched = one_stage.run_method("paired_asha", target, target_orders, np.empty((campaigns, 0), dtype=int), plan)
        grid = n_arms * design.confirm_seeds * model.milestones
        base = one_stage.metrics(searched, effects, grid)
        results.one_stage[setting] = OneStageMetrics(
            base.picked_best, base.false_winner, base.compute_frac, float(searched.trial_steps.mean())
        )
        results.two_stage[setting] = {}
        for rho in rhos:
            phi = proxy_effects(effects, rho, z, design.proxy_scale)
            screen = one_stage.simulate_scores(phi, screen_model, campaigns, np.random.default_rng([seed, index, 0]))
            screened = {
                mode: one_stage.run_paired_rungs(screen, screen_orders, one_stage.rung_rule_keep(design.rule), rungs)
                if mode != GRID
                else one_stage.run_paired_rungs(screen, screen_orders, one_stage.keep_all, rungs=())
                for mode in dict.fromkeys(mode for mode, _ in design.variants)
            }
            results.two_stage[setting][rho] = {
                (mode, top): two_stage_metrics(
                    confirm(theta, screen, *screened[mode], target, top, design),
                    theta,
                    results.one_stage[setting].steps,
                )
                for mode, top in design.variants
            }
            if progress:
                print(f"  {setting} rho {rho:+g}: done ({time.perf_counter() - started:.0f} s)", flush=True)
    return results


# --- output ----------------------------------------------------------------------------------------


def fmt(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


TWO_STAGE_FIELDS = (
    "picked_best",
    "false_winner",
    "fwer",
    "best_screened",
    "confirmed",
    "compute_vs_one_stage",
    "screen_share",
    "nontransfer",
    "cannot_tell",
    "rho_significant",
    "spearman",
)


def table(results: Results) -> str:
    lines = [
        "| setting | design | screen | rho | K | " + " | ".join(TWO_STAGE_FIELDS) + " |",
        "|" + "---|" * (5 + len(TWO_STAGE_FIELDS)),
    ]
    for setting, by_rho in results.two_stage.items():
        o = results.one_stage[setting]
        lines.append(
            f"| {setting} | one_stage | — | — | all | {fmt(o.picked_best)} | {fmt(o.false_winner)} | "
            + " | ".join("—" for _ in TWO_STAGE_FIELDS[2:5])
            + f" | 1.000 (grid {fmt(o.compute_frac)}) | — | — | — | — | — |"
        )
        for rho, by_variant in by_rho.items():
            for (mode, top), m in by_variant.items():
                cells = " | ".join(fmt(getattr(m, f)) for f in TWO_STAGE_FIELDS)
                lines.append(f"| {setting} | two_stage | {mode} | {rho:+g} | {top} | {cells} |")
    return "\n".join(lines)


def result_rows(results: Results) -> list[dict[str, object]]:
    """The rows of the results file (benchmarks/results_file.py), 3 decimals; NaN: none."""

    def r(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 3)

    rows: list[dict[str, object]] = []
    for setting, by_rho in results.two_stage.items():
        o = results.one_stage[setting]
        one = {"picked_best": r(o.picked_best), "false_winner": r(o.false_winner), "compute_vs_one_stage": 1.0}
        rows.append(
            {"setting": setting, "design": "one_stage", "screen": None, "rho": None, "K": None}
            | {f: one.get(f) for f in TWO_STAGE_FIELDS}
            | {"compute_frac_of_grid": r(o.compute_frac)}
        )
        for rho, by_variant in by_rho.items():
            for (mode, top), m in by_variant.items():
                rows.append(
                    {"setting": setting, "design": "two_stage", "screen": mode, "rho": rho, "K": top}
                    | {f: r(getattr(m, f)) for f in TWO_STAGE_FIELDS}
                    | {"compute_frac_of_grid": None}
                )
    return rows


def summary_json(results: Results) -> str:
    def r(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 4)

    head, null = results.two_stage[HEADLINE], results.two_stage[NULL]
    return json.dumps(
        {
            "one_stage": {
                "picked_best": r(results.one_stage[HEADLINE].picked_best),
                "false_winner": r(results.one_stage[HEADLINE].false_winner),
                "false_winner_null": r(results.one_stage[NULL].false_winner),
                "compute_frac_of_grid": r(results.one_stage[HEADLINE].compute_frac),
            },
            "two_stage": [
                {
                    "rho": rho,
                    "screen": mode,
                    "top": top,
                    "picked_best": r(m.picked_best),
                    "false_winner": r(m.false_winner),
                    "false_winner_null": r(null[rho][(mode, top)].false_winner),
                    "worst_fwer": r(max(by_rho[rho][(mode, top)].fwer for by_rho in results.two_stage.values())),
                    "compute_vs_one_stage": r(m.compute_vs_one_stage),
                    "nontransfer": r(m.nontransfer),
                    "cannot_tell": r(m.cannot_tell),
                    "rho_significant": r(m.rho_significant),
                }
                for rho, by_variant in head.items()
                for (mode, top), m in by_variant.items()
            ],
        }
    )


def main(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, Results]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaigns", type=int, default=300, help="simulated campaigns per setting")
    parser.add_argument("--seed", type=int, default=0, help="master seed: the same seed reproduces the table")
    parser.add_argument("--top", type=int, default=Design.top, help="K: the screen's top arms confirmed")
    parser.add_argument(
        "--top-wide", type=int, default=Design.top_wide, help="a second, wider confirm (the transfer check can tell)"
    )
    parser.add_argument("--screen-seeds", type=int, default=Design.screen_seeds, help="paired seeds of the screen")
    parser.add_argument(
        "--confirm-seeds", type=int, default=Design.confirm_seeds, help="fresh paired seeds of the confirm"
    )
    parser.add_argument(
        "--proxy-cost", type=float, default=Design.proxy_cost, help="one proxy cell-step in target cell-steps"
    )
    parser.add_argument("--proxy-scale", type=float, default=Design.proxy_scale, help="sd(phi) / sd(theta)")
    parser.add_argument(
        "--transfer-resamples", type=int, default=Design.transfer_resamples, help="transfer check bootstrap"
    )
    parser.add_argument("--milestones", type=int, default=10, help="evaluation milestones per trial")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    calibration = one_stage.estimate_calibration()
    model = one_stage.CampaignModel(
        paired_sd=calibration.paired_sd, seed_sd=calibration.seed_sd, milestones=args.milestones
    )
    design = Design(
        top=args.top,
        top_wide=args.top_wide,
        screen_seeds=args.screen_seeds,
        confirm_seeds=args.confirm_seeds,
        proxy_cost=args.proxy_cost,
        proxy_scale=args.proxy_scale,
        transfer_resamples=args.transfer_resamples,
    )
    print(
        f"calibration from {one_stage.DATA.name}: paired SD {calibration.paired_sd:.3f} points, "
        f"seed SD {calibration.seed_sd:.3f} points"
    )
    print(f"model: {model}")
    print(f"design: {design}")
    print(f"settings (true target effects of the 12 arms, points): {one_stage.SETTINGS}; rho in {RHOS}")
    print(f"{args.campaigns} campaigns per setting, seed {args.seed}\n", flush=True)
    results = run_benchmark(model, design, args.campaigns, args.seed, progress=True)
    print()
    print(table(results))
    print(f"\nelapsed {time.perf_counter() - started:.1f} s")
    print(summary_json(results))
    return args, results


if __name__ == "__main__":
    from results_file import write_results

    arguments, figures = main()
    write_results("two_stage_decisions", result_rows(figures), __doc__.splitlines()[0])
