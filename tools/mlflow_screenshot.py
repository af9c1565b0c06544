"""Screenshot of the MLflow UI for a search's output folder: the page the search prints (its arms view), or the
compare view of its arm runs.

    python tools/mlflow_screenshot.py OUT [--view runs|compare] [--png PNG] [--width 1400] [--height 900]

Starts `mlflow server` on 127.0.0.1 at a free port over OUT/mlflow.db (artifacts OUT/mlartifacts), opens in
headless chromium with a fresh profile, as a first visit, `--view runs` (default; PNG docs/img/mlflow_runs.png):
the URL the search printed (`tune_dfrl.tracking.writer.runs_url`, on that port); `--view compare` (PNG
docs/img/mlflow_compare.png): the UI's "Compare" page of every arm parent run (`tune_dfrl.role=arm`), the control
first, then the arms in the order the search tried them, as the runs table's Compare button opens it; saves the PNG
and stops the server. Needs `chromium` on the PATH (Debian: apt-get install chromium). The experiment is the one in
the store holding the arms view (`tune_dfrl.tracking.writer.ARMS_VIEW`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow import MlflowClient

from tune_dfrl.tracking.writer import ARMS_VIEW, ROLE, SAVED_VIEW_TAG, UI_SERVER_ENV, runs_url

SERVER_START_S = 180.0
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def arms_experiment(tracking_uri: str) -> str:
    """The id of the store's one experiment holding the arms view; SystemExit naming the experiments otherwise."""
    experiments = MlflowClient(tracking_uri).search_experiments()
    found = [e.experiment_id for e in experiments if SAVED_VIEW_TAG + ARMS_VIEW in e.tags]
    if len(found) != 1:
        names = ", ".join(e.name for e in experiments)
        raise SystemExit(f"{tracking_uri}: expected one experiment of a search, found {len(found)} among: {names}")
    return found[0]


def arm_runs(tracking_uri: str, experiment_id: str) -> list[str]:
    """The ids of the experiment's arm parent runs, in the order they were created (the control first)."""
    runs = MlflowClient(tracking_uri).search_runs(
        [experiment_id], f"tags.`{ROLE}` = 'arm'", max_results=1000, order_by=["attributes.start_time ASC"]
    )
    return [r.info.run_id for r in runs]


def compare_url(served: str, experiment_id: str, run_ids: list[str]) -> str:
    """The UI's Compare page of `run_ids` (MLflow 3.17.2: `#/compare-runs?runs=[...]&experiments=[...]`, JSON)."""
    runs, experiments = (urllib.parse.quote(json.dumps(v, separators=(",", ":"))) for v in (run_ids, [experiment_id]))
    return f"{served}/#/compare-runs?runs={runs}&experiments={experiments}"


def wait_until_up(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"mlflow server exited with {server.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise SystemExit(f"mlflow server did not answer {url}/health within {timeout_s:.0f} s")


def screenshot(url: str, png: Path, width: int, height: int, wait_ms: int) -> None:
    """Chromium, headless with a fresh profile, saves `url` as `png` after `wait_ms` of page time."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not on the PATH (Debian: apt-get install chromium)")
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--virtual-time-budget={wait_ms}",
                f"--screenshot={png.absolute()}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=120 + wait_ms / 1000,
        )


@contextmanager
def mlflow_server(out: Path) -> Iterator[str]:
    """`mlflow server` over OUT/mlflow.db (artifacts OUT/mlartifacts) on 127.0.0.1 at a free port, as the search's
    printed `mlflow ui` command serves it (`UI_SERVER_ENV`), stopped (its process group) on exit; yields its base URL
    once it answers /health."""
    port = free_port()
    served = f"http://127.0.0.1:{port}"
    store, artifacts = f"sqlite:///{out / 'mlflow.db'}", str(out / "mlartifacts")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--artifacts-destination", artifacts]
        + ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **UI_SERVER_ENV},
        start_new_session=True,  # its own process group: the server and its workers stop together
    )
    try:
        wait_until_up(served, server, SERVER_START_S)
        yield served
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a search's output folder (holds mlflow.db and mlartifacts/)")
    parser.add_argument("--view", choices=("runs", "compare"), default="runs", help="the arms view or Compare page")
    parser.add_argument("--png", type=Path, help="default docs/img/mlflow_runs.png or docs/img/mlflow_compare.png")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--wait-ms", type=int, default=20000, help="page time before the screenshot")
    args = parser.parse_args(argv)
    out = args.out.absolute()
    if not (out / "mlflow.db").exists():
        raise SystemExit(f"no MLflow store at {out / 'mlflow.db'}")
    store = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = arms_experiment(store)
    png = args.png or Path(f"docs/img/mlflow_{args.view}.png")
    with mlflow_server(out) as served:
        if args.view == "runs":
            url = runs_url(served, experiment_id)
        else:
            url = compare_url(served, experiment_id, arm_runs(store, experiment_id))
        screenshot(url, png, args.width, args.height, args.wait_ms)
    print(f"{url}\n-> {png}")


if __name__ == "__main__":
    main()
