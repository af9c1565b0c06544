"""One Tune trial of the verl backend (stand-in child) on a private Ray cluster with 8 logical GPUs.

Usage: python tests/verl_gpu_probe.py RECIPE_JSON WORK_DIR. Prints one JSON line: the GPU ids Ray
gave the trial, the `CUDA_VISIBLE_DEVICES` the verl child saw, and the trial's resource request.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")

import ray  # noqa: E402
from ray import tune  # noqa: E402
from verl_stand_in import command  # noqa: E402

from tune_dfrl.backends.base import ArmSpec  # noqa: E402
from tune_dfrl.cluster.services import start_private_ray, stop_ray  # noqa: E402
from tune_dfrl.trainers.verl.backend import VerlBackend  # noqa: E402


def main() -> None:
    recipe, work = json.loads(sys.argv[1]), Path(sys.argv[2])
    backend = VerlBackend({**recipe, "command": command()})

    def trainable(config: dict) -> None:
        (work / "trial_gpu_ids.json").write_text(json.dumps([int(i) for i in ray.get_gpu_ids()]))
        arm = ArmSpec("softmax", {"temperature": 1.0}, "probe", "probe")
        backend.run_trial(arm, 0, lambda m: tune.report(m.flat()), work / "trial")

    start_private_ray(num_cpus=2, num_gpus=8, log_to_driver=False)
    try:
        resources = backend.resources()
        results = tune.Tuner(
            tune.with_resources(trainable, resources),
            run_config=tune.RunConfig(storage_path=str(work / "tune"), name="gpu_probe", verbose=0),
        ).fit()
        child = json.loads((work / "trial" / "stand_in.json").read_text())
        print(
            json.dumps(
                {
                    "resources": resources,
                    "trial_gpu_ids": json.loads((work / "trial_gpu_ids.json").read_text()),
                    "child_cuda_visible_devices": child["env"]["CUDA_VISIBLE_DEVICES"],
                    "final_step": results[0].metrics["step"],
                    "errors": [str(e) for e in results.errors],
                }
            )
        )
    finally:
        stop_ray()


if __name__ == "__main__":
    main()
