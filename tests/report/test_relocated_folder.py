"""A search folder copied elsewhere is a search of its own: the report reads and writes only inside the copy.

MLflow keeps absolute `file://` artifact locations in the folder's store; the report command re-points them at the
folder where the store is now (`tune_dfrl.tracking.writer.repoint_store`) before it reads the search's record or
logs its re-render. The original is checked byte for byte."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from mlflow import MlflowClient
from reliability_helpers import tree_bytes
from search_folder import build_search

from tune_dfrl.tracking.writer import repoint_store


def report(*overrides: str) -> None:
    """`python -m tune_dfrl.report` as a user runs it, from another folder."""
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.report", *overrides], capture_output=True, text=True, cwd="/", timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def artifact_locations(store: Path) -> list[str]:
    with sqlite3.connect(store) as db:
        found = [row[0] for row in db.execute("SELECT artifact_location FROM experiments")]
        found += [row[0] for row in db.execute("SELECT artifact_uri FROM runs")]
    db.close()
    return found


def test_a_copied_search_folder_re_renders_and_logs_only_inside_the_copy(tmp_path: Path) -> None:
    original = build_search(tmp_path / "original").out
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(original, copy)
    untouched = tree_bytes(original)
    own = (copy / "mlartifacts").as_uri()
    assert not any(u.startswith(own) for u in artifact_locations(copy / "mlflow.db"))  # as copied: the original's

    report(f"runs={copy}")
    assert all(u.startswith(own) for u in artifact_locations(copy / "mlflow.db"))
    store = f"sqlite:///{copy / 'mlflow.db'}"
    report("experiment=tune_dfrl/original", f"mlflow.tracking_uri={store}")

    assert tree_bytes(original) == untouched
    rerendered = json.loads((copy / "rerender" / "summary.json").read_text())
    assert rerendered["source"]["kind"] == "mlflow" and rerendered["verdicts"]
    client = MlflowClient(store)
    search_run = client.search_runs(
        [client.get_experiment_by_name("tune_dfrl/original").experiment_id], "tags.`tune_dfrl.role` = 'search'"
    )[0]
    assert search_run.info.artifact_uri.startswith(own)
    assert {Path(a.path).name for a in client.list_artifacts(search_run.info.run_id, "rerender")} >= {"summary.json"}
    assert list(copy.joinpath("mlartifacts").rglob("rerender/summary.json"))


def test_repointing_changes_only_locations_under_another_folders_mlartifacts(tmp_path: Path) -> None:
    """Locations elsewhere (another store's, a server's) and those already in place are kept."""
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE experiments (artifact_location TEXT)")
        con.execute("CREATE TABLE runs (artifact_uri TEXT)")
        con.execute("CREATE TABLE logged_models (artifact_location TEXT)")
        con.executemany(
            "INSERT INTO experiments VALUES (?)",
            [("file:///old/place/mlartifacts",), ("file:///old/place/mlartifacts/0",), ("s3://bucket/artifacts",)],
        )
        con.executemany(
            "INSERT INTO runs VALUES (?)",
            [("file:///old/place/mlartifacts/r1/artifacts",), ((tmp_path / "mlartifacts" / "r2").as_uri(),)],
        )
    con.close()
    here = (tmp_path / "mlartifacts").as_uri()
    assert repoint_store(f"sqlite:///{db}", here) == 3
    assert artifact_locations(db) == [here, f"{here}/0", "s3://bucket/artifacts", f"{here}/r1/artifacts", f"{here}/r2"]
    assert repoint_store(f"sqlite:///{db}", here) == 0
    assert repoint_store(f"sqlite:///{tmp_path / 'absent.db'}", here) == 0 and not (tmp_path / "absent.db").exists()
