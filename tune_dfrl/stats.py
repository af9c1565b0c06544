"""Paired-seed statistics of arms against a control (DESIGN §7).

For arm c and control b at seeds s = 1..S: d_s = score(c, s) - score(b, s), mean(d), sd(d) (ddof 1),
se = sd / sqrt(n) with n the seeds the arm shares with the control.

- Paired t-interval at level 1 - a: mean +- t_{1-a/2, n-1} * se; p = 2 * P(T_{n-1} > |mean| / se).
- Holm across the m arms of the family: sort p ascending, p_(1) <= ... <= p_(m); step k tests
  p_(k) < alpha / (m - k + 1) and the procedure stops at the first step r that fails.
  p_holm = min(1, max_{j <= k} (m - j + 1) p_(j)) (as statsmodels `multipletests(method="holm")`).
- Holm-adjusted interval (decides better / worse): the t-interval at level 1 - alpha_k with
  alpha_k = alpha / (m - k + 1) for the arms rejected before the stop (k < r) and alpha_k =
  alpha / (m - r + 1) for the rest. It excludes 0 exactly when p_holm < alpha: for k < r because
  p_(k) < alpha_k; for k >= r because p_(k) >= p_(r) >= alpha_r. With one arm it is the plain
  (1 - alpha) interval.
- TOST equivalence within +-delta: the (1 - 2 alpha) t-interval lies inside (-delta, delta);
  tost_p = max(P(T > (mean + delta)/se), P(T < (mean - delta)/se)) < alpha is the same test.
- Verdict, in this order: better (adjusted interval above 0), worse (below 0), equivalent (TOST),
  inconclusive. An arm both better and within +-delta is `better`.
- Optional (`bootstrap=True`, reported, never deciding): BCa interval of mean(d) over seeds
  (`scipy.stats.bootstrap`) and the exact sign-flip permutation p-value (all 2^n sign patterns
  while n <= 16, `scipy.stats.permutation_test`), Holm-adjusted as well.
- Power (statsmodels `TTestPower`, one-sample t on d): minimum detectable effect at n seeds and the
  observed sd, and seeds needed to detect a true difference of delta, both at two-sided alpha and 80%.

A zero paired sd (identical differences at every seed) gives a zero-width interval at the mean,
p = 0 when the mean is non-zero and 1 otherwise.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import stats
from statsmodels.stats.power import TTestPower

VERDICTS = ("better", "worse", "equivalent", "inconclusive")
EXACT_PERMUTATION_MAX_SEEDS = 16
MAX_SEEDS_NEEDED = 2**30  # the seeds-needed search stops here (an effect that small is never resolved)


@dataclass(frozen=True)
class ArmVerdict:
    """Paired statistics of one arm against the control (see the module docstring)."""

    n: int  # paired seeds
    delta: float  # mean paired difference (points)
    sd: float  # paired standard deviation
    ci_low: float  # Holm-adjusted t-interval: decides better / worse
    ci_high: float
    level: float  # confidence level of the adjusted interval, 1 - alpha_k
    p: float  # two-sided paired t p-value
    p_holm: float
    t_low: float  # unadjusted (1 - alpha) t-interval
    t_high: float
    tost_p: float
    eq_low: float  # (1 - 2 alpha) t-interval of TOST
    eq_high: float
    verdict: str
    bca_low: float = math.nan
    bca_high: float = math.nan
    p_perm: float = math.nan
    p_perm_holm: float = math.nan


def t_interval(mean: np.ndarray, se: np.ndarray, n: np.ndarray, level: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """mean +- t_{(1+level)/2, n-1} * se, elementwise."""
    half = stats.t.ppf((1.0 + np.asarray(level)) / 2.0, n - 1) * se
    return mean - half, mean + half


def t_pvalue(mean: np.ndarray, se: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Two-sided one-sample t p-value of mean = 0 (0 or 1 when se = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2.0 * stats.t.sf(np.abs(mean) / se, n - 1)
    return np.where(se > 0, p, np.where(mean != 0, 0.0, 1.0))


def holm(p: np.ndarray, alpha: float, family_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Holm step-down: (adjusted p-values, per-hypothesis alpha_k of the adjusted interval).

    `family_size` m >= len(p) counts hypotheses of the family that were never tested (arms the
    scheduler stopped early): they enter as p = 1, i.e. never rejected, which only makes the
    correction stricter for the tested ones.

    p_holm of the k-th smallest = min(1, max_{j <= k} (m - j + 1) p_(j)): the values of statsmodels
    `multipletests(p, method="holm")` (the tests check it). Computed here because that function
    runs `gc.collect()` on every call (~50 ms in a loaded process), too slow inside simulation loops.
    alpha_k as in the module docstring; ties keep input order.
    """
    tested = len(p)
    if family_size is not None and family_size > tested:
        p = np.concatenate([p, np.ones(family_size - tested)])
    m = len(p)
    order = np.argsort(p, kind="stable")
    factor = m - np.arange(m)
    step_alpha = alpha / factor
    passed = p[order] < step_alpha
    stop = m if passed.all() else int(np.argmin(passed))
    p_holm, alpha_k = np.empty(m), np.empty(m)
    p_holm[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * factor))
    alpha_k[order] = np.where(np.arange(m) < stop, step_alpha, step_alpha[min(stop, m - 1)])
    return p_holm[:tested], alpha_k[:tested]


