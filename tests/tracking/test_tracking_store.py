"""A search's new sqlite MLflow store is a copy of the empty store MLflow builds (`tracking.new_sqlite_store`)."""

from __future__ import annotations

import importlib.metadata
import logging
import sqlite3
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tune_dfrl.tracking.writer import new_sqlite_store


def schema(database: Path) -> tuple[list, list]:
    """Every table's and index's definition, and the alembic revision MLflow checks an existing store against. A
    definition is the set of its SQL's lines: MLflow's migrations write a table's constraints in an order that
    varies from one build to the next (set order)."""
    with sqlite3.connect(database) as db:
        entries = db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        revision = db.execute("SELECT version_num FROM alembic_version").fetchall()
    db.close()
    lines = [
        (kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
        for kind, name, sql in entries
    ]
    return lines, revision


def test_a_new_store_is_mlflows_empty_store_with_its_default_experiment_in_the_search_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TUNE_DFRL_CACHE", str(tmp_path / "cache"))
    built = tmp_path / "built.db"
    MlflowClient(f"sqlite:///{built}").search_experiments()  # MLflow's own: every migration
    store, artifacts = tmp_path / "out" / "mlflow.db", (tmp_path / "out" / "mlartifacts").as_uri()
    new_sqlite_store(f"sqlite:///{store}", artifacts)

    template = tmp_path / "cache" / "mlflow" / f"empty-{importlib.metadata.version('mlflow')}.db"
    assert template.is_file() and schema(store) == schema(built)
    assert sorted(p.name for p in store.parent.iterdir()) == ["mlflow.db"]  # no partial copy left
    with caplog.at_level(logging.INFO, logger="mlflow.store.db.utils"):
        caplog.clear()
        client = MlflowClient(f"sqlite:///{store}")
        [default] = client.search_experiments()
    assert [r.getMessage() for r in caplog.records if r.name == "mlflow.store.db.utils"] == []  # no table built

    assert (default.experiment_id, default.name, default.artifact_location) == ("0", "Default", f"{artifacts}/0")
    experiment = client.create_experiment("search", artifact_location=artifacts)
    run = client.create_run(experiment).info.run_id
    client.log_metric(run, "score/db", 1.5, step=2)
    assert [(m.step, m.value) for m in client.get_metric_history(run, "score/db")] == [(2, 1.5)]

    kept = store.read_bytes()
    new_sqlite_store(f"sqlite:///{store}", artifacts)  # an existing store is left as it is
    assert store.read_bytes() == kept


def test_a_cache_that_cannot_be_written_leaves_the_store_to_mlflow(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cache").write_text("a file where the cache folder goes")
    monkeypatch.setenv("TUNE_DFRL_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "out" / "mlflow.db"
    new_sqlite_store(f"sqlite:///{store}", (tmp_path / "out" / "mlartifacts").as_uri())
    assert not store.exists()
    MlflowClient(f"sqlite:///{store}").search_experiments()
    assert store.exists()
