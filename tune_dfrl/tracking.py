"""MLflow layout of one search (DESIGN §8), logged from the driver as a Ray Tune callback.

    experiment  (one per search; tag mlflow.experimentKind=custom_model_development)
    ├── search run          tune_dfrl.role=search: settings as params, benchmarks.json, the report
    └── arm run             tune_dfrl.role=arm, arm_id, arm_label, method, space, control_id, canonical
        └── seed run        tune_dfrl.role=seed, arm_id, arm_label, seed; metrics at step = training step

Logging happens in the driver (works when workers cannot reach the tracking server), one
`log_batch` per reported milestone. After the search, every arm run carries `paired_delta_<agg>`,
`ci_low_<agg>`, `ci_high_<agg>` and a `verdict` tag so the MLflow table sorts arms by lower bound.
A resumed search (`resume=True`) reopens its experiment and runs (found by their tags) and logs
only the milestones its seed runs do not hold yet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from ray.tune import Callback

from tune_dfrl.backend import BenchmarkInfo
from tune_dfrl.ledger import PairedLedger
from tune_dfrl.scheduler import ArmDecision
from tune_dfrl.schema import RESULT_PREFIXES, Summary

ROLE = "tune_dfrl.role"
MAX_PARAM_CHARS = 6000
MAX_RUNS = 50000  # runs of one experiment read back on resume


def default_tracking_uri(out_dir: Path) -> str:
    """The default store: sqlite in the output directory."""
    return f"sqlite:///{out_dir / 'mlflow.db'}"


def ui_command(tracking_uri: str) -> str:
    """The command that opens this store in the MLflow UI."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"


