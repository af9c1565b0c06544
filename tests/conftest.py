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
