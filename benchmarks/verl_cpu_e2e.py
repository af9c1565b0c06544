"""A small verl search end to end through the CLI: real `verl.trainer.main_ppo` children, our plugin trainer.

    python benchmarks/verl_cpu_e2e.py [--out DIR] [--arms 2] [--seeds 2] [--steps 2] [--device cpu|cuda]

Exports the embedded backend's base model and tasks (`python -m tune_dfrl.trainers.verl.export`),
keeps the first `VAL_ITEMS` validation rows of the first benchmark of each domain, then runs

    python -m tune_dfrl.search space=difffilter_band backend=verl backend.device=DEVICE ...

(the control and `--arms` difffilter arms x `--seeds` seeds, a milestone every step, one trial at
a time) and prints, from what the search wrote: trial start-up time (the launcher's `startup_s`: from
starting verl to its first step, i.e. process start, private Ray, workers, model load), seconds of a
start's first verl step and of later steps (verl's `timing_s/step`), the mean seconds of each start-up
phase and of each process's imports (trainers/verl/timeline.py), and the search's wall time.
Its standard output is one JSON line (progress and the search's own output go to standard error).
`--device cuda` is the GPU smoke test (benchmarks/verl_gpu_smoke.sh): the same search with vLLM
rollouts on one GPU. The figures, less the output folder, also go to benchmarks/results/verl_cpu_e2e.json
(`--device cuda`: verl_gpu_smoke.json; benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tune_dfrl.trainers.verl import timeline
from tune_dfrl.trainers.verl.recipe import default_recipe, hydra_quote

VAL_ITEMS = 8  # validation rows per benchmark
TRAIN_PER_DOMAIN = 32
CPU_TRIAL_CPUS = 2  # Tune's CPUs per CPU trial, and the search's Ray has as many: one trial at a time
# One GPU, the tiny model: one rollout replica, a small vLLM share, padded batches, one agent-loop and reward worker.
# Added to the recipe's `overrides` (and its own settings, trainers/verl/recipe.py), not in their place.
GPU_OVERRIDES = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
)


def export(root: Path, model_dir: Path | None = None) -> dict:
    """Model and parquet files under `root` (the exporter's command; `model_dir`: an embedded model
    directory other than the cached base model), and `val_small.parquet`."""
    model = [f"--model-dir={model_dir}"] if model_dir is not None else []
    subprocess.run(
        [sys.executable, "-m", "tune_dfrl.trainers.verl.export", str(root), f"--per-domain={TRAIN_PER_DOMAIN}", *model],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    val = pq.read_table(root / "data" / "val.parquet")
    first: dict[str, str] = {}
    for source, domain in zip(val.column("data_source").to_pylist(), val.column("domain").to_pylist()):
        first.setdefault(domain, source)
    rows = [
        r for source in first.values() for r in [r for r in val.to_pylist() if r["data_source"] == source][:VAL_ITEMS]
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=val.schema), root / "data" / "val_small.parquet")
    return {
        "model": root / "model",
        "train": root / "data" / "train.parquet",
        "val": root / "data" / "val_small.parquet",
        "benchmarks": [{"data_source": s, "name": s, "domain": d, "items": VAL_ITEMS} for d, s in first.items()],
    }


def search_args(
    files: dict,
    device: str,
    arms: int,
    seeds: int,
    steps: int,
    out: Path,
    control_cache: str = "null",
    one_at_a_time: bool = True,
) -> list[str]:
    """The search command's overrides: a tiny GRPO recipe (groups of 4, 8 prompts a step, 8 response tokens).
    `one_at_a_time`: on cpu, one trial at a time and no rung (the figures of one trial); else the sizing and the
    paired scheduler of the defaults (on this 2-CPU machine: two trials at a time, arms paused at their rung)."""
    benchmarks = ",".join(
        "{" + ",".join(f"{k}:{v}" for k, v in b.items()) + ",reference_format:'{answer}'}" for b in files["benchmarks"]
    )
    if device != "cpu":
        overrides = ",".join(hydra_quote(o) for o in (*default_recipe()["overrides"], *GPU_OVERRIDES))
        device_args = [f"backend.overrides=[{overrides}]", "scheduler.name=fifo"]
    elif one_at_a_time:
        device_args = [
            f"backend.cpus_per_trial={CPU_TRIAL_CPUS}",
            f"ray.num_cpus={CPU_TRIAL_CPUS}",
            "backend.overrides=[]",
            "scheduler.name=fifo",
        ]
    else:
        device_args = []
    return [
        "space=difffilter_band",
        "backend=verl",
        f"backend.device={device}",
        "backend.gpus_per_trial=1",
        f"backend.model_path={hydra_quote(str(files['model']))}",
        f"backend.train_files=[{hydra_quote(str(files['train']))}]",
        f"backend.val_files=[{hydra_quote(str(files['val']))}]",
        f"backend.benchmarks=[{benchmarks}]",
        "backend.rollout_n=4",
        "backend.train_batch_size=8",
        "backend.max_prompt_length=48",
        "backend.max_response_length=8",
        "backend.lr=1e-4",
        *device_args,
        f"steps={steps}",
        "milestone_every=1",
        f"arms={arms}",
        f"seeds={seeds}",
        f"control_cache={control_cache}",
        f"out={hydra_quote(str(out))}",
    ]


def search_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def timings(out: Path) -> dict[str, Any]:
    """Over all cells of the search: each start's start-up (`startup_s` in the cell's verl_runs.jsonl, from
    starting verl to its first metrics record less that step's time, trainers/verl/backend.py), verl's
    `timing_s/step` of a start's first step and of later steps, and the mean seconds of each start-up phase
    and of each process's imports (verl_timeline.jsonl, trainers/verl/timeline.py)."""
    cells = sorted((out / "cells").glob("*/seed*/checkpoint"))
    first, later, startup, phases = [], [], [], []
    for cell in cells:
        records = [r for r in map(json.loads, (cell / "verl_metrics.jsonl").read_text().splitlines())]
        steps = [r["data"]["timing_s/step"] for r in records if "timing_s/step" in r["data"]]  # not a validation
        first += steps[:1]
        later += steps[1:]
        startup += [r["startup_s"] for r in map(json.loads, (cell / "verl_runs.jsonl").read_text().splitlines())]
        names = timeline.actor_names((cell / "verl.log").read_text(errors="replace"))
        phases += [timeline.phases(start, names) for start in timeline.starts(timeline.read(cell / timeline.FILE_NAME))]
    imports: dict[str, list[float]] = {}
    for start in phases:
        for process, seconds in start.pop("process_imports"):
            imports.setdefault(process, []).append(seconds)
    return {
        "trials": len(cells),
        "steps": len(first) + len(later),
        "trial_startup_s": statistics.mean(startup),
        "trial_startup_s_max": max(startup),
        "first_step_s": statistics.mean(first),
        "later_step_s": statistics.mean(later) if later else None,
        "later_step_s_max": max(later) if later else None,
        "phases_s": {name: round(statistics.mean(p[name] for p in phases if name in p), 2) for name in phases[0]},
        "process_imports_s": {name: round(statistics.mean(s), 2) for name, s in sorted(imports.items())},
    }


