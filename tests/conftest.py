"""Shared fixtures: one real local Ray cluster per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray cluster (never joins a cluster already on the machine)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 1024**2,
            log_to_driver=False,
        )
    yield ray
    ray.shutdown()


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
