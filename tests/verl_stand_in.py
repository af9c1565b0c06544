"""Stand-in for `python -m verl.trainer.main_ppo OVERRIDES` in the launcher tests (no GPU, no verl run).

Reads the Hydra overrides the launcher passes, then, like verl's file logger, writes one
`{"step": s, "data": {...}}` line per training step to $VERL_FILE_LOGGER_PATH, with validation
metrics every `trainer.test_freq` steps and at `trainer.total_training_steps`. The accuracy
on the i-th validation data_source (sorted) at step s is

    acc(s, i) = 0.2 + 0.1 * strength * s / steps + 0.01 * i + u(arm, seed),

strength = the arm's `temperature` (1 when it has none), u a fixed offset in [0, 0.01) per
(arm id, `data.seed`), so that paired deltas of a search vary over seeds.

Checkpoints as verl 0.9.1's `PPOTrainer.fit` makes and uses them: at every `trainer.save_freq`-th
step and the last, before that step's validation and log line, `global_step_<s>/` and
`latest_checkpointed_iteration.txt` in `trainer.default_local_dir`; a start resumes after the
step named there and, with `trainer.val_before_train=true`, first logs validation metrics alone
at that step.

Like verl, it leaves a long-lived process of its own behind (a stand-in for its Ray instance);
its pids, the environment and the overrides go to `stand_in.json` next to the metrics file.

Options before the overrides: --step-seconds S (sleep per step), --crash-after K (after step K
print a traceback and exit 3), --exit-after-checkpoint K (exit 137, as if killed, right after
saving step K's checkpoint), --shutdown-seconds S (sleep after the last log line, as verl's shutdown), --start-ray (start Ray as verl's main_ppo does, `ray.init(**ray_kwargs.ray_init)`,
and record in stand_in.json what that Ray is: its GCS address, nodes, resources and the addresses its
processes listen on).

`write_model(path)` writes the model directory the stand-in's recipes name: verl's checks load its
tokenizer and chat template; the stand-in never loads weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
from hydra.core.override_parser.overrides_parser import OverridesParser


def command(*options: str) -> list[str]:
    """The recipe's `command` that runs this stand-in with `options` (before the overrides verl gets)."""
    return [sys.executable, str(Path(__file__).resolve()), *options]


def command_override(*options: str) -> str:
    """`backend.command=[...]` for the search's command line: `command(*options)`, each item Hydra-quoted."""
    from tune_dfrl.trainers.verl.recipe import hydra_quote

    return f"backend.command=[{','.join(hydra_quote(part) for part in command(*options))}]"


def write_model(path: Path) -> Path:
    """config.json and the embedded tokenizer with the exporter's verbatim chat template."""
    from tune_dfrl.trainers.embedded.model import build_tokenizer
    from tune_dfrl.trainers.verl.export import VERBATIM_CHAT_TEMPLATE

    tokenizer = build_tokenizer()
    tokenizer.chat_template = VERBATIM_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    (path / "config.json").write_text("{}")
    return path


def accuracy(step: int, steps: int, strength: float, index: int, arm_id: str, seed: int) -> float:
    offset = int(hashlib.sha256(f"{arm_id}:{seed}".encode()).hexdigest()[:8], 16) % 1000 / 100_000
    return 0.2 + 0.1 * strength * step / steps + 0.01 * index + offset


def start_ray(overrides: dict) -> dict:
    """`ray.init` with the `ray_kwargs.ray_init` overrides, as verl's main_ppo starts its Ray; what that Ray is."""
    import psutil
    import ray

    prefix = "ray_kwargs.ray_init."
    ray.init(**{key[len(prefix) :]: value for key, value in overrides.items() if key.startswith(prefix)})
    listening = set()
    for process in psutil.Process().children(recursive=True):
        try:
            listening |= {c.laddr.ip for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    described = {
        "gcs_address": ray.get_runtime_context().gcs_address,
        "nodes": len(ray.nodes()),
        "resources": {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "object_store_memory")},
        "listening": sorted(listening),
    }
    ray.shutdown()
    return described


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--exit-after-checkpoint", type=int, default=0)
    parser.add_argument("--shutdown-seconds", type=float, default=0.0)
    parser.add_argument("--start-ray", action="store_true")
    options, raw = parser.parse_known_args()
    overrides = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(raw)}
    steps, every = int(overrides["trainer.total_training_steps"]), int(overrides["trainer.test_freq"])
    save_every, checkpoints = int(overrides["trainer.save_freq"]), Path(overrides["trainer.default_local_dir"])
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    resumed = int(tracker.read_text()) if tracker.exists() else 0
    policy = json.loads(overrides["tune_dfrl.policy"])
    strength, arm_id, seed = (
        float(policy["params"].get("temperature", 1.0)),
        policy["arm_id"],
        int(overrides["data.seed"]),
    )
    sources = sorted(
        {s for f in overrides["data.val_files"] for s in pq.read_table(f).column("data_source").to_pylist()}
    )

    metrics_path = Path(os.environ["VERL_FILE_LOGGER_PATH"])
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    info = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "lingering": lingering.pid,
        "overrides": raw,
        "cwd": os.getcwd(),
        "env": {
            k: os.environ.get(k)
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "WANDB_MODE",
                "VERL_PLATFORM",
                "HF_HUB_OFFLINE",
                "RAY_ADDRESS",
                "RAY_AUTH_MODE",
            )
        },
    }
    if options.start_ray:
        info["ray"] = start_ray(overrides)
    metrics_path.with_name("stand_in.json").write_text(json.dumps(info))
    print(f"stand-in verl: {steps} steps, validation every {every}", flush=True)

    def validation(step: int) -> dict[str, float]:
        data = {}
        for i, source in enumerate(sources):
            data[f"val-core/{source}/acc/mean@1"] = accuracy(step, steps, strength, i, arm_id, seed)
            data[f"val-aux/{source}/length_chars/mean@1"] = 10.0 + i
            data[f"val-aux/{source}/format_fail/mean@1"] = 0.05
        return data

    with metrics_path.open("wb", buffering=0) as log:
        if overrides["trainer.val_before_train"]:
            log.write(json.dumps({"step": resumed, "data": validation(resumed)}).encode() + b"\n")
        for step in range(resumed + 1, steps + 1):
            time.sleep(options.step_seconds)
            data: dict[str, float] = {
                "critic/score/mean": 0.1 * step,
                "policy/kept_fraction": 0.5,
                "timing_s/step": options.step_seconds,
            }
            if step % save_every == 0 or step == steps:
                (checkpoints / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
                tracker.write_text(str(step))
                if step == options.exit_after_checkpoint:
                    return 137
            if step % every == 0 or step == steps:
                data |= validation(step)
            log.write(json.dumps({"step": step, "data": data}).encode() + b"\n")
            if options.crash_after and step >= options.crash_after:
                print("Traceback (most recent call last):\nRuntimeError: stand-in CUDA out of memory", file=sys.stderr)
                return 3
    time.sleep(options.shutdown_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
