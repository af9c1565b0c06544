"""A search's private Ray cluster is closed to everyone but its user.

One tiny embedded search (`python -m tune_dfrl.search`, in a subprocess as a user runs it) is examined while its
trials run: every listening TCP socket of its process tree is on loopback, and a Ray client without the cluster's
token is refused (the same client with the token, read from the driver's environment, is let in). Its environment
has `RAY_AUTH_MODE=disabled`, which a private cluster ignores, and a fresh HOME, where no token file may appear.
After it ends: the token is in no file it or Ray wrote, and nothing it wrote is world-writable.
Token mode with no token at hand is an error before any cluster is contacted.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from reliability_helpers import (
    LOOPBACK,
    TINY,
    descendants,
    listening,
    ray_programs,
    records,
    search_command,
    short_tmp,
    signal_all,
    start,
    stop,
    wait_for,
)

from tune_dfrl.cluster.services import LOCAL_ONLY

# A Ray client of the cluster's GCS at argv[1]: prints whether the cluster let it in.
CLIENT = """import sys
from ray._raylet import InnerGcsClient
from ray.exceptions import AuthenticationError
try:
    InnerGcsClient.standalone(sys.argv[1], None, 60000)  # ms: the GCS of a loaded machine answers late
    print("accepted")
except AuthenticationError:
    print("refused")
"""


@dataclass(frozen=True)
class Observed:
    root: Path
    out: Path
    home: Path
    ray_folder_mode: int  # of the private cluster's folder, <RAY_TMPDIR>/tdfrl-<uid>
    ray_files: dict[str, bool]  # each file Ray wrote there -> holds the token
    listeners: set[tuple[str, str, int]]  # (process name, address, port) of every listening socket of the tree
    token: str
    clients: dict[str, str]  # client's credentials -> "accepted" | "refused"
    ray_programs: set[str]  # what Ray ran in the tree while its trials ran (reliability_helpers.ray_programs)
    workers: dict[str, bool]  # each Ray worker process's output file (logs/worker-*.out) -> it ran an actor or task


def is_trial_worker(pid: int) -> bool:
    """A Ray worker process (`ray::...`) other than the node's agents."""
    try:
        title = " ".join(psutil.Process(pid).cmdline())  # (its name is cut at 15 characters)
    except psutil.NoSuchProcess:
        return False
    return title.startswith("ray::") and not title.split()[0].endswith("Agent")


def client(gcs: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", CLIENT, gcs], env=env, capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or done.stderr[-2000:]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, embedded_cache: Path) -> Observed:
    root = tmp_path_factory.mktemp("security")
    out, home, ray_tmp = root / "out", root / "home", short_tmp("rt-sec-")
    home.mkdir()
    env = {
        "HOME": str(home),
        "RAY_TMPDIR": str(ray_tmp),
        "TUNE_DFRL_CACHE": str(embedded_cache),  # the suite's base models
        "RAY_AUTH_MODE": "disabled",  # what a user may have set: a private cluster authenticates anyway
    }
    command = search_command(
        "space=difffilter_band", "seeds=2", "arms=1", *TINY, f"out={out}", f"control_cache={root / 'cache'}"
    )
    driver = start(command, cwd=root, env=env, log=root / "search.log")
    try:
        wait_for(lambda: records(out / "results.jsonl") or driver.poll() is not None, 600, "a first milestone")
        assert driver.poll() is None, (root / "search.log").read_text()[-3000:]
        tree = descendants(driver.pid)
        listeners = listening(tree)
        programs = ray_programs(tree)
        [gcs] = [psutil.Process(pid) for pid in tree if psutil.Process(pid).name() == "gcs_server"]
        token = gcs.environ()["RAY_AUTH_TOKEN"]  # the driver set it before starting the cluster's processes
        [gcs_port] = {c.laddr.port for c in gcs.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(home)}
        # the driver and its trials are frozen while the clients call, so that the search cannot finish (and end
        # its cluster) before the last one; the cluster's own processes (GCS, raylet, agents) keep running
        frozen = {driver.pid} | {pid for pid in tree if is_trial_worker(pid)}
        signal_all(frozen, signal.SIGSTOP)
        try:
            clients = {
                credentials: client(f"127.0.0.1:{gcs_port}", bare | extra)
                for credentials, extra in {
                    "none": {},
                    "another token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
                    "the token": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
                }.items()
            }
        finally:
            signal_all(frozen, signal.SIGCONT)
        driver.wait(timeout=900)
    finally:
        stop(driver, marker=str(ray_tmp), sig=signal.SIGKILL)
    try:
        assert driver.returncode == 0, (root / "search.log").read_text()[-3000:]
        folder = ray_tmp / f"tdfrl-{os.getuid()}"
        ray_files = {str(p.relative_to(folder)): token.encode() in p.read_bytes() for p in regular_files(folder)}
        workers = {p.name: ran_something(p.read_text()) for p in folder.glob("ray/session_*/logs/worker-*.out")}
        mode = stat.S_IMODE(folder.stat().st_mode)
        return Observed(root, out, home, mode, ray_files, listeners, token, clients, programs, workers)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def ran_something(worker_output: str) -> bool:
    """Ray marks a worker's output with the name of each actor or task it runs (`:actor_name:`, `:task_name:`)."""
    return ":actor_name:" in worker_output or ":task_name:" in worker_output


def regular_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if not p.is_symlink() and p.is_file()]


