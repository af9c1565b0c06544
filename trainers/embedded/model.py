"""The tiny policy: a small Qwen2 decoder with a character-level tokenizer, saved as a HF model directory.

transformers is imported where a model or tokenizer is made: its model classes take seconds to import, and the
search driver, which imports this backend for its recipe's declaration, never makes one. When a trial's worker does,
transformers sees scikit-learn and scipy as not installed (`import_hooks.lighten_transformers`: ~1 CPU-s of
imports per worker that the tiny model never uses)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from ..import_hooks import lighten_transformers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

lighten_transformers()

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
PAD_ID, EOS_ID = 0, 1
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789+-*=?:>,&|~()"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of ALPHABET plus pad / eos / unk; left padding for generation."""
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([PAD, EOS, UNK, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


@dataclass(frozen=True)
class ModelShape:
    """Size of the Qwen2 decoder (defaults: ~134k parameters)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    max_positions: int = 96


def new_model(shape: ModelShape, vocab_size: int, generator: torch.Generator) -> Qwen2ForCausalLM:
    """A freshly initialised model: N(0, 0.02) weights drawn from `generator`, zero biases, unit norms."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * config.initializer_range)
    return model


def load_model(path: Path) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Model and tokenizer from a directory written by `save_model` (a valid HF model directory)."""
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, PreTrainedTokenizerFast.from_pretrained(path)


def save_model(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save in Hugging Face's format, without its "Writing model shards" bar (the caller shows its own progress)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


@dataclass(frozen=True)
class EncodedItems:
    """Token tensors of a list of items: left-padded prompts [M, P] + mask, targets [M, A] (answer, eos, pad)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    targets: torch.Tensor

    def select(self, index: torch.Tensor) -> EncodedItems:
        """Rows `index`, with all-pad prompt columns and all-pad target columns trimmed."""
        mask = self.prompt_mask[index]
        first = int((mask.sum(0) > 0).int().argmax())
        targets = self.targets[index]
        width = int((targets != PAD_ID).sum(0).nonzero().max()) + 1
        return EncodedItems(self.prompt_ids[index][:, first:], mask[:, first:], targets[:, :width])


def encode_items(tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: list[str]) -> EncodedItems:
    """Token ids of many items at once. The tokenizer maps each character to one token, so this is
    a vectorised table lookup equal to `tokenizer(prompts, padding=True)` (and answer + eos)."""
    table = np.full(256, tokenizer.unk_token_id, dtype=np.int64)
    for token, index in tokenizer.get_vocab().items():
        if len(token) == 1:
            table[ord(token)] = index
    prompt_ids, prompt_mask = _pad_chars(prompts, table, left=True)
    answer_ids, answer_mask = _pad_chars(answers, table, left=False, extra=1)
    lengths = answer_mask.sum(1)
    answer_ids[np.arange(len(answers)), lengths] = EOS_ID
    return EncodedItems(torch.from_numpy(prompt_ids), torch.from_numpy(prompt_mask), torch.from_numpy(answer_ids))


def _pad_chars(texts: list[str], table: np.ndarray, left: bool, extra: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[M, W + extra] ids (pad elsewhere) and mask of `texts`, aligned right (left padding) or left."""
    lengths = np.array([len(t) for t in texts])
    flat = table[np.frombuffer("".join(texts).encode("latin-1"), dtype=np.uint8)]
    width = int(lengths.max()) + extra
    rows = np.repeat(np.arange(len(texts)), lengths)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    if left:
        cols += width - lengths[rows]
    ids = np.full((len(texts), width), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(texts), width), dtype=np.int64)
    ids[rows, cols] = flat
    mask[rows, cols] = 1
    return ids, mask


def decode_responses(tokenizer: PreTrainedTokenizerFast, responses: torch.Tensor) -> tuple[list[str], list[bool]]:
    """Per row: the text before the first eos (the whole row when there is none) and whether an eos came.

    Special tokens inside the text decode to NUL, which no answer pattern accepts.
    """
    symbols = [t if len(t) == 1 else "\x00" for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
    is_eos = responses == EOS_ID
    finished = is_eos.any(dim=1)
    ends = torch.where(finished, is_eos.int().argmax(dim=1), responses.shape[1]).tolist()
    texts = ["".join(symbols[i] for i in row[:end]) for row, end in zip(responses.tolist(), ends)]
    return texts, finished.tolist()
