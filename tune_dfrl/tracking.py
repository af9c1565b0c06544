"""MLflow layout of one search (DESIGN §8), logged from the driver as a Ray Tune callback.

    experiment  (one per search; tag mlflow.experimentKind=custom_model_development)
    ├── search run          tune_dfrl.role=search: settings as params, benchmarks.json, the report
    └── arm run             tune_dfrl.role=arm, arm_id, arm_label, method, space, control_id, canonical
        └── seed run        tune_dfrl.role=seed, arm_id, arm_label, seed; metrics at step = training step

Logging happens in the driver (works when workers cannot reach the tracking server), one
`log_batch` per reported milestone. After the search every arm run carries a `status` and a `verdict`
tag and its final figures (`SearchTracker.finish`). A resumed search (`resume=True`) reopens its
experiment and runs (found by their tags) and logs only the milestones its seed runs do not hold yet.

The experiment also holds a saved view of the UI's runs table, `ARMS_VIEW` (`arms_view`): the arm runs
only, with the columns compared first. MLflow 3.17.2's UI stores its saved views as experiment tags
`mlflow.sharedViewState.<id>` and opens one at `#/experiments/<id>/runs?viewStateShareKey=<id>`.
Whether an experiment opens on the GenAI "Overview" or on the runs table is no property of the
experiment in that version: the UI's workflow switch decides, kept in the browser (local storage,
default GenAI) and overridden by the URL parameter `workflowType=machine_learning`, which `runs_url`
sets; the tag `mlflow.experimentKind` is not read for it.
"""

from __future__ import annotations

import json
import math
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
from tune_dfrl.schema import RESULT_PREFIXES, SCORE, Summary

ROLE = "tune_dfrl.role"
MAX_PARAM_CHARS = 6000
MAX_RUNS = 50000  # runs of one experiment read back on resume
UI_HOST, UI_PORT = "127.0.0.1", 5000  # where the printed `mlflow ui` command serves a local store
ARMS_VIEW = "tune_dfrl.arms"  # id of the saved runs-table view of the arm runs
SAVED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow 3.17.2's UI: experiment tag prefix of a saved view


def default_tracking_uri(out_dir: Path) -> str:
    """The default store: sqlite in the output directory."""
    return f"sqlite:///{out_dir / 'mlflow.db'}"


def _is_server(tracking_uri: str) -> bool:
    return tracking_uri.startswith(("http://", "https://"))


def ui_command(tracking_uri: str) -> str | None:
    """The command that serves a local store in the MLflow UI at http://127.0.0.1:5000 (None: an http store is
    served already)."""
    if _is_server(tracking_uri):
        return None
    return f"mlflow ui --backend-store-uri {tracking_uri} --host {UI_HOST} --port {UI_PORT}"


def runs_url(tracking_uri: str, experiment_id: str) -> str:
    """The experiment's runs table opened on the arms view, in the UI's "Model training" workflow: on the server
    of an http store, else where `ui_command` serves it."""
    base = tracking_uri.rstrip("/") if _is_server(tracking_uri) else f"http://{UI_HOST}:{UI_PORT}"
    return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={ARMS_VIEW}&workflowType=machine_learning"


def browse_lines(tracking_uri: str, experiment_id: str) -> list[str]:
    """What a search prints last: the command serving its store (none for an http store) and the runs table URL."""
    command, url = ui_command(tracking_uri), runs_url(tracking_uri, experiment_id)
    return [f"browse:  {command}", f"         then open {url}"] if command else [f"browse:  {url}"]


