"""Rollout engine `hf_cpu`: token-in, token-out sampling with the Hugging Face model, on CPU.

verl's synchronous trainer (hybrid mode) runs one replica per training worker:

- `HFReplica` (the replica verl's `LLMServerManager` creates) starts one `HFRolloutServer` Ray
  actor, named after the replica, whose async `generate` verl's agent loop calls; the plugin trainer
  creates replica 0's before verl builds its training workers (`start_server`), so that the server's
  process imports this module (seconds) while theirs import verl, and the replica loads the model into it;
- the server is also the request router of verl's clients (`LLMServerClient`): with one server, verl's
  `GlobalRequestLoadBalancer` actor (a process of its own that imports verl) would send every request to it,
  so the CPU support hands the clients the server's own handle (cpu/patches.py) and the server answers the
  router's four calls itself (`acquire_server` returns the server);
- `HFServerAdapter` (the worker-side rollout inside each training worker) sends the trainer's
  weights to that actor after every step (`update_weights`; one Ray call with the full tensors);
- `GroupIndexedAgentLoop` (agent loop `AGENT_LOOP_NAME`) is verl's single-turn agent loop whose
  requests say which response of its prompt's group each one is.

Sampling (`sample`), for prompt tokens x and at most `max_tokens` new ones: a plain KV-cache
loop; at each step the next-token distribution is p = softmax(logits / T); the token is drawn
from p restricted to its `top_k` most likely tokens and to the smallest most-likely set of mass
>= `top_p` (renormalised), or is argmax p when T = 0 (validation); the reported log-prob is
log p(token) with the full tempered p, the quantity verl's actor recomputes. Generation stops
after an end-of-sequence token. `max_tokens` = min(response_length, room left in the model's
context). Each request draws from its own generator, seeded by
sha256(rollout seed, weight version, i, prompt tokens), where i is the request's index in its
prompt's group of n: verl's single-turn agent loop sends request id `det-<priority>` under
`actor_rollout_ref.rollout.full_determinism` (which `device=cpu` sets) and `GroupIndexedAgentLoop`
passes i as the priority. Response i of a prompt is then the same in every run, whatever the order
in which the group's concurrent requests arrive (two rows of one prompt in one step draw the same
samples). Requests are served one at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import CONTROL_METHOD_CONCURRENCY, RolloutMode, RolloutReplica, TokenOutput

from . import AGENT_LOOP_NAME, ROLLOUT_NAME


def server_name(replica_rank: int) -> str:
    return f"{ROLLOUT_NAME}_server_{replica_rank}"


def model_path(model_config: Any) -> str:
    """The model directory of verl's model config (a DictConfig or `HFModelConfig`)."""
    for key in ("local_path", "path"):
        value = model_config.get(key) if hasattr(model_config, "get") else getattr(model_config, key, None)
        if value:
            return str(value)
    raise ValueError("the rollout's model config has neither local_path nor path")


def group_index(request_id: str) -> int:
    """i of a request id `det-<i>` (`GroupIndexedAgentLoop` under rollout.full_determinism)."""
    prefix, _, index = request_id.partition("-")
    if prefix != "det" or not index.isdigit():
        raise ValueError(
            f"rollout '{ROLLOUT_NAME}' seeds each response by its index in its group, which verl sends as request "
            f"id 'det-<index>' with actor_rollout_ref.rollout.full_determinism=true and agent loop "
            f"'{AGENT_LOOP_NAME}' (device=cpu sets both); got request id {request_id!r}"
        )
    return int(index)


def request_seed(seed: int, version: int, index: int, prompt_ids: Iterable[int]) -> int:
    text = f"{seed}|{version}|{index}|{','.join(map(str, prompt_ids))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)


def truncated_probs(log_p: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """exp(log_p) restricted to the top_k most likely tokens (top_k > 0) and to the smallest
    most-likely set whose mass reaches top_p (top_p < 1); not renormalised."""
    probs = log_p.exp()
    if 0 < top_k < probs.numel():
        probs = torch.where(probs >= torch.topk(probs, top_k).values[-1], probs, 0.0)
    if top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        mass_before = ordered.cumsum(0) - ordered
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[mass_before < top_p * ordered.sum()]] = True
        probs = torch.where(keep, probs, 0.0)
    return probs


@torch.inference_mode()
def sample(
    model: Any,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    stop_ids: set[int],
    generator: torch.Generator,
) -> tuple[list[int], list[float]]:
    """(response tokens, their log-probs) for one prompt; see the module docstring."""
    tokens: list[int] = []
    log_probs: list[float] = []
    inputs, past = torch.tensor([prompt_ids]), None
    for _ in range(max_tokens):
        output = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past = output.past_key_values
        logits = output.logits[0, -1].float()
        log_p = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
        if temperature > 0:
            token = int(torch.multinomial(truncated_probs(log_p, top_k, top_p), 1, generator=generator))
        else:
            token = int(log_p.argmax())
        tokens.append(token)
        log_probs.append(float(log_p[token]))
        if token in stop_ids:
            break
        inputs = torch.tensor([[token]])
    return tokens, log_probs


