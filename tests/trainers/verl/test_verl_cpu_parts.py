"""verl's CPU support, part by part, without starting verl's trainer: the verl 0.9.1 symbols it
changes are the expected ones, a `VERL_PLATFORM=cpu` process gets the cpu platform, the FSDP
engines, the rollout and a gloo process group, the exported model is read by verl's qwen2
tokenisation exactly as the embedded backend reads it, and the rollout's sampling loop gives
the log-probs a full forward pass gives."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import types
import uuid
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy

from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, training_pools
from tune_dfrl.trainers.embedded.model import EOS_ID, ModelShape, build_tokenizer, new_model, save_model
from tune_dfrl.trainers.verl.cpu import cpu_env, cpu_overrides, patches
from tune_dfrl.trainers.verl.cpu.rollout import group_index, request_seed, sample, truncated_probs
from tune_dfrl.trainers.verl.export import CHAT_EOS, NEWLINE, export_model, main


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """(embedded model dir, exported model dir) of a randomly initialised embedded model."""
    root = tmp_path_factory.mktemp("verl_cpu_parts")
    tokenizer = build_tokenizer()
    save_model(new_model(ModelShape(), len(tokenizer), torch.Generator().manual_seed(3)), tokenizer, root / "raw")
    return root / "raw", export_model(root / "raw", root / "model")


def test_changed_verl_symbols_are_verl_0_9_1s():
    patches.check_pinned()


def test_a_changed_symbol_that_differs_is_an_error():
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return backend or "cpu:gloo"

    module = types.ModuleType("fake_distributed")
    module.initialize_global_process_group_ray = initialize_global_process_group_ray
    with pytest.raises(patches.PinnedSymbolError, match="no longer contains"):
        patches.patch_distributed(module)
    with pytest.raises(patches.PinnedSymbolError, match="_ROLLOUT_REGISTRY"):
        patches.check_rollout_base(types.SimpleNamespace(_ROLLOUT_REGISTRY={}))

    class SingleTurnAgentLoop:  # builds a fresh uuid request id whatever full_determinism says
        async def run(self, sampling_params, priority=0, **kwargs):
            request_id = uuid.uuid4().hex
            return request_id

    with pytest.raises(patches.PinnedSymbolError, match="no longer builds"):
        patches.check_single_turn(types.SimpleNamespace(SingleTurnAgentLoop=SingleTurnAgentLoop))

    class FSDPEngine:  # offloads its reference model without pinning: nothing to change
        def _build_fsdp_module(self, module):
            return CPUOffloadPolicy(pin_memory=False)

    with pytest.raises(patches.PinnedSymbolError, match="no longer builds"):
        patches.unpin_offload_policy(types.SimpleNamespace(CPUOffloadPolicy=CPUOffloadPolicy, FSDPEngine=FSDPEngine))

    class LLMServerManager:
        async def _init_global_load_balancer(self):
            self.global_load_balancer = get_router_handle(servers={})  # noqa: F821

    class LLMServerClient:  # also asks its router for a call the rollout server does not answer
        async def _acquire_server(self, request_id):
            await self._load_balancer.get_total_inflight.remote()
            return await self._load_balancer.acquire_server.remote(request_id=request_id)

    with pytest.raises(patches.PinnedSymbolError, match="calls its router"):
        patches.route_through_the_server(
            types.SimpleNamespace(LLMServerManager=LLMServerManager, LLMServerClient=LLMServerClient)
        )


CPU_PROCESS = """
import os, torch, verl
from verl.plugin.platform import get_platform
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout.base import get_rollout_class
from verl.workers.rollout.replica import get_rollout_replica_class
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from tune_dfrl.trainers.verl.cpu import AGENT_LOOP_NAME, ROLLOUT_NAME
import verl.workers.engine.fsdp.transformer_impl as fsdp