def paired_verdicts(control: np.ndarray, arms: dict[str, np.ndarray], delta: float = 1.0, alpha: float = 0.05,
                    bootstrap: bool = False, rng: np.random.Generator | None = None,
                    n_resamples: int = 9999, family_size: int | None = None) -> dict[str, ArmVerdict]:
    """Verdict of every arm against the control; `arms` is one Holm family.

    `family_size` (>= len(arms)) is the size of the whole family when some of its arms were not
    compared (stopped early by the scheduler): DESIGN §7's family is the search, not its survivors.

    `control` [S] holds the control's score at each seed; each arm [S] its score at the same seeds,
    NaN where the arm lacks that seed (it is then compared on the seeds it has, at least 2).
    `bootstrap=True` adds the BCa interval and the permutation p-values (needs `rng`).
    """
    if not arms:
        raise ValueError("paired_verdicts needs at least one arm besides the control")
    if not 0.0 < alpha < 0.5 or not delta > 0.0:
        raise ValueError(f"need 0 < alpha < 0.5 and delta > 0; got alpha={alpha}, delta={delta}")
    control = np.asarray(control, dtype=float)
    if control.ndim != 1 or np.isnan(control).any():
        raise ValueError("control must be a 1-d array with a score at every seed")
    names = list(arms)
    scores = np.stack([np.asarray(arms[name], dtype=float) for name in names])
    if scores.shape[1] != control.shape[0]:
        raise ValueError(f"arms must hold one score per control seed ({control.shape[0]}); got shape {scores.shape}")
    diffs = scores - control
    n = (~np.isnan(diffs)).sum(axis=1)
    if (n < 2).any():
        short = [f"{name} ({k} seed{'s' if k != 1 else ''})" for name, k in zip(names, n) if k < 2]
        raise ValueError(f"a paired comparison needs at least 2 seeds shared with the control; too few: {', '.join(short)}")
    mean = np.nanmean(diffs, axis=1)
    sd = np.nanstd(diffs, axis=1, ddof=1)
    se = sd / np.sqrt(n)
    p = t_pvalue(mean, se, n)
    p_holm, alpha_k = holm(p, alpha, family_size)
    ci_low, ci_high = t_interval(mean, se, n, 1.0 - alpha_k)
    t_low, t_high = t_interval(mean, se, n, 1.0 - alpha)
    eq_low, eq_high = t_interval(mean, se, n, 1.0 - 2.0 * alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        tost = np.maximum(stats.t.sf((mean + delta) / se, n - 1), stats.t.cdf((mean - delta) / se, n - 1))
    tost = np.where(se > 0, tost, np.where(np.abs(mean) < delta, 0.0, 1.0))
    verdict = np.select([ci_low > 0, ci_high < 0, (eq_low > -delta) & (eq_high < delta)],
                        ["better", "worse", "equivalent"], "inconclusive")
    extra = _resampling(diffs, alpha, rng, n_resamples, family_size) if bootstrap else {}
    return {
        name: ArmVerdict(n=int(n[i]), delta=float(mean[i]), sd=float(sd[i]), ci_low=float(ci_low[i]),
                         ci_high=float(ci_high[i]), level=float(1.0 - alpha_k[i]), p=float(p[i]),
                         p_holm=float(p_holm[i]), t_low=float(t_low[i]), t_high=float(t_high[i]),
                         tost_p=float(tost[i]), eq_low=float(eq_low[i]), eq_high=float(eq_high[i]),
                         verdict=str(verdict[i]), **{key: float(values[i]) for key, values in extra.items()})
        for i, name in enumerate(names)
    }


def _resampling(diffs: np.ndarray, alpha: float, rng: np.random.Generator | None, n_resamples: int,
               family_size: int | None = None) -> dict[str, np.ndarray]:
    """BCa interval and sign-flip permutation p per arm; arms sharing a seed pattern are batched."""
    if rng is None:
        raise ValueError("bootstrap=True needs an explicit numpy Generator (rng)")
    out = {key: np.full(len(diffs), np.nan) for key in ("bca_low", "bca_high", "p_perm")}
    patterns, group = np.unique(~np.isnan(diffs), axis=0, return_inverse=True)
    for g, pattern in enumerate(patterns):
        rows = np.flatnonzero(group == g)
        d = diffs[np.ix_(rows, pattern)]
        with warnings.catch_warnings():  # degenerate data (all d equal) gives NaN, reported as such
            warnings.simplefilter("ignore")
            boot = stats.bootstrap((d,), np.mean, axis=-1, vectorized=True, method="BCa", n_resamples=n_resamples,
                                   confidence_level=1.0 - alpha, rng=rng)
        exact = d.shape[1] <= EXACT_PERMUTATION_MAX_SEEDS
        perm = stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                      vectorized=True, axis=-1, n_resamples=np.inf if exact else n_resamples, rng=rng)
        out["bca_low"][rows] = boot.confidence_interval.low
        out["bca_high"][rows] = boot.confidence_interval.high
        out["p_perm"][rows] = perm.pvalue
    out["p_perm_holm"] = holm(out["p_perm"], alpha, family_size)[0]
    return out


