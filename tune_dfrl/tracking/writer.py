"""MLflow layout of one search (DESIGN §8), logged from the driver as a Ray Tune callback.

    experiment  (one per search; tag mlflow.experimentKind=custom_model_development)
    ├── search run          tune_dfrl.role=search: settings as params, benchmarks.json, the report
    └── arm run             tune_dfrl.role=arm, arm_id, arm_label, method, space, control_id, canonical
        └── seed run        tune_dfrl.role=seed, arm_id, arm_label, seed; metrics at step = training step

Logging happens in the driver (works when workers cannot reach the tracking server), one
`log_batch` per reported milestone. After the search (`SearchTracker.finish`) every arm run carries the
`status` and `verdict` of the search's analysis (`tune_dfrl.report.analysis.analyze_search`), its step series
(`curve/...`, `series_metrics`) and final figures (`arm_metrics`, `arm_tags`); the search run carries the
search's record under `record/`, which `load_search` reads back with the seed runs' milestones, so
`python -m tune_dfrl.report experiment=NAME` gives the search's own answer. A resumed search (`resume=True`)
reopens its experiment and runs (found by their tags) and logs only the milestones its seed runs do not hold yet.

The experiment also holds a saved view of the UI's runs table, `ARMS_VIEW` (`arms_view`): the arm runs
only, with the columns compared first. MLflow 3.17.2's UI stores its saved views as experiment tags
`mlflow.sharedViewState.<id>` and opens one at `#/experiments/<id>/runs?viewStateShareKey=<id>`.
Whether an experiment opens on the GenAI "Overview" or on the runs table is no property of the
experiment in that version: the UI's workflow switch decides, kept in the browser (local storage,
default GenAI) and overridden by the URL parameter `workflowType=machine_learning`, which `runs_url`
sets; the tag `mlflow.experimentKind` is not read for it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import math
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from ray.tune import Callback
from sqlalchemy.engine import make_url

from tune_dfrl.backends.base import RESULT_PREFIXES, SCORE
from tune_dfrl.backends.benchmarks import BenchmarkInfo
from tune_dfrl.config.cache_root import default_cache_dir
from tune_dfrl.paired.ledger import milestone
from tune_dfrl.paired.rungs import ArmDecision, name_leader
from tune_dfrl.report.render import interval_words
from tune_dfrl.report.schema import EQUIVALENT, Summary
from tune_dfrl.state.folder import ARTIFACTS, BENCHMARKS, LOOKS, MLFLOW_DB
from tune_dfrl.state.records import RECORD_FILES

ROLE = "tune_dfrl.role"
RECORD = "record"  # the search run's artifact folder holding the search's record (`results.RECORD_FILES`)
CURVE = "curve/"  # prefix of an arm run's step series
VERDICTS = "verdicts.json"  # the search run's table of every arm's status and answer
FIGURES = ("paired_delta", "ci_low", "ci_high", "ci_level", "mean")  # an arm's final figures, suffixed _<agg>
MAX_PARAM_CHARS = 6000
MAX_RUNS = 50000  # runs of one experiment read back on resume
UI_HOST, UI_PORT = "127.0.0.1", 5000  # where the printed `mlflow ui` command serves a local store
# MLflow 3.17.2's server (`mlflow ui` too) starts a job runner and 7 queue consumers that poll for MLflow's GenAI jobs,
# which browsing runs never uses (their CPU: docs/readme_search.md, "Browsing a search in the MLflow UI").
UI_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
ARMS_VIEW = "tune_dfrl.arms"  # id of the saved runs-table view of the arm runs
SAVED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow 3.17.2's UI: experiment tag prefix of a saved view
ARTIFACT_COLUMNS = {"experiments": "artifact_location", "runs": "artifact_uri", "logged_models": "artifact_location"}


def default_tracking_uri(out_dir: Path) -> str:
    """The default store: sqlite in the output directory."""
    return f"sqlite:///{out_dir.absolute() / MLFLOW_DB}"


def folder_artifacts(out_dir: Path) -> str:
    """Where a search in `out_dir` keeps its MLflow artifacts (with a sqlite store): OUT/mlartifacts."""
    return (out_dir.absolute() / ARTIFACTS).as_uri()


def repoint_folder_store(out_dir: Path) -> int:
    """`repoint_store` of the search folder's own store (OUT/mlflow.db) at OUT/mlartifacts; 0 if it has none."""
    return repoint_store(default_tracking_uri(out_dir), folder_artifacts(out_dir))


