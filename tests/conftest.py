"""Shared fixtures: one real local Ray cluster per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray cluster, as a search starts its own: loopback only, token authentication
    (`tune_dfrl.cluster.services.start_private_ray`); it never joins a cluster already on the machine."""
    import ray

    from tune_dfrl.cluster.services import start_private_ray, stop_ray

    if not ray.is_initialized():
        start_private_ray(num_cpus=2, log_to_driver=False)
    yield ray
    stop_ray()


@pytest.fixture(scope="session")
def embedded_cache():
    """The base-model cache shared by every test of the session (`.cache/tune_dfrl`, gitignored).

    Sets TUNE_DFRL_CACHE for this process; pass the returned path as recipe["cache_dir"] to code
    that runs elsewhere (Ray workers), so each base model is built once per checkout.
    """
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / ".cache" / "tune_dfrl"
    path.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TUNE_DFRL_CACHE")
    os.environ["TUNE_DFRL_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TUNE_DFRL_CACHE", None)
    else:
        os.environ["TUNE_DFRL_CACHE"] = previous


# Modules that run for minutes (real verl trainings, clusters, many full searches), in decreasing length (the sums
# of their tests' `--durations` under `make test`): collected first, so that under `pytest -n 3 --dist loadfile
# --no-loadscope-reorder` (make test) each worker starts on one and the workers end together. (xdist's default
# `--loadscope-reorder` would instead send the modules with the most tests first, which puts these last.)
LONG_MODULES = (
    "test_verl_search_cpu.py",
    "test_reliability_servers.py",
    "test_reliability_hangs.py",
    "test_reliability_lost_trials.py",
    "test_search_sequential.py",
    "test_reliability_resume.py",
    "test_reliability_kills.py",
    "test_verl_search.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)

    items.sort(key=rank)  # stable: the tests of a module keep their order