def arms_view(primary: str) -> dict[str, Any]:
    """The runs-table state of the arms view: the arm runs only, the control first, then the arms in the order the
    search tried them; after the run name (widened for the arm labels) and creation time, which the UI pins on the
    left, the columns verdict, paired Δ [interval] at level as text, status, seeds, then as numbers (to sort and
    chart) the paired Δ, its interval and level, and the mean on `primary`."""
    columns = {
        "tags.`verdict`": 90,
        f"tags.`paired_{primary}`": 200,
        "tags.`status`": 140,
        "metrics.`seeds`": 65,
        f"metrics.`paired_delta_{primary}`": 110,
        f"metrics.`ci_low_{primary}`": 95,
        f"metrics.`ci_high_{primary}`": 95,
        f"metrics.`ci_level_{primary}`": 95,
        f"metrics.`mean_{primary}`": 95,
    }
    pinned = {"attributes.`Run Name`": 285, "runDateAndNestInfo": 125}  # the UI's ids of these two columns
    return {
        "searchFilter": f"tags.`{ROLE}` = 'arm'",
        "orderByKey": "attributes.start_time",
        "orderByAsc": True,
        "selectedColumns": list(columns),
        "columnOrder": list(pinned) + list(columns),
        "columnWidths": pinned | columns,
    }


