"""Sequential paired seeds: which arms get the next batch of seeds, and when a verdict is settled.

Pure (numpy/scipy only). Seeds arrive in batches: look k happens when the open arms have n_k
seeds, n_1 = `start`, n_{k+1} = n_k + `batch`, the last look at `max` seeds. At a look, an arm's
paired deltas d_s = score(arm, s) - score(control, s) over its first n_k seeds give

    T_k = mean(d) / (sd(d) / sqrt(n_k))        (Student t with n_k - 1 degrees of freedom)

Error control (group-sequential, Lan-DeMets alpha spending). An arm's two-sided test of Δ = 0 at
level a spends a over the planned information fractions t_k = n_k / max with the
O'Brien-Fleming-type function a(t) = 2 - 2 Φ(z_{1-a/2} / sqrt(t)). Its z boundaries c_k solve

    P(|Z_j| < c_j for j < k, |Z_k| >= c_k) = a(t_k) - a(t_{k-1}),   Corr(Z_j, Z_k) = sqrt(t_j / t_k),

computed by numerical integration of the canonical joint distribution (`boundaries`). With the
variance estimated, the arm is settled at look k when its two-sided t p-value is below the nominal
level p_k = 2 (1 - Φ(c_k)) — equivalently its (1 - p_k) paired t interval excludes 0 — the usual
conversion of z boundaries to t tests (Jennison & Turnbull §3.7).

Multiplicity: the family is every searched arm (DESIGN §7), K of them. Holm-type recycling for
group-sequential tests (the sequentially rejective procedure of Maurer & Bretz, 2013): unsettled
arms are tested at a = alpha / (K - r), r = arms settled so far, at every look up to the current one
(their boundaries recomputed at the larger level), until no further arm settles. It controls the
familywise error rate under any dependence between the arms.

Futility is non-binding (it never makes a rejection easier, so the error rates above hold): an
open arm stops receiving seeds when it is out of the running for the recommendation, i.e. its
one-sided `futility_confidence` upper t bound lies below 0 (it is unlikely ever to be shown
better) or below the highest common-level lower bound of an arm already settled better.

Recommendation: among arms settled better, the highest lower bound of the repeated confidence
interval at one common level (the Bonferroni level alpha / K, each arm at its last look); else
the control.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

from tune_dfrl.config.constraints import check_declared
from tune_dfrl.config.settings import ReportSettings, SequentialSettings
from tune_dfrl.errors import SettingsError
from tune_dfrl.paired.stats import negligible, paired_interval, sign_flip_floor

NODES = 801  # Simpson nodes over each continuation region (odd)


@dataclass(frozen=True)
class SequentialRule:
    """Looks at start, start + batch, ... seeds up to max; alpha is the whole search's familywise level. The
    defaults and allowed ranges are the sequential settings' (`tune_dfrl.config.settings.SequentialSettings`)."""

    start: int = SequentialSettings.start
    batch: int = SequentialSettings.batch
    max: int = SequentialSettings.max
    alpha: float = ReportSettings.alpha
    futility_confidence: float = SequentialSettings.futility_confidence
    futility_margin: float = SequentialSettings.futility_margin  # points: an upper bound below it -> futile

    def __post_init__(self) -> None:
        check_declared(self, "sequential.", SequentialSettings)
        check_declared(self, "report.", ReportSettings)  # alpha
        if self.max < self.start:
            raise SettingsError(f"sequential.max={self.max!r}: allowed: an integer >= sequential.start={self.start}")

    @classmethod
    def of(cls, settings: SequentialSettings, alpha: float) -> SequentialRule:
        """The rule of the sequential settings, at the report's familywise level `alpha`."""
        return cls(
            settings.start, settings.batch, settings.max, alpha, settings.futility_confidence, settings.futility_margin
        )

    def looks(self) -> tuple[int, ...]:
        """Seed counts at the looks: start, start + batch, ..., and max (always the last)."""
        counts = list(range(self.start, self.max, self.batch))
        return tuple(counts + [self.max])


