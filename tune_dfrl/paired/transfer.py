"""The transfer check: does a cheap proxy's ("screen") ranking of arms predict the target's?

Input: per stage (screen, target) and arm a, the paired differences d_{a,s} = score(a, s) - score(control, s) at
the stage's seeds s (points, on one aggregation), NaN where the arm has no run at s. Only the K arms trained in both
stages enter, the control included with d = 0 at every seed.

- Per arm and stage: mean Δ_a = mean_s d_{a,s} over its n_a seeds and the unadjusted (1 - alpha) paired interval
  `stats.paired_interval` (t-interval; without spread the inverted exact sign-flip test). The control: {0}.
  rank_a: 1 = the highest Δ at that stage (average ranks on ties).
- Rank agreement of the K stage means: Spearman ρ (Pearson correlation of the average ranks) and Kendall τ-b
  ((C - D) / sqrt((P - T_x)(P - T_y)), P = K(K-1)/2 pairs, T_x, T_y pairs tied in x, y), as scipy computes them.
- Bootstrap interval of each: the stages' seeds are independent runs, so each resample draws, independently per
  stage, S_stage seeds with replacement from that stage's S_stage seeds (one draw shared by every arm of the stage,
  which keeps the arms' pairing through the shared control and data order), recomputes every arm's mean Δ over the
  drawn seeds (an arm lacking a drawn seed averages the drawn seeds it has) and both correlations. A resample where
  an arm has none of the drawn seeds, or a stage's means are all tied (ρ undefined), is left out (`resamples_used`).
  Interval: the alpha/2 and 1 - alpha/2 percentiles (numpy linear interpolation) of the kept resamples.
  `numpy.random.default_rng(seed)`: the same input and seed give the same interval. At S seeds a stage has only
  C(2S - 1, S) distinct resamples (10 at 3 seeds), so the interval is coarse and under-covers at few seeds.
- Pick: the arm with the highest screen Δ (the control when none beats it; the first in `arms` order on ties). The
  target reverses it when its best arm is another one (then the pick, unless the control, may also fall below the
  control at the target: Δ_target < 0, said so).
- Verdict: "transfers" only when the Spearman interval lies above 0, the pick is not reversed and K >= 4; otherwise
  "does not transfer", with the reasons and the advice (confirm more arms on the target, or screen on a recipe
  closer to the target).
- What K items can show: under the null of unrelated rankings (every permutation of K distinct ranks equally
  likely) ρ = 1 - 6 Σ d_i² / (K(K² - 1)). Its distribution is enumerated over the K! permutations for K <= 8, else
  approximated by ρ sqrt(K - 1) ~ N(0, 1). From it: the smallest |ρ| with two-sided P(|ρ_null| >= |ρ|) <= alpha
  (None when no value is), whether ρ = 1 is (P = 2 / K! exactly), and the observed ρ's p-value. With K <= 3, ρ
  takes only a few values (listed) and the check cannot tell.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from itertools import permutations

import numpy as np
from scipy import special, stats

from tune_dfrl.paired.stats import paired_interval

TRANSFERS, DOES_NOT_TRANSFER = "transfers", "does not transfer"
EXACT_NULL_MAX_K = 8  # the null of Spearman's ρ is enumerated over K! permutations up to here
FEWEST_TELLING_K = 4  # with K <= 3 items ρ takes at most 4 values: the check cannot tell
TIE = 1e-9  # two ρ values closer than this are the same (their spacing is 12 / (K(K²-1)) >= 0.02 for K <= 8)
ADVICE = (
    "confirm more arms on the target (not only the screen's pick), or screen on a recipe closer to the target "
    "(a model, data and training length nearer the target's)"
)


@dataclass(frozen=True)
class StageEstimate:
    """One arm at one stage: mean paired Δ over n seeds, its unadjusted (1 - alpha) interval, its rank (1 = best)."""

    n: int
    delta: float
    low: float
    high: float
    rank: float


@dataclass(frozen=True)
class TransferCheck:
    """The transfer check of one screen/target pair of stages (module docstring). `to_json` writes it; non-finite
    numbers (an unbounded interval) become null."""

    control: str
    arms: tuple[str, ...]  # the K arms trained in both stages, the control first
    screen: dict[str, StageEstimate]
    target: dict[str, StageEstimate]
    alpha: float  # intervals at 1 - alpha; the null figures at two-sided alpha
    spearman: float
    spearman_low: float
    spearman_high: float
    kendall: float
    kendall_low: float
    kendall_high: float
    n_resamples: int
    resamples_used: int
    seed: int
    screen_pick: str
    target_pick: str
    pick_reversed: bool
    pick_note: str
    verdict: str
    reasons: tuple[str, ...]
    advice: str
    k: int
    null_method: str  # "exact (K! permutations)" or "normal approximation"
    rho_critical: float | None  # smallest |ρ| significant at two-sided alpha; None: none is
    rho_one_significant: bool
    rho_values: tuple[float, ...]  # every value ρ can take, listed when K <= 3
    spearman_p: float  # two-sided p-value of the observed ρ under the null
    caveat: str
    screen_only: tuple[str, ...]  # arms of one stage only: not compared
    target_only: tuple[str, ...]
    screen_label: str = "screen"  # what each stage is (e.g. its slice of a run table): errors and tables name it
    target_label: str = "target"
    aggregation: str = ""  # the aggregation the Δs are on, as the caller names it

    def to_dict(self) -> dict:
        return _finite_or_none(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)


def _finite_or_none(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


# ------------------------------------------------------------------------------- rank correlations


def rank_correlations(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Spearman ρ, Kendall τ-b) of a and b along the last axis ([..., K], batched), NaN where either is constant;
    the values of scipy's `spearmanr` / `kendalltau` (module docstring)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ra, rb = stats.rankdata(a, axis=-1), stats.rankdata(b, axis=-1)
    ra, rb = ra - ra.mean(axis=-1, keepdims=True), rb - rb.mean(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (ra * rb).sum(-1) / np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
        i, j = np.triu_indices(a.shape[-1], k=1)
        sa, sb = np.sign(a[..., i] - a[..., j]), np.sign(b[..., i] - b[..., j])
        pairs = len(i)
        tau = (sa * sb).sum(-1) / np.sqrt((pairs - (sa == 0).sum(-1)) * (pairs - (sb == 0).sum(-1)))
    return np.clip(rho, -1.0, 1.0), np.clip(tau, -1.0, 1.0)


@lru_cache(maxsize=16)
def spearman_null(k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The exact null distribution of Spearman's ρ for k >= 2 distinct items: (values ascending, probabilities),
    over the k! equally likely permutations. Enumerated: meant for k <= EXACT_NULL_MAX_K."""
    if k < 2:
        raise ValueError(f"Spearman's ρ needs at least 2 items; got {k}")
    ranks = np.array(list(permutations(range(k))), dtype=np.int64)
    squares = ((ranks - np.arange(k)) ** 2).sum(axis=1)
    values, counts = np.unique(squares, return_counts=True)  # Σ d² ascending: ρ descending
    rho = 1.0 - 6.0 * values / (k * (k * k - 1))
    return tuple(rho[::-1].tolist()), tuple((counts[::-1] / len(ranks)).tolist())


