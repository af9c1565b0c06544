"""The search folder OUT: every name in it, defined here once.

    search.lock         held by the driver running the search (one search per folder)
    search.json         the resolved plan (space, seeds, recipe, scheduler, ...)
    benchmarks.json     the backend's benchmarks (name, domain, items)
    state/events.jsonl  the searcher's and the scheduler's events, replayed by `resume=true`
    state/attempts.jsonl  one line per driver run (0, then one per resume)
    cells/<arm_id>/seed<k>/milestones.jsonl   the milestones each cell reported (replayed on restart)
    cells/<arm_id>/seed<k>/checkpoint/        the cell's backend checkpoints
    results.jsonl       one line per (arm, seed, milestone)
    failures.jsonl      (arm, seed) cells that failed after their last retry
    stops.jsonl         arms the paired scheduler stopped at a rung
    control_equivalent.jsonl  suggestions that act as the control (never trained)
    sequential.json     seeds=auto: the looks
    optuna.db           the Optuna study (a view of state/events.jsonl, written again by a resume's replay)
    ray/                Ray Tune's experiment state (tune/, then resume<k>/ per resumed attempt)
    mlflow.db, mlartifacts/   the default MLflow store and its artifacts
    report/             report.md, report.html, figures, summary.json
    summary.json        the report's summary
    confirm.json        a confirm search (`confirm.screen=DIR`): both stages side by side (report/confirm.md too)
    rerender/           `python -m tune_dfrl.report runs=OUT` (the search's own report stays in report/)

No file in OUT names OUT by an absolute path (the MLflow store's artifact locations are re-pointed when the folder
has moved: `tune_dfrl.tracking.writer.repoint_store`), so a folder can be copied or moved and used where it is.
"""

LOCK = "search.lock"
PLAN = "search.json"
BENCHMARKS = "benchmarks.json"
STATE = "state"
EVENTS = "events.jsonl"
ATTEMPTS = "attempts.jsonl"
CELLS = "cells"
MILESTONES = "milestones.jsonl"
CHECKPOINT = "checkpoint"
RESULTS = "results.jsonl"
FAILURES = "failures.jsonl"
STOPS = "stops.jsonl"
EQUIVALENTS = "control_equivalent.jsonl"
LOOKS = "sequential.json"
OPTUNA_DB = "optuna.db"
RAY = "ray"
MLFLOW_DB = "mlflow.db"
ARTIFACTS = "mlartifacts"
REPORT = "report"
SUMMARY = "summary.json"
CONFIRM = "confirm.json"
RERENDER = "rerender"
