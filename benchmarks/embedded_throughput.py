"""Throughput of the embedded backend at the default recipe.

Prints the base-model build time (into a fresh cache), the median GRPO step time, rollout
tokens per second (valid response tokens sampled per second of rollout), the greedy evaluation
time on all 12 benchmarks, and the wall time of one default trial (milestone evaluations
included, process start-up and imports excluded). Targets on a 2-core machine: trial <= 20 s
with 1 thread, base build <= 2 min.

    python benchmarks/embedded_throughput.py [--threads 1] [--steps 20] [--cache-dir DIR]

With --cache-dir the base model is reused when present (base_build_s is then the lookup time).
The last output line is one JSON object {"step_ms", "rollout_tokens_per_s", "eval_s", "base_build_s", "trial_s"},
also written to benchmarks/results/embedded_throughput.json (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.trainers.embedded import EmbeddedBackend, EmbeddedRecipe
from tune_dfrl.trainers.embedded.base import ensure_base_model
from tune_dfrl.trainers.embedded.benchmarks import get_benchmarks
from tune_dfrl.trainers.embedded.evaluate import Evaluator
from tune_dfrl.trainers.embedded.rollout import generate
from tune_dfrl.trainers.embedded.trainer import GRPOTrainer

BASELINE = ArmSpec("baseline", {}, "baseline", "uniform GRPO")


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps timed for the median")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(args.cache_dir).resolve() if args.cache_dir else Path(scratch) / "cache"
        recipe = {"num_threads": args.threads, "cache_dir": str(cache)}
        r = EmbeddedRecipe.from_dict(recipe)

        start = time.perf_counter()
        base_dir = ensure_base_model(r.base, cache)
        base_build_s = time.perf_counter() - start
        print(f"base model: {base_dir.name} in {base_build_s:.1f} s")

        trainer = GRPOTrainer(r, BASELINE, 0, base_dir)
        trainer.step()  # warm-up
        step_s = []
        for _ in range(args.steps):
            start = time.perf_counter()
            trainer.step()
            step_s.append(time.perf_counter() - start)
        step_ms = 1000 * float(np.median(step_s))
        batch = f"{r.prompts_per_step} prompts x {r.rollout_n} rollouts"
        print(f"GRPO step ({batch}): median {step_ms:.1f} ms over {args.steps} steps")

        rollout_tokens_per_s = _rollout_rate(trainer, r)
        print(f"rollout: {rollout_tokens_per_s:.0f} response tokens/s")

        evaluator = Evaluator(get_benchmarks(), trainer.tokenizer, r.max_new_tokens)
        start = time.perf_counter()
        evaluator(trainer.model)
        eval_s = time.perf_counter() - start
        print(f"greedy evaluation, 12 benchmarks ({sum(len(i) for i in evaluator.items)} items): {eval_s:.2f} s")

        start = time.perf_counter()
        EmbeddedBackend(recipe).run_trial(BASELINE, 0, lambda m: None, Path(scratch) / "trial")
        trial_s = time.perf_counter() - start
        print(f"default trial ({r.steps} steps, milestone every {r.milestone_every}): {trial_s:.1f} s")

    figures = {
        "step_ms": round(step_ms, 1),
        "rollout_tokens_per_s": round(rollout_tokens_per_s),
        "eval_s": round(eval_s, 2),
        "base_build_s": round(base_build_s, 1),
        "trial_s": round(trial_s, 1),
    }
    print(json.dumps(figures))
    return figures


def _rollout_rate(trainer: GRPOTrainer, r: EmbeddedRecipe, repeats: int = 10) -> float:
    """Valid response tokens per second of `generate` on default-size batches from the pools."""
    tokens, seconds = 0.0, 0.0
    generator = torch.Generator().manual_seed(0)
    for _ in range(repeats):
        draw = trainer.sampler.draw(np.full(3, 1 / 3), r.prompts_per_step)
        prompts = trainer.prompt_batch(draw)
        start = time.perf_counter()
        _, mask = generate(
            trainer.model,
            prompts.prompt_ids,
            prompts.prompt_mask,
            r.max_new_tokens,
            r.temperature,
            generator,
            r.rollout_n,
        )
        seconds += time.perf_counter() - start
        tokens += float(mask.sum())
    return tokens / seconds


if __name__ == "__main__":
    from results_file import write_results

    write_results("embedded_throughput", [main()], __doc__.splitlines()[0])