def spent(fraction: float, alpha: float) -> float:
    """O'Brien-Fleming-type spending: a(t) = 2 - 2 Φ(z_{1-a/2} / sqrt(t)), a(1) = a."""
    return float(2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1.0 - alpha / 2.0) / math.sqrt(fraction)))


def _first_crossing(c: float, target: float, mass: np.ndarray, nodes: np.ndarray, r: float, s: float) -> float:
    """P(first crossing of +-c at this look) - target; `mass` empty at the first look (then Z ~ N(0, 1))."""
    if not mass.size:
        return float(2.0 * stats.norm.sf(c)) - target
    return float(mass @ (stats.norm.cdf((-c - r * nodes) / s) + stats.norm.sf((c - r * nodes) / s))) - target


@lru_cache(maxsize=4096)
def boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Two-sided z boundaries c_k spending `alpha` at the information fractions (increasing, last 1).

    Given Z_{k-1} = u, Z_k ~ N(r u, s^2) with r = sqrt(t_{k-1} / t_k), s^2 = 1 - r^2. With m_{k-1}
    the sub-density of Z_{k-1} on the continuation region |u| < c_{k-1} (Simpson nodes and weights),

        P(cross first at k) = ∫ m_{k-1}(u) [Φ((-c - r u) / s) + 1 - Φ((c - r u) / s)] du,
        m_k(z) = ∫ m_{k-1}(u) φ((z - r u) / s) / s du   on |z| < c_k,

    and c_k is the root of P(cross first at k) = a(t_k) - a(t_{k-1}).
    """
    from scipy.optimize import brentq

    if not fractions or fractions[-1] != 1.0 or any(b <= a for a, b in zip((0.0,) + fractions, fractions)):
        raise ValueError(f"information fractions must increase from above 0 to 1; got {fractions}")
    out: list[float] = []
    nodes = mass = np.empty(0)
    previous_fraction, previous_spent = 0.0, 0.0
    for fraction in fractions:
        target = spent(fraction, alpha) - previous_spent
        r = math.sqrt(previous_fraction / fraction)
        s = math.sqrt(1.0 - r * r)
        c = float(brentq(_first_crossing, 1e-6, 40.0, args=(target, mass, nodes, r, s), xtol=1e-12))
        grid = np.linspace(-c, c, NODES)
        density = (
            stats.norm.pdf(grid) if not out else (stats.norm.pdf((grid[:, None] - r * nodes[None, :]) / s) / s) @ mass
        )
        out.append(c)
        nodes, mass = grid, density * _simpson_weights(grid)
        previous_fraction, previous_spent = fraction, spent(fraction, alpha)
    return tuple(out)


def _simpson_weights(grid: np.ndarray) -> np.ndarray:
    """Composite Simpson weights on an evenly spaced grid with an odd number of points."""
    weights = np.ones(grid.size)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * (grid[1] - grid[0]) / 3.0


def nominal_levels(rule: SequentialRule, alpha: float) -> tuple[float, ...]:
    """Two-sided nominal p-value thresholds p_k = 2 (1 - Φ(c_k)) at the rule's looks, for per-arm level `alpha`."""
    fractions = tuple(n / rule.max for n in rule.looks())
    return tuple(float(2.0 * stats.norm.sf(c)) for c in boundaries(fractions, alpha))


@dataclass(frozen=True)
class ArmState:
    """One arm after a look: `status` is better | worse | futile | open; the interval is at the common level."""

    status: str
    seeds: int  # paired seeds the verdict uses
    look: int  # 1-based look at which the status was reached (or the current look for open arms)
    mean: float
    low: float
    high: float


