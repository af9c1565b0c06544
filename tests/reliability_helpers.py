"""Helpers for the reliability tests: tiny embedded searches, the CLI in a subprocess, and cleanup of
the processes a test started (by process group and by a unique marker in their command line)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tune_dfrl.state.records import read_records
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS

records = read_records  # the product's reader of JSON-lines logs, under the name the tests use

# 4 GRPO steps, milestones at 2 and 4, the first benchmark of each domain, a small base model (cached by content).
FIRST_OF_DOMAIN: dict[str, str] = {}
for benchmark in BENCHMARKS:
    FIRST_OF_DOMAIN.setdefault(benchmark.info().domain, benchmark.name)
TINY = (
    "steps=4",
    "milestone_every=2",
    "backend.prompts_per_step=8",
    "backend.lr=0.001",
    "backend.base.steps=200",
    f"backend.eval_benchmarks=[{','.join(FIRST_OF_DOMAIN.values())}]",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_tmp(prefix: str) -> Path:
    """A short private folder under /tmp (Ray's socket paths must stay under ~100 characters); its name marks our processes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def search_command(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "tune_dfrl.search", *overrides]


def start(
    command: list[str], cwd: Path, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen:
    """A subprocess in its own session (so its whole process group can be stopped), output to `log`."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, marker: str | None = None, sig: int = signal.SIGTERM, grace_s: float = 20.0) -> None:
    """Stop a process we started and its process group, then SIGKILL anything whose command line or environment holds
    `marker` (Ray renames its actors' processes, e.g. `ray::ImplicitFunc.train`, so a trial's command line loses the
    session folder; its environment keeps the RAY_TMPDIR it was started with), until none is left."""
    for s in (sig, signal.SIGKILL):
        try:
            os.killpg(proc.pid, s)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    if marker is not None:
        deadline = time.time() + grace_s
        while (left := marked(marker) + with_environment(marker)) and time.time() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)


def interrupt(
    proc: subprocess.Popen, ready: Callable[[], None], send: Callable[[], None], marker: str, wait_s: float
) -> float:
    """Once `ready()` returns, `send()` a signal and wait up to `wait_s` for `proc` to exit; returns the seconds it
    took. `proc` and what is left of it (`stop`, `marker`) are ended in any case."""
    try:
        ready()
        began = time.monotonic()
        send()
        proc.wait(timeout=wait_s)
        return time.monotonic() - began
    finally:
        stop(proc, marker=marker)


def marked(*markers: str) -> list[int]:
    """Live processes (other than this one) whose command line contains every one of `markers`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if all(marker in command for marker in markers):
            pids.append(int(entry.name))
    return pids


def with_environment(marker: str) -> list[int]:
    """Live processes (other than this one) whose environment holds `marker` (e.g. a RAY_TMPDIR value)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in environment:
            pids.append(int(entry.name))
    return pids


LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def listening(pids: set[int]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of each TCP socket the processes `pids` listen on."""
    found = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            found |= {
                (process.name(), c.laddr.ip, c.laddr.port)
                for c in process.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.NoSuchProcess:
            continue
    return found


def alive(pid: int) -> bool:
    """Running: zombies, which only wait for their parent to reap them, count as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def signal_all(pids: set[int], sig: int) -> None:
    """Send `sig` to each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def ray_programs(pids: set[int]) -> set[str]:
    """What Ray runs in the processes `pids`: the file names of Ray's own Python scripts (`dashboard.py`,
    `log_monitor.py`, the autoscaler's `monitor.py`, ...) and the titles Ray's processes give themselves
    (`ray::DashboardAgent`, `ray::IDLE`, ...)."""
    found = set()
    for pid in pids:
        try:
            words = psutil.Process(pid).cmdline()
        except psutil.NoSuchProcess:
            continue
        found |= {Path(word).name for word in words if word.endswith(".py") and "/ray/" in word}
        if words and words[0].startswith("ray::"):
            found.add(words[0])
    return found


def descendants(root: int) -> set[int]:
    """`root` and every live process below it (by parent pid)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    found, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in found]
        found.update(children)
        frontier = children
    return {pid for pid in found if alive(pid)}


def session_members(session: int) -> set[int]:
    """The live processes of session `session` (one pass over /proc: quick enough to freeze a run mid-step; Ray's
    workers each lead a process group of their own, inside the session of the process that started Ray)."""
    members = set()
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            members.add(int(entry.name))
    return members


VERL_SUPERVISOR = "tune_dfrl.trainers.verl.supervise"  # the process trainers/verl/launcher.py starts per trial


def verl_trees(folder: Path) -> set[int]:
    """The live verl processes of the trials under `folder`: each supervisor and everything below it."""
    return set().union(*(descendants(pid) for pid in marked(VERL_SUPERVISOR, str(folder))))


def trained_steps(logged: list[dict]) -> list[int]:
    """The steps of verl file-logger records (`verl_metrics.jsonl`) that trained (validation-only ones excluded)."""
    return [r["step"] for r in logged if "timing_s/step" in r["data"]]


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its content (to show that a refused command changed nothing)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# `python -m tune_dfrl.search` with the synthetic backend of search_helpers registered (tests only): fast trials,
# the real CLI, Ray, Optuna and MLflow. `+backend.sleep_s=S` slows each training step.
SYNTHETIC_CLI = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import ray.cloudpickle
import search_helpers
from tune_dfrl.backends import registry as backend_registry
from tune_dfrl.search import cli as search
ray.cloudpickle.register_pickle_by_value(search_helpers)
backend_registry.BACKENDS["synthetic"] = search_helpers.build
sys.argv = ["tune_dfrl.search", *sys.argv[1:]]
search.main()
"""
SMALL = (
    "backend.name=synthetic",
    "space=maxvar_keep",
    "seeds=2",
    "arms=1",
    "steps=10",
    "milestone_every=5",
    "ray.num_cpus=2",
)


def synthetic_search_command(*overrides: str, cli: str = SYNTHETIC_CLI) -> list[str]:
    return [sys.executable, "-c", cli, *SMALL, *overrides]


# The same CLI with the bookkeeping bug that `tune_dfrl.tune.trial_watch` guards against planted: the searcher never
# hears that the control's seed-1 trial ended, so once every other trial is done Ray Tune waits on the searcher.
UNTOLD_END_CLI = SYNTHETIC_CLI.replace(
    "search.main()",
    """from tune_dfrl.tune import searcher as pairing
told = pairing.PairedRepeater.on_trial_complete
def untold(self, trial_id, result=None, error=False):
    arm_id, seed = self._cells[trial_id]
    if (arm_id, seed) != (self.control.arm_id, 1):
        told(self, trial_id, result, error)
pairing.PairedRepeater.on_trial_complete = untold
search.main()""",
)


def resume_search(command: list[str], root: Path, env: dict[str, str], ray_tmp: Path, timeout_s: float) -> None:
    """Run `command resume=true` to its end (log: root/resumed.log), then end what is left of its Ray (marked by
    `ray_tmp`) and remove `ray_tmp`; the resumed search must exit 0."""
    resume = start([*command, "resume=true"], cwd=root, env=env, log=root / "resumed.log")
    try:
        resume.wait(timeout=timeout_s)
    finally:
        stop(resume, marker=str(ray_tmp))
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert resume.returncode == 0, (root / "resumed.log").read_text()[-3000:]


# `python -c TWO_NODES TEMP_DIR`: a Ray cluster of two nodes on this machine, a head and a worker node of 1 CPU each
# (`ray.cluster_utils.Cluster`: `ray start` refuses a second node in Ray's local-only mode), with the local-only mode
# and the token authentication of its environment; prints one JSON line (the address; each node's id and raylet
# pid, the head's GCS pid), then holds the cluster until it is stopped. Ray's address file of the machine goes in
# TEMP_DIR/ray too. The GCS checks each node every second and marks it dead after 3 failed checks (Ray's defaults:
# every 3 s, 5 failures), so a killed node is lost in seconds; a check of a slow but live node fails only after Ray's
# default 10 s without an answer.
TWO_NODES = """import json, os, sys, time
os.environ["RAY_TMPDIR"] = sys.argv[1]
os.makedirs(os.path.join(sys.argv[1], "ray"), exist_ok=True)
from ray._private import ray_constants
from ray.cluster_utils import Cluster
nodes = {"num_cpus": 1, "include_dashboard": False}
checks = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
cluster = Cluster(initialize_head=True, head_node_args={**nodes, "temp_dir": sys.argv[1], "_system_config": checks})
worker = cluster.add_node(**nodes)
cluster.wait_for_nodes()
def described(node):
    return {"id": node.node_id, "raylet": node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid}
gcs = cluster.head_node.all_processes[ray_constants.PROCESS_TYPE_GCS_SERVER][0].process.pid
head = {**described(cluster.head_node), "gcs": gcs}
print(json.dumps({"address": cluster.address, "head": head, "worker": described(worker)}))
sys.stdout.flush()
while True:
    time.sleep(3600)
"""


def trial_cells(raylet: int) -> set[tuple[str, int]]:
    """The cells (arm id, seed) of the Tune trial actors among the workers of the node whose raylet is `raylet`, by
    the trial folder each works in (`<arm id>-seed<k>-<trial id>`, `tune_dfrl.tune.trial.trial_dirname`)."""
    cells = set()
    for pid in descendants(raylet):
        try:
            folder = Path(f"/proc/{pid}/cwd").readlink().name
        except OSError:
            continue
        arm, _, rest = folder.partition("-seed")
        if rest and rest.split("-")[0].isdigit():
            cells.add((arm, int(rest.split("-")[0])))
    return cells
