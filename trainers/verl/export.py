"""Export the embedded backend's tasks and model in verl's formats (GPU smoke test, tests).

Parquet rows (verl `RLHFDataset`, verl/utils/dataset/rl_dataset.py):

    prompt        [{"role": "user", "content": <task prompt>}]
    data_source   benchmark name (validation) or "generated/<kind>" (training)
    reward_model  {"style": "rule", "ground_truth": <answer>}
    extra_info    {"index": i, "tune_dfrl_kind": <kind>, "tune_dfrl_prompt": <prompt>}  (reward.py)
    domain        math | logic | science

The model directory is a copy of a Hugging Face model directory whose tokenizer gets a chat
template that renders the user turns verbatim: the embedded model reads the bare task prompt.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import AutoTokenizer

from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, training_pools
from tune_dfrl.trainers.embedded.tasks import Item

from .reward import KIND_KEY, PROMPT_KEY

VERBATIM_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def rows(items: Iterable[Item], data_source: str | None = None) -> list[dict[str, Any]]:
    """verl rows of `items`; data_source defaults to "generated/<kind>"."""
    return [
        {
            "prompt": [{"role": "user", "content": item.prompt}],
            "data_source": data_source or f"generated/{item.kind}",
            "reward_model": {"style": "rule", "ground_truth": item.answer},
            "extra_info": {"index": i, KIND_KEY: item.kind, PROMPT_KEY: item.prompt},
            "domain": item.domain,
        }
        for i, item in enumerate(items)
    ]


def write_parquet(records: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def export_tasks(out_dir: Path, per_domain: int | None = None) -> tuple[Path, Path]:
    """(train.parquet, val.parquet): the training pools (first `per_domain` items of each
    domain, all when None) and the twelve benchmarks (data_source = benchmark name)."""
    pools = training_pools()
    train = rows(item for items in pools.values() for item in items[:per_domain])
    val = [row for bench in BENCHMARKS for row in rows(bench.items(), data_source=bench.name)]
    return write_parquet(train, out_dir / "train.parquet"), write_parquet(val, out_dir / "val.parquet")


def export_model(model_dir: Path, out_dir: Path) -> Path:
    """Copy a Hugging Face model directory and give its tokenizer the verbatim chat template."""
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.chat_template = VERBATIM_CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return out_dir
