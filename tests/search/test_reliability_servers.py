"""The search plugs into services a team already runs, each started here on loopback and stopped by its PID:

- a Ray cluster of two nodes, a head and a worker of 1 CPU each (`reliability_helpers.TWO_NODES`), on loopback with
  token authentication, whose workers cannot import tune_dfrl (the editable install is hidden from them) and record
  what they write: the search attaches with `ray.address=127.0.0.1:PORT` and the cluster's token in its environment,
  and ships the project in its runtime_env; without the token, or with another one, it stops with one `error:` line
  before anything is written;
- an MLflow tracking server (`mlflow server`): the search logs to it, checked through its REST API.

One tiny embedded search (`python -m tune_dfrl.search`, in a subprocess as a user runs it) uses both. A synthetic
search's driver is killed and the search resumed on the cluster. Each test that kills a node has a cluster of its own
(`own_cluster`, the same two nodes, no MLflow server), so that every test passes alone and in any order: a synthetic
search loses the worker node (its raylet SIGKILLed) mid-search: it finishes, with one note of the loss; a verl search
(stand-in child) loses the worker node whole (every process of the node SIGKILLed, as when its machine goes): the
lost trial continues from its verl checkpoint on the head, and each trial's child started its own Ray beside the
cluster; and another search loses the head node (its GCS and raylet SIGKILLed): it stops with one `error:` line and
finishes on resume.
Never `ray stop`: a cluster is stopped through its process group and its private temp dir.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from reliability_helpers import (
    TINY,
    TWO_NODES,
    descendants,
    free_port,
    records,
    search_command,
    short_tmp,
    signal_all,
    start,
    stop,
    synthetic_search_command,
    trained_steps,
    trial_cells,
    verl_trees,
    wait_for,
)
from verl_stand_in import command_override, write_model

from tune_dfrl.cluster.services import LOCAL_ONLY
from tune_dfrl.state.control_cache import MILESTONE_FIELDS
from tune_dfrl.tracking.writer import UI_SERVER_ENV
from tune_dfrl.trainers.verl.export import export_tasks
from tune_dfrl.trainers.verl.recipe import OBJECT_STORE_BYTES, hydra_quote
from tune_dfrl.tune.trial import MILESTONES, cell_dir

pytestmark = pytest.mark.integration  # Ray clusters, an MLflow server and searches

# Loaded first by every Python process of the cluster: drops the editable finder that maps tune_dfrl to this checkout.
HIDE_PROJECT = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___tune_dfrl")]
"""

# ... and appends "PID PATH" to the file named by $TDFRL_TEST_WRITES for each file under $TDFRL_TEST_WRITES_UNDER it
# opens for writing, renames to, or opens as a sqlite database.
WRITES, WRITES_UNDER = "TDFRL_TEST_WRITES", "TDFRL_TEST_WRITES_UNDER"
RECORD_WRITES = f"""import os
_log, _under = os.environ.get({WRITES!r}), os.environ.get({WRITES_UNDER!r})
def _record(event, args):
    if event == "open" and not isinstance(args[0], int) and args[2] & (os.O_WRONLY | os.O_RDWR):
        path = args[0]
    elif event in ("os.rename", "sqlite3.connect"):
        path = args[1] if event == "os.rename" else args[0]
    else:
        return
    path = os.path.abspath(os.fsdecode(path))
    if path.startswith(_under) and path != _log:
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{{os.getpid()}} {{path}}\\n".encode())
        os.close(fd)
if _log and _under:
    sys.addaudithook(_record)
"""

# Run on a cluster worker without any runtime_env: can it import tune_dfrl?
PROBE = """import ray, sys
ray.init(address=sys.argv[1], log_to_driver=False)
visible = ray.remote(num_cpus=0)(lambda: __import__("importlib.util").util.find_spec("tune_dfrl") is not None)
print("visible" if ray.get(visible.remote()) else "hidden")
"""

# The cluster's nodes: all of them, and those alive.
NODES = """import ray, sys
ray.init(address=sys.argv[1], log_to_driver=False)
print(len(ray.nodes()), sum(1 for node in ray.nodes() if node["Alive"]))
"""