def server_concurrency(rollout_config: Any) -> int:
    """Ray's `max_concurrency` of a rollout server (verl's for its replicas): Ray's default for async actors, 1000,
    or room for `max_num_seqs` requests and verl's control calls."""
    return max(1000, int(rollout_config.max_num_seqs) + CONTROL_METHOD_CONCURRENCY)


def start_server(replica_rank: int, rollout_config: Any) -> ray.actor.ActorHandle:
    """Create the (empty) server of replica `replica_rank`; `HFReplica.launch_servers` loads the model into it."""
    return (
        ray.remote(HFRolloutServer)
        .options(name=server_name(replica_rank), max_concurrency=server_concurrency(rollout_config))
        .remote()
    )


class HFRolloutServer:
    """Ray actor holding the rollout's copy of the model (`load`); serves `generate` one request at a time, and
    routes every request of verl's `LLMServerClient` to itself (the router calls below)."""

    def load(self, config: Any, model_config: Any, replica_rank: int) -> None:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        path = model_path(model_config)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        eos = self.model.generation_config.eos_token_id
        self.stop_ids = {tokenizer.eos_token_id, *([] if eos is None else [eos] if isinstance(eos, int) else eos)}
        self.stop_ids.discard(None)
        self.config, self.replica_rank = config, replica_rank
        self.max_model_len = int(config.max_model_len or self.model.config.max_position_embeddings)
        self.weight_version = 0
        self.lock = asyncio.Lock()

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> None:
        """Load the trainer's full weights; tied output weights may be left out."""
        result = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if result.unexpected_keys or set(result.missing_keys) - tied:
            raise ValueError(
                f"weight sync mismatch: missing {result.missing_keys}, unexpected {result.unexpected_keys}"
            )
        self.weight_version = int(global_steps or 0)

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, **unused: Any
    ) -> TokenOutput:
        prompt = [int(t) for t in prompt_ids]
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in the model's {self.max_model_len}")
        max_tokens = min(self.config.response_length, int(sampling_params.get("max_tokens") or room), room)
        seed = request_seed(self.config.seed, self.weight_version, group_index(request_id), prompt)
        generator = torch.Generator().manual_seed(seed)
        async with self.lock:
            tokens, log_probs = await asyncio.to_thread(
                sample,
                self.model,
                prompt,
                max_tokens,
                float(sampling_params.get("temperature", 1.0)),
                int(sampling_params.get("top_k", -1)),
                float(sampling_params.get("top_p", 1.0)),
                self.stop_ids,
                generator,
            )
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.weight_version},
        )

    def require_acquire_fields(self) -> list[str]:
        return []

    def require_release_fields(self) -> list[str]:
        return []

    def acquire_server(self, request_id: str) -> tuple[str, ray.actor.ActorHandle]:
        """(this server's address, its handle): the one server of the replica takes every request."""
        return server_name(self.replica_rank), ray.get_runtime_context().current_actor

    def release_server(self, server_id: str) -> None:
        pass

    async def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {}

    async def resume_generation(self) -> None:
        pass

    async def start_profile(self, **kwargs: Any) -> None:
        pass

    async def stop_profile(self) -> None:
        pass


class GroupIndexedAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop with the request's priority set to its index in the group (verl's
    v1 agent loop passes it as `session_id`), which the request id carries under full_determinism."""

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> Any:
        if "session_id" not in kwargs:
            raise ValueError(f"agent loop '{AGENT_LOOP_NAME}' runs under verl's v1 trainer, which passes session_id")
        return await super().run(sampling_params, priority=int(kwargs["session_id"]), **kwargs)


class HFReplica(RolloutReplica):
    """One `HFRolloutServer` per training worker (hybrid mode only: verl's synchronous trainer)."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID or self.world_size != 1:
            raise NotImplementedError(
                f"rollout '{ROLLOUT_NAME}' runs in hybrid mode with tensor_model_parallel_size=1 "
                f"only; got mode {self.rollout_mode}, world size {self.world_size}"
            )
        name = server_name(self.replica_rank)
        try:
            server = ray.get_actor(name)  # started by the plugin trainer
        except ValueError:
            server = start_server(self.replica_rank, self.config)
        await server.load.remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        self.servers, self._server_handle, self._server_address = [server], server, name


class HFServerAdapter(BaseRollout):
    """Worker-side rollout: forwards the trainer's weights to this worker's `HFRolloutServer`."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = int(os.environ["RANK"]) if replica_rank == -1 else replica_rank
        self.server: Any = None

    async def resume(self, tags: list[str]) -> None:
        pass

    async def release(self) -> None:
        pass

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"rollout '{ROLLOUT_NAME}' takes full named tensors; got wire format {wire_format!r}")
        state = {
            name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().to("cpu", copy=True)
            for name, t in weights
        }
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        await self.server.load_weights.remote(state, global_steps)
