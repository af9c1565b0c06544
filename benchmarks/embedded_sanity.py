"""Sanity check of the embedded backend: uniform GRPO must improve the base model's db score.

Trains the baseline arm (uniform GRPO) at the default recipe for each seed, evaluates the base
model once (greedy decoding is deterministic, so the base score is the same for every seed),
and reports the paired differences d_s = db(trained, s) - db(base) with a 95% t-interval

    mean(d) +- t_{0.975, S-1} * sd(d) / sqrt(S).

    python benchmarks/embedded_sanity.py [--seeds 6] [--workers 2] [--steps N]

The last output line is one JSON object {"seeds", "base_db", "trained_db", "delta", "ci_low", "ci_high"}, also
written to benchmarks/results/embedded_sanity.json (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats


def train_seed(seed: int, recipe: dict) -> float:
    """Final db of the baseline arm at `seed` (one trial, in this process)."""
    from tune_dfrl.backends.base import ArmSpec
    from tune_dfrl.trainers.embedded import EmbeddedBackend

    milestones = []
    arm = ArmSpec("baseline", {}, "baseline", "uniform GRPO")
    with tempfile.TemporaryDirectory() as ckpt:
        EmbeddedBackend(recipe).run_trial(arm, seed, milestones.append, Path(ckpt))
    return milestones[-1].aggregates["db"]


def base_db(recipe: dict) -> float:
    import torch

    from tune_dfrl.trainers.embedded.base import ensure_base_model
    from tune_dfrl.trainers.embedded.benchmarks import get_benchmarks
    from tune_dfrl.trainers.embedded.evaluate import Evaluator
    from tune_dfrl.trainers.embedded.model import load_model
    from tune_dfrl.trainers.embedded.recipe import EmbeddedRecipe

    r = EmbeddedRecipe.from_dict(recipe)
    torch.set_num_threads(r.threads)
    model, tokenizer = load_model(ensure_base_model(r.base, Path(r.cache_dir) if r.cache_dir else None))
    return Evaluator(get_benchmarks(r.eval_benchmarks), tokenizer, r.max_new_tokens)(model).aggregates["db"]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2, help="trials in parallel, 1 thread each")
    parser.add_argument("--steps", type=int, default=None, help="override the default step budget")
    parser.add_argument(
        "--cache-dir", default=None, help="base-model cache (default: $TUNE_DFRL_CACHE, ~/.cache/tune_dfrl)"
    )
    args = parser.parse_args()
    recipe: dict = {"num_threads": 1}
    if args.steps is not None:
        recipe.update(steps=args.steps, milestone_every=args.steps)
    if args.cache_dir:
        recipe["cache_dir"] = str(Path(args.cache_dir).resolve())

    base = base_db(recipe)  # builds the base model first if needed, so workers never race on it
    print(f"base model db: {base:.2f}")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        trained = list(pool.map(train_seed, range(args.seeds), [recipe] * args.seeds))
    deltas = np.array(trained) - base
    half = stats.t.ppf(0.975, len(deltas) - 1) * deltas.std(ddof=1) / np.sqrt(len(deltas))
    for seed, score in enumerate(trained):
        print(f"seed {seed}: trained db {score:.2f}  delta {score - base:+.2f}")
    mean = float(deltas.mean())
    print(
        f"uniform GRPO vs base over {len(deltas)} seeds: delta {mean:+.2f} points, "
        f"95% CI [{mean - half:+.2f}, {mean + half:+.2f}]"
    )
    figures = {
        "seeds": len(deltas),
        "base_db": round(base, 3),
        "trained_db": round(float(np.mean(trained)), 3),
        "delta": round(mean, 3),
        "ci_low": round(mean - half, 3),
        "ci_high": round(mean + half, 3),
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    from results_file import write_results

    write_results("embedded_sanity", [main()], __doc__.splitlines()[0])
