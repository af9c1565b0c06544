"""The transfer check on the released DataFlex-RL run table (the issue's negative 0.5B -> 7B agreement, pinned), the
command, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_module
from repo_files import DATAFLEX_CSV
from scipy import stats

from tune_dfrl.config.settings import register_settings
from tune_dfrl.paired.transfer import DOES_NOT_TRANSFER
from tune_dfrl.report.cli import report_from_config
from tune_dfrl.report.transfer import transfer_report

MAIN_05B = {"campaign": "main", "model": "Qwen2.5-0.5B-Instruct"}
MAIN_7B = {"campaign": "main", "model": "Qwen2.5-7B-Instruct"}
SCALE_15B = {"campaign": "scale_curve", "model": "Qwen2.5-1.5B-Instruct"}
SCALE_3B = {"campaign": "scale_curve", "model": "Qwen2.5-3B-Instruct"}
DOMAINS = {  # the study's db: the mean of the three domain means (data/dataflex_rl/README.md), written out here
    "math": ["math500", "aime24", "olympiadbench", "minerva_math", "gsm8k"],
    "logic": ["kk_hard", "bbh_logical_deduction", "bbh_tracking", "zebra_logic_mc"],
    "science": ["gpqa_diamond", "mmlu_pro_chemistry", "mmlu_pro_physics"],
}
# The issue's figures: mean paired db Δ vs baseline over seeds 1-3 at 0.5B and at 7B.
ISSUE = {"difffilter": (-0.87, 0.33), "gfpo": (-0.66, 1.11), "ar": (-0.24, -2.20)}


def db_deltas(filters: dict[str, str]) -> pd.Series:
    """Mean paired db Δ per method, by pandas alone."""
    runs = pd.read_csv(DATAFLEX_CSV)
    for column, value in filters.items():
        runs = runs[runs[column] == value]
    runs = runs.assign(db=np.mean([runs[b].mean(axis=1) for b in DOMAINS.values()], axis=0))
    db = runs.pivot(index="method", columns="seed", values="db")
    return (db - db.loc["baseline"]).mean(axis=1)


def test_dataflex_main_05b_to_7b_reproduces_the_negative_agreement(tmp_path):
    check, paths = transfer_report(DATAFLEX_CSV, MAIN_05B, MAIN_7B, tmp_path, control="baseline")
    screen, target = db_deltas(MAIN_05B), db_deltas(MAIN_7B)
    for arm, (at_05b, at_7b) in ISSUE.items():
        assert (check.screen[arm].delta, check.target[arm].delta) == pytest.approx((at_05b, at_7b), abs=0.005)
    for arm in check.arms:
        assert check.screen[arm].delta == pytest.approx(screen[arm], abs=1e-9)
        assert check.target[arm].delta == pytest.approx(target[arm], abs=1e-9)
    assert check.k == 9 and check.aggregation == "db" and check.screen["difffilter"].rank == 9
    assert check.target["difffilter"].rank == 2 and check.target["gfpo"].rank == 1  # worst -> best but one
    # 9 methods, no ties: ρ = 1 - 6 Σd² / 720 = -2/15, τ = (C - D) / 36 = -1/18
    assert check.spearman == pytest.approx(stats.spearmanr(screen, target[screen.index]).statistic) == -2 / 15
    assert check.kendall == pytest.approx(-1 / 18)
    # pinned from this implementation at seed 0 (9,999 resamples); the exact-bootstrap oracle is tests/paired
    assert (check.spearman_low, check.spearman_high) == pytest.approx((-31 / 60, -1 / 15))
    assert (check.kendall_low, check.kendall_high) == pytest.approx((-7 / 18, -1 / 18))
    assert check.screen_pick == "baseline" and check.target_pick == "gfpo" and check.pick_reversed
    assert check.verdict == DOES_NOT_TRANSFER and check.rho_critical == pytest.approx(1.959964 / np.sqrt(8), abs=1e-6)
    assert set(paths) == {"md", "json", "png"}
    page = paths["md"].read_text()
    assert "**Verdict: does not transfer.**" in page and "| difffilter | -0.87 [" in page and "credibly" not in page
    record = json.loads(paths["json"].read_text())
    assert record["verdict"] == DOES_NOT_TRANSFER and record["source"] == str(DATAFLEX_CSV)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dataflex_scale_curve_15b_to_3b_four_arms_cannot_show_agreement(tmp_path):
    check, _ = transfer_report(DATAFLEX_CSV, SCALE_15B, SCALE_3B, tmp_path)  # control inferred: baseline
    assert check.control == "baseline" and check.k == 4
    assert (check.spearman, check.kendall) == pytest.approx((-0.8, -2 / 3))
    assert check.screen_pick == "maxvar" and check.target_pick == "baseline" and check.verdict == DOES_NOT_TRANSFER
    assert "falls below the control" in check.pick_note and check.target["maxvar"].delta == pytest.approx(
        -0.1544, abs=1e-4
    )
    assert not check.rho_one_significant and check.rho_critical is None and check.spearman_p == pytest.approx(1 / 3)


def test_command_writes_the_check_and_prints_the_verdict(tmp_path):
    out = tmp_path / "transfer"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tune_dfrl.report",
            f"runs={DATAFLEX_CSV}",
            "control=baseline",
            "transfer.screen.campaign=main",
            "transfer.screen.model=Qwen2.5-0.5B-Instruct",
            "transfer.target.campaign=main",
            "transfer.target.model=Qwen2.5-7B-Instruct",
            f"out={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "verdict: does not transfer" in done.stdout and "Spearman ρ -0.13" in done.stdout
    assert {p.name for p in out.iterdir()} == {"transfer.md", "transfer.json", "transfer.png"}
    for name in ("transfer.md", "transfer.json", "transfer.png"):
        assert str(out / name) in done.stdout
    assert json.loads((out / "transfer.json").read_text())["spearman"] == pytest.approx(-2 / 15)


def config(overrides: list[str]):
    register_settings()
    with initialize_config_module(config_module="tune_dfrl.conf", version_base="1.3"):
        return compose("report", overrides=overrides)


def slices(screen: dict[str, str], target: dict[str, str]) -> list[str]:
    return [f"+transfer.screen.{k}={v}" for k, v in screen.items()] + [
        f"+transfer.target.{k}={v}" for k, v in target.items()
    ]


def synthetic_csv(tmp_path, rows: list[tuple[str, str, int]]):
    """A wide DataFlex-shaped table: (stage, method, seed) rows with random scores."""
    rng = np.random.default_rng(0)
    names = [b for bench in DOMAINS.values() for b in bench]
    frame = pd.DataFrame(rows, columns=["stage", "method", "seed"])
    frame[names] = rng.uniform(20, 80, size=(len(rows), len(names)))
    path = tmp_path / "runs.csv"
    frame.to_csv(path, index=False)
    return path


def test_bad_input_is_a_one_line_error(tmp_path):
    out = f"out={tmp_path / 'out'}"
    source = f"runs={DATAFLEX_CSV}"
    cases = {
        r"transfer.target \(campaign=main model=nope\): filter model=nope matches no row": slices(
            MAIN_05B, {**MAIN_7B, "model": "nope"}
        ),
        r"transfer.screen \(colour=red\): filter column 'colour' is not in": slices({"colour": "red"}, MAIN_7B),
        r"transfer.screen: give the screen's slice": slices({}, MAIN_7B),
        r"transfer.target: control 'baseline' is not an arm of the slice; arms: dump_ucb": slices(
            MAIN_05B, {"campaign": "mixer", "model": "Qwen2.5-7B-Instruct"}
        ),
    }
    for message, overrides in cases.items():
        with pytest.raises(ValueError, match=message):
            report_from_config(config([source, "control=baseline", out, *overrides]))
    s = [("s", m, seed) for m in ("baseline", "a") for seed in (1, 2, 3)]
    t = [("t", m, seed) for m in ("baseline", "b") for seed in (1, 2, 3)]
    csv = synthetic_csv(tmp_path, s + t)
    with pytest.raises(ValueError, match=r"no arm besides the control 'baseline' is in both stages"):
        report_from_config(config([f"runs={csv}", out, *slices({"stage": "s"}, {"stage": "t"})]))
    csv = synthetic_csv(tmp_path, s + [("t", "baseline", seed) for seed in (1, 2, 3)] + [("t", "a", 2)])
    with pytest.raises(
        ValueError, match=r"target \(stage=t\): a paired interval needs at least 2 seeds per arm; too few: a \(1 seed\)"
    ):
        report_from_config(config([f"runs={csv}", out, *slices({"stage": "s"}, {"stage": "t"})]))
    assert not (tmp_path / "out").exists()

    done = subprocess.run(  # the command: exit 2, one line on stderr
        [
            sys.executable,
            "-m",
            "tune_dfrl.report",
            source,
            "transfer.screen.colour=red",
            "transfer.target.model=x",
            out,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: transfer.screen (colour=red): filter column")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
