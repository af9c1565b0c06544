"""The twelve fixed evaluation benchmarks and the per-domain training pools.

Benchmarks are generated from fixed seeds (5 math, 4 logic, 3 science, of different sizes and
difficulty levels). Training pools are drawn from the same generators with other seeds and
exclude every candidate that matches an evaluation item exactly after normalisation or
whose N-gram Jaccard with one exceeds the threshold (`overlap.py`); `checks.contamination_check`
re-verifies that on the finished pools. Drawing the pools takes ~1.5 CPU-s, which every process that trains
or checks a recipe would pay (a search's driver and each of its trial workers): the first one to draw them keeps
them in the cache folder (`tune_dfrl.config.cache_root`) as `pools-<key>.json`, which the others read instead; the key
hashes the source of the generators (this module, tasks.py, overlap.py) and numpy's version.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from dataclasses import astuple, dataclass
from functools import cache
from pathlib import Path

import numpy as np

from tune_dfrl.backends.benchmarks import BenchmarkInfo
from tune_dfrl.config.cache_root import default_cache_dir
from tune_dfrl.state.atomic_file import write_atomically

from . import overlap, tasks
from .overlap import JACCARD_THRESHOLD, max_jaccard, normal_form
from .tasks import DOMAINS, KINDS, Item, make_item

EVAL_SEED = 20_240_601
POOL_SEED = 20_240_602
POOL_PER_KIND = 1500
MIN_POOL_PER_KIND = 500


@dataclass(frozen=True)
class Benchmark:
    """One evaluation benchmark: `size` distinct items of one task kind, drawn from `seed`."""

    name: str
    kind: str
    size: int

    @property
    def domain(self) -> str:
        return KINDS[self.kind].domain

    @property
    def level(self) -> int:
        return KINDS[self.kind].level

    def info(self) -> BenchmarkInfo:
        return BenchmarkInfo(self.name, self.domain, self.size)

    def items(self) -> list[Item]:
        return list(_benchmark_items(self))


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("math_sum3", "sum3", 200),
    Benchmark("math_mix3", "mix3", 250),
    Benchmark("math_sum5", "sum5", 250),
    Benchmark("math_mix5", "mix5", 250),
    Benchmark("math_mix7", "mix7", 150),
    Benchmark("logic_bool3", "bool3", 300),
    Benchmark("logic_bool5", "bool5", 200),
    Benchmark("logic_order", "order", 250),
    Benchmark("logic_knights", "knights", 150),
    Benchmark("sci_mc3", "mc3", 300),
    Benchmark("sci_mc4", "mc4", 250),
    Benchmark("sci_not4", "mc4not", 150),
)
BENCHMARK_NAMES: tuple[str, ...] = tuple(b.name for b in BENCHMARKS)


def get_benchmarks(names: list[str] | tuple[str, ...] | None = None) -> list[Benchmark]:
    """The named benchmarks in the fixed order (all twelve when `names` is None); a domain name
    (math, logic, science) stands for all of that domain's benchmarks."""
    if names is None:
        return list(BENCHMARKS)
    allowed = f"allowed benchmarks: {', '.join(BENCHMARK_NAMES)}; allowed domains: {', '.join(DOMAINS)}"
    unknown = [n for n in names if n not in BENCHMARK_NAMES and n not in DOMAINS]
    if unknown:
        raise ValueError(f"unknown benchmark or domain name(s) {unknown}; {allowed}")
    if not names:
        raise ValueError(f"the benchmark list is empty; {allowed}")
    return [b for b in BENCHMARKS if b.name in names or b.domain in names]


def draw_unique(
    kind: str, count: int, rng: np.random.Generator, exclude: set[str] = frozenset(), at_least: int | None = None
) -> list[Item]:
    """Up to `count` items of `kind` with distinct normal forms, none in `exclude` (at most 10
    draws per item asked for); fewer than `at_least` (default `count`) is an error naming the kind."""
    seen = set(exclude)
    items: list[Item] = []
    for _ in range(10 * count):
        item = make_item(kind, rng)
        key = normal_form(item.prompt)
        if key not in seen:
            seen.add(key)
            items.append(item)
            if len(items) == count:
                break
    if len(items) < (count if at_least is None else at_least):
        raise RuntimeError(f"task kind '{kind}' yielded only {len(items)} distinct items of the {count} asked for")
    return items


@cache
def _benchmark_items(benchmark: Benchmark) -> tuple[Item, ...]:
    rng = np.random.default_rng([EVAL_SEED, list(KINDS).index(benchmark.kind)])
    return tuple(draw_unique(benchmark.kind, benchmark.size, rng))


@cache
def training_pools() -> dict[str, tuple[Item, ...]]:
    """Per-domain training prompts (warm-up and GRPO), as `draw_training_pools` draws them: read from the
    cache folder's `pools_file()` when it is there and readable, else drawn and written there (when it can be)."""
    path = pools_file()
    try:
        stored = json.loads(path.read_text())
        return {d: tuple(Item(*fields) for fields in stored[d]) for d in DOMAINS}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    pools = draw_training_pools()
    try:
        write_atomically(path, json.dumps({d: [astuple(i) for i in items] for d, items in pools.items()}))
    except OSError:
        pass
    return pools


def pools_file() -> Path:
    """`<cache folder>/pools-<key>.json`: key = sha256 of the generators' source and numpy's version."""
    h = hashlib.sha256(np.__version__.encode())
    for module in (sys.modules[__name__], tasks, overlap):
        h.update(inspect.getsource(module).encode())
    return default_cache_dir() / f"pools-{h.hexdigest()[:16]}.json"


def draw_training_pools() -> dict[str, tuple[Item, ...]]:
    """Per-domain training prompts (warm-up and GRPO): up to POOL_PER_KIND clean items of every
    kind of the domain, at least MIN_POOL_PER_KIND.

    Candidates come from their own seed stream; exact (normal-form) matches of any evaluation
    item are never drawn, and candidates above the Jaccard threshold are dropped.
    """
    eval_prompts = [i.prompt for b in BENCHMARKS for i in b.items()]
    eval_forms = {normal_form(p) for p in eval_prompts}
    candidates = [
        draw_unique(kind, POOL_PER_KIND, np.random.default_rng([POOL_SEED, index]), eval_forms, MIN_POOL_PER_KIND)
        for index, kind in enumerate(KINDS)
    ]
    jaccard, _ = max_jaccard([c.prompt for items in candidates for c in items], eval_prompts)
    clean = jaccard <= JACCARD_THRESHOLD
    pools: dict[str, list[Item]] = {d: [] for d in DOMAINS}
    start = 0
    for kind, items in zip(KINDS, candidates):
        kept = [c for c, ok in zip(items, clean[start : start + len(items)]) if ok]
        start += len(items)
        if len(kept) < MIN_POOL_PER_KIND:
            raise RuntimeError(
                f"task kind '{kind}': only {len(kept)} uncontaminated training items, need {MIN_POOL_PER_KIND}"
            )
        pools[KINDS[kind].domain].extend(kept)
    return {d: tuple(items) for d, items in pools.items()}


@cache
def longest_answer() -> int:
    """Characters of the longest reference answer in the benchmarks and pools."""
    pools = training_pools()
    return max(len(i.answer) for items in [*(b.items() for b in BENCHMARKS), *pools.values()] for i in items)