def new_sqlite_store(tracking_uri: str, artifact_location: str) -> None:
    """Create the database of a sqlite `tracking_uri` that does not exist yet as a copy of an empty store.

    MLflow builds a new sqlite store by running every schema migration of its history: 2-5 s on two cores, in
    every new search folder. The empty store is built that way once per MLflow version, by MLflow, in the shared
    cache (`<cache>/mlflow/empty-<version>.db`, beside the base models and controls); a copy takes milliseconds and
    MLflow opens it as its own. The copy's Default experiment (id 0, which MLflow would put under `./mlruns` of the
    folder the search started in) gets `<artifact_location>/0`. A cache that cannot be written leaves the store to
    MLflow."""
    if not tracking_uri.startswith("sqlite:") or not (database := make_url(tracking_uri).database):
        return
    target = Path(database)
    if target.exists():
        return
    try:
        template = _empty_store()
    except OSError:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(template, partial)
        now = int(time.time() * 1000)
        with sqlite3.connect(partial) as db:
            db.execute(
                "UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                "WHERE experiment_id = 0",
                (f"{artifact_location.rstrip('/')}/0", now, now),
            )
        db.close()
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)  # a copy that failed half-way is not left in the search folder


def repoint_store(tracking_uri: str, artifact_location: str) -> int:
    """Point a sqlite store's artifact locations that name another folder's `mlartifacts/` at `artifact_location`
    (a copied or moved search folder: MLflow keeps absolute `file://` URIs). Returns how many rows changed.

    An experiment's location `file:///OLD/mlartifacts` becomes `artifact_location`; a run's
    `file:///OLD/mlartifacts/<run>/artifacts` becomes `<artifact_location>/<run>/artifacts`. Nothing else is read or
    written; a store that does not exist yet, or is no sqlite file, is left alone."""
    if not tracking_uri.startswith("sqlite:") or not (database := make_url(tracking_uri).database):
        return 0
    if not Path(database).exists():
        return 0
    root = artifact_location.rstrip("/")
    marker = "/" + ARTIFACTS
    changed = 0
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        for table, column in ARTIFACT_COLUMNS.items():
            for key, value in db.execute(f"SELECT rowid, {column} FROM {table}").fetchall():
                cut = value.find(marker + "/") if isinstance(value, str) else -1
                cut = len(value) - len(marker) if cut < 0 and isinstance(value, str) and value.endswith(marker) else cut
                if cut < 0 or not value.startswith("file:"):
                    continue
                moved = root + value[cut + len(marker) :]
                if moved != value:
                    db.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (moved, key))
                    changed += 1
    return changed


def _empty_store() -> Path:
    """The cache's empty store of the installed MLflow, built by MLflow on first use."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    template = default_cache_dir() / "mlflow" / f"empty-{importlib.metadata.version('mlflow')}.db"
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent) as folder, _quiet("mlflow.store.db.utils", "alembic"):
        building = Path(folder) / MLFLOW_DB
        store = SqlAlchemyStore(f"sqlite:///{building}", Path(folder).as_uri())
        store.engine.dispose()
        os.replace(building, template)
    return template


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """The named loggers say only warnings and errors meanwhile (MLflow and Alembic narrate a new store's schema)."""
    chosen = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in chosen]
    for logger in chosen:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(chosen, levels):
            logger.setLevel(level)


def _is_server(tracking_uri: str) -> bool:
    return tracking_uri.startswith(("http://", "https://"))


def ui_command(tracking_uri: str) -> str | None:
    """The command that serves a local store in the MLflow UI at http://127.0.0.1:5000 to one browsing user: one server
    worker (MLflow's default is 4), without MLflow's job runners (`UI_SERVER_ENV`; None: an http store is served
    already)."""
    if _is_server(tracking_uri):
        return None
    env = " ".join(f"{name}={value}" for name, value in UI_SERVER_ENV.items())
    return f"{env} mlflow ui --backend-store-uri {tracking_uri} --host {UI_HOST} --port {UI_PORT} --workers 1"


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
        "tags.`interval`": 170,
        "metrics.`at_step`": 70,
        f"metrics.`mean_{primary}`": 95,
        f"metrics.`control_mean_{primary}`": 95,
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


