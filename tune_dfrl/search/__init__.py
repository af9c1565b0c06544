"""A search in three stages: `plan` (`plan_search` -> `Plan`: settings, paths and services checked, nothing
written), `run` (`holding`, `train` -> `Trained`: the folder lock, Ray Tune), `finish` (`finish` -> `Summary`: the
report, summary.json, MLflow). The command `python -m tune_dfrl.search` is `cli` (`main`, `run_search`)."""
