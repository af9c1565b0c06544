"""Reading a search back from MLflow (the layout `tune_dfrl.tracking.writer` logs): its seed runs' milestones as a
score table (`load_mlflow`) and the record its search run carries under `record/` (`load_search`), so
`python -m tune_dfrl.report experiment=NAME` gives the search's own answer."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from mlflow.artifacts import download_artifacts

from tune_dfrl.backends.base import ACCURACY, LENGTH
from tune_dfrl.backends.benchmarks import BenchmarkSet
from tune_dfrl.report.scores import ScoreTable, listing, table_from_arm_rows
from tune_dfrl.state.folder import BENCHMARKS
from tune_dfrl.state.records import SearchRecord
from tune_dfrl.tracking.writer import RECORD, ROLE


def load_mlflow(experiment: str, tracking_uri: str | None = None, bench: BenchmarkSet | None = None) -> ScoreTable:
    """Load a search from its MLflow experiment.

    Seed runs: tagged `tune_dfrl.role=seed`, `arm_id`, `arm_label`, `seed` (optional `method`),
    with metrics `acc/<benchmark>` (and `len/<benchmark>`) logged at step = training step. The
    search-level run (`tune_dfrl.role=search`) carries the `benchmarks.json` artifact, used unless
    `bench` is given.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = [e.name for e in client.search_experiments()]
        raise ValueError(
            f"no MLflow experiment named {experiment!r} at {tracking_uri or 'the default tracking URI'}; experiments: {listing(names)}"
        )

    def runs_with_role(role: str) -> list[Any]:
        runs, token = [], None
        while True:
            page = client.search_runs(
                [found.experiment_id],
                f"tags.`{ROLE}` = '{role}'",
                order_by=["attributes.start_time DESC"],
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    origin = {"kind": "mlflow", "experiment": experiment, "tracking_uri": tracking_uri or ""}
    search_runs = runs_with_role("search")
    if search_runs:
        origin["search_run_id"] = search_runs[0].info.run_id
    if bench is None:
        if not search_runs:
            raise ValueError(
                f"experiment {experiment!r} has no search-level run (tag tune_dfrl.role=search) holding "
                "benchmarks.json; pass the benchmark metadata explicitly"
            )
        with tempfile.TemporaryDirectory() as tmp:
            meta = download_artifacts(
                run_id=origin["search_run_id"], artifact_path=BENCHMARKS, dst_path=tmp, tracking_uri=tracking_uri
            )
            bench = BenchmarkSet.from_file(meta)
    seed_runs = runs_with_role("seed")
    if not seed_runs:
        raise ValueError(f"experiment {experiment!r} has no seed run (tag tune_dfrl.role=seed)")
    rows = []
    for run in seed_runs:
        tags = run.data.tags
        missing = [t for t in ("arm_id", "seed") if t not in tags]
        if missing:
            raise ValueError(f"seed run {run.info.run_id} lacks tags {missing}; seed runs need arm_id, arm_label, seed")
        lengths = {
            (m.key, m.step): m.value
            for name in bench.names
            for m in client.get_metric_history(run.info.run_id, LENGTH + name)
        }
        for name in bench.names:
            for metric in client.get_metric_history(run.info.run_id, ACCURACY + name):
                rows.append(
                    {
                        "arm_id": tags["arm_id"],
                        "label": tags.get("arm_label") or tags["arm_id"],
                        "method": tags.get("method", ""),
                        "parent_run_id": tags.get("mlflow.parentRunId", ""),
                        "seed": tags["seed"],
                        "step": metric.step,
                        "benchmark": name,
                        "score": metric.value,
                        "length_chars": lengths.get((LENGTH + name, metric.step), math.nan),
                    }
                )
    if not rows:
        raise ValueError(
            f"experiment {experiment!r}: no seed run has acc/<benchmark> metrics for {', '.join(bench.names)}"
        )
    return table_from_arm_rows(pd.DataFrame(rows), bench, origin)


def load_search(
    experiment: str, tracking_uri: str | None = None, bench: BenchmarkSet | None = None
) -> tuple[ScoreTable, SearchRecord | None]:
    """A search read back from its MLflow experiment: the score table of its seed runs (`load_mlflow`) and the
    record its search run carries under `record/` (None for an experiment without one)."""
    table = load_mlflow(experiment, tracking_uri, bench)
    run_id = table.origin.get("search_run_id")
    client = MlflowClient(tracking_uri=tracking_uri)
    if not run_id or not client.list_artifacts(run_id, RECORD):
        return table, None
    with tempfile.TemporaryDirectory() as tmp:
        folder = download_artifacts(run_id=run_id, artifact_path=RECORD, dst_path=tmp, tracking_uri=tracking_uri)
        return table, SearchRecord.read(Path(folder))