def _paired_text(delta: float, low: float | None, high: float | None, kind: str) -> str:
    """ "Δ [low, high] (kind)" in points to 2 decimals, `kind` the interval's kind and level ("Holm 99.17%",
    "unadjusted 95% at step 20"); an unbounded or undefined end as ∞."""

    def end(value: float | None, unbounded: str) -> str:
        return f"{value:+.2f}" if value is not None and math.isfinite(value) else unbounded

    return f"{delta:+.2f} [{end(low, '-∞')}, {end(high, '+∞')}] ({kind})"


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
        if artifact_location is not None:
            new_sqlite_store(tracking_uri, artifact_location)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment = experiment
        self.space, self.control_id, self.metric = space, control_id, metric
        self.arm_runs: dict[str, str] = {}  # arm id -> run id
        self.seed_runs: dict[tuple[str, int], str] = {}  # (arm id, seed) -> run id
        self._open_seed_runs: set[str] = set()
        self.logged: set[tuple[str, int, int]] = set()  # the milestones logged (the ledger's duplicate rule)
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
        self.client.log_dict(self.search_run_id, [vars(b) for b in benchmarks], BENCHMARKS)

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
                    self.logged.add(milestone(*key, m.step))
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
            numeric = {
                f"param.{k}": float(v)
                for k, v in arm["params"].items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            self.client.log_batch(
                run.info.run_id,
                metrics=_metrics(numeric, int(time.time() * 1000), 0),
                params=_params({"method": arm["method"]}) + _params(arm["params"], "param."),
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
            self.client.log_batch(
                run.info.run_id,
                params=_params({"method": arm["method"], "seed": seed}) + _params(arm["params"], "param."),
            )
            self.seed_runs[key] = run.info.run_id
            self._open_seed_runs.add(run.info.run_id)
        return self.seed_runs[key]

    # -- Tune callback ----------------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.seed_run(trial.config["arm"], int(trial.config["seed"]))

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        arm, seed, step = trial.config["arm"], int(trial.config["seed"]), int(result["step"])
        if milestone(arm["arm_id"], seed, step) in self.logged:
            return  # a resumed trial reporting a milestone again
        self.logged.add(milestone(arm["arm_id"], seed, step))
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in result.items() if k.startswith(tuple(RESULT_PREFIXES))]
        self.client.log_batch(self.seed_run(arm, seed), metrics=metrics)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        final = bool((trial.last_result or {}).get("final", False))
        run_id = self.seed_run(trial.config["arm"], int(trial.config["seed"]))
        if not final:  # stopped by the scheduler: a finished run, tagged (KILLED is an interrupted search's)
            self.client.set_tag(run_id, "stopped", "true")
        self._end(run_id, "FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._end(self.seed_run(trial.config["arm"], int(trial.config["seed"])), "FAILED")

    def _end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
        self._open_seed_runs.discard(run_id)

    def note_decision(self, decided: ArmDecision) -> None:
        """Record a rung decision on the arm's parent run, in the rule's words with the rung leader named
        ("stop: 80% interval of Δ against the leader topk(f=0.9) [-4.37, -2.13] over 6 seeds, below 0")."""
        run_id = self.arm_runs.get(decided.arm)
        if run_id is None:
            return
        verdict = "keep" if decided.decision.keep else "stop"
        reason = name_leader(decided.decision.reason, self._label(decided.decision.leader))
        tags = [RunTag(f"rung{decided.rung}", f"{verdict}: {reason}"[:MAX_PARAM_CHARS])]
        if not decided.decision.keep:
            tags += [RunTag("stopped_at_step", str(decided.rung)), RunTag("verdict", "stopped")]
        self.client.log_batch(run_id, tags=tags)

    def _label(self, arm_id: str | None) -> str | None:
        """An arm's label from its run's tags (None: no such arm run)."""
        if arm_id is None or (run_id := self.arm_runs.get(arm_id)) is None:
            return None
        return self.client.get_run(run_id).data.tags.get("arm_label", arm_id)

    def note_look(self, history: Mapping[str, Any]) -> None:
        """seeds=auto: the looks so far as the search run's sequential.json; the last look on each arm's parent run
        (an arm still open at the last look: unsettled)."""
        self.client.log_dict(self.search_run_id, dict(history), LOOKS)
        look, now = history["looks"][-1], int(time.time() * 1000)
        for arm, state in look["states"].items():
            if (run_id := self.arm_runs.get(arm)) is not None:
                status = "unsettled" if state["status"] == "open" and history.get("finished") else state["status"]
                self.client.log_batch(
                    run_id,
                    metrics=[Metric("sequential_seeds", float(state["seeds"]), now, look["number"])],
                    tags=[RunTag(f"look{look['number']}", f"{status} at {state['seeds']} seeds")],
                )

    # -- after the search -------------------------------------------------------------------------

    def finish(self, summary: Summary, report_dir: Path | None, out: Path) -> None:
        """Every arm run's step series, final figures and `status` / `verdict` tags (`arm_metrics`, `arm_tags`); on
        the search run the record of `out` (`record/`, what `load_search` reads back), the report, the verdict table
        and the recommendation; then close all runs."""
        now = int(time.time() * 1000)
        by_id = {status.arm_id: arm for arm, status in summary.statuses.items() if status.status != EQUIVALENT}
        for arm_id, run_id in self.arm_runs.items():
            if (arm := by_id.get(arm_id)) is None:
                continue
            tags = arm_tags(summary, arm)
            self.client.log_batch(
                run_id,
                metrics=self._unlogged(run_id, arm_metrics(summary, arm, now)),
                tags=[RunTag(k, v[:MAX_PARAM_CHARS]) for k, v in tags.items()],
            )
        for name in RECORD_FILES:
            if (out / name).exists():
                self.client.log_artifact(self.search_run_id, str(out / name), RECORD)
        if report_dir is not None:
            self.client.log_artifacts(self.search_run_id, str(report_dir), "report")
        self._log_table(status_table(summary), VERDICTS)
        self.client.log_batch(
            self.search_run_id,
            tags=[
                # a machine field: summary.json's recommendation, figure for figure (its `reason` rounds them)
                RunTag("recommendation", json.dumps(asdict(summary.recommendation))[:MAX_PARAM_CHARS]),
                RunTag("rule", summary.rule),
            ],
        )
        self.close("FINISHED")

    def tag_runs(self, search: Mapping[str, str], arms: Mapping[str, Mapping[str, str]]) -> None:
        """More tags on the search run (`search`) and on arm runs by arm id (`arms`): a confirm search names its
        screen's folder and experiment there, and each confirmed arm's screen arm id and screen Δ."""
        self.client.log_batch(self.search_run_id, tags=[RunTag(k, str(v)[:MAX_PARAM_CHARS]) for k, v in search.items()])
        for arm_id, tags in arms.items():
            if (run_id := self.arm_runs.get(arm_id)) is not None:
                self.client.log_batch(run_id, tags=[RunTag(k, str(v)[:MAX_PARAM_CHARS]) for k, v in tags.items()])

    def _unlogged(self, run_id: str, metrics: list[Metric]) -> list[Metric]:
        """The `metrics` whose (step, value) the run does not hold yet: a finish that runs again (a resume of a
        finished search) logs nothing twice, and only what its analysis changed."""
        held = set(self.client.get_run(run_id).data.metrics)
        logged = {
            key: {(m.step, m.value) for m in self.client.get_metric_history(run_id, key)}
            for key in {m.key for m in metrics} & held
        }
        return [m for m in metrics if (m.step, m.value) not in logged.get(m.key, set())]

    def _log_table(self, table: dict[str, list[Any]], name: str) -> None:
        """`log_table` on the search run, replacing the table an earlier finish logged (`log_table` appends)."""
        if name not in {a.path for a in self.client.list_artifacts(self.search_run_id)}:
            self.client.log_table(self.search_run_id, table, name)
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            pd.DataFrame(table).to_json(path, orient="split", index=False, date_format="iso")  # log_table's format
            self.client.log_artifact(self.search_run_id, str(path))

    def close(self, status: str) -> None:
        """End every run still open: seed runs (normally ended with their trials), arm runs, the search run."""
        for run_id in list(self._open_seed_runs):
            self._end(run_id, status)
        for run_id in self.arm_runs.values():
            self.client.set_terminated(run_id, status)
        self.client.set_terminated(self.search_run_id, status)


# -- the layout of an arm run after the search, and reading a search back ------------------------------------------


def curve_level(summary: Summary) -> str:
    """The level in the step series' interval names: "ci95" for the unadjusted 95% interval (alpha 0.05)."""
    return f"ci{100 * (1 - (summary.alpha or 0.05)):.3g}"


def series_metrics(summary: Summary, arm: str, timestamp: int) -> list[Metric]:
    """An arm's step series on the primary aggregation p: `curve/mean_<p>` (its mean over its seeds at each
    milestone it reached) and, for searched arms, `curve/delta_<p>`, `curve/ci95_low_<p>`, `curve/ci95_high_<p>`
    (paired Δ against the control and its unadjusted (1 - alpha) interval, the level in the name, where >= 2 seeds
    are paired)."""
    p, ci = summary.primary, curve_level(summary)
    return [
        metric
        for point in summary.series.get(arm, [])
        for metric in _metrics(
            {
                f"{CURVE}mean_{p}": point.mean,
                f"{CURVE}delta_{p}": point.delta,
                f"{CURVE}{ci}_low_{p}": point.ci_low,
                f"{CURVE}{ci}_high_{p}": point.ci_high,
            },
            timestamp,
            point.step,
        )
    ]


def arm_metrics(summary: Summary, arm: str, timestamp: int) -> list[Metric]:
    """An arm run's step series (`series_metrics`) and its final figures at the step they were measured:

    - every arm: from its `ArmStatus` on the primary aggregation p, `mean_<p>`, `seeds`, `at_step` (the step all
      these were measured at: a stopped arm's stop step) and (searched arms with figures) `paired_delta_<p>`,
      `ci_low_<p>`, `ci_high_<p>`, `ci_level_<p>`, `control_mean_<p>` (the control's mean at that step on those
      seeds): the answer's interval (fixed rule: Holm-adjusted; sequential rule: the looks' repeated interval; stopped:
      unadjusted at the rung), its kind in the tag `interval`;
    - the control: `mean_<agg>` over all its seeds per aggregation;
    - analysed arms under the fixed rule: the same figures per other aggregation, and `p_holm_<agg>`.
    """
    status, p = summary.statuses[arm], summary.primary
    final: dict[str, float | None] = {}
    if status.status == "control":
        final.update({f"mean_{agg}": mean for agg, mean in summary.control_mean.items()})
    if status.status == "analysed" and summary.rule == "fixed":
        for agg, f in summary.arms[arm].items():
            figures = (f.delta, f.ci_low, f.ci_high, f.level, f.mean, f.p_holm)
            final.update({f"{key}_{agg}": v for key, v in zip(FIGURES + ("p_holm",), figures)})
    if status.status != "control":
        figures = (status.delta, status.ci_low, status.ci_high, status.level, status.mean)
        final.update({f"{key}_{p}": v for key, v in zip(FIGURES, figures)})
    final[f"mean_{p}"] = status.mean if status.status != "control" else final.get(f"mean_{p}", status.mean)
    if status.status != "control" and status.control_mean is not None:
        final[f"control_mean_{p}"] = status.control_mean
    final["seeds"] = len(status.seeds) if status.seeds else None
    final["at_step"] = status.step
    return series_metrics(summary, arm, timestamp) + _metrics(final, timestamp, status.step or 0)


def arm_tags(summary: Summary, arm: str) -> dict[str, str]:
    """An arm run's tags after the search: `status` (its text), `verdict` (the answer under the search's `rule`),
    `paired_<p>` (Δ [interval] (its kind and level) as text, figures to 2 decimals), `interval` (that kind and level:
    "Holm 99.17%", "unadjusted 95% at step 20", "sequential boundary 98.75%"), `reason` (a stop's rung decision with
    the leader named, a failure's error, a look),
    `verdict_<agg>` per aggregation of the fixed-sample analysis (descriptive under the sequential rule); the
    control's run names the suggestions that acted as it (`control-equivalent`, never trained: no run of their own)."""
    status, p = summary.statuses[arm], summary.primary
    tags = {"status": status.text, "verdict": status.verdict, "rule": summary.rule}
    if status.status == "control":
        tags[f"paired_{p}"] = "Δ ≡ 0 (the reference)"
        equivalents = [name for name, s in summary.statuses.items() if s.status == EQUIVALENT]
        if equivalents:
            tags[EQUIVALENT] = "; ".join(equivalents)
    elif status.delta is not None and status.level is not None:
        kind = interval_words(summary, status)
        tags[f"paired_{p}"] = _paired_text(status.delta, status.ci_low, status.ci_high, kind)
        tags["interval"] = kind
    if status.reason:
        tags["reason"] = status.reason
    if status.status == "stopped":
        tags["stopped_at_step"] = str(status.step)
        tags["reason"] = f"stopped at step {status.step}: {status.reason}"
    prefix = "descriptive_verdict_" if summary.rule == "sequential" else "verdict_"
    tags.update({f"{prefix}{agg}": f.verdict for agg, f in summary.arms.get(arm, {}).items()})
    return tags


def status_table(summary: Summary) -> dict[str, list[Any]]:
    """Every arm's status and answer as the columns of an MLflow table artifact (`verdicts.json`)."""
    rows = list(summary.statuses.items())
    columns: dict[str, list[Any]] = {"arm": [arm for arm, _ in rows]}
    for key in ("status", "text", "verdict", "step", "delta", "ci_low", "ci_high", "level", "mean", "reason"):
        columns[key] = [getattr(s, key) for _, s in rows]
    columns["control_mean"] = [s.control_mean for _, s in rows]
    columns["interval"] = [interval_words(summary, s) for _, s in rows]
    columns["seeds"] = [len(s.seeds) for _, s in rows]
    return columns
