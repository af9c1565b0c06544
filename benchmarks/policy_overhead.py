"""Cost of each data policy relative to one forward of verl's vanilla policy loss.

For two verl-scale shapes, long responses (1024 prompts x 5 rollouts x 4096 tokens) and many
groups (8192 x 8 x 256), times per policy the whole hook: building the validated RolloutBatch
(derived signals are cached on it, so each repetition builds a fresh one) plus scoring and
acting. The reference is verl's `get_policy_loss_fn("vanilla")` forward on the same batch, timed
in alternation with the policy in the same run (the ratio survives load drift). Each shape is
also timed at 1/8 of its prompts to show cost grows no faster than linearly; the loss's own
full / eighth factor is printed alongside (fresh 80 MB buffers page-fault while 1/8-size ones are
recycled by malloc, so both can exceed 8x). Medians of `--reps` runs after one warm-up; 2 torch
threads by default; masks are int64, as verl builds them.

    python benchmarks/policy_overhead.py [--reps 5] [--threads 2] [--quick]

The last output line is one JSON object:
{"max_ratio": ..., "results": [{"policy", "shape": "PxnxL", "ms", "loss_ms", "ratio", "ms_eighth"}, ...]}
The results go to benchmarks/results/policy_overhead.json too (benchmarks/results_file.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

from tune_dfrl.policies import RolloutBatch, make_policy

POLICIES: list[tuple[str, str, dict]] = [
    ("baseline", "baseline", {}),
    ("difffilter", "difffilter", {"low": 0.2, "high": 0.8}),
    ("topk", "topk", {"f": 0.5}),
    ("gfpo", "gfpo", {"k": 3}),
    ("gfpo+recompute", "gfpo", {"k": 3, "recompute_advantages": True, "denominator": "kept"}),
    ("maxvar", "maxvar", {"f": 0.5}),
    ("maxvar+recompute", "maxvar", {"f": 0.5, "recompute_advantages": True}),
    ("softmax", "softmax", {"temperature": 0.5}),
    ("diffband", "diffband", {}),
    ("ar", "ar", {"alpha": 0.5}),
    ("per", "per", {"alpha": 1.0}),
]


def synthetic(prompts: int, n: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """A GRPO-shaped batch: binary rewards, group-normalised advantages, ragged int64 masks (verl's dtype)."""
    g = torch.Generator().manual_seed(seed)
    size = prompts * n
    group = torch.arange(prompts).repeat_interleave(n)
    reward = (torch.rand(size, generator=g) < 0.5).float()
    grouped = reward.view(prompts, n)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(size)
    lengths = torch.randint(length // 8, length + 1, (size,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    old = -torch.rand(size, length, generator=g) * 3
    return dict(
        group=group,
        domain=torch.randint(0, 3, (size,), generator=g),
        reward=reward,
        advantages=adv[:, None] * mask,
        response_mask=mask,
        old_log_probs=old,
        log_prob=old + 0.1 * torch.randn(size, length, generator=g),
    )


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    return 1000 * statistics.median(seconds(fn) for _ in range(reps))


def paired_ms(fn: Callable[[], object], reference: Callable[[], object], reps: int) -> tuple[float, float]:
    """Medians of `fn` and `reference` timed in alternation, so load drift hits both alike."""
    fn(), reference()
    pairs = [(seconds(fn), seconds(reference)) for _ in range(reps)]
    return tuple(1000 * statistics.median(column) for column in zip(*pairs))


def loss_forward(t: dict[str, torch.Tensor]) -> Callable[[], object]:
    config = ActorConfig(strategy="fsdp", rollout_n=8, ppo_micro_batch_size_per_gpu=1)
    vanilla = get_policy_loss_fn("vanilla")
    return lambda: vanilla(t["old_log_probs"], t["log_prob"], t["advantages"], t["response_mask"], "token-mean", config)


def policy_hook(t: dict[str, torch.Tensor], method: str, params: dict, n: int) -> Callable[[], object]:
    policy = make_policy(method, params, rollout_n=n)
    fields = {k: v for k, v in t.items() if k != "log_prob"}
    return lambda: policy.apply(RolloutBatch(**fields))


def main() -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="shapes / 16 (a smoke run)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [(1024, 5, 4096), (8192, 8, 256)]
    if args.quick:
        shapes = [(p // 16, n, length) for p, n, length in shapes]
    results = []
    for prompts, n, length in shapes:
        full, eighth = synthetic(prompts, n, length, seed=0), synthetic(prompts // 8, n, length, seed=1)
        print(f"shape {prompts}x{n}x{length} (policy vs verl vanilla loss forward, timed in alternation)", flush=True)
        for name, method, params in POLICIES:
            ms, loss_ms = paired_ms(policy_hook(full, method, params, n), loss_forward(full), args.reps)
            ms_eighth, loss_eighth = paired_ms(policy_hook(eighth, method, params, n), loss_forward(eighth), args.reps)
            row = dict(
                policy=name,
                shape=f"{prompts}x{n}x{length}",
                ms=round(ms, 2),
                loss_ms=round(loss_ms, 2),
                ratio=round(ms / loss_ms, 4),
                ms_eighth=round(ms_eighth, 2),
            )
            print(
                f"  {name:18s} {ms:8.1f} ms  loss {loss_ms:7.1f} ms  ratio {ms / loss_ms:.3f}  "
                f"| at 1/8: {ms_eighth:7.1f} ms (full / eighth = {ms / ms_eighth:.1f}; "
                f"loss full / eighth = {loss_ms / loss_eighth:.1f})",
                flush=True,
            )
            results.append(row)
        del full, eighth
    print(json.dumps({"max_ratio": max(r["ratio"] for r in results), "results": results}))
    return results


if __name__ == "__main__":
    from results_file import write_results

    write_results("policy_overhead", main(), __doc__.splitlines()[0])
