"""Export the embedded backend's tasks and model in verl's formats (GPU smoke test, tests).

Parquet rows (verl `RLHFDataset`, verl/utils/dataset/rl_dataset.py):

    prompt        [{"role": "user", "content": <task prompt>}]
    data_source   benchmark name (validation) or "generated/<kind>" (training)
    reward_model  {"style": "rule", "ground_truth": <answer>}
    extra_info    {"index": i, "tune_dfrl_kind": <kind>, "tune_dfrl_prompt": <prompt>}  (reward.py)
    domain        math | logic | science

The model directory is the embedded model in a form verl accepts: the character tokenizer as
the byte-level BPE that transformers loads for model type qwen2 (same ids for every character),
its end-of-sequence token named `<|im_end|>` and "\n" one token (a new vocabulary row
initialised as the unknown token's, which the model never emits), as verl's Continuous Token
builder for qwen2 requires; the chat template renders the user turns verbatim: the embedded
model reads the bare task prompt.

One command writes OUT_DIR/model and OUT_DIR/data/{train,val}.parquet from the cached base model
of the embedded backend (built first when missing):

    python -m tune_dfrl.trainers.verl.export OUT_DIR [--per-domain N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, training_pools
from tune_dfrl.trainers.embedded.model import EOS, PAD, UNK
from tune_dfrl.trainers.embedded.tasks import Item

from .reward import KIND_KEY, PROMPT_KEY

VERBATIM_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
CHAT_EOS = "<|im_end|>"
NEWLINE = "\n"


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


def chat_tokenizer(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The embedded character tokenizer as a byte-level BPE without merges, the form Hugging Face
    loads for model type qwen2 (`Qwen2Tokenizer`): every character keeps its id under its
    byte-level name (" " is "Ġ"), `<eos>` is renamed `<|im_end|>`, "\n" ("Ċ") is appended, and
    the chat template renders user turns verbatim."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    specials = {PAD: PAD, EOS: CHAT_EOS, UNK: UNK}
    vocab = {
        specials.get(token) or byte_level.pre_tokenize_str(token)[0][0]: index
        for token, index in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    }
    vocab[byte_level.pre_tokenize_str(NEWLINE)[0][0]] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"), byte_level]
    )
    core.decoder = decoders.ByteLevel()
    chat = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=CHAT_EOS, unk_token=UNK, padding_side="left"
    )
    chat.chat_template = VERBATIM_CHAT_TEMPLATE
    return chat


def export_model(model_dir: Path, out_dir: Path) -> Path:
    """The embedded model directory `model_dir` with the chat tokenizer, saved to `out_dir`."""
    tokenizer = chat_tokenizer(PreTrainedTokenizerFast.from_pretrained(model_dir))
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    embeddings = model.get_input_embeddings().weight
    with torch.no_grad():
        embeddings[tokenizer.convert_tokens_to_ids(NEWLINE)] = embeddings[tokenizer.unk_token_id]
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def export(out_dir: Path, model_dir: Path | None = None, per_domain: int | None = None) -> tuple[Path, Path, Path]:
    """(model dir, train.parquet, val.parquet) under `out_dir`; the model defaults to the embedded
    backend's cached base model."""
    if model_dir is None:
        from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model

        model_dir = ensure_base_model(BaseRecipe())
    model = export_model(Path(model_dir), out_dir / "model")
    return (model, *export_tasks(out_dir / "data", per_domain))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tune_dfrl.trainers.verl.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="embedded model directory (default: cached base model)"
    )
    parser.add_argument("--per-domain", type=int, default=None, help="training prompts per domain (default: all)")
    args = parser.parse_args(argv)
    if args.per_domain is not None and args.per_domain < 1:
        print(f"error: --per-domain must be >= 1; got {args.per_domain}", file=sys.stderr)
        return 2
    if args.model_dir is not None and not (args.model_dir / "config.json").is_file():
        print(
            f"error: --model-dir {args.model_dir} is not a Hugging Face model directory (no config.json)",
            file=sys.stderr,
        )
        return 2
    for path in export(args.out_dir.resolve(), args.model_dir, args.per_domain):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
