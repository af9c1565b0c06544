"""verl's driver (trainers/verl/driver.py): which overrides start the trial's Ray node, and that node, started while
the driver module imports, on a real Ray: the trial's size and folder, loopback only, the driver connected to it, its
exit code kept, nothing of it left when the driver ends. The real verl runs of tests/trainers/verl/test_verl_search_cpu.py go
through the same module (their private Ray's size, sockets and folders are asserted there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from reliability_helpers import LOOPBACK, alive, listening, ray_programs, session_members, short_tmp, wait_for

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.trainers.verl.driver import RAY_INIT, split_overrides
from tune_dfrl.trainers.verl.launcher import child_env
from tune_dfrl.trainers.verl.recipe import (
    VerlRecipe,
    build_overrides,
    default_recipe,
    private_ray_logical_cpus,
    ray_temp_dir,
)

ARM = ArmSpec("baseline", {}, "1e2006d35802", "baseline")


def cpu_recipe(**changes) -> VerlRecipe:
    paths = dict(model_path="/models/m", train_files=["/data/train.parquet"], val_files=["/data/val.parquet"])
    return VerlRecipe.from_dict(default_recipe(device="cpu", **paths, **changes))


def test_a_trials_overrides_give_its_ray_settings_to_the_node_and_the_rest_to_verl(tmp_path: Path) -> None:
    """A cpu trial's overrides: the private Ray's settings (the last one of a key wins: the recipe's own overrides
    come after ours) start the node; verl gets every other override, in order, and no Ray setting it would refuse."""
    recipe = cpu_recipe(overrides=[f"{RAY_INIT}object_store_memory=123456789"])
    overrides = build_overrides(recipe, ARM, 0, tmp_path)
    node, rest = split_overrides(overrides)
    assert node == {
        "num_cpus": private_ray_logical_cpus(recipe),
        "num_gpus": 1,
        "object_store_memory": 123456789,
        "temp_dir": str(ray_temp_dir(tmp_path)),
        "include_dashboard": False,
    }
    assert rest == [line for line in overrides if RAY_INIT not in line] and len(rest) == len(overrides) - 7


def test_overrides_that_do_not_start_a_node_reach_verl_unchanged() -> None:
    """Another address (a running cluster) or none: no node; a deleted setting is not passed to the node."""
    sizes = [f"+{RAY_INIT}num_cpus=4", f"+{RAY_INIT}num_gpus=1", "data.seed=3"]
    for address in ([f"+{RAY_INIT}address='127.0.0.1:6379'"], [f"+{RAY_INIT}address=auto"], []):
        assert split_overrides([*sizes, *address]) == (None, [*sizes, *address])
    node, rest = split_overrides([f"+{RAY_INIT}address=local", *sizes, f"~{RAY_INIT}num_gpus"])
    assert node == {"num_cpus": 4} and rest == ["data.seed=3"]


# Stands in for verl's main_ppo: imported (by the driver's import thread), then run as __main__, where it connects to
# the address the driver gave it, as verl's `ray.init(**ray_kwargs.ray_init)` does, describes what it sees, waits for
# the test's go and exits with status 3.
FAKE_DRIVER = """
import json, os, pathlib, sys, threading, time
IMPORTED_IN = threading.current_thread().name
if __name__ == "__main__":
    import ray
    address = sys.argv[-1].split("=", 1)[1].strip("'")
    context = ray.init(address=address)
    seen = {
        "argv": sys.argv[1:],
        "first_import_in": sys.modules["fake_driver"].IMPORTED_IN,
        "resources": ray.cluster_resources(),
        "nodes": len(ray.nodes()),
        "session_dir": context.address_info["session_dir"],
        "gcs_address": context.address_info["gcs_address"],
    }
    pathlib.Path(os.environ["FAKE_OUT"]).write_text(json.dumps(seen))
    while not pathlib.Path(os.environ["FAKE_OUT"] + ".go").exists():
        time.sleep(0.05)
    sys.exit(3)
"""


def start_driver(root: Path, argv: list[str], out: Path) -> subprocess.Popen:
    """The driver running the stand-in (written under `root`) on `argv`, in a session of its own, with a trial's
    environment (launcher.child_env: token authentication, loopback); the stand-in writes what it saw to `out`;
    output to root/driver.log."""
    (root / "fake_driver.py").write_text(FAKE_DRIVER)
    code = "import sys; from tune_dfrl.trainers.verl import driver; driver.main(sys.argv[1:], 'fake_driver')"
    env = child_env(root / "metrics.jsonl") | {"PYTHONPATH": str(root), "FAKE_OUT": str(out)}
    with (root / "driver.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code, *argv], cwd=root, env=env, start_new_session=True, stdout=log, stderr=log
        )


@contextmanager
def connected_driver(root: Path, argv: list[str], out: Path) -> Iterator[subprocess.Popen]:
    """`start_driver`, once the stand-in has connected to the trial's node and written `out`; on leaving, whatever of
    the driver's session is left is killed."""
    child = start_driver(root, argv, out)
    try:
        wait_for(lambda: out.exists() or child.poll() is not None, 120, "the stand-in driver to connect")
        assert child.poll() is None, (root / "driver.log").read_text()[-3000:]
        yield child
    finally:
        for pid in session_members(child.pid):
            os.kill(pid, 9)
        child.wait()