@dataclass(frozen=True)
class SpearmanNull:
    """What K items can show about Spearman's ρ at two-sided level alpha (module docstring)."""

    k: int
    method: str
    critical: float | None
    one_significant: bool
    values: tuple[float, ...]  # listed when K < FEWEST_TELLING_K

    def p_value(self, rho: float) -> float:
        """Two-sided P(|ρ_null| >= |rho|)."""
        if not math.isfinite(rho):
            return math.nan
        if self.k <= EXACT_NULL_MAX_K:
            values, probs = (np.array(x) for x in spearman_null(self.k))
            return float(min(1.0, probs[np.abs(values) >= abs(rho) - TIE].sum()))
        return float(2.0 * special.ndtr(-abs(rho) * math.sqrt(self.k - 1)))


def spearman_limits(k: int, alpha: float = 0.05) -> SpearmanNull:
    """The smallest |ρ| significant at two-sided alpha for k items, whether ρ = 1 is, the values ρ takes (k <= 3)."""
    if k <= EXACT_NULL_MAX_K:
        values, probs = (np.array(x) for x in spearman_null(k))
        tails = {abs(v): probs[np.abs(values) >= abs(v) - TIE].sum() for v in values}
        significant = [c for c, p in tails.items() if p <= alpha + TIE]
        critical = float(min(significant)) if significant else None
        one = bool(2.0 / math.factorial(k) <= alpha + TIE)
        method = f"exact ({k}! permutations)"
    else:
        critical = float(special.ndtri(1.0 - alpha / 2.0) / math.sqrt(k - 1))
        one = bool(critical <= 1.0)
        method = "normal approximation (ρ √(K-1) ~ N(0, 1))"
    shown = tuple(float(round(v, 12)) for v in spearman_null(k)[0]) if k < FEWEST_TELLING_K else ()
    return SpearmanNull(k, method, critical, one, shown)


# ---------------------------------------------------------------------------------------- the check


