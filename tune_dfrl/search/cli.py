"""The search service: `python -m tune_dfrl.search space=NAME [key=value ...]`.

One search = the control arm and up to `arms` searched arms, each trained at the same explicit
seeds (one Ray Tune trial per (arm, seed)); arms are suggested by Optuna through the
`PairedRepeater` and continued or stopped together by the paired scheduler; every milestone goes
to OUT/results.jsonl and MLflow; the paired-CI report ends it. Three stages, one module each, conducted here
(`run_search`), each taking and returning typed objects; the plan is built once per search:

    tune_dfrl.search.plan     settings, paths and services checked; nothing written   -> Plan
    tune_dfrl.search.run      folder lock, Ray Tune with the paired searcher and scheduler   Plan -> Trained
    tune_dfrl.search.finish   the report on results.jsonl                              Plan, Trained -> Summary

`dry_run=true` checks everything a search would before its first trial (stage 1 and the calibration
smoke test), prints the plan and the first trial's command, and exits 0: no Ray, no training, nothing
written; what this machine lacks for the trials (e.g. GPUs, vLLM) is printed as `warning:` lines.

Exit status: 0 done; 2 bad input (`error:` line, nothing written or trained); 1 the search ran
but ended without a report, or lost its Ray cluster's head (`error:` line saying what to run next); 130 / 143
interrupted by SIGINT / SIGTERM (one line saying how to resume).

The output folder OUT and every file in it: `tune_dfrl.state.folder`.
"""

from __future__ import annotations

import sys

from tune_dfrl.errors import ClusterLost, Interrupted, SearchError, SearchFailed
from tune_dfrl.report.schema import Summary
from tune_dfrl.search.finish import finish
from tune_dfrl.search.plan import (
    Plan,
    compose,
    dry_run_lines,
    plan_search,
    register_configs,
    save_plan,
)
from tune_dfrl.search.run import OPTUNA_STUDY, calibrate, holding, train

__all__ = ["OPTUNA_STUDY", "Plan", "SearchError", "plan_search", "register_configs", "run_search", "save_plan"]


def run_search(plan: Plan) -> Summary:
    """Run a planned search to the end, holding its folder: train, then report; returns the report summary (also in
    OUT/summary.json)."""
    with holding(plan):
        return finish(plan, train(plan))


def main() -> None:
    """The CLI: the overrides are composed and planned first (exit 2 on bad input), then Hydra runs the search.
    (With a Hydra flag, e.g. `--help`, `--cfg job` or `--multirun`, Hydra alone handles the command line, and each
    job is planned from its config.)"""
    import hydra
    from omegaconf import OmegaConf

    register_configs()
    planned: Plan | None = None
    if not any(a.startswith("-") for a in sys.argv[1:]):
        try:
            planned = plan_search(compose(sys.argv[1:]))  # every key, value, path and service, before anything starts
            if planned.dry_run:
                dry_run(planned)
        except ValueError as error:
            _exit(2, f"error: {error}")

    @hydra.main(config_path="pkg://tune_dfrl.conf", config_name="search", version_base="1.3")
    def run(cfg: object) -> None:
        try:
            plan = planned if planned is not None else plan_search(OmegaConf.to_container(cfg, resolve=True))
            if plan.dry_run:
                dry_run(plan)
            run_search(plan)
        except ValueError as error:  # bad input found late (calibration, the folder taken meanwhile): nothing trained
            _exit(2, f"error: {error}")
        except SearchFailed as error:
            _exit(1, f"error: {error}")
        except ClusterLost as lost:
            _exit(1, f"error: {lost}; to continue, {lost.hint}")
        except Interrupted as interrupted:
            _exit(128 + interrupted.signum, f"interrupted by {interrupted}; to continue, {interrupted.hint}")

    run()


def dry_run(plan: Plan) -> None:
    """Calibrate the backend, print the warnings and the plan (`dry_run_lines`), exit 0."""
    calibrate(plan.backend)
    for line in plan.warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    print("\n".join(dry_run_lines(plan)), flush=True)
    sys.exit(0)


def _exit(code: int, line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)