def _saved_view(name: str, state: Mapping[str, Any]) -> str:
    """A saved view as MLflow 3.17.2's UI stores it in an experiment tag."""
    now = int(time.time() * 1000)
    return json.dumps({"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)})


def _params(values: Mapping[str, Any], prefix: str = "") -> list[Param]:
    return [Param(f"{prefix}{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(values.items())]


def _metrics(values: Mapping[str, float | None], timestamp: int, step: int) -> list[Metric]:
    """Metrics at `step`, leaving out the undefined (None, NaN) and the unbounded."""
    return [Metric(k, float(v), timestamp, step) for k, v in values.items() if v is not None and math.isfinite(v)]


def _paired_text(delta: float, low: float | None, high: float | None, level: float) -> str:
    """ "Δ [low, high] at level" in points to 2 decimals; an unbounded or undefined end as ∞."""

    def end(value: float | None, unbounded: str) -> str:
        return f"{value:+.2f}" if value is not None and math.isfinite(value) else unbounded

    return f"{delta:+.2f} [{end(low, '-∞')}, {end(high, '+∞')}] at {level:.2%}"


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
                tags={
                    "mlflow.experimentKind": "custom_model_development",
                    "space": space,
                    "control_id": control_id,
                    SAVED_VIEW_TAG + ARMS_VIEW: _saved_view("arms vs control", arms_view(metric.removeprefix(SCORE))),
                },
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
        """Final figures and the `status` and `verdict` tags on every arm run (`_final`); the report on the search
        run; close all runs. `summary` is the analysis of the arms that ran their full budget; `arm_ids` maps its arm
        names to arm ids; `primary` is the aggregation whose verdict becomes the `verdict` tag."""
        names = {arm_id: name for name, arm_id in arm_ids.items()}
        for arm_id, run_id in self.arm_runs.items():
            metrics, tags = self._final(summary, arm_id, names.get(arm_id), primary)
            self.client.log_batch(
                run_id, metrics=metrics, tags=[RunTag(k, v[:MAX_PARAM_CHARS]) for k, v in tags.items()]
            )
        self.client.log_artifacts(self.search_run_id, str(report_dir), "report")
        self.client.set_tag(
            self.search_run_id, "recommendation", json.dumps(asdict(summary.recommendation))[:MAX_PARAM_CHARS]
        )
        self.close("FINISHED")

    def _final(
        self, summary: Summary, arm_id: str, name: str | None, primary: str
    ) -> tuple[list[Metric], dict[str, str]]:
        """An arm run's final figures (metrics at the step they were measured) and its `status` and `verdict`:

        - control: `mean_<agg>` over all its seeds per aggregation, `seeds`;
        - analysed (ran its full budget): per aggregation `paired_delta_<agg>`, `ci_low_<agg>`, `ci_high_<agg>` (the
          Holm-adjusted interval), `ci_level_<agg>` (its level), `mean_<agg>`, `p_holm_<agg>`, tag `verdict_<agg>`;
          `seeds` (paired with the control); the tag `paired_<primary>` writes Δ [low, high] at level as text;
        - stopped by the scheduler: on the search metric at its last milestone (the rung that stopped it), the paired
          Δ against the control with its unadjusted (1 - alpha) interval and level (also as the text tag), its mean,
          `seeds`;
        - excluded from the analysis, failed at every seed it ran, or without a milestone: tags only.
        """
        now, step = int(time.time() * 1000), summary.arm_steps.get(name or "", 0)
        if arm_id == self.control_id:
            metrics = {f"mean_{agg}": mean for agg, mean in summary.control_mean.items()}
            metrics["seeds"] = len(summary.arm_seeds.get(name or "", []))
            tags = {"status": "control", "verdict": "control", f"paired_{primary}": "Δ ≡ 0 (the reference)"}
            return _metrics(metrics, now, step), tags
        if name is not None and name in summary.arms:
            failed_seeds = f", failed at seeds {summary.failed[name]}" if summary.failed.get(name) else ""
            by_agg, metrics, tags = summary.arms[name], {}, {"status": f"analysed at step {step}{failed_seeds}"}
            for agg, f in by_agg.items():
                figures = (f.delta, f.ci_low, f.ci_high, f.level, f.mean, f.p_holm)
                keys = ("paired_delta", "ci_low", "ci_high", "ci_level", "mean", "p_holm")
                metrics.update({f"{key}_{agg}": value for key, value in zip(keys, figures)})
                tags[f"verdict_{agg}"] = f.verdict
            if primary in by_agg:
                f = by_agg[primary]
                metrics["seeds"], tags["verdict"] = f.n, f.verdict
                tags[f"paired_{primary}"] = _paired_text(f.delta, f.ci_low, f.ci_high, f.level)
            return _metrics(metrics, now, step), tags
        if name is not None and name in summary.excluded:
            return [], {"status": f"excluded: {summary.excluded[name]}", "verdict": "excluded"}
        started = {seed for arm, seed in self.seed_runs if arm == arm_id}
        failed = set(summary.failed.get(name or "", []))
        if failed and started <= failed:
            return [], {"status": f"failed at seeds {sorted(failed)}", "verdict": "failed"}
        if arm_id in self._stopped or (name is not None and name in summary.stopped):
            return self._stopped_figures(arm_id, started, 1.0 - float(summary.alpha), now)
        return [], {"status": "not analysed: it did not reach the full budget", "verdict": "not analysed"}

    def _stopped_figures(
        self, arm_id: str, seeds: set[int], confidence: float, now: int
    ) -> tuple[list[Metric], dict[str, str]]:
        """A stopped arm's figures on the search metric at the last milestone its `seeds` reached (see `_final`)."""
        step = max((self.ledger.reached(arm_id, seed) for seed in seeds), default=0)
        agg = self.metric.removeprefix(SCORE)
        scores = self.ledger.scores(arm_id, step)
        e = self.ledger.estimate(arm_id, step, confidence)
        metrics = {
            f"paired_delta_{agg}": e.mean,
            f"ci_low_{agg}": e.low,
            f"ci_high_{agg}": e.high,
            f"ci_level_{agg}": confidence,
            f"mean_{agg}": sum(scores.values()) / len(scores) if scores else math.nan,
            "seeds": len(e.seeds),
        }
        tags = {
            "status": f"stopped at step {step}",
            "verdict": "stopped",
            f"paired_{agg}": _paired_text(e.mean, e.low, e.high, confidence),
        }
        return _metrics(metrics, now, step), tags

    def close(self, status: str) -> None:
        """End every run still open: seed runs (normally ended with their trials), arm runs, the search run."""
        for run_id in list(self._open_seed_runs):
            self._end(run_id, status)
        for run_id in self.arm_runs.values():
            self.client.set_terminated(run_id, status)
        self.client.set_terminated(self.search_run_id, status)
