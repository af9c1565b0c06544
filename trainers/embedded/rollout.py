"""Decoding with a KV cache (sampled or greedy) and response log-probabilities.

Prompts are left-padded; position ids count only real tokens, so a padded prompt sees the
same positions as an unpadded one. Response token t of row i is valid (mask 1) up to and
including its first eos; after it the row holds pad. GRPO samples `repeats` responses per
prompt: each prompt is encoded once and its KV cache repeated, both when sampling and in the
differentiable log-prob pass (gradients from all repeats flow back into the one prompt pass).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _prefill(model: PreTrainedModel, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, repeats: int):
    """One pass over the distinct prompts; returns (cache, last-position logits, mask, next position), repeated."""
    positions = (prompt_mask.cumsum(1) - 1).clamp(min=0)
    out = model(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    cache = out.past_key_values
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)
    expand = lambda t: t.repeat_interleave(repeats, dim=0)  # noqa: E731
    return cache, expand(out.logits[:, -1]), expand(prompt_mask), expand(prompt_mask.sum(1, keepdim=True))


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
    repeats: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Responses [B * repeats, L] (rows of a prompt adjacent; L <= max_new_tokens, decoding stops
    once every row has an eos) and their mask.

    temperature > 0 samples from softmax(logits / temperature) with `generator`; 0 is greedy.
    """
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    cache, logits, mask, next_position = _prefill(model, prompt_ids, prompt_mask, repeats)
    done = torch.zeros(logits.shape[0], dtype=torch.bool)
    tokens = []
    for _ in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(dim=-1)
        token = token.masked_fill(done, pad)
        tokens.append(token)
        done |= token == eos
        if done.all():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_position,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1]
        next_position = next_position + 1
    responses = torch.stack(tokens, dim=1)
    return responses, response_mask(responses, eos)


def response_mask(responses: torch.Tensor, eos: int) -> torch.Tensor:
    """[B, L] float: 1 for tokens up to and including the first eos (all tokens when there is none)."""
    eos_before = torch.cumsum(responses == eos, dim=1) - (responses == eos).long()
    return (eos_before == 0).float()


def response_log_probs(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    repeats: int = 1,
) -> torch.Tensor:
    """[B * repeats, L] log pi(y_t | x, y_<t), logits divided by `temperature` (as verl's actor does).

    Differentiable: call under torch.no_grad() for a reference model. With one response per
    prompt this is one pass over prompt + response; with repeats, a shared prompt pass first.
    """
    steps = responses.shape[1]
    if repeats == 1:
        attention = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        ids = torch.cat([prompt_ids, responses], dim=1)
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=steps + 1)
        logits = out.logits[:, :-1]
    else:
        cache, first_logits, full_mask, length = _prefill(model, prompt_ids, prompt_mask, repeats)
        attention = torch.cat([full_mask, mask.to(full_mask.dtype)], dim=1)
        positions = length + torch.arange(steps)
        out = model(input_ids=responses, attention_mask=attention, position_ids=positions, past_key_values=cache)
        logits = torch.cat([first_logits[:, None], out.logits[:, :-1]], dim=1)
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, responses[..., None]).squeeze(-1)
