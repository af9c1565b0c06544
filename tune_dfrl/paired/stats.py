"""Paired-seed statistics of arms against a control (DESIGN §7).

For arm c and control b at seeds s = 1..S: d_s = score(c, s) - score(b, s), mean(d), sd(d) (ddof 1),
se = sd / sqrt(n) with n the seeds the arm shares with the control; m is the Holm family size
(every arm of the search, including arms stopped early or excluded from the comparison).

- Paired t-interval at level 1 - a: mean +- t_{1-a/2, n-1} * se; p = 2 * P(T_{n-1} > |mean| / se).
- Holm across the m arms of the family: sort p ascending, p_(1) <= ... <= p_(m); step k tests
  p_(k) < alpha / (m - k + 1) and the procedure stops at the first step r that fails.
  p_holm = min(1, max_{j <= k} (m - j + 1) p_(j)) (as statsmodels `multipletests(method="holm")`).
- Holm-adjusted interval (decides better / worse): the interval at level 1 - alpha_k with
  alpha_k = alpha / (m - k + 1) for the arms rejected before the stop (k < r) and alpha_k =
  alpha / (m - r + 1) for the rest. It excludes 0 exactly when p_holm < alpha: for k < r because
  p_(k) < alpha_k; for k >= r because p_(k) >= p_(r) >= alpha_r. With one arm it is the plain
  (1 - alpha) interval.
- Common-level lower bound (selects among the arms judged better): the lower end of the interval at
  the one level 1 - alpha / m shared by every arm, so an arm with weaker evidence never wins on a
  lower bound taken at a laxer level than its rival's.
- TOST equivalence within +-delta: the (1 - 2 alpha) interval lies inside (-delta, delta);
  tost_p = max(P(T > (mean + delta)/se), P(T < (mean - delta)/se)) < alpha is the same test.
- Verdict, in this order: better (adjusted interval above 0), worse (below 0), equivalent (TOST),
  inconclusive. An arm both better and within +-delta is `better`.
- No spread (sd <= ZERO_TOLERANCE * max(1, |mean|): the same difference at every seed, up to float
  rounding): the t-test is undefined, and the exact sign-flip test decides. Its smallest two-sided
  p-value at n seeds is 2^(1-n) (only the all-plus and all-minus patterns reach |mean|; 0.25 at
  3 seeds), one-sided 2^-n. So p = 2^(1-n) (1 when mean is 0 within the tolerance), tost_p = 2^-n
  when |mean| < delta (else 1), and the interval at level 1 - a, inverting that test, is the point
  {mean} when 2^(1-n) < a and unbounded (-inf, inf) otherwise.
- Optional (`bootstrap=True`, reported, never deciding): BCa interval of mean(d) over seeds
  (`scipy.stats.bootstrap`) and the exact sign-flip permutation p-value (all 2^n sign patterns
  while n <= 16, `scipy.stats.permutation_test`), Holm-adjusted as well. A nominal 95% BCa
  interval under-covers at few seeds: BCA_COVERAGE_95 (measured by tests/paired/test_stats_simulation.py).
- Power at the observed sd (80%): minimum detectable effect at n seeds and seeds needed to detect a
  true difference of delta, both by the two-sided paired t-test at alpha / m (Holm's first step, the
  level an arm with a real effect among null arms must pass); seeds needed to show equivalence within
  +-delta by TOST at alpha when the true difference is 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy import optimize, special, stats

VERDICTS = ("better", "worse", "equivalent", "inconclusive")
EXACT_PERMUTATION_MAX_SEEDS = 16
MAX_SEEDS_NEEDED = 2**30  # the seeds-needed search stops here (an effect that small is never resolved)
ZERO_TOLERANCE = 1e-9  # relative: a spread or difference below 1e-9 * max(1, |reference|) is float rounding
TARGET_POWER = 0.8
QUADRATURE = np.polynomial.legendre.leggauss(200)  # Gauss-Legendre nodes, weights on (-1, 1): power integrals
# Coverage of a nominal 95% BCa interval of the mean of n normal paired differences, by seeds:
# measured over 10,000 simulations each (9,999 resamples) and re-checked by tests/paired/test_stats_simulation.py.
BCA_COVERAGE_95 = {3: 0.72, 6: 0.86, 12: 0.91}


def negligible(values: np.ndarray | float, reference: np.ndarray | float = 1.0) -> np.ndarray:
    """|values| <= ZERO_TOLERANCE * max(1, |reference|): the one tolerance for 'zero up to rounding'."""
    return np.abs(values) <= ZERO_TOLERANCE * np.maximum(1.0, np.abs(reference))


def sign_flip_floor(n: np.ndarray | int) -> np.ndarray:
    """Smallest two-sided p-value the exact sign-flip test can reach with n paired seeds: 2^(1-n)."""
    return 2.0 ** (1.0 - np.asarray(n, dtype=float))


@dataclass(frozen=True)
class ArmVerdict:
    """Paired statistics of one arm against the control (see the module docstring)."""

    n: int  # paired seeds
    delta: float  # mean paired difference (points)
    sd: float  # paired standard deviation
    exact: bool  # no spread: p-values and intervals come from the exact sign-flip test
    ci_low: float  # Holm-adjusted interval: decides better / worse
    ci_high: float
    level: float  # confidence level of the adjusted interval, 1 - alpha_k
    common_low: float  # lower bound at the common level 1 - alpha / m: selects among better arms
    common_level: float
    p: float  # two-sided paired t p-value (exact sign-flip p when exact)
    p_holm: float
    t_low: float  # unadjusted (1 - alpha) interval
    t_high: float
    tost_p: float
    eq_low: float  # (1 - 2 alpha) interval of TOST
    eq_high: float
    verdict: str
    bca_low: float = math.nan
    bca_high: float = math.nan
    p_perm: float = math.nan
    p_perm_holm: float = math.nan


def t_interval(
    mean: np.ndarray, se: np.ndarray, n: np.ndarray, level: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """mean +- t_{(1+level)/2, n-1} * se, elementwise (the quantile by `special.stdtrit`, which `stats.t.ppf` calls
    after ~100 us of argument checks: the scheduler's rung decisions call this once each)."""
    half = special.stdtrit(np.asarray(n) - 1, (1.0 + np.asarray(level)) / 2.0) * se
    return mean - half, mean + half


def paired_interval(
    mean: np.ndarray, sd: np.ndarray, n: np.ndarray, level: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """Interval of the mean paired difference at `level`: the t-interval, or without spread the inverted
    exact sign-flip test ({mean} when 2^(1-n) < 1 - level, else unbounded); see the module docstring."""
    mean, sd, n = (np.asarray(x, dtype=float) for x in (mean, sd, n))
    low, high = t_interval(mean, sd / np.sqrt(n), n, level)
    exact = negligible(sd, mean)
    point = sign_flip_floor(n) < 1.0 - np.asarray(level)
    return (np.where(exact, np.where(point, mean, -np.inf), low), np.where(exact, np.where(point, mean, np.inf), high))


def holm(p: np.ndarray, alpha: float, family_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Holm step-down: (adjusted p-values, per-hypothesis alpha_k of the adjusted interval).

    `family_size` m >= len(p) counts hypotheses of the family that were never tested (arms the
    scheduler stopped early, arms with too few paired seeds): they enter as p = 1, i.e. never
    rejected, which only makes the correction stricter for the tested ones.

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


def paired_verdicts(
    control: np.ndarray,
    arms: dict[str, np.ndarray],
    delta: float = 1.0,
    alpha: float = 0.05,
    bootstrap: bool = False,
    rng: np.random.Generator | None = None,
    n_resamples: int = 9999,
    family_size: int | None = None,
) -> dict[str, ArmVerdict]:
    """Verdict of every arm against the control; `arms` is one Holm family.

    `family_size` (>= len(arms)) is the size of the whole family when some of its arms were not
    compared (stopped early by the scheduler, too few paired seeds): DESIGN §7's family is the search,
    not its survivors.

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
        raise ValueError(
            f"a paired comparison needs at least 2 seeds shared with the control; too few: {', '.join(short)}"
        )
    mean = np.nanmean(diffs, axis=1)
    sd = np.nanstd(diffs, axis=1, ddof=1)
    se = sd / np.sqrt(n)
    exact = negligible(sd, mean)
    floor = sign_flip_floor(n)
    family = max(len(names), family_size or 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_t = 2.0 * stats.t.sf(np.abs(mean) / se, n - 1)
        tost_t = np.maximum(stats.t.sf((mean + delta) / se, n - 1), stats.t.cdf((mean - delta) / se, n - 1))
    p = np.where(exact, np.where(negligible(mean), 1.0, floor), p_t)
    tost = np.where(exact, np.where(np.abs(mean) < delta, floor / 2.0, 1.0), tost_t)
    p_holm, alpha_k = holm(p, alpha, family)
    ci_low, ci_high = paired_interval(mean, sd, n, 1.0 - alpha_k)
    common_low, _ = paired_interval(mean, sd, n, 1.0 - alpha / family)
    t_low, t_high = paired_interval(mean, sd, n, 1.0 - alpha)
    eq_low, eq_high = paired_interval(mean, sd, n, 1.0 - 2.0 * alpha)
    verdict = np.select(
        [ci_low > 0, ci_high < 0, (eq_low > -delta) & (eq_high < delta)],
        ["better", "worse", "equivalent"],
        "inconclusive",
    )
    extra = _resampling(diffs, alpha, rng, n_resamples, family) if bootstrap else {}
    return {
        name: ArmVerdict(
            n=int(n[i]),
            delta=float(mean[i]),
            sd=float(sd[i]),
            exact=bool(exact[i]),
            ci_low=float(ci_low[i]),
            ci_high=float(ci_high[i]),
            level=float(1.0 - alpha_k[i]),
            common_low=float(common_low[i]),
            common_level=1.0 - alpha / family,
            p=float(p[i]),
            p_holm=float(p_holm[i]),
            t_low=float(t_low[i]),
            t_high=float(t_high[i]),
            tost_p=float(tost[i]),
            eq_low=float(eq_low[i]),
            eq_high=float(eq_high[i]),
            verdict=str(verdict[i]),
            **{key: float(values[i]) for key, values in extra.items()},
        )
        for i, name in enumerate(names)
    }


def _resampling(
    diffs: np.ndarray, alpha: float, rng: np.random.Generator | None, n_resamples: int, family_size: int
) -> dict[str, np.ndarray]:
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
            boot = stats.bootstrap(
                (d,),
                np.mean,
                axis=-1,
                vectorized=True,
                method="BCa",
                n_resamples=n_resamples,
                confidence_level=1.0 - alpha,
                rng=rng,
            )
        exact = d.shape[1] <= EXACT_PERMUTATION_MAX_SEEDS
        perm = stats.permutation_test(
            (d,),
            lambda x, axis: np.mean(x, axis=axis),
            permutation_type="samples",
            vectorized=True,
            axis=-1,
            n_resamples=np.inf if exact else n_resamples,
            rng=rng,
        )
        out["bca_low"][rows] = boot.confidence_interval.low
        out["bca_high"][rows] = boot.confidence_interval.high
        out["p_perm"][rows] = perm.pvalue
    out["p_perm_holm"] = holm(out["p_perm"], alpha, family_size)[0]
    return out


def _over_sd_draws(given: Callable[[np.ndarray], np.ndarray], n: int, upper: float = 1.0) -> float:
    """E[given(W); F(W) < upper] for W ~ chi2(n - 1) with cdf F: the integral of given(F^-1(q)) over q in
    (0, upper) by Gauss-Legendre quadrature (QUADRATURE; smooth and bounded in q at any df)."""
    nodes, node_weights = QUADRATURE
    q = (nodes + 1.0) * upper / 2.0
    return float(np.sum(node_weights * given(stats.chi2.ppf(q, n - 1))) * upper / 2.0)


def t_power(effect: float, n: int, alpha: float) -> float:
    """Power of the two-sided one-sample t-test at level alpha, true mean / sd = effect, n seeds.

    T = (Z + effect sqrt(n)) / sqrt(W / (n - 1)), Z ~ N(0, 1), W ~ chi2(n - 1) independent:
    P(|T| > c) = E_W[Phi(-c s - nc) + Phi(nc - c s)], s = sqrt(W / (n - 1)), nc = effect sqrt(n).
    (scipy's noncentral t returns NaN for some large noncentralities; this integral does not.)
    """
    crit, nc = stats.t.ppf(1.0 - alpha / 2.0, n - 1), effect * math.sqrt(n)

    def given(w: np.ndarray) -> np.ndarray:
        s = np.sqrt(w / (n - 1))
        return stats.norm.cdf(-crit * s - nc) + stats.norm.cdf(nc - crit * s)

    return _over_sd_draws(given, n)


def tost_power(margin: float, n: int, alpha: float) -> float:
    """Power of TOST (each one-sided test at alpha) within +-margin sd when the true difference is 0.

    In units of the true sd, mean = Z / sqrt(n) and the sample sd is s = sqrt(W / (n - 1)); TOST
    rejects when |mean| < margin - c s / sqrt(n), c = t_{1-alpha, n-1}, i.e. |Z| < a - c s with
    a = margin sqrt(n): power = E_W[max(0, 2 Phi(a - c s) - 1)], nonzero while W < (n - 1) (a / c)^2.
    """
    crit, a = stats.t.ppf(1.0 - alpha, n - 1), margin * math.sqrt(n)

    def given(w: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, 2.0 * stats.norm.cdf(a - crit * np.sqrt(w / (n - 1))) - 1.0)

    return _over_sd_draws(given, n, stats.chi2.cdf((n - 1) * (a / crit) ** 2, n - 1))


def _fewest_seeds(reaches: Callable[[int], bool]) -> int:
    """Smallest n >= 2 with reaches(n) (monotone in n), or MAX_SEEDS_NEEDED: doubling, then bisection."""
    low, high = 1, 2
    while not reaches(high) and high < MAX_SEEDS_NEEDED:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return high


def power_figures(v: ArmVerdict, delta: float, alpha: float = 0.05, family: int = 1) -> dict[str, float | int]:
    """At the arm's observed paired sd and 80% power (module docstring):

    - `mde`: the smallest true difference the two-sided t-test at alpha / family detects at v.n seeds;
    - `seeds_to_detect`: seeds to detect a true difference of delta by that test;
    - `seeds_for_equivalence`: seeds for TOST at alpha to show equivalence within +-delta when the
      true difference is 0.

    Without spread (v.exact) the exact sign-flip test's floor decides: detection needs 2^(1-n) <
    alpha / family (mde 0 once it holds, infinite before), equivalence 2^-n < alpha.
    """
    level = alpha / family
    if v.exact:
        detects = bool(sign_flip_floor(v.n) < level)
        return {
            "mde": 0.0 if detects else math.inf,
            "seeds_to_detect": _fewest_seeds(lambda seeds: bool(sign_flip_floor(seeds) < level)),
            "seeds_for_equivalence": _fewest_seeds(lambda seeds: bool(sign_flip_floor(seeds) / 2 < alpha)),
        }
    high = 1.0
    while t_power(high, v.n, level) < TARGET_POWER:
        high *= 2.0
    effect = optimize.brentq(lambda e: t_power(e, v.n, level) - TARGET_POWER, 0.0, high, xtol=1e-10)
    return {
        "mde": effect * v.sd,
        "seeds_to_detect": _fewest_seeds(lambda seeds: t_power(delta / v.sd, seeds, level) >= TARGET_POWER),
        "seeds_for_equivalence": _fewest_seeds(lambda seeds: tost_power(delta / v.sd, seeds, alpha) >= TARGET_POWER),
    }


def recommend(
    verdicts: dict[str, ArmVerdict],
    control_name: str,
    margin: float = 1.0,
    seeds_to_detect: int | None = None,
    seeds_for_equivalence: int | None = None,
) -> dict:
    """DESIGN §7 selection: among arms judged better, the highest lower bound at the common level
    1 - alpha / m (ties: the higher mean); else the control.

    Never the point-best: `point_best` lists the arms (the control at Δ = 0 included) whose mean Δ
    is highest, every one of them when several tie. With no winner, the seeds figures (at the
    observed sd, for the arms still inconclusive) are passed through and named in the reason.
    """
    candidates = {control_name: 0.0, **{name: v.delta for name, v in verdicts.items()}}
    top = max(candidates.values())
    point_best = [name for name, d in candidates.items() if negligible(top - d, top)]
    better = [name for name, v in verdicts.items() if v.verdict == "better"]
    if better:
        best = max(better, key=lambda name: (verdicts[name].common_low, verdicts[name].delta))
        v = verdicts[best]
        return {
            "recommended": best,
            "is_control": False,
            "delta": v.delta,
            "ci_low": v.ci_low,
            "common_low": v.common_low,
            "common_level": v.common_level,
            "point_best": point_best,
            "seeds_to_detect": None,
            "seeds_for_equivalence": None,
            "reason": f"{best!r} is better than the control {control_name!r}: its Holm-adjusted {v.level:.2%} "
            f"interval lies above 0, and it has the highest lower bound at the common level {v.common_level:.2%} "
            f"({v.common_low:+.2f} points; mean Δ {v.delta:+.2f})",
        }
    open_arms = [v for v in verdicts.values() if v.verdict == "inconclusive"]
    one = len(open_arms) == 1
    per_arm = "" if one else " per arm"
    need = []
    if seeds_for_equivalence:
        need.append(
            f"about {seeds_for_equivalence} paired seeds{per_arm} would show equivalence within ±{margin:g} "
            f"with 80% power (TOST, if the true Δ were 0)"
        )
    if seeds_to_detect:
        first_step = 1.0 - next(iter(verdicts.values())).common_level  # alpha / m
        need.append(
            f"about {seeds_to_detect} would detect a true Δ of +{margin:g} with 80% power (paired t-test at "
            f"α/m = {first_step:.3g})"
        )
    seeds = sorted({v.n for v in open_arms}) or [0]
    at = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    whose = (
        f"for the 1 arm still inconclusive, taking its paired SD observed at {at} seeds as known (an estimate)"
        if one
        else f"for the {len(open_arms)} arms still inconclusive, taking their paired SDs observed at {at} seeds as "
        "known (estimates)"
        if open_arms
        else "for the arms still inconclusive, at their observed paired SDs (estimates)"
    )
    need_text = f"; {whose}, {', and '.join(need)}" if need else ""
    return {
        "recommended": control_name,
        "is_control": True,
        "delta": 0.0,
        "ci_low": None,
        "common_low": None,
        "common_level": None,
        "point_best": point_best,
        "seeds_to_detect": seeds_to_detect,
        "seeds_for_equivalence": seeds_for_equivalence,
        "reason": f"no arm is better than the control {control_name!r} (no Holm-adjusted interval lies above 0); "
        f"keep the control{need_text}",
    }


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
    top = means.max(axis=0)
    best = negligible(top - means, top)
    return best / best.sum(axis=0)


def winner_flip_rate(
    scores: np.ndarray, k: int, rng: np.random.Generator, max_subsets: int = 10000
) -> tuple[float, int]:
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
