"""Start-up of the search's private Ray node against the node Ray's own `ray.init` starts.

`private`: `tune_dfrl.cluster.services.start_private_ray(num_cpus=2, log_to_driver=False)`, as the search and the tests
start theirs (no autoscaler monitor, no log monitor, no API server). `ray`: `ray.init(address="local", num_cpus=2,
include_dashboard=False, log_to_driver=False, object_store_memory=100 MiB)` in local-only mode, with the token
Ray creates (in a temporary home folder).
Each run is a fresh interpreter (Ray imported before the clock starts); the kinds alternate. Printed per kind, as
medians over the runs: seconds from the start call to a connected driver, seconds to the first task's result, and
the CPU-s the node's processes (the driver's descendants) used by then plus `--idle` seconds.

    python benchmarks/private_ray_start.py --runs 5

One JSON line per kind; both go to benchmarks/results/private_ray_start.json (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
import ray

from tune_dfrl.cluster import services

KINDS = ("private", "ray")


def one_run(kind: str, idle_s: float) -> dict[str, float]:
    """Start the node of `kind`, run one task, wait `idle_s`, and measure."""
    started = time.perf_counter()
    if kind == "private":
        services.start_private_ray(num_cpus=2, log_to_driver=False)
    else:
        ray.init(  # (Ray turns token authentication on for a new local cluster)
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=100 * 1024**2,
        )
    connected = time.perf_counter()
    ray.get(ray.remote(lambda: 1).remote())
    first_task = time.perf_counter()
    time.sleep(idle_s)
    node = psutil.Process().children(recursive=True)
    cpu_s = 0.0
    for process in node:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        cpu_s += times.user + times.system
    figures = {
        "start_s": connected - started,
        "first_task_s": first_task - connected,
        "node_cpu_s": cpu_s,
        "node_processes": len(node),
    }
    services.stop_ray()
    return figures


def main() -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (alternating)")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds the node idles after the first task")
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)  # a single run, in this interpreter
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.idle)))
        return []
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as home:  # Ray's own token mode writes ~/.ray/auth_token
        env = {**os.environ, "HOME": home, services.LOCAL_ONLY: "0"}
        for i in range(args.runs):
            for kind in KINDS:
                command = [sys.executable, __file__, "--one", kind, "--idle", str(args.idle)]
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=True)
                runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"run {i + 1}/{args.runs} {kind}: {runs[kind][-1]}", file=sys.stderr)
    rows = []
    for kind, figures in runs.items():
        medians = {key: round(statistics.median(f[key] for f in figures), 2) for key in figures[0]}
        rows.append({"kind": kind, "runs": args.runs, **medians})
        print(json.dumps(rows[-1]))
    return rows


if __name__ == "__main__":
    medians = main()
    if medians:  # not a single run of one kind (--one)
        from results_file import write_results

        write_results("private_ray_start", medians, __doc__.splitlines()[0])