def _stage_matrix(deltas: Mapping[str, Sequence[float]], arms: list[str], control: str, name: str) -> np.ndarray:
    """[K, S] paired Δ of `arms` (the control: 0 at every seed) from {arm: [S] Δ}."""
    lengths = {len(np.atleast_1d(v)) for v in deltas.values()}
    if len(lengths) > 1:
        raise ValueError(f"{name}: every arm needs one Δ per seed of the stage (NaN where missing); lengths {lengths}")
    seeds = lengths.pop()
    rows = [np.zeros(seeds) if arm == control else np.asarray(deltas[arm], dtype=float) for arm in arms]
    matrix = np.vstack(rows)
    n = np.isfinite(matrix).sum(axis=1)
    if short := [f"{arm} ({c} seed{'s' if c != 1 else ''})" for arm, c in zip(arms, n) if c < 2]:
        raise ValueError(f"{name}: a paired interval needs at least 2 seeds per arm; too few: {', '.join(short)}")
    return matrix


def _estimates(matrix: np.ndarray, arms: list[str], control: str, alpha: float) -> dict[str, StageEstimate]:
    n = np.isfinite(matrix).sum(axis=1)
    mean = np.nanmean(matrix, axis=1)
    low, high = paired_interval(mean, np.nanstd(matrix, axis=1, ddof=1), n, 1.0 - alpha)
    rank = stats.rankdata(-mean)
    return {
        arm: StageEstimate(
            int(n[i]),
            float(mean[i]),
            0.0 if arm == control else float(low[i]),
            0.0 if arm == control else float(high[i]),
            float(rank[i]),
        )
        for i, arm in enumerate(arms)
    }


