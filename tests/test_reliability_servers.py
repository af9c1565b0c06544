"""The search plugs into services a team already runs, each started here on loopback and stopped by its PID:

- a Ray cluster (`ray start --head --block`) on loopback with token authentication, whose workers cannot import
  tune_dfrl (the editable install is hidden from them): the search attaches with `ray.address=127.0.0.1:PORT` and
  the cluster's token in its environment, and ships the project in its runtime_env; without the token, or with
  another one, it stops with one `error:` line before anything is written;
- an MLflow tracking server (`mlflow server`): the search logs to it, checked through its REST API.

One tiny embedded search (`python -m tune_dfrl.search`, in a subprocess as a user runs it) uses both.
Never `ray stop`: the cluster is stopped through its process group and its private temp dir.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from reliability_helpers import TINY, free_port, records, search_command, short_tmp, start, stop, wait_for

from tune_dfrl.services import LOCAL_ONLY

# Loaded first by every Python process of the cluster: drops the editable finder that maps tune_dfrl to this checkout.
HIDE_PROJECT = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___tune_dfrl")]
"""

# Run on a cluster worker without any runtime_env: can it import tune_dfrl?
PROBE = """import ray, sys
ray.init(address=sys.argv[1], log_to_driver=False)
visible = ray.remote(num_cpus=0)(lambda: __import__("importlib.util").util.find_spec("tune_dfrl") is not None)
print("visible" if ray.get(visible.remote()) else "hidden")
"""


@dataclass(frozen=True)
class Services:
    root: Path
    ray_address: str
    ray_tmp: Path
    tracking_uri: str
    ray_env: dict[str, str]  # the environment that reaches the cluster: its token, loopback (Ray's local-only mode)


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


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    root = tmp_path_factory.mktemp("services")
    hide = root / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_PROJECT)
    ray_tmp, port = short_tmp("rt-head-"), free_port()
    ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), LOCAL_ONLY: "0"}
    ports = {
        flag: free_port()
        for flag in (
            "--ray-client-server-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
            "--node-manager-port",
            "--object-manager-port",
        )
    }
    head = start(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={ray_tmp}",
            *(f"{flag}={value}" for flag, value in ports.items()),
        ],
        cwd=root,
        env=environment(PYTHONPATH=str(hide), **ray_env),
        log=root / "ray-head.log",
    )
    mlflow_port = free_port()
    tracking = start(
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
        log=root / "mlflow-server.log",
    )
    uri = f"http://127.0.0.1:{mlflow_port}"
    try:
        wait_for(lambda: healthy(uri) or tracking.poll() is not None, 120, "the MLflow server")
        wait_for(
            lambda: "Ray runtime started" in (root / "ray-head.log").read_text() or head.poll() is not None,
            120,
            "the Ray head",
        )
        assert head.poll() is None, (root / "ray-head.log").read_text()[-3000:]
        assert tracking.poll() is None, (root / "mlflow-server.log").read_text()[-3000:]
        yield Services(root, f"127.0.0.1:{port}", ray_tmp, uri, ray_env)
    finally:
        stop(head, marker=str(ray_tmp), sig=signal.SIGKILL)  # a throwaway cluster: no 30 s drain
        stop(tracking)
        shutil.rmtree(ray_tmp, ignore_errors=True)


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
