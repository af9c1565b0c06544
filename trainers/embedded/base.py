"""The base model: a deterministic supervised warm-up on the task formats, cached on disk.

Warm-up: `steps` Adam steps of token-mean cross-entropy on answer+eos given the prompt, batches
drawn domain-balanced from the training pools. Items of level >= `mistake_level` get the
kind's systematic mistake (tasks.py) as target with probability `mistake_rate` per
presentation, so the base model puts most of its mass on a wrong but well-formed answer while
keeping the right one in reach: headroom that sampling can find and RL can learn.

Cache: `<cache_dir>/base-<key>/` is a Hugging Face model directory (model + tokenizer) plus
`recipe.json`; key = hash of the recipe, the data (pools and benchmarks), the tokenizer alphabet
and FORMAT_VERSION (bump it when the warm-up code changes).
It is built once under a file lock, in a temporary directory renamed into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from filelock import FileLock
from rich import get_console
from rich.progress import Progress

from tune_dfrl.config.cache_root import default_cache_dir
from tune_dfrl.config.constraints import COUNT, POSITIVE, Interval, check_declared, declared

from .benchmarks import BENCHMARKS, training_pools
from .model import ALPHABET, PAD_ID, EncodedItems, ModelShape, build_tokenizer, encode_items, new_model, save_model
from .rollout import response_log_probs
from .tasks import DOMAINS, KINDS

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

FORMAT_VERSION = 1


@dataclass(frozen=True)
class BaseRecipe:
    """Everything that determines the base model (its cache key derives from it)."""

    shape: ModelShape = field(default_factory=ModelShape)
    steps: int = declared(3000, COUNT)
    batch_size: int = declared(32, COUNT)
    lr: float = declared(3e-3, POSITIVE)
    warmup_steps: int = declared(100, Interval(int, 0, None))
    domain_weights: tuple[float, ...] = (0.4, 0.3, 0.3)  # share of steps per domain (math, logic, science)
    mistake_level: int = declared(2, Interval(int, 0, None))
    mistake_rate: float = declared(0.6, Interval(float, 0.0, 1.0))
    seed: int = declared(0, Interval(int, 0, None))
    # torch threads while building: fixed, so the result does not depend on the machine's cores
    threads: int = declared(2, COUNT)

    @classmethod
    def from_dict(cls, values: dict) -> BaseRecipe:
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ValueError(f"unknown base-model recipe key(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
        values = dict(values)
        if "domain_weights" in values:
            values["domain_weights"] = tuple(values["domain_weights"])
        if isinstance(values.get("shape"), dict):
            shape_keys = set(ModelShape.__dataclass_fields__)
            bad = sorted(set(values["shape"]) - shape_keys)
            if bad:
                raise ValueError(f"unknown model shape key(s) {bad}; allowed: {', '.join(sorted(shape_keys))}")
            values["shape"] = ModelShape(**values["shape"])
        recipe = cls(**values)
        return dataclasses.replace(recipe, **check_declared(recipe, "backend.base."))


@cache
def data_digest() -> str:
    """Hash of every benchmark and training item (a change of the generators changes the key)."""
    h = hashlib.sha256()
    pools = training_pools()
    for items in [b.items() for b in BENCHMARKS] + [list(pools[d]) for d in DOMAINS]:
        for item in items:
            h.update(f"{item.kind}\t{item.prompt}\t{item.answer}\n".encode())
    return h.hexdigest()


def cache_key(recipe: BaseRecipe) -> str:
    blob = json.dumps(
        {"recipe": asdict(recipe), "data": data_digest(), "alphabet": ALPHABET, "format": FORMAT_VERSION},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_base_model(recipe: BaseRecipe, cache_dir: Path | None = None) -> Path:
    """Path of the cached base model for `recipe`, building it first if it is not there."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"base-{cache_key(recipe)}"
    with FileLock(str(target) + ".lock"):
        if not (target / "recipe.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=root))
            try:
                build_base_model(recipe, staging)
                (staging / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2))
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def build_base_model(recipe: BaseRecipe, out_dir: Path) -> None:
    """Run the warm-up with `recipe.threads` torch threads and save model + tokenizer to `out_dir`."""
    previous = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        _warm_up(recipe, out_dir)
    finally:
        torch.set_num_threads(previous)


def _warm_up(recipe: BaseRecipe, out_dir: Path) -> None:
    tokenizer = build_tokenizer()
    torch_gen = torch.Generator().manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    model = new_model(recipe.shape, len(tokenizer), torch_gen)
    pools = training_pools()
    items = [item for d in DOMAINS for item in pools[d]]  # domain-major: domain d is one contiguous block
    sizes = np.array([len(pools[d]) for d in DOMAINS])
    offsets = np.cumsum(sizes) - sizes
    corruptible = torch.tensor([KINDS[i.kind].level >= recipe.mistake_level for i in items])
    truth = encode_items(tokenizer, [i.prompt for i in items], [i.answer for i in items])
    wrong = encode_items(tokenizer, [i.prompt for i in items], [KINDS[i.kind].mistake(i) for i in items])
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _warmup_cosine(s, recipe.warmup_steps, recipe.steps)
    )
    model.train()
    with Progress(transient=True, disable=not get_console().is_terminal) as progress:  # a log gets no bar
        task = progress.add_task(f"building base model {out_dir.name}", total=recipe.steps)
        weights = np.asarray(recipe.domain_weights) / sum(recipe.domain_weights)
        for d in rng.choice(len(DOMAINS), size=recipe.steps, p=weights):  # one domain per batch: little padding
            index = torch.from_numpy(offsets[d] + rng.integers(sizes[d], size=recipe.batch_size))
            use_wrong = corruptible[index] & torch.from_numpy(rng.random(recipe.batch_size) < recipe.mistake_rate)
            loss = _answer_loss(model, truth, wrong, index, use_wrong)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            progress.update(task, advance=1, description=f"building base model (loss {loss.item():.3f})")
    model.eval()
    save_model(model, tokenizer, out_dir)


def _answer_loss(
    model: Qwen2ForCausalLM, truth: EncodedItems, wrong: EncodedItems, index: torch.Tensor, use_wrong: torch.Tensor
) -> torch.Tensor:
    """Token-mean cross-entropy of the chosen targets (truth or mistake) given the prompts."""
    batch = truth.select(index)
    mistakes = wrong.select(index)
    width = max(batch.targets.shape[1], mistakes.targets.shape[1])
    targets = torch.where(use_wrong[:, None], _pad_to(mistakes.targets, width), _pad_to(batch.targets, width))
    mask = (targets != PAD_ID).float()
    log_probs = response_log_probs(model, batch.prompt_ids, batch.prompt_mask, targets, mask)
    return -(log_probs * mask).sum() / mask.sum()


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
