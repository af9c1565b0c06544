"""Stand-in for `python -m verl.trainer.main_ppo OVERRIDES` in the launcher tests (no GPU, no verl run).

Reads the Hydra overrides the launcher passes, then, like verl's file logger, writes one
`{"step": s, "data": {...}}` line per training step to $VERL_FILE_LOGGER_PATH, with validation
metrics every `trainer.test_freq` steps and at `trainer.total_training_steps`. The accuracy
on the i-th validation data_source (sorted) at step s is

    acc(s, i) = 0.2 + 0.1 * strength * s / steps + 0.01 * i,   strength = the arm's `temperature`.

Like verl, it leaves a long-lived process of its own behind (a stand-in for its Ray instance);
its pids, the environment and the overrides go to `stand_in.json` next to the metrics file.

Options before the overrides: --step-seconds S (sleep per step), --crash-after K (after step K
print a traceback and exit 3).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
from hydra.core.override_parser.overrides_parser import OverridesParser


def accuracy(step: int, steps: int, strength: float, index: int) -> float:
    return 0.2 + 0.1 * strength * step / steps + 0.01 * index


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--crash-after", type=int, default=0)
    options, raw = parser.parse_known_args()
    overrides = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(raw)}
    steps, every = int(overrides["trainer.total_training_steps"]), int(overrides["trainer.test_freq"])
    strength = float(json.loads(overrides["tune_dfrl.policy"])["params"].get("temperature", 1.0))
    sources = sorted({s for f in overrides["data.val_files"] for s in pq.read_table(f).column("data_source").to_pylist()})

    metrics_path = Path(os.environ["VERL_FILE_LOGGER_PATH"])
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    info = {"pid": os.getpid(), "parent": os.getppid(), "lingering": lingering.pid, "overrides": raw,
            "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "WANDB_MODE",
                                                                          "HF_HUB_OFFLINE", "RAY_ADDRESS")}}
    metrics_path.with_name("stand_in.json").write_text(json.dumps(info))
    print(f"stand-in verl: {steps} steps, validation every {every}", flush=True)
    with metrics_path.open("wb", buffering=0) as log:
        for step in range(1, steps + 1):
            time.sleep(options.step_seconds)
            data: dict[str, float] = {"critic/score/mean": 0.1 * step, "policy/kept_fraction": 0.5,
                                      "timing_s/step": options.step_seconds}
            if step % every == 0 or step == steps:
                for i, source in enumerate(sources):
                    data[f"val-core/{source}/acc/mean@1"] = accuracy(step, steps, strength, i)
                    data[f"val-aux/{source}/length_chars/mean@1"] = 10.0 + i
                    data[f"val-aux/{source}/format_fail/mean@1"] = 0.05
            log.write(json.dumps({"step": step, "data": data}).encode() + b"\n")
            if options.crash_after and step >= options.crash_after:
                print("Traceback (most recent call last):\nRuntimeError: stand-in CUDA out of memory", file=sys.stderr)
                return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
