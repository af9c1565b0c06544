"""MLflow, one layout (DESIGN §8): `writer` (`SearchTracker`, the driver's Ray Tune callback: a search run, a run
per arm, a child run per seed; the UI command) and `reader` (`load_mlflow`, `load_search`: the same search read
back)."""
