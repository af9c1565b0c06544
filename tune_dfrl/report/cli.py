"""The report command: `python -m tune_dfrl.report runs=PATH | experiment=NAME [key=value ...]`.

`runs=` a search's folder (its `results.jsonl` and record), a `results.jsonl`, or an external CSV run table;
`experiment=` a search's MLflow experiment (`tune_dfrl.tracking.reader`). A search is re-analysed with its own
options (those named on the command line replace them) and written to OUT/rerender; a CSV to ./report.
`transfer.screen.COLUMN=VALUE ... transfer.target.COLUMN=VALUE ...` on a CSV: the transfer check between the two
slices (`tune_dfrl.report.transfer`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import hydra
from mlflow.tracking import MlflowClient
from sqlalchemy.engine import make_url

from tune_dfrl.backends.benchmarks import BenchmarkSet
from tune_dfrl.config.settings import ReportSettings, from_mapping, register_settings
from tune_dfrl.report.analysis import analyze, analyze_search, default_control, print_summary, write_report
from tune_dfrl.report.scores import ScoreTable, load_csv, load_results
from tune_dfrl.report.transfer import print_transfer, transfer_report
from tune_dfrl.state.folder import MLFLOW_DB, REPORT, RERENDER, SUMMARY
from tune_dfrl.state.records import SearchRecord
from tune_dfrl.tracking.reader import load_search
from tune_dfrl.tracking.writer import repoint_folder_store

SEARCH_OPTIONS = ("aggregations", "delta", "alpha", "seed", "flip_k")  # what a re-render of a search may change
TRANSFER_SLICES = ("transfer.screen.", "transfer.target.")  # open mappings, like filter.: Hydra's `+` optional


def log_report(paths: dict[str, Path], run_id: str, tracking_uri: str | None = None) -> None:
    """Log a re-rendered report's files as artifacts (folder `rerender`) of an MLflow run, e.g. the search-level run
    (the search's own report stays in `report`)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    for path in paths.values():
        client.log_artifact(run_id, str(path), artifact_path=RERENDER)


def load_source(cfg: Any) -> tuple[ScoreTable, SearchRecord | None]:
    """The score table a report config points at: runs= (CSV or search directory) or experiment=, and the search's
    record when the source is a search (search.json in the directory, `record/` on the MLflow search run).

    Checked first, before reading anything: `aggregations` must be a list (`aggregations=db` reaches
    the config as the string 'db', which the CLI would split into letters).
    """
    if isinstance(cfg.aggregations, str):
        raise ValueError(
            f"aggregations={cfg.aggregations} is one string, not a list; write aggregations=[{cfg.aggregations}] "
            "(several: aggregations=[db,macro])"
        )
    bench = BenchmarkSet.from_file(cfg.benchmarks) if cfg.benchmarks else None
    if bool(cfg.runs) == bool(cfg.experiment):
        raise ValueError("give exactly one source: runs=PATH (a CSV or a search output directory) or experiment=NAME")
    if cfg.experiment:
        if (folder := store_folder(cfg.mlflow.tracking_uri)) is not None:
            repoint_folder_store(folder)
        return load_search(cfg.experiment, cfg.mlflow.tracking_uri, bench)
    path = Path(cfg.runs)
    if path.is_dir() or path.suffix == ".jsonl":
        if cfg.filter:
            raise ValueError("filter.* applies to CSV run tables only")
        folder = path if path.is_dir() else path.parent
        repoint_folder_store(folder)  # a copied or moved search folder: its MLflow store names its own artifacts
        return load_results(path, bench), SearchRecord.read(folder)
    if not path.exists():
        raise FileNotFoundError(f"runs={path}: no such file")
    return load_csv(path, bench, dict(cfg.filter), cfg.arm_column), None


def store_folder(tracking_uri: str | None) -> Path | None:
    """The search folder whose own sqlite store `tracking_uri` is (OUT/mlflow.db beside OUT/search.json), else None."""
    if not tracking_uri or not tracking_uri.startswith("sqlite:") or not (database := make_url(tracking_uri).database):
        return None
    folder = Path(database).parent
    return folder if Path(database).name == MLFLOW_DB and SearchRecord.read(folder) is not None else None


def report_from_config(cfg: Any, given: frozenset[str] = frozenset()) -> None:
    """The report of `cfg`. A search (`load_source`) is analysed by `analyze_search` with the options named on the
    command line (`given`; the others are the search's), and written by default to OUT/rerender (runs=OUT, or
    experiment= of a search folder's own store; else ./rerender), never over the search's own report unless out=
    says so."""
    if (transfer := cfg.get("transfer")) and (transfer.screen or transfer.target):
        return transfer_from_config(cfg)
    table, record = load_source(cfg)
    if record is not None:
        options = {k: cfg[k] for k in SEARCH_OPTIONS if k in given}
        summary = analyze_search(table, record, **options)
        folder = Path(cfg.runs) if cfg.runs else store_folder(cfg.mlflow.tracking_uri) or Path(".")
        default_out = (folder if folder.is_dir() else folder.parent) / RERENDER
    else:
        summary = analyze(
            table,
            cfg.control or default_control(table),
            list(cfg.aggregations or []) or None,
            cfg.delta,
            cfg.alpha,
            cfg.seed,
            cfg.flip_k,
        )
        runs_dir = Path(cfg.runs) if cfg.runs and Path(cfg.runs).is_dir() else None
        default_out = runs_dir / REPORT if runs_dir else Path(REPORT)
    out = Path(cfg.out) if cfg.out else default_out
    if summary.arms:
        paths = write_report(summary, table, out.absolute())
    else:  # every searched arm stopped or failed: nothing compared, the summary only
        out.mkdir(parents=True, exist_ok=True)
        paths = {"summary": out.absolute() / SUMMARY}
        paths["summary"].write_text(summary.to_json())
    print_summary(summary)
    for kind, path in paths.items():
        print(f"{kind:>8}: {path}")
    if table.origin.get("search_run_id") and cfg.mlflow.log_artifacts:
        log_report(paths, table.origin["search_run_id"], cfg.mlflow.tracking_uri)
        print(f"logged to MLflow run {table.origin['search_run_id']} ({RERENDER}/)")


# ------------------------------------------------------------------ the transfer check (tune_dfrl.report.transfer)


def transfer_from_config(cfg: Any) -> None:
    """transfer.screen.COLUMN=VALUE ... transfer.target.COLUMN=VALUE ...: the transfer check between two slices of
    the CSV run table runs= (filter.* applies to both), on the first of aggregations (default db), written to out=
    (default ./report) as transfer.md, .json, .png; prints the verdict and the paths."""
    if cfg.experiment:
        raise ValueError("transfer.* compares two slices of a CSV run table (runs=PATH), not an MLflow experiment")
    if not cfg.runs:
        raise ValueError("transfer.* needs the CSV run table: runs=PATH")
    common = dict(cfg.filter)
    check, paths = transfer_report(
        cfg.runs,
        {**common, **cfg.transfer.screen},
        {**common, **cfg.transfer.target},
        Path(cfg.out or REPORT),
        cfg.control,
        cfg.aggregations,
        cfg.alpha,
        cfg.seed,
        BenchmarkSet.from_file(cfg.benchmarks) if cfg.benchmarks else None,
        cfg.arm_column,
    )
    print_transfer(check, paths)


def main() -> None:
    """Entry point: Hydra `key=value` overrides; `filter.COLUMN=VALUE` may omit Hydra's `+`. The statistics
    settings (delta, alpha, flip_k, seed) are checked first (`tune_dfrl.config.settings.ReportSettings`)."""
    sys.argv = [("+" + a if a.startswith("filter.") else a) for a in sys.argv]
    sys.argv = [("+" + a if a.startswith(TRANSFER_SLICES) else a) for a in sys.argv]
    given = frozenset(a.split("=", 1)[0].lstrip("+~") for a in sys.argv[1:] if "=" in a)
    register_settings()

    @hydra.main(config_path="pkg://tune_dfrl.conf", config_name="report", version_base="1.3")
    def run(cfg: Any) -> None:
        try:
            from_mapping(ReportSettings, {f.name: cfg[f.name] for f in dataclasses.fields(ReportSettings)})
            report_from_config(cfg, given)
        except (ValueError, FileNotFoundError) as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    run()