platform = get_platform()
assert platform.device_name == "cpu" and platform.communication_backend_name() == "gloo"
assert torch.ones(1).to(platform.current_device()).device.type == "cpu"
assert EngineRegistry._engines["language_model"]["fsdp2"]["cpu"] is fsdp.FSDPEngineWithLMHead
assert get_rollout_class(ROLLOUT_NAME).__name__ == "HFServerAdapter"
assert get_rollout_replica_class(ROLLOUT_NAME).__name__ == "HFReplica"
from hydra.utils import get_class
loop = get_class(_agent_loop_registry[AGENT_LOOP_NAME]["_target_"])
assert loop.__name__ == "GroupIndexedAgentLoop" and "single_turn_agent" in _agent_loop_registry
assert fsdp.CPUOffloadPolicy(pin_memory=True).pin_memory is False  # the reference model's offload, unpinned
from verl.workers.rollout.llm_server import LLMServerManager
assert LLMServerManager._init_global_load_balancer.__wrapped__  # the rollout server is its clients' router
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
initialize_global_process_group_ray()
value = torch.ones(2)
torch.distributed.all_reduce(value)
assert torch.distributed.get_backend() in ("gloo", "cpu:gloo") and value.tolist() == [1.0, 1.0]
import psutil
listening = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
assert listening <= {"127.0.0.1"}, listening  # gloo's own; no TCPStore on every interface (file:// rendezvous)
torch.distributed.destroy_process_group()
print("ok")
"""


def test_a_verl_platform_cpu_process_gets_platform_engines_rollout_and_process_group(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items()}
    env.update(cpu_env(tmp_path))
    done = subprocess.run([sys.executable, "-c", CPU_PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_cpu_overrides_and_environment(tmp_path):
    overrides = cpu_overrides()
    assert "trainer.device=cpu" in overrides and "+ray_kwargs.ray_init.num_gpus=1" in overrides
    assert "actor_rollout_ref.rollout.full_determinism=true" in overrides
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=hf_cpu_single_turn" in overrides
    assert not any("kl" in o for o in overrides)  # the KL loss is the recipe's, on both devices
    env = cpu_env(tmp_path)
    assert env["VERL_PLATFORM"] == "cpu" and Path(env["TMPDIR"]).is_dir()
    assert env["DIST_INIT_METHOD"].startswith(f"file://{Path(env['TMPDIR'])}/process_group-")
    assert cpu_env(tmp_path)["DIST_INIT_METHOD"] != env["DIST_INIT_METHOD"]  # a new rendezvous file per start


def test_exported_tokenizer_reads_every_task_as_the_embedded_one(exported):
    from transformers import AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    chat, embedded = AutoTokenizer.from_pretrained(exported[1]), build_tokenizer()
    assert type(chat).__name__ == "Qwen2Tokenizer"  # what transformers loads for model type qwen2
    assert chat.eos_token == CHAT_EOS and chat.eos_token_id == EOS_ID
    assert len(chat.encode(NEWLINE, add_special_tokens=False)) == 1
    prompts = [i.prompt for b in BENCHMARKS for i in b.items()] + [
        i.prompt for p in training_pools().values() for i in p
    ]
    assert all(chat.encode(p, add_special_tokens=False) == embedded.encode(p) for p in prompts)
    builder = create_continuous_token_builder(chat, hf_model_type="qwen2")
    assert builder.build_initial_tokens([{"role": "user", "content": prompts[-1]}]) == embedded.encode(prompts[-1])
    assert chat.decode(embedded.encode(prompts[-1]) + [EOS_ID], skip_special_tokens=True) == prompts[-1]


def test_exported_model_computes_what_the_embedded_model_computes(exported):
    from transformers import AutoModelForCausalLM

    raw, chat = (AutoModelForCausalLM.from_pretrained(p).eval() for p in exported)
    ids = torch.tensor([build_tokenizer().encode("1+7+1=")])
    with torch.no_grad():
        before, after = raw(ids).logits, chat(ids).logits
    torch.testing.assert_close(after[..., : before.shape[-1]], before)


def test_export_command_rejects_bad_input(tmp_path, capsys):
    assert main([str(tmp_path / "out"), "--per-domain", "0"]) == 2
    assert main([str(tmp_path / "out"), "--model-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("error:") == 2


def test_sampling_log_probs_are_the_tempered_distribution_of_a_full_forward(exported):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(exported[1]).eval()
    prompt = build_tokenizer().encode("3+4=")

    def draw(seed, **kw):
        return sample(model, prompt, 8, stop_ids={EOS_ID}, generator=torch.Generator().manual_seed(seed), **kw)

    tokens, log_probs = draw(1, temperature=0.7, top_k=-1, top_p=1.0)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(log_probs), expected, atol=1e-5, rtol=1e-5)
    assert draw(1, temperature=0.7, top_k=-1, top_p=1.0) == (tokens, log_probs)  # seeded
    greedy = draw(2, temperature=0.0, top_k=-1, top_p=1.0)[0]
    assert (
        draw(3, temperature=1.0, top_k=1, top_p=1.0)[0] == greedy == draw(4, temperature=1.0, top_k=-1, top_p=1e-6)[0]
    )


def test_truncation_and_request_seeds():
    log_p = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert truncated_probs(log_p, 2, 1.0).nonzero().flatten().tolist() == [0, 1]
    assert truncated_probs(log_p, -1, 0.7).nonzero().flatten().tolist() == [0, 1]
    assert truncated_probs(log_p, -1, 0.85).nonzero().flatten().tolist() == [0, 1, 2]
    assert request_seed(1, 0, 0, [5, 6]) == request_seed(1, 0, 0, [5, 6]) != request_seed(1, 0, 1, [5, 6])
    assert request_seed(1, 0, 0, [5, 6]) not in {request_seed(2, 0, 0, [5, 6]), request_seed(1, 1, 0, [5, 6])}
    assert group_index("det-3") == 3
    for request_id in ("0f3a9c", "det-", "det-x", "vllm-3"):  # verl's uuid ids without rollout.full_determinism
        with pytest.raises(ValueError, match="full_determinism=true and agent loop 'hf_cpu_single_turn'"):
            group_index(request_id)


@pytest.mark.integration
def test_the_rollout_server_routes_its_clients_requests_to_itself(exported, ray_session):
    """For rollout hf_cpu with one server, verl's `LLMServerManager` hands its clients the server's handle instead of
    starting verl's router (patches.route_through_the_server); verl's `LLMServerClient` then acquires that server,
    generates through it and releases it, under full determinism by the request's index in its group."""
    from omegaconf import OmegaConf
    from verl.workers.rollout import llm_server

    from tune_dfrl.trainers.verl.cpu.rollout import server_name, start_server

    rollout = OmegaConf.create(
        {"name": "hf_cpu", "full_determinism": True, "max_num_seqs": 8, "max_model_len": None, "response_length": 4}
    )
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {**OmegaConf.to_container(rollout), "seed": 5}}})
    server = start_server(7, rollout)
    ray_session.get(
        server.load.remote(
            config=config.actor_rollout_ref.rollout, model_config={"path": str(exported[1])}, replica_rank=7
        )
    )
    patches.route_through_the_server(llm_server)
    manager = llm_server.LLMServerManager.__new__(llm_server.LLMServerManager)
    manager.rollout_config, manager.server_handles = rollout, [server]
    asyncio.run(manager._init_global_load_balancer())
    assert manager.global_load_balancer is server

    async def two_requests() -> list:
        client = llm_server.LLMServerClient(config, load_balancer_handle=manager.global_load_balancer)
        assert (await client._acquire_server("det-1"))[0] == server_name(7)
        prompt = {"prompt_ids": [5, 6, 7], "sampling_params": {"temperature": 1.0}}
        return [await client.generate(request_id, **prompt) for request_id in ("det-1", "det-1", "det-2")]

    first, again, other = asyncio.run(two_requests())
    assert 1 <= len(first.token_ids) <= 4 and first.token_ids == again.token_ids and first.log_probs == again.log_probs
    assert len(other.log_probs) == len(other.token_ids)
    ray_session.kill(server)