@dataclass(frozen=True)
class Services:
    root: Path
    ray_address: str
    ray_tmp: Path
    tracking_uri: str | None  # the MLflow server's (None: a cluster without one, `own_cluster`)
    ray_env: dict[str, str]  # the environment that reaches the cluster: its token, loopback (Ray's local-only mode)
    head: dict  # the head node's id, raylet pid and GCS pid
    worker: dict  # the worker node's id and raylet pid
    cluster: int  # the pid of the process that holds the cluster (TWO_NODES)


def environment(**changes: str) -> dict[str, str]:
    """This process's environment without Ray credentials, with `changes`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | changes


def rest(uri: str, endpoint: str, query: dict | None = None, body: dict | None = None) -> dict:
    """One call of the MLflow REST API: GET with `query`, or POST with a JSON `body`."""
    url = f"{uri}/api/2.0/mlflow/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def running_services(root: Path, tracking: bool) -> Iterator[Services]:
    """In `root`: the cluster of two nodes and, with `tracking`, the MLflow server; stopped on leaving."""
    hide = root / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_PROJECT + RECORD_WRITES)
    ray_tmp = short_tmp("rt-head-")
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), LOCAL_ONLY: "0"}
    cluster_env = {"PYTHONPATH": str(hide), WRITES: str(root / "writes.log"), WRITES_UNDER: str(root)}
    cluster = start(
        [sys.executable, "-c", TWO_NODES, str(ray_tmp)],
        cwd=root,
        env=environment(**ray_env, **cluster_env),
        log=root / "cluster.log",
    )
    server, uri = None, None
    try:
        if tracking:
            mlflow_port = free_port()
            server = start(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(mlflow_port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    f"sqlite:///{root / 'server.db'}",
                    "--artifacts-destination",
                    str(root / "server-artifacts"),
                ],
                cwd=root,
                env=UI_SERVER_ENV,  # as the printed `mlflow ui` runs: no job runner polling beside the tests
                log=root / "mlflow-server.log",
            )
            uri = f"http://127.0.0.1:{mlflow_port}"
            wait_for(lambda: healthy(uri) or server.poll() is not None, 120, "the MLflow server")
            assert server.poll() is None, (root / "mlflow-server.log").read_text()[-3000:]

        def described() -> list[str]:
            return [line for line in (root / "cluster.log").read_text().splitlines() if line.startswith("{")]

        wait_for(lambda: described() or cluster.poll() is not None, 180, "the Ray cluster")
        assert cluster.poll() is None, (root / "cluster.log").read_text()[-3000:]
        nodes = json.loads(described()[0])
        yield Services(root, nodes["address"], ray_tmp, uri, ray_env, nodes["head"], nodes["worker"], cluster.pid)
    finally:
        stop(cluster, marker=str(ray_tmp), sig=signal.SIGKILL)  # a throwaway cluster: no 30 s drain
        if server is not None:
            stop(server)
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The cluster and the MLflow server the module's tests share: none of them kills a node of it."""
    with running_services(tmp_path_factory.mktemp("services"), tracking=True) as running:
        yield running


@pytest.fixture
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A cluster of two nodes for one test alone (no MLflow server): the test may kill a node of it."""
    with running_services(tmp_path_factory.mktemp("cluster"), tracking=False) as running:
        yield running


def each_milestone_once(out: Path, steps: tuple[int, ...] = (5, 10)) -> list[dict]:
    """results.jsonl of a search of 4 cells: every milestone of every cell, each once; its lines."""
    lines = records(out / "results.jsonl")
    cells = {(r["arm_id"], r["seed"]) for r in lines}
    assert len(cells) == 4 and sorted((r["arm_id"], r["seed"], r["step"]) for r in lines) == sorted(
        (arm, seed, step) for arm, seed in cells for step in steps
    ), lines
    return lines


def lost_node_note(said: str, node: dict) -> str:
    """The search's one `note: lost node` line, which names `node` and says its trials run again."""
    notes = [line for line in said.splitlines() if line.startswith("note: lost node")]
    assert len(notes) == 1 and f"(id {node['id'][:8]}" in notes[0], said[-3000:]
    assert "run again from their last milestone" in notes[0], notes
    return notes[0]


