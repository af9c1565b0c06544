"""Helpers for the search tests: a Hydra-composed search config and a synthetic backend (tests only).

The synthetic backend scores score(arm, seed, step) = 30 + 7 u(seed) + (effect(arm) + 0.5 z(arm, seed)) * step / steps
on all three benchmarks: u(seed) in [0, 1) is a per-seed offset (large next to the arm effects, so
only *paired* comparisons see them), z a fixed standard normal per (arm, seed), and
effect = `slope` * (f - 0.5) for arms with a keep fraction f (topk / maxvar), 0 for the control.
It checkpoints {"step"} before reporting a milestone and resumes from it, like a real backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from tune_dfrl.backends.base import ArmSpec, CalibrationResult, Milestone
from tune_dfrl.backends.benchmarks import BenchmarkInfo
from tune_dfrl.search.cli import register_configs

BENCHMARKS = [
    BenchmarkInfo("arith", "math", 40),
    BenchmarkInfo("bool", "logic", 40),
    BenchmarkInfo("units", "science", 40),
]


@dataclass(frozen=True)
class SyntheticBackend:
    recipe: dict[str, Any]
    name: str = "synthetic"
    binary_rewards: bool = False
    reuses_trial_actors: bool = True
    slope: float = 20.0
    sleep_s: float = 0.02
    calibration_ok: bool = True

    def benchmarks(self) -> list[BenchmarkInfo]:
        return list(BENCHMARKS)

    def calibrate(self) -> CalibrationResult:
        if self.calibration_ok:
            return CalibrationResult(True, [])
        return CalibrationResult(False, ["units: reference answer '3 m' scored 0 (expected 1)"])

    def prepare(self) -> None:
        pass

    def validate(self, arm: ArmSpec) -> None:
        if arm.method not in ("baseline", "topk", "maxvar"):
            raise ValueError(f"synthetic backend runs baseline, topk and maxvar; got {arm.method!r}")

    def resources(self) -> dict[str, float]:
        return {"cpu": 1}

    def score(self, arm: ArmSpec, seed: int, step: int, steps: int) -> float:
        offset = float(np.random.default_rng(seed).random())
        noise = float(np.random.default_rng([seed, int(arm.arm_id, 16)]).standard_normal())
        effect = self.slope * (float(arm.params["f"]) - 0.5) if "f" in arm.params else 0.0
        return 30.0 + 7.0 * offset + (effect + 0.5 * noise) * step / steps

    def run_trial(self, arm: ArmSpec, seed: int, report: Callable[[Milestone], None], checkpoint_dir: Path) -> None:
        state = checkpoint_dir / "state.json"
        done = json.loads(state.read_text())["step"] if state.exists() else 0
        steps, every = int(self.recipe["steps"]), int(self.recipe["milestone_every"])
        for step in range(max(done, 1), steps + 1):  # from the checkpoint's milestone: re-reported, as real backends do
            time.sleep(self.sleep_s)
            if step % every and step != steps:
                continue
            s = self.score(arm, seed, step, steps)
            state.write_text(json.dumps({"step": step}))
            report(
                Milestone(
                    step,
                    accuracy={b.name: s for b in BENCHMARKS},
                    length_chars={b.name: 100.0 for b in BENCHMARKS},
                    format_failure={b.name: 0.0 for b in BENCHMARKS},
                    aggregates={"db": s, "macro": s, "item": s, "efficiency": s / 100.0 * 10.0},
                )
            )


def build(cfg: dict[str, Any]) -> SyntheticBackend:
    """Backend constructor for `tune_dfrl.backends.registry.BACKENDS` (selected with backend.name=synthetic, so `cfg` also
    carries the embedded recipe keys: only the budget is taken from it; groups of 8)."""
    options = {k: cfg[k] for k in ("slope", "sleep_s", "calibration_ok") if k in cfg}
    recipe = {"steps": cfg.get("steps", 30), "milestone_every": cfg.get("milestone_every", 10), "rollout_n": 8}
    return SyntheticBackend(recipe, **options)


def search_cfg(*overrides: str) -> dict[str, Any]:
    """The search config exactly as `python -m tune_dfrl.search OVERRIDES...` composes it."""
    register_configs()
    with initialize_config_module(config_module="tune_dfrl.conf", version_base="1.3"):
        return OmegaConf.to_container(compose("search", overrides=list(overrides)), resolve=True)