def t_stats(deltas: np.ndarray) -> tuple[float, float, float]:
    """(mean, sd, two-sided p of mean = 0) of paired deltas.

    A difference without spread (`stats.negligible`: the same shift on every seed) has sd 0 and the
    p-value of the exact sign-flip test, 2^(1-n) with n seeds: as strong as n signs allow.
    """
    n = deltas.size
    mean, sd = float(deltas.mean()), float(deltas.std(ddof=1))
    if negligible(sd, mean):
        return mean, 0.0, 1.0 if negligible(mean) else float(sign_flip_floor(n))
    return mean, sd, float(2.0 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def bounds(mean: float, sd: float, n: int, two_sided_p: float) -> tuple[float, float]:
    """The (1 - p) paired interval of `stats.paired_interval` (t, or the inverted sign-flip test without spread)."""
    low, high = paired_interval(mean, sd, n, 1.0 - two_sided_p)
    return float(low), float(high)


def look(
    deltas: Mapping[str, Sequence[float]],
    previous: Mapping[str, ArmState],
    rule: SequentialRule,
    family_size: int,
    current: int,
    stopped: Sequence[str] = (),
) -> dict[str, ArmState]:
    """Pure. The states of every arm after look `current` (1-based) of `rule.looks()`.

    `deltas[arm]` are the arm's paired deltas in seed order (the first n_j are its deltas at look j);
    `previous` the states after the last look (settled and futile arms keep theirs); `stopped` arms
    (stopped by the rung scheduler in the first batch) are out of the running and get no verdict
    here. `family_size` is K, the number of searched arms.
    """
    counts = rule.looks()
    if not 1 <= current <= len(counts):
        raise ValueError(f"look {current} is not one of the rule's {len(counts)} looks {counts}")
    if family_size < len(deltas):
        raise ValueError(f"family_size={family_size} is smaller than the {len(deltas)} arms given")
    states = {arm: state for arm, state in previous.items() if state.status in ("better", "worse", "futile")}
    common_p = nominal_levels(rule, rule.alpha / family_size)
    candidates = [arm for arm in deltas if arm not in states and arm not in stopped]
    for arm in candidates:
        if len(deltas[arm]) < counts[current - 1]:
            raise ValueError(
                f"arm {arm!r} has {len(deltas[arm])} paired seeds at look {current}; the look needs {counts[current - 1]}"
            )
    unsettled = list(candidates)
    while unsettled:  # Holm-type recycling: settle at level alpha / (K - r) over every look so far
        settled = sum(state.status in ("better", "worse") for state in states.values())
        levels = nominal_levels(rule, rule.alpha / (family_size - settled))
        newly = {}
        for arm in unsettled:
            for j in range(1, current + 1):
                values = np.asarray(deltas[arm][: counts[j - 1]], dtype=np.float64)
                mean, sd, p = t_stats(values)
                if p < levels[j - 1]:
                    low, high = bounds(mean, sd, values.size, common_p[j - 1])
                    newly[arm] = ArmState("better" if mean > 0 else "worse", values.size, j, mean, low, high)
                    break
        if not newly:
            break
        states.update(newly)
        unsettled = [arm for arm in unsettled if arm not in newly]
    best_low = max((s.low for s in states.values() if s.status == "better"), default=-math.inf)
    for arm in unsettled:
        values = np.asarray(deltas[arm][: counts[current - 1]], dtype=np.float64)
        mean, sd, _ = t_stats(values)
        low, high = bounds(mean, sd, values.size, common_p[current - 1])
        upper = mean + float(stats.t.ppf(rule.futility_confidence, values.size - 1)) * sd / math.sqrt(values.size)
        futile = current < len(counts) and (upper < rule.futility_margin or upper < best_low)
        states[arm] = ArmState("futile" if futile else "open", values.size, current, mean, low, high)
    return states


def is_settled(states: Mapping[str, ArmState]) -> bool:
    """The recommendation can no longer change: no arm is open."""
    return all(state.status != "open" for state in states.values())


def recommendation(states: Mapping[str, ArmState], control: str) -> str:
    """The arm settled better with the highest common-level lower bound (ties: the smaller name); else the control."""
    better = [(-state.low, arm) for arm, state in states.items() if state.status == "better"]
    return min(better)[1] if better else control