@pytest.mark.integration
def test_the_driver_starts_the_trials_ray_while_verl_imports_and_ends_it_with_verl(tmp_path: Path) -> None:
    out, ray_dir = tmp_path / "seen.json", short_tmp("rt-driver-")
    settings = {"address": "local", "num_cpus": 3, "num_gpus": 1, "object_store_memory": 80 * 1024**2}
    argv = ["data.seed=3", *(f"+{RAY_INIT}{k}={v}" for k, v in settings.items())]
    argv += [f"+{RAY_INIT}_temp_dir={ray_dir}", f"+{RAY_INIT}include_dashboard=false"]
    with connected_driver(tmp_path, argv, out) as child:
        seen = json.loads(out.read_text())
        running = session_members(child.pid)
        sockets = listening(running)
        programs = ray_programs(running)
        (tmp_path / "seen.json.go").touch()
        child.wait(timeout=60)
        try:
            wait_for(lambda: not session_members(child.pid), 30, "the node's processes to end", poll_s=0.1)
        except TimeoutError:
            pass
        left = session_members(child.pid)
    assert child.returncode == 3
    assert seen["first_import_in"] == "import-verl-driver"  # imported beside the node's start, not after it
    assert seen["argv"][0] == "data.seed=3" and len(seen["argv"]) == 2  # only the node's address was added
    assert seen["argv"][1] == f"++{RAY_INIT}address='{seen['gcs_address']}'" and seen["nodes"] == 1
    sized = {key: seen["resources"].get(key) for key in ("CPU", "GPU", "object_store_memory")}
    assert sized == {"CPU": 3.0, "GPU": 1.0, "object_store_memory": float(80 * 1024**2)}
    assert Path(seen["session_dir"]).parent == ray_dir and seen["gcs_address"].startswith("127.0.0.1:")
    # worker output still reaches verl's log; no autoscaler on a one-node Ray, no API server without a dashboard
    assert "log_monitor.py" in programs and not {"monitor.py", "dashboard.py"} & programs, programs
    assert len(running) > 5 and sockets and {s for s in sockets if s[1] not in LOOPBACK} == set(), sockets
    assert left == set() and not any(alive(pid) for pid in running)


@pytest.mark.integration
def test_a_trial_that_asks_for_rays_dashboard_gets_its_server(tmp_path: Path) -> None:
    """`ray_kwargs.ray_init.include_dashboard=true` in a recipe's overrides: the trial's node runs Ray's dashboard
    (its API server, `dashboard.py`), which a node without a dashboard does not start (`services.start_node`)."""
    out, ray_dir = tmp_path / "seen.json", short_tmp("rt-dash-")
    argv = [f"+{RAY_INIT}address=local", f"+{RAY_INIT}num_cpus=1", f"+{RAY_INIT}_temp_dir={ray_dir}"]
    with connected_driver(tmp_path, [*argv, f"+{RAY_INIT}include_dashboard=true"], out) as child:
        programs = ray_programs(session_members(child.pid))
        (tmp_path / "seen.json.go").touch()
        child.wait(timeout=60)
    assert child.returncode == 3 and "dashboard.py" in programs, programs


@pytest.mark.integration
def test_a_node_that_cannot_start_fails_the_driver_with_rays_error(tmp_path: Path) -> None:
    """verl's driver does not run then: the child exits non-zero with Ray's message and leaves no process."""
    child = start_driver(tmp_path, [f"+{RAY_INIT}address=local", f"+{RAY_INIT}num_cpus=-1"], tmp_path / "seen")
    child.wait(timeout=120)
    said = (tmp_path / "driver.log").read_text()
    assert child.returncode != 0 and "Resource quantities must be nonnegative" in said.splitlines()[-1], said[-3000:]
    assert not (tmp_path / "seen").exists()
    # what the node had started (its GCS, Ray's agents) is ended by its reaper, as when `ray.init` fails so
    wait_for(lambda: not session_members(child.pid), 30, "the failed node's processes to end", poll_s=0.1)