def power_figures(sd: float, n: int, delta: float, alpha: float = 0.05, power: float = 0.8) -> tuple[float, int]:
    """(minimum detectable effect at n seeds, seeds needed to detect a true difference of delta).

    Two-sided one-sample t-test on the paired differences (statsmodels TTestPower): the MDE is the
    standardised effect reaching `power` at n seeds times sd; seeds needed is the smallest n >= 2
    whose power at effect delta / sd reaches `power` (integer bisection; power grows with n), or
    MAX_SEEDS_NEEDED when even that many would not.
    """
    if sd < 1e-9:  # identical differences at every seed (up to rounding): any effect is detected at 2 seeds
        return 0.0, 2
    analysis = TTestPower()
    effect = analysis.solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")

    def reaches(seeds: int) -> bool:
        return analysis.power(delta / sd, seeds, alpha, alternative="two-sided") >= power

    low, high = 1, 2
    while not reaches(high) and high < MAX_SEEDS_NEEDED:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return float(np.asarray(effect).item()) * sd, high


def recommend(verdicts: dict[str, ArmVerdict], control_name: str, seeds_needed: int | None = None) -> dict:
    """DESIGN §7 selection: among arms judged better, the highest adjusted lower bound; else the control.

    Never the point-best: an arm with the highest mean but no credible win is reported as
    `point_best` only. With no winner, `seeds_needed` (seeds to resolve the margin) is passed through.
    """
    point_best = max(verdicts, key=lambda name: verdicts[name].delta) if verdicts else None
    better = [name for name, v in verdicts.items() if v.verdict == "better"]
    if better:
        best = max(better, key=lambda name: (verdicts[name].ci_low, verdicts[name].delta))
        v = verdicts[best]
        return {"recommended": best, "is_control": False, "delta": v.delta, "ci_low": v.ci_low, "point_best": point_best,
                "seeds_needed": None,
                "reason": f"{best!r} is credibly better than {control_name!r} with the highest Holm-adjusted lower "
                          f"bound ({v.ci_low:+.2f} points; mean {v.delta:+.2f})"}
    need = f"; about {seeds_needed} paired seeds per arm would resolve the equivalence margin for every arm (80% power)" if seeds_needed else ""
    return {"recommended": control_name, "is_control": True, "delta": 0.0, "ci_low": None, "point_best": point_best,
            "seeds_needed": seeds_needed,
            "reason": f"no arm is credibly better than {control_name!r}; keep the control{need}"}


def prob_best(scores: np.ndarray, rng: np.random.Generator, n_resamples: int = 10000) -> np.ndarray:
    """P(each arm has the highest mean) under one joint bootstrap of seeds.

    `scores` [A, S] (every arm at the same S seeds). Each resample draws S seeds with replacement
    (multinomial counts c [S]) and applies them to all arms at once: mean_a = scores[a] @ c / S.
    Ties share the resample equally.
    """
    arms, seeds = scores.shape
    counts = rng.multinomial(seeds, np.full(seeds, 1.0 / seeds), size=n_resamples)  # [B, S]
    return _share_best(scores @ counts.T / seeds).mean(axis=1)


def _share_best(means: np.ndarray) -> np.ndarray:
    """[A, B] means -> [A, B] share of each column's win (1 / number of tied maxima)."""
    best = means >= means.max(axis=0) - 1e-9 * np.maximum(1.0, np.abs(means).max(axis=0))
    return best / best.sum(axis=0)


def winner_flip_rate(scores: np.ndarray, k: int, rng: np.random.Generator, max_subsets: int = 10000) -> tuple[float, int]:
    """(share of seed subsets of size k whose point-best arm is not the all-seed point-best, subsets used).

    All C(S, k) subsets when there are at most `max_subsets`, else that many random subsets.
    Ties within a subset share; the all-seed winner is the first arm with the highest mean.
    """
    arms, seeds = scores.shape
    if not 1 <= k < seeds:
        raise ValueError(f"winner-flip subsets need 1 <= k < seeds; got k={k} with {seeds} seeds")
    if math.comb(seeds, k) <= max_subsets:
        chosen = np.array(list(combinations(range(seeds), k)))
    else:
        chosen = np.argsort(rng.random((max_subsets, seeds)), axis=1)[:, :k]
    membership = np.zeros((len(chosen), seeds))
    np.put_along_axis(membership, chosen, 1.0, axis=1)
    winner = int(np.argmax(scores.mean(axis=1)))
    share = _share_best(scores @ membership.T / k)[winner]
    return float(1.0 - share.mean()), len(chosen)


def rank_agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Spearman rho and Kendall tau-b between two score vectors over the same arms (NaN if constant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {"spearman": float(stats.spearmanr(a, b).statistic), "kendall": float(stats.kendalltau(a, b).statistic)}
