"""Decoding with a KV cache (sampled or greedy) and response log-probabilities.

Prompts are left-padded; position ids count only real tokens, so a padded prompt sees the
same positions as an unpadded one. Response token t of row i is valid (mask 1) up to and
including its first eos; after it the row holds pad.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Responses [B, L] (L <= max_new_tokens; decoding stops once every row has an eos) and their mask.

    temperature > 0 samples from softmax(logits / temperature) with `generator`; 0 is greedy.
    """
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    batch = prompt_ids.shape[0]
    mask = prompt_mask
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    next_position = positions[:, -1:] + 1
    done = torch.zeros(batch, dtype=torch.bool)
    tokens = []
    for _ in range(max_new_tokens):
        logits = out.logits[:, -1]
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
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_position,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
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
) -> torch.Tensor:
    """[B, L] log pi(y_t | x, y_<t) with logits divided by `temperature` (as verl's actor does)."""
    ids = torch.cat([prompt_ids, responses], dim=1)
    attention = torch.cat([prompt_mask, mask.to(prompt_mask.dtype)], dim=1)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    length = responses.shape[1]
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=length + 1).logits
    logits = logits[:, :-1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses[..., None]).squeeze(-1)