def _params(values: Mapping[str, Any], prefix: str = "") -> list[Param]:
    return [Param(f"{prefix}{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(values.items())]


class SearchTracker(Callback):
    """Creates the experiment and search run up front, arm/seed runs as trials appear."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        artifact_location: str | None,
        space: str,
        control_id: str,
        metric: str,
        settings: Mapping[str, Any],
        benchmarks: list[BenchmarkInfo],
        resume: bool = False,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment = experiment
        self.space, self.control_id, self.metric = space, control_id, metric
        self.arm_runs: dict[str, str] = {}  # arm id -> run id
        self.seed_runs: dict[tuple[str, int], str] = {}  # (arm id, seed) -> run id
        self._open_seed_runs: set[str] = set()
        self.ledger = PairedLedger(control_id)  # the milestones logged, with their `metric`
        self._stopped: set[str] = set()  # arm ids the scheduler stopped
        existing = self.client.get_experiment_by_name(experiment)
        if existing is not None and not resume:
            raise ValueError(
                f"MLflow experiment {experiment!r} already exists at {tracking_uri}; "
                "one experiment per search: choose another mlflow.experiment=NAME"
            )
        if existing is not None and self._reopen(existing.experiment_id):
            return
        self.experiment_id = (
            existing.experiment_id
            if existing is not None
            else self.client.create_experiment(
                experiment,
                artifact_location=artifact_location,
                tags={"mlflow.experimentKind": "custom_model_development", "space": space, "control_id": control_id},
            )
        )
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"search {space}",
            tags={ROLE: "search", "space": space, "control_id": control_id},
        )
        self.search_run_id = run.info.run_id
        self.client.log_batch(self.search_run_id, params=_params(settings))
        self.client.log_dict(self.search_run_id, [vars(b) for b in benchmarks], "benchmarks.json")

    def _reopen(self, experiment_id: str) -> bool:
        """Pick up the runs of an interrupted search (False when it has no search run yet); mark them running again."""
        runs = self.client.search_runs([experiment_id], max_results=MAX_RUNS)
        search = [r for r in runs if r.data.tags.get(ROLE) == "search"]
        if not search:
            return False
        self.experiment_id, self.search_run_id = experiment_id, search[0].info.run_id
        for run in runs:
            tags, run_id = run.data.tags, run.info.run_id
            if tags.get(ROLE) == "arm":
                self.arm_runs[tags["arm_id"]] = run_id
            elif tags.get(ROLE) == "seed":
                key = (tags["arm_id"], int(tags["seed"]))
                self.seed_runs[key] = run_id
                for m in self.client.get_metric_history(run_id, self.metric):
                    self.ledger.record(*key, m.step, m.value)
                if run.info.status == "RUNNING" or (run.info.status == "KILLED" and tags.get("stopped") != "true"):
                    self._open_seed_runs.add(run_id)  # interrupted, not stopped by the scheduler
        for run_id in [self.search_run_id, *self.arm_runs.values(), *self._open_seed_runs]:
            self.client.update_run(run_id, status="RUNNING")
        return True

    # -- run creation -----------------------------------------------------------------------------

    def arm_run(self, arm: Mapping[str, Any]) -> str:
        """The parent run of an arm, created when the arm first appears."""
        arm_id = arm["arm_id"]
        if arm_id not in self.arm_runs:
            tags = {
                ROLE: "arm",
                "arm_id": arm_id,
                "arm_label": arm["label"],
                "method": arm["method"],
                "space": self.space,
                "control_id": self.control_id,
                "is_control": str(arm_id == self.control_id).lower(),
                "canonical": json.dumps({"method": arm["method"], "params": arm["params"]}, sort_keys=True),
            }
            run = self.client.create_run(self.experiment_id, run_name=arm["label"], tags=tags)
            self.client.log_batch(
                run.info.run_id, params=_params({"method": arm["method"]}) + _params(arm["params"], "param.")
            )
            self.arm_runs[arm_id] = run.info.run_id
        return self.arm_runs[arm_id]

    def seed_run(self, arm: Mapping[str, Any], seed: int) -> str:
        """The child run of one (arm, seed) cell."""
        key = (arm["arm_id"], seed)
        if key not in self.seed_runs:
            tags = {
                ROLE: "seed",
                "mlflow.parentRunId": self.arm_run(arm),
                "arm_id": arm["arm_id"],
                "arm_label": arm["label"],
                "method": arm["method"],
                "seed": str(seed),
            }
            run = self.client.create_run(self.experiment_id, run_name=f"{arm['label']}/seed{seed}", tags=tags)
            self.seed_runs[key] = run.info.run_id
            self._open_seed_runs.add(run.info.run_id)
        return self.seed_runs[key]

    # -- Tune callback ----------------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.seed_run(trial.config["arm"], int(trial.config["seed"]))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        arm, seed, step = trial.config["arm"], int(trial.config["seed"]), int(result["step"])
        if not self.ledger.record(arm["arm_id"], seed, step, result[self.metric]):
            return  # a resumed trial reporting a milestone again
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items() if k.startswith(tuple(RESULT_PREFIXES))]
        self.client.log_batch(self.seed_run(arm, seed), metrics=metrics)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        final = bool((trial.last_result or {}).get("final", False))
        run_id = self.seed_run(trial.config["arm"], int(trial.config["seed"]))
        if not final:
            self.client.set_tag(run_id, "stopped", "true")
        self._end(run_id, "FINISHED" if final else "KILLED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(self.seed_run(trial.config["arm"], int(trial.config["seed"])), "FAILED")

    def _end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
        self._open_seed_runs.discard(run_id)

    def note_decision(self, decided: ArmDecision) -> None:
        """Record a rung decision on the arm's parent run."""
        run_id = self.arm_runs.get(decided.arm)
        if run_id is None:
            return
        verdict = "keep" if decided.decision.keep else "stop"
        tags = [RunTag(f"rung{decided.rung}", f"{verdict}: {decided.decision.reason}"[:MAX_PARAM_CHARS])]
        if not decided.decision.keep:
            self._stopped.add(decided.arm)
            tags += [RunTag("stopped_at_step", str(decided.rung)), RunTag("verdict", "stopped")]
        self.client.log_batch(run_id, tags=tags)

    def note_look(self, history: Mapping[str, Any]) -> None:
        """seeds=auto: the looks so far as the search run's sequential.json; the last look on each arm's parent run."""
        self.client.log_dict(self.search_run_id, dict(history), "sequential.json")
        look, now = history["looks"][-1], int(time.time() * 1000)
        for arm, state in look["states"].items():
            if (run_id := self.arm_runs.get(arm)) is not None:
                self.client.log_batch(
                    run_id,
                    metrics=[Metric("sequential_seeds", float(state["seeds"]), now, look["number"])],
                    tags=[RunTag(f"look{look['number']}", f"{state['status']} at {state['seeds']} seeds")],
                )

    # -- after the search -------------------------------------------------------------------------

    def finish(self, summary: Summary, arm_ids: Mapping[str, str], primary: str, report_dir: Path) -> None:
        """Summary metrics and verdict on every arm run; the report on the search run; close all runs.

        `arm_ids` maps the report's arm names to arm ids; `primary` is the aggregation whose verdict
        becomes the `verdict` tag.
        """
        now = int(time.time() * 1000)
        for name, by_agg in summary.arms.items():
            run_id = self.arm_runs.get(arm_ids.get(name, ""))
            if run_id is None:
                continue
            metrics, tags = [], []
            for agg, figures in by_agg.items():
                for key, stat in (
                    ("paired_delta", "delta"),
                    ("ci_low", "ci_low"),
                    ("ci_high", "ci_high"),
                    ("mean", "mean"),
                    ("p_holm", "p_holm"),
                ):
                    if getattr(figures, stat) is not None:
                        metrics.append(Metric(f"{key}_{agg}", float(getattr(figures, stat)), now, 0))
                tags.append(RunTag(f"verdict_{agg}", figures.verdict))
            if primary in by_agg:
                tags.append(RunTag("verdict", by_agg[primary].verdict))
            self.client.log_batch(run_id, metrics=metrics, tags=tags)
        self.client.log_artifacts(self.search_run_id, str(report_dir), "report")
        self.client.set_tag(
            self.search_run_id, "recommendation", json.dumps(asdict(summary.recommendation))[:MAX_PARAM_CHARS]
        )
        self.close("FINISHED")

    def close(self, status: str) -> None:
        """End every run still open: seed runs (normally ended with their trials), arm runs, the search run."""
        for run_id in list(self._open_seed_runs):
            self._end(run_id, status)
        for run_id in self.arm_runs.values():
            self.client.set_terminated(run_id, status)
        self.client.set_terminated(self.search_run_id, status)