def _resampled_means(matrix: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """[B, K] arm means over S seeds drawn with replacement (one draw per resample for every arm); NaN where an
    arm has none of the drawn seeds."""
    seeds = matrix.shape[1]
    counts = rng.multinomial(seeds, np.full(seeds, 1.0 / seeds), size=n_resamples)  # [B, S]
    finite = np.isfinite(matrix)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (counts @ np.where(finite, matrix, 0.0).T) / (counts @ finite.T.astype(float))


def transfer_check(
    screen: Mapping[str, Sequence[float]],
    target: Mapping[str, Sequence[float]],
    control: str,
    alpha: float = 0.05,
    seed: int = 0,
    n_resamples: int = 9999,
    screen_label: str = "screen",
    target_label: str = "target",
    aggregation: str = "",
) -> TransferCheck:
    """The transfer check (module docstring) of {arm: per-seed paired Δ} at the screen and at the target.

    Each mapping holds the arms of its stage besides the control (a control entry, if given, must be all 0); within
    a stage every arm's array has one entry per seed of that stage, in the same seed order, NaN where the arm has
    no run. Raises ValueError when no arm besides the control is in both stages, or an arm in both has fewer than
    2 seeds at a stage.
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"need 0 < alpha < 0.5; got {alpha}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1; got {n_resamples}")
    names = {
        stage: stage if label == stage else f"{stage} ({label})"
        for stage, label in (("screen", screen_label), ("target", target_label))
    }
    for name, deltas in ((names["screen"], screen), (names["target"], target)):
        if control in deltas and np.nanmax(np.abs(np.asarray(deltas[control], dtype=float)), initial=0.0) > 0.0:
            raise ValueError(f"{name}: the control {control!r} is the reference; its paired Δ must be 0")
    common = sorted((set(screen) & set(target)) - {control})
    if not common:
        raise ValueError(
            f"no arm besides the control {control!r} is in both stages: {names['screen']} has "
            f"{sorted(set(screen) - {control}) or 'none'}, {names['target']} has {sorted(set(target) - {control}) or 'none'}"
        )
    arms = [control, *common]
    k = len(arms)
    by_stage = {
        "screen": _stage_matrix(screen, arms, control, names["screen"]),
        "target": _stage_matrix(target, arms, control, names["target"]),
    }
    est = {stage: _estimates(m, arms, control, alpha) for stage, m in by_stage.items()}
    means = {stage: np.array([e[a].delta for a in arms]) for stage, e in est.items()}
    rho, tau = (float(x) for x in rank_correlations(means["screen"], means["target"]))

    rng = np.random.default_rng(seed)
    boot = {stage: _resampled_means(m, rng, n_resamples) for stage, m in by_stage.items()}
    rhos, taus = rank_correlations(boot["screen"], boot["target"])
    kept = np.isfinite(rhos) & np.isfinite(taus)
    quantiles = [alpha / 2.0, 1.0 - alpha / 2.0]
    if kept.any():
        rho_low, rho_high = (float(x) for x in np.quantile(rhos[kept], quantiles))
        tau_low, tau_high = (float(x) for x in np.quantile(taus[kept], quantiles))
    else:
        rho_low = rho_high = tau_low = tau_high = math.nan

    screen_pick = arms[int(np.argmax(means["screen"]))]
    target_pick = arms[int(np.argmax(means["target"]))]
    reversed_pick = screen_pick != target_pick
    at_target = est["target"][screen_pick].delta
    picked = (
        f"the screen picks the control {control!r} (no arm beats it there)"
        if screen_pick == control
        else f"the screen picks {screen_pick!r} (Δ {est['screen'][screen_pick].delta:+.2f})"
    )
    if not reversed_pick:
        pick_note = f"{picked}; it is also the target's best"
    else:
        best = est["target"][target_pick].delta
        pick_note = picked + (
            f"; at the target no arm beats the control {control!r}"
            if target_pick == control
            else f"; at the target {target_pick!r} is best (Δ {best:+.2f})"
        )
        if screen_pick != control and at_target < 0:
            pick_note += f", and the pick falls below the control there (Δ {at_target:+.2f})"

    limits = spearman_limits(k, alpha)
    p_rho = limits.p_value(rho)
    level = f"{1 - alpha:.0%}"
    reasons = []
    if not rho_low > 0:
        where = "lies below 0" if rho_high < 0 else "includes 0"
        reasons.append(f"the {level} bootstrap interval of Spearman ρ [{rho_low:+.2f}, {rho_high:+.2f}] {where}")
    if reversed_pick:
        reasons.append(pick_note)
    if k < FEWEST_TELLING_K:
        reasons.append(f"with K = {k} arms ρ takes only the values {_values(limits.values)}: the check cannot tell")
    verdict = DOES_NOT_TRANSFER if reasons else TRANSFERS
    return TransferCheck(
        control=control,
        arms=tuple(arms),
        screen=est["screen"],
        target=est["target"],
        alpha=alpha,
        spearman=rho,
        spearman_low=rho_low,
        spearman_high=rho_high,
        kendall=tau,
        kendall_low=tau_low,
        kendall_high=tau_high,
        n_resamples=n_resamples,
        resamples_used=int(kept.sum()),
        seed=seed,
        screen_pick=screen_pick,
        target_pick=target_pick,
        pick_reversed=reversed_pick,
        pick_note=pick_note,
        verdict=verdict,
        reasons=tuple(reasons),
        advice=ADVICE if reasons else "",
        k=k,
        null_method=limits.method,
        rho_critical=limits.critical,
        rho_one_significant=limits.one_significant,
        rho_values=limits.values,
        spearman_p=p_rho,
        caveat=_caveat(limits, rho, p_rho, alpha, {s: m.shape[1] for s, m in by_stage.items()}),
        screen_only=tuple(sorted(set(screen) - set(target) - {control})),
        target_only=tuple(sorted(set(target) - set(screen) - {control})),
        screen_label=screen_label,
        target_label=target_label,
        aggregation=aggregation,
    )


def _values(values: Sequence[float]) -> str:
    return ", ".join(f"{v:+g}" for v in values)


def _caveat(limits: SpearmanNull, rho: float, p: float, alpha: float, seeds: dict[str, int]) -> str:
    """What K items and these seeds can show, in words."""
    k, level = limits.k, f"{alpha:.0%}"
    if k < FEWEST_TELLING_K:
        text = (
            f"With K = {k} arms, Spearman ρ takes only the values {_values(limits.values)}; no value is "
            f"significant at {level} (even ρ = 1 has two-sided p = 2/{k}! = {2 / math.factorial(k):.2f}). "
            "The check cannot tell whether the screen predicts the target: confirm more arms."
        )
    elif not limits.one_significant:
        text = (
            f"With K = {k} arms even perfect agreement (ρ = 1) would not be significant at {level} (two-sided "
            f"p = 2/{k}! = {2 / math.factorial(k):.3f} under unrelated rankings): {k} arms cannot show agreement "
            f"beyond chance. Observed ρ = {rho:+.2f} (p = {p:.2f}); the figures describe these {k} arms only."
        )
    else:
        text = (
            f"With K = {k} arms, |ρ| >= {limits.critical:.2f} is needed for significance at {level} (two-sided, "
            f"{limits.method}); observed ρ = {rho:+.2f} (p = {p:.2f})."
        )
    distinct = {stage: math.comb(2 * s - 1, s) for stage, s in seeds.items()}
    return text + (
        f" The bootstrap draws from {seeds['screen']} screen and {seeds['target']} target seeds "
        f"({distinct['screen']} and {distinct['target']} distinct resamples per stage): its interval is coarse "
        "and tends to be too narrow at so few seeds."
        if min(seeds.values()) < 10
        else ""
    )
