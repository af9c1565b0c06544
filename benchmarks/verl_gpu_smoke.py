"""A tiny real verl GRPO trial through tune_dfrl's launcher (one GPU, vLLM). Run via verl_gpu_smoke.sh.

Exports the embedded backend's base model as a Hugging Face directory and its generated tasks as
verl parquet files, validates and calibrates the recipe, then trains one arm at one seed for a
few steps and prints every milestone the launcher reports.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pyarrow.parquet as pq

from tune_dfrl.backend import ArmSpec, Milestone
from tune_dfrl.policies import arm_key, canonical_params
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.export import export_model, export_tasks
from tune_dfrl.trainers.verl.recipe import default_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("runs/verl_gpu_smoke"))
    parser.add_argument("--method", default="difffilter")
    parser.add_argument("--params", default='{"low": 0.1, "high": 0.9}', help="JSON")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--per-domain", type=int, default=256, help="training prompts per domain")
    args = parser.parse_args()
    out = args.out.resolve()

    model = export_model(ensure_base_model(BaseRecipe()), out / "model")
    train, val = export_tasks(out / "data", per_domain=args.per_domain)
    prompts = [m[0]["content"] for f in (train, val) for m in pq.read_table(f, columns=["prompt"]).column(0).to_pylist()]
    recipe = default_recipe(
        model_path=str(model), train_files=[str(train)], val_files=[str(val)], gpus_per_trial=1, rollout_n=4,
        max_prompt_length=max(map(len, prompts)) + 1, max_response_length=12, lr=1e-4, steps=args.steps,
        milestone_every=2, train_batch_size=32,
        overrides=[
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "actor_rollout_ref.model.use_remove_padding=false",  # no flash-attn needed by the trainer
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "reward.num_workers=1",
        ],
    )
    params = json.loads(args.params)
    canonical = canonical_params(args.method, params, recipe["rollout_n"])
    arm = ArmSpec(args.method, canonical, arm_key(args.method, canonical), f"{args.method} {params}")

    backend = VerlBackend(recipe)
    backend.validate(arm)
    calibration = backend.calibrate()
    print(f"calibration ok={calibration.ok} {calibration.failures[:3]}", flush=True)
    start = time.monotonic()

    def report(milestone: Milestone) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] milestone step {milestone.step}: "
              f"{json.dumps(milestone.aggregates)}\n  accuracy {json.dumps(milestone.accuracy)}\n"
              f"  train {json.dumps(milestone.train)}", flush=True)

    backend.run_trial(arm, seed=0, report=report, checkpoint_dir=out / "trial")
    print(f"done in {time.monotonic() - start:.1f}s; verl log: {out / 'trial' / 'verl.log'}")


if __name__ == "__main__":
    main()
