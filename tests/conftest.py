"""Shared fixtures: one real local Ray cluster per test session; the `integration` marker kept honest for it; the
order of the tests (`LONG_MODULES`, or `--shuffle=SEED`)."""

from __future__ import annotations

import os
import random

import pytest

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")

INTEGRATION = "integration"  # pyproject.toml's marker: starts a Ray cluster, verl, or a search (make check skips it)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the test modules, and the tests within each module, in an order shuffled with SEED (in place of "
        "LONG_MODULES' order; the same SEED gives the same order, on every xdist worker)",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("shuffle")
    return None if seed is None else f"shuffled order: --shuffle={seed}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses `ray_session` (itself, or through a fixture) must be marked `integration`: fail it before the
    cluster starts otherwise. (The session fixture itself cannot tell: its `request.node` is the session, and it runs
    for the first test that asks only.)"""
    if "ray_session" in getattr(item, "fixturenames", ()) and item.get_closest_marker(INTEGRATION) is None:
        pytest.fail(
            f"{item.nodeid} uses the ray_session fixture (a Ray cluster) but is not marked {INTEGRATION}: add "
            f"`pytestmark = pytest.mark.{INTEGRATION}` to its module (or @pytest.mark.{INTEGRATION} to the test), "
            "so that `make check` (-m 'not integration') leaves it out",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray cluster, as a search starts its own: loopback only, token authentication
    (`tune_dfrl.cluster.services.start_private_ray`); it never joins a cluster already on the machine. Only for tests
    marked `integration` (`pytest_runtest_setup` fails the others)."""
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)

    items.sort(key=rank)  # stable: the tests of a module keep their order
    seed = config.getoption("shuffle")
    if seed is not None:
        items[:] = shuffled(items, seed)


def shuffled(items: list[pytest.Item], seed: int) -> list[pytest.Item]:
    """The modules in an order drawn with `seed`, each module's tests together, in an order drawn with it too. The
    draw depends only on `seed` and on which tests were collected (modules by path, tests in collection order), so
    one seed gives one order: on every xdist worker (which must all collect the same order), and when rerun."""
    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules)
    rng.shuffle(order)
    result: list[pytest.Item] = []
    for module in order:
        tests = modules[module]
        rng.shuffle(tests)
        result.extend(tests)
    return result
