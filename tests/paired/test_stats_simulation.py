"""Statistical validity of the verdict path by simulation (DESIGN §7).

Score of arm a at seed s on benchmark b of the DataFlex-RL set (points):

    y[a, s, b] = mu_b + u[s] + v[a, s] + e[a, s, b] + effect_a

u[s] ~ N(0, 2^2): seed effect shared by every arm and benchmark (same data order); v[a, s] ~ N(0, 1):
the run's own effect, shared across its 12 benchmarks (one run's scores move together);
e ~ N(0, 3^2): benchmark noise. The domain-balanced score goes through `tune_dfrl.report.schema`, the
verdicts through `tune_dfrl.paired.stats.paired_verdicts` (Holm across the 8 arms; the t-interval path is
the one that decides). The paired sd of db is sqrt(2 (1 + 9 sum_b w_b^2)).

Paired differences are then normal, so the BCa check draws them directly: d ~ N(0, 1) (BCa is
equivariant under shift and scale).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from tune_dfrl.backends.benchmarks import aggregate, weights
from tune_dfrl.paired.stats import BCA_COVERAGE_95, paired_verdicts
from tune_dfrl.report.scores import dataflex_benchmarks

BENCH = dataflex_benchmarks()
ARMS = 8
SEED_SD, RUN_SD, CELL_SD = 2.0, 1.0, 3.0
PAIRED_SD = float(np.sqrt(2 * (RUN_SD**2 + CELL_SD**2 * np.sum(weights("db", BENCH) ** 2))))


def simulate_db(rng: np.random.Generator, sims: int, seeds: int, effects: np.ndarray) -> np.ndarray:
    """db scores [sims, 1 + ARMS, seeds] (row 0 the control) under the model of the module docstring."""
    shape = (sims, 1 + ARMS, seeds, len(BENCH.names))
    mu = np.linspace(20, 80, shape[-1])
    y = (
        mu
        + rng.normal(0, SEED_SD, (sims, 1, seeds, 1))
        + rng.normal(0, RUN_SD, shape[:3] + (1,))
        + rng.normal(0, CELL_SD, shape)
        + np.concatenate([[0.0], effects])[None, :, None, None]
    )
    return aggregate(y, "db", BENCH)


def verdict_runs(db: np.ndarray):
    """Per simulation: the paired verdicts of the 8 arms against row 0."""
    for sim in db:
        yield paired_verdicts(sim[0], {f"arm{a}": sim[a] for a in range(1, 1 + ARMS)})


def test_null_coverage_and_familywise_false_better():
    rng = np.random.default_rng(20260101)
    db = simulate_db(rng, sims=2500, seeds=6, effects=np.zeros(ARMS))
    covered, any_better, any_credible = [], [], []
    for verdicts in verdict_runs(db):
        covered += [v.t_low <= 0 <= v.t_high for v in verdicts.values()]
        any_better.append(any(v.verdict == "better" for v in verdicts.values()))
        any_credible.append(any(v.verdict in ("better", "worse") for v in verdicts.values()))
    coverage, familywise, two_sided = np.mean(covered), np.mean(any_better), np.mean(any_credible)
    print(
        f"null, 6 seeds: 95% paired t-interval covers 0 in {coverage:.2%} of {len(covered)} comparisons; "
        f"any false 'better' among {ARMS} arms (Holm) in {familywise:.2%} of {len(any_better)} searches "
        f"(any 'better' or 'worse': {two_sided:.2%})"
    )
    assert len(covered) >= 2000
    assert 0.93 <= coverage <= 0.97
    assert familywise <= 0.05
    assert two_sided <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / len(any_credible))  # Holm's family-wise bound, up to MC error


def test_power_at_one_and_a_half_paired_sd_with_twelve_seeds():
    rng = np.random.default_rng(20260102)
    effects = np.zeros(ARMS)
    effects[0] = 1.5 * PAIRED_SD
    db = simulate_db(rng, sims=2000, seeds=12, effects=effects)
    found, false_better = [], []
    for verdicts in verdict_runs(db):
        found.append(verdicts["arm1"].verdict == "better")
        false_better.append(any(v.verdict == "better" for name, v in verdicts.items() if name != "arm1"))
    power, familywise = np.mean(found), np.mean(false_better)
    print(
        f"true effect 1.5 paired sd ({effects[0]:.2f} points) at 12 seeds, {ARMS} arms with Holm: "
        f"'better' found in {power:.1%} of {len(found)} simulations; a null arm called better in {familywise:.2%}"
    )
    assert power > 0.8
    assert familywise <= 0.05


def test_bca_coverage_at_few_seeds_matches_the_reported_figures():
    """A nominal 95% BCa interval of mean(d) (scipy, 9,999 resamples as the report uses) under-covers at few seeds;
    the report quotes BCA_COVERAGE_95, measured here again within Monte Carlo error."""
    rng = np.random.default_rng(20260103)
    sims, chunk = 4000, 1000
    for seeds, reported in BCA_COVERAGE_95.items():
        covered = []
        for _ in range(sims // chunk):
            d = rng.normal(0.0, 1.0, (chunk, seeds))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ci = stats.bootstrap(
                    (d,), np.mean, axis=-1, vectorized=True, method="BCa", n_resamples=9999, rng=rng
                ).confidence_interval
            covered.append((ci.low <= 0) & (0 <= ci.high))
        coverage = np.concatenate(covered).mean()
        print(
            f"nominal 95% BCa at {seeds} seeds covers the true mean in {coverage:.1%} of {sims} simulations (reported {reported:.0%})"
        )
        assert coverage == pytest.approx(reported, abs=0.025)
    assert BCA_COVERAGE_95[3] < 0.8 < 0.9 < BCA_COVERAGE_95[12] < 0.95