def stand_in_verl_search(root: Path, services: Services, child: str, steps: int) -> list[str]:
    """The command of a verl search attached to the cluster whose trials run the stand-in child with option `child`
    (2 seeds, 1 arm, `steps` steps, a milestone every 2), its data, model and OUT (root/out) under `root`."""
    root.mkdir()
    train, val = export_tasks(root / "data", per_domain=4)
    model = write_model(root / "model")
    return search_command(
        "space=difffilter_band",
        "backend=verl",
        "backend.device=cpu",
        f"backend.model_path={hydra_quote(str(model))}",
        f"backend.train_files=[{hydra_quote(str(train))}]",
        f"backend.val_files=[{hydra_quote(str(val))}]",
        command_override(*child.split()),
        f"steps={steps}",
        "milestone_every=2",
        "seeds=2",
        "arms=1",
        "scheduler.name=fifo",
        "control_cache=null",
        f"out={root / 'out'}",
        f"ray.address={services.ray_address}",
    )


@pytest.fixture(scope="module")
def searched(services: Services) -> Path:
    out = services.root / "out"
    done = subprocess.run(
        search_command(
            "space=difffilter_band",
            "seeds=2",
            "arms=1",
            *TINY,
            "scheduler.name=fifo",
            f"out={out}",
            f"control_cache={services.root / 'cache'}",
            f"ray.address={services.ray_address}",
            f"mlflow.tracking_uri={services.tracking_uri}",
        ),
        cwd=services.root,
        env=environment(**services.ray_env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    ("credentials", "refusal"),
    [
        ({}, "demands an authentication token"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "refused this search's authentication token"),
    ],
    ids=["no token", "another token"],
)
def test_a_search_without_the_clusters_token_stops_before_writing_anything(
    services: Services, credentials: dict[str, str], refusal: str
) -> None:
    out = services.root / f"refused-{len(credentials)}"
    done = subprocess.run(
        search_command("space=difffilter_band", f"out={out}", f"ray.address={services.ray_address}"),
        cwd=services.root,
        env=environment(**credentials, **{LOCAL_ONLY: "0"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and said[-1].startswith(f"error: Ray cluster at ray.address='{services.ray_address}' ")
    assert refusal in said[-1] and "RAY_AUTH_MODE=token" in said[-1], said[-5:]
    assert not out.exists() and services.ray_env["RAY_AUTH_TOKEN"] not in done.stdout + done.stderr


def test_the_cluster_workers_never_saw_the_project(services: Services) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, services.ray_address],
        cwd=services.root,
        env=environment(**services.ray_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.stdout.strip().splitlines()[-1:] == ["hidden"], probe.stdout + probe.stderr[-3000:]


def test_a_search_attached_to_the_cluster_ran_its_trials_there(searched: Path, services: Services) -> None:
    lines = records(searched / "results.jsonl")
    assert {(r["label"] == "baseline", r["seed"]) for r in lines if r["final"]} == {
        (True, 0),
        (True, 1),
        (False, 0),
        (False, 1),
    }
    shipped = list(
        services.ray_tmp.glob("session_*/runtime_resources/py_modules_files/*/tune_dfrl/trainers/embedded/backend.py")
    )
    assert shipped, "the project package was not shipped to the cluster through the runtime_env"
    assert (searched / "summary.json").exists()


def test_the_tracking_server_received_parents_children_and_summaries(searched: Path, services: Services) -> None:
    uri = services.tracking_uri
    experiment_id = rest(uri, "experiments/get-by-name", {"experiment_name": f"tune_dfrl/{searched.name}"})[
        "experiment"
    ]["experiment_id"]
    runs = rest(uri, "runs/search", body={"experiment_ids": [experiment_id], "max_results": 100})["runs"]

    def tags(run: dict) -> dict[str, str]:
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    by_role: dict[str, list[dict]] = {}
    for run in runs:
        by_role.setdefault(tags(run)["tune_dfrl.role"], []).append(run)
    assert len(by_role["search"]) == 1 and len(by_role["arm"]) == 2 and len(by_role["seed"]) == 4
    parents = {run["info"]["run_id"] for run in by_role["arm"]}
    assert {tags(run)["mlflow.parentRunId"] for run in by_role["seed"]} == parents
    assert all(run["info"]["status"] == "FINISHED" for run in runs)
    for run in by_role["seed"]:
        history = rest(uri, "metrics/get-history", {"run_id": run["info"]["run_id"], "metric_key": "score/db"})[
            "metrics"
        ]
        assert sorted(int(m["step"]) for m in history) == [2, 4]
    summary = json.loads((searched / "summary.json").read_text())
    [searched_arm] = [run for run in by_role["arm"] if tags(run)["is_control"] == "false"]
    metrics = {m["key"]: m["value"] for m in searched_arm["data"]["metrics"]}
    figures = summary["arms"][tags(searched_arm)["arm_label"]]["db"]
    assert (
        metrics["paired_delta_db"] == pytest.approx(figures["delta"])
        and tags(searched_arm)["verdict"] == figures["verdict"]
    )
    artifacts = rest(uri, "artifacts/list", {"run_id": by_role["search"][0]["info"]["run_id"], "path": "report"})
    assert "report/summary.json" in {f["path"] for f in artifacts.get("files", [])}


def test_a_search_whose_driver_is_killed_resumes_on_the_cluster(services: Services) -> None:
    """The driver of a search attached to the cluster is SIGKILLed once a cell has finished (Ray then ends its
    trials: their actors are the driver's); the same command with `resume=true`, attached to the cluster again,
    finishes: what was recorded stays, every milestone of every cell is recorded once, no finished cell trains again."""
    root = services.root / "driver"
    root.mkdir()
    out = root / "out"
    args = (
        "ray.num_cpus=null",
        f"ray.address={services.ray_address}",
        "scheduler.name=fifo",
        "+backend.sleep_s=0.7",
        f"out={out}",
        f"control_cache={root / 'cache'}",
    )
    env = environment(**services.ray_env)
    driver = start(synthetic_search_command(*args), cwd=root, env=env, log=root / "search.log")
    try:
        wait_for(
            lambda: any(r["final"] for r in records(out / "results.jsonl")) or driver.poll() is not None,
            300,
            "a cell's last milestone",
            poll_s=0.2,
        )
        assert driver.poll() is None, (root / "search.log").read_text()[-3000:]
        driver.kill()
        driver.wait(timeout=60)
    finally:
        stop(driver)
    before = records(out / "results.jsonl")
    finished = {(r["arm_id"], r["seed"]) for r in before if r["final"]}
    assert finished and len(before) < 8, before  # killed with a cell finished and others not
    done = subprocess.run(
        synthetic_search_command(*args, "resume=true"), cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = each_milestone_once(out)
    assert after[: len(before)] == before
    assert not [r for r in after[len(before) :] if (r["arm_id"], r["seed"]) in finished]
    assert (out / "summary.json").exists()


def test_a_search_that_loses_a_node_finishes_every_cell_once_and_says_so(own_cluster: Services) -> None:
    """On a cluster of its own, whose worker node it kills. Two trials at a time, one per node; once the worker's has
    logged its first milestone (of 2), the worker's raylet is SIGKILLed; its trial runs again on the head."""
    services = own_cluster
    root, out, cache = services.root / "lost", services.root / "lost" / "out", services.root / "lost" / "cache"
    root.mkdir()
    command = synthetic_search_command(
        "ray.num_cpus=null",
        f"ray.address={services.ray_address}",
        "scheduler.name=fifo",
        "+backend.sleep_s=0.7",
        f"out={out}",
        f"control_cache={cache}",
    )
    driver = start(command, cwd=root, env=environment(**services.ray_env), log=root / "search.log")
    on_head: set[tuple[str, int]] = set()
    worker_raylet = services.worker["raylet"]

    def midway_on_the_worker() -> bool:
        """A trial runs on each node, and the worker's has logged its first milestone but not its last."""
        on_head.update(trial_cells(services.head["raylet"]))
        logged = {cell: records(cell_dir(out / "cells", *cell) / MILESTONES) for cell in trial_cells(worker_raylet)}
        midway = [cell for cell, steps in logged.items() if [r["step"] for r in steps] == [5]]
        return bool(on_head and midway) or driver.poll() is not None

    try:
        wait_for(midway_on_the_worker, 300, "a trial on each node, the worker's midway", poll_s=0.2)
        assert driver.poll() is None and on_head, (root / "search.log").read_text()[-3000:]
        os.kill(worker_raylet, signal.SIGKILL)
        driver.wait(timeout=300)
    finally:
        stop(driver)
    said = (root / "search.log").read_text()
    assert driver.returncode == 0, said[-3000:]
    lines = each_milestone_once(out)
    lost_node_note(said, services.worker)
    assert not any(dump in said for dump in ("Trial task failed", "Raylet is terminated", "marked dead")), said
    written = {Path(line.split(" ", 1)[1]) for line in (services.root / "writes.log").read_text().splitlines()}
    assert any(path.is_relative_to(out / "cells") for path in written), "the cluster's writes were not recorded"
    # the control cache holds each control seed's milestones, as results.jsonl has them, and nothing else
    control = json.loads((out / "search.json").read_text())["control"]["arm_id"]
    seeds = sorted({r["seed"] for r in lines if r["arm_id"] == control})
    stored = sorted(p for p in cache.rglob("*") if p.is_file())
    assert [(p.parent.name, p.name) for p in stored] == [(control, f"seed{seed}.jsonl") for seed in seeds], stored
    for seed, path in zip(seeds, stored, strict=True):
        milestones = sorted((r for r in lines if (r["arm_id"], r["seed"]) == (control, seed)), key=lambda r: r["step"])
        assert records(path) == [{k: r[k] for k in MILESTONE_FIELDS} for r in milestones], path
    driver_only = [
        out / name for name in ("results.jsonl", "failures.jsonl", "mlflow.db", "mlartifacts", "optuna.db", "report")
    ]
    assert not [p for p in written if p.is_relative_to(cache) or any(p.is_relative_to(d) for d in driver_only)]


@dataclass(frozen=True)
class LostVerl:
    out: Path
    ray_address: str  # the cluster's
    worker: dict  # the worker node lost (its id and raylet pid)
    cell: tuple[str, int]  # the cell whose trial ran there
    killed_verl: set[int]  # the processes of that trial's verl run among the node's, at the kill
    returncode: int
    said: str  # the search's output
    nodes: subprocess.CompletedProcess  # NODES run on the cluster once the search ended: its nodes, those alive


@pytest.fixture(scope="module")
def lost_verl(tmp_path_factory: pytest.TempPathFactory) -> LostVerl:
    """On a cluster of its own (stopped once the search is over and its nodes are counted): a verl search (the
    stand-in child, which keeps verl's checkpoints and resume and starts its own Ray as verl's main_ppo does:
    `ray.init` with the trial's `ray_kwargs.ray_init`; no training) runs two trials at a time, one per node, with its
    trial folders in OUT, which both nodes see. Once the worker's trial has recorded its first milestone (of 2; its
    checkpoint is saved before), every process of that node (raylet, Ray workers, the trial's verl run and its Ray) is
    frozen, then SIGKILLed, as when its machine goes. 50-100 s on an idle machine, up to 180 s beside the rest of
    `make test`: five stand-in starts, each starting a Ray instance, two at a time on the two 1-CPU nodes, and Ray's
    health checks marking the node dead (up to 30 s) before the retry."""
    with running_services(tmp_path_factory.mktemp("cluster"), tracking=False) as services:
        worker = services.worker
        root = services.root / "lost-verl"
        out = root / "out"
        command = stand_in_verl_search(root, services, "--start-ray --step-seconds 2", steps=4)
        driver = start(command, cwd=root, env=environment(**services.ray_env), log=root / "search.log")
        lost: list[tuple[str, int]] = []

        def midway_on_the_worker() -> bool:
            cells = trial_cells(worker["raylet"])
            lost[:] = [
                cell
                for cell in cells
                if [r["step"] for r in records(cell_dir(out / "cells", *cell) / MILESTONES)] == [2]
            ]
            return bool(lost) or driver.poll() is not None

        try:
            wait_for(midway_on_the_worker, 300, "the worker's verl trial at its first milestone", poll_s=0.2)
            assert driver.poll() is None, (root / "search.log").read_text()[-3000:]
            node = descendants(worker["raylet"])
            killed_verl = node & verl_trees(out)
            for sig in (signal.SIGSTOP, signal.SIGKILL):  # frozen first: nothing of the node runs on while it is listed
                signal_all(node, sig)
            driver.wait(timeout=300)
        finally:
            stop(driver)
        nodes = subprocess.run(
            [sys.executable, "-c", NODES, services.ray_address],
            env=environment(**services.ray_env),
            capture_output=True,
            text=True,
            timeout=300,
        )
        said = (root / "search.log").read_text()
        return LostVerl(out, services.ray_address, worker, lost[0], killed_verl, driver.returncode, said, nodes)


def test_a_verl_trial_on_a_lost_node_continues_from_its_checkpoint_on_the_survivor(lost_verl: LostVerl) -> None:
    """The search finishes with every milestone once and one note of the loss; the lost trial ran again on the head
    and its verl run resumed from the checkpoint of step 2: its second start begins at step 3."""
    assert lost_verl.returncode == 0, lost_verl.said[-3000:]
    each_milestone_once(lost_verl.out, steps=(2, 4))
    lost_node_note(lost_verl.said, lost_verl.worker)
    assert lost_verl.killed_verl  # the trial's verl run was lost with the node
    trial = cell_dir(lost_verl.out / "cells", *lost_verl.cell) / "checkpoint"
    starts = [run["first_step"] for run in records(trial / "verl_runs.jsonl")]
    assert starts == [1, 3], starts
    assert trained_steps(records(trial / "verl_metrics.jsonl")) == [3, 4]


def test_verl_trials_on_the_cluster_start_their_own_private_ray_on_loopback(lost_verl: LostVerl) -> None:
    """Each trial's child (the stand-in starts Ray as verl's main_ppo does) ran a new one-node Ray of the trial's size,
    on 127.0.0.1 only, with token authentication, and none joined the cluster: it holds its own two nodes only (the
    head, alive, and the worker lost)."""
    children = [json.loads(p.read_text()) for p in (lost_verl.out / "cells").glob("*/seed*/checkpoint/stand_in.json")]
    assert len(children) == 4
    for info in children:
        private = info["ray"]
        assert private["gcs_address"].startswith("127.0.0.1:") and private["gcs_address"] != lost_verl.ray_address
        assert private["nodes"] == 1 and "127.0.0.1" in private["listening"]
        assert set(private["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}  # loopback only
        assert private["resources"] == {"CPU": 16.0, "GPU": 1.0, "object_store_memory": float(OBJECT_STORE_BYTES)}
        assert info["env"]["RAY_ADDRESS"] is None and info["env"]["RAY_AUTH_MODE"] == "token"
    nodes = lost_verl.nodes
    assert nodes.stdout.strip().splitlines()[-1:] == ["2 1"], nodes.stdout + nodes.stderr[-3000:]


def test_a_search_that_loses_the_clusters_head_stops_with_the_resume_line_and_resumes(own_cluster: Services) -> None:
    """On a cluster of its own: it kills the head node (its GCS and raylet), which ends the cluster. Ray would keep the
    driver waiting for its GCS and end it 60 s later with its own fatal log line; the search stops within seconds
    with one `error:` line that says how to continue, and `resume=true` on this machine's own Ray
    (`ray.address=null`) finishes it with every milestone recorded once."""
    services = own_cluster
    root, out = services.root / "headless", services.root / "headless" / "out"
    root.mkdir()
    attached = (f"ray.address={services.ray_address}", "ray.num_cpus=null")
    settings = ("scheduler.name=fifo", "+backend.sleep_s=0.7", f"out={out}", "control_cache=null")
    driver = start(
        synthetic_search_command(*attached, *settings),
        cwd=root,
        env=environment(**services.ray_env),
        log=root / "search.log",
    )
    try:
        wait_for(lambda: bool(records(out / "results.jsonl")) or driver.poll() is not None, 300, "a first milestone")
        assert driver.poll() is None, (root / "search.log").read_text()[-3000:]
        for pid in (services.head["gcs"], services.head["raylet"]):
            os.kill(pid, signal.SIGKILL)
        lost_at = time.monotonic()
        driver.wait(timeout=120)
        took = time.monotonic() - lost_at
    finally:
        stop(driver)
    said = (root / "search.log").read_text()
    last = said.strip().splitlines()[-1]
    assert driver.returncode == 1 and took < 45, said[-3000:]  # Ray alone ends it after 60 s
    assert last.startswith(f"error: lost the Ray cluster: its head (GCS at {services.ray_address}) refused"), said
    assert last.endswith(f"then run the same command with resume=true out={out}") and "Failed to connect" not in said
    resumed = subprocess.run(
        synthetic_search_command("ray.address=null", *settings, "resume=true"),
        cwd=root,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    each_milestone_once(out)
    assert (out / "summary.json").exists()