def main() -> tuple[int, dict[str, Any] | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/verl_cpu_e2e"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--arms", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="embedded model to export (default: the cached base model)"
    )
    args = parser.parse_args()
    root = args.out.resolve()
    began = time.monotonic()
    files = export(root, args.model_dir)
    print(f"exported in {time.monotonic() - began:.0f} s: {root}", file=sys.stderr, flush=True)
    out = root / "search"
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tune_dfrl.search",
            *search_args(files, args.device, args.arms, args.seeds, args.steps, out),
        ],
        env=search_env(),
        stdout=sys.stderr,
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        print(f"error: the search exited with code {done.returncode}", file=sys.stderr)
        return done.returncode, None
    figures = {
        "device": args.device,
        "arms": args.arms,
        "seeds": args.seeds,
        "steps_per_trial": args.steps,
        **timings(out),
        "search_wall_s": wall,
        "out": str(out),
    }
    later = figures["later_step_s"]
    print(
        f"{figures['trials']} trials, {figures['steps']} verl steps: trial start-up {figures['trial_startup_s']:.1f} s "
        f"(max {figures['trial_startup_s_max']:.1f}), first step {figures['first_step_s']:.1f} s, later steps "
        f"{'-' if later is None else f'{later:.2f}'} s, search wall time {wall:.0f} s",
        file=sys.stderr,
    )
    print(json.dumps(figures))
    return 0, figures


if __name__ == "__main__":
    code, measured = main()
    if measured is not None:
        from results_file import write_results

        gpu = measured["device"] != "cpu"
        what = __doc__.splitlines()[0]
        if gpu:
            what = "The GPU smoke test (benchmarks/verl_gpu_smoke.sh, vLLM on one GPU): " + what[0].lower() + what[1:]
        rows = [{k: v for k, v in measured.items() if k != "out"}]
        write_results("verl_gpu_smoke" if gpu else "verl_cpu_e2e", rows, what)
    sys.exit(code)
