"""An MLflow store laid out as a search leaves it (tests only): a search run holding benchmarks.json and one
run per (arm, seed) tagged as `tune_dfrl.tracking.writer` tags them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient

from tune_dfrl.backends.benchmarks import BenchmarkSet


@dataclass(frozen=True)
class SearchStore:
    client: MlflowClient
    uri: str
    experiment: str  # experiment id
    search_run: str  # run id of the search's run

    @classmethod
    def create(cls, folder: Path, name: str, benchmarks: BenchmarkSet) -> SearchStore:
        """A sqlite store in `folder` with experiment `name` and its search run."""
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        experiment = client.create_experiment(name, artifact_location=(folder / "artifacts").as_uri())
        search = client.create_run(experiment, tags={"tune_dfrl.role": "search"}).info.run_id
        client.log_dict(
            search,
            [{"name": b.name, "domain": b.domain, "items": b.items} for b in benchmarks.benchmarks],
            "benchmarks.json",
        )
        return cls(client, uri, experiment, search)

    def seed_run(self, arm_id: str, label: str, seed: int, parent: str | None = None) -> str:
        """A child run of one (arm, seed) cell; its id."""
        tags = {"tune_dfrl.role": "seed", "arm_id": arm_id, "arm_label": label, "method": label, "seed": str(seed)}
        if parent is not None:
            tags["mlflow.parentRunId"] = parent
        return self.client.create_run(self.experiment, tags=tags).info.run_id