@pytest.mark.integration
def test_every_listening_socket_of_the_search_is_on_loopback(observed: Observed) -> None:
    names = {name for name, _, _ in observed.listeners}
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names), names
    assert {(name, ip, port) for name, ip, port in observed.listeners if ip not in LOOPBACK} == set()


@pytest.mark.integration
def test_the_private_cluster_runs_no_autoscaler_log_monitor_or_api_server(observed: Observed) -> None:
    """One node never scales, the search does not print its workers' output, and without a dashboard Ray's API server
    would serve usage statistics only, which are off (`services.start_node`). (Ray's dashboard agent runs: the
    raylet needs it.)"""
    started = observed.ray_programs
    assert "ray::DashboardAgent" in started and not {"monitor.py", "log_monitor.py", "dashboard.py"} & started, started


@pytest.mark.integration
def test_the_private_cluster_starts_a_worker_process_only_for_work(observed: Observed) -> None:
    """Ray starts no idle workers ahead of demand there (`services.NO_WORKER_PRESTART`): each trial is an actor with a
    process of its own, so prestarted workers would only take CPU and memory while the search starts."""
    assert observed.workers and all(observed.workers.values()), observed.workers


@pytest.mark.integration
def test_a_ray_client_without_the_clusters_token_is_refused(observed: Observed) -> None:
    assert observed.clients == {"none": "refused", "another token": "refused", "the token": "accepted"}


@pytest.mark.integration
def test_the_token_is_in_no_file_and_no_token_file_is_written(observed: Observed) -> None:
    assert len(observed.token) == 64 and not (observed.home / ".ray").exists()
    files = regular_files(observed.root)  # the output folder, the search's log
    assert {observed.out / "search.json", observed.out / "mlflow.db", observed.root / "search.log"} <= set(files)
    assert [p for p in files if observed.token.encode() in p.read_bytes()] == []
    assert any(name.endswith("logs/raylet.out") for name in observed.ray_files)  # Ray's own logs, too
    assert [name for name, holds in observed.ray_files.items() if holds] == []


@pytest.mark.integration
def test_nothing_the_search_wrote_is_world_writable(observed: Observed) -> None:
    written = [observed.out, *observed.out.rglob("*")]
    assert [p for p in written if not p.is_symlink() and p.stat().st_mode & stat.S_IWOTH] == []
    # Ray makes its own folders world-writable: they live in a folder only the user can open
    assert observed.ray_folder_mode == 0o700


# check_ray_address on a port that listens (no Ray behind it: the credentials are refused before any call)
CHECK = """import socket
from tune_dfrl.cluster.services import ServiceError, check_ray_address
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        check_ray_address(f"127.0.0.1:{s.getsockname()[1]}")
    except ServiceError as error:
        print(error)
"""


@pytest.mark.parametrize(
    ("credentials", "said"),
    [
        ({}, "RAY_AUTH_MODE=token but no Ray authentication token is set: put the cluster's token in RAY_AUTH_TOKEN"),
        ({"RAY_AUTH_TOKEN_PATH": "/nonexistent"}, "RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty"),
    ],
    ids=["no token anywhere", "a token path without a file"],
)
def test_token_mode_without_a_token_at_hand_is_an_error(tmp_path: Path, credentials: dict[str, str], said: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env |= {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token", LOCAL_ONLY: "0", **credentials}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(said), done.stdout + done.stderr[-2000:]
