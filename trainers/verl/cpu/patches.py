"""The changes verl 0.9.1 needs beyond a platform to train on CPU, each applied right after verl
imports the module it changes (`import_hooks.after_import`), each checked against what 0.9.1 ships.

- `verl.utils.distributed.initialize_global_process_group_ray` builds the default process-group
  backend as "cpu:gloo,{device}:{backend}", which on device "cpu" reads "cpu:gloo,cpu:gloo" and
  torch rejects ("Duplicate device type cpu"). Replaced, process-wide, by a wrapper whose
  default is "cpu:gloo". It takes effect because plugins load inside `import verl`, before
  `verl.workers.engine_workers` imports the function by name.
- verl registers its FSDP training engines (`verl.workers.engine.fsdp.transformer_impl`) for
  devices "cuda" and "npu" only; they are registered for "cpu" too (`EngineRegistry.register`).
  FSDP2 (`fully_shard`) runs on CPU with gloo.
- the FSDP engine offloads a forward-only model under FSDP2 (the reference model of the KL loss) with
  `CPUOffloadPolicy(pin_memory=True)`, and pinning memory needs an accelerator. Inside that module only, the
  name `CPUOffloadPolicy` becomes a function that builds torch's policy with `pin_memory=False` (the
  parameters stay in ordinary host memory, which on CPU is where they are computed on anyway).
- rollout engine `ROLLOUT_NAME` (rollout.py): its worker-side adapter enters
  `verl.workers.rollout.base._ROLLOUT_REGISTRY` (a module dict: verl has no public call) and its
  replica `RolloutReplicaRegistry.register` (public), loaded only when verl asks for it;
- agent loop `AGENT_LOOP_NAME` (rollout.py) enters `verl.experimental.agent_loop.agent_loop.
  _agent_loop_registry` by class path, as verl's `register` decorator does; it relies on verl's
  single-turn agent loop sending request id `det-<priority>` under rollout.full_determinism.
- verl's `LLMServerManager` (`verl.workers.rollout.llm_server`) starts a `GlobalRequestLoadBalancer` actor that
  the agent loop's `LLMServerClient` asks for a server before each request. For rollout `ROLLOUT_NAME` with one
  server (the synchronous trainer's one replica), `_init_global_load_balancer` hands the clients that server's
  handle instead, and the server answers the router's calls (`rollout.HFRolloutServer.acquire_server`): one
  process fewer per trial, which would import verl only to route every request to the one server. Any other
  rollout, or more servers, get verl's router.

`check_pinned()` imports every target and raises `PinnedSymbolError` if one is not what these
changes assume; the same checks run before each change is applied.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...import_hooks import after_import
from ..plugin import CPU_PLATFORM
from . import AGENT_LOOP_NAME, ROLLOUT_NAME

DISTRIBUTED = "verl.utils.distributed"
FSDP_ENGINES = "verl.workers.engine.fsdp.transformer_impl"
DEFAULT_BACKEND_SOURCE = 'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
CPU_BACKEND = "cpu:gloo"
ENGINE_CLASSES = {"language_model": "FSDPEngineWithLMHead", "value_model": "FSDPEngineWithValueHead"}
ENGINE_BACKENDS = ("fsdp", "fsdp2")
PINNED_OFFLOAD = "offload_policy = CPUOffloadPolicy(pin_memory=True)"
ROLLOUT_BASE = "verl.workers.rollout.base"
ROLLOUT_REPLICA = "verl.workers.rollout.replica"
ADAPTER = "tune_dfrl.trainers.verl.cpu.rollout.HFServerAdapter"
AGENT_LOOPS = "verl.experimental.agent_loop.agent_loop"
SINGLE_TURN = "verl.experimental.agent_loop.single_turn_agent_loop"
SINGLE_TURN_REQUEST_ID = 'request_id = f"det-{priority}" if getattr(self.rollout_config, "full_determinism", False)'
AGENT_LOOP = "tune_dfrl.trainers.verl.cpu.rollout.GroupIndexedAgentLoop"
LLM_SERVER = "verl.workers.rollout.llm_server"
ROUTER_CREATION = "self.global_load_balancer = get_router_handle("
ROUTER_CALLS = ("acquire_server", "release_server", "require_acquire_fields", "require_release_fields")


class PinnedSymbolError(RuntimeError):
    """A verl symbol that the CPU support changes differs from verl 0.9.1's."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise PinnedSymbolError(f"verl CPU support (pinned to verl 0.9.1): {message}")


def check_distributed(module: ModuleType) -> None:
    function = getattr(module, "initialize_global_process_group_ray", None)
    _require(callable(function), f"{DISTRIBUTED}.initialize_global_process_group_ray is missing")
    source = inspect.getsource(getattr(function, "__wrapped__", function))
    _require(
        DEFAULT_BACKEND_SOURCE in source,
        f"{DISTRIBUTED}.initialize_global_process_group_ray no longer contains `{DEFAULT_BACKEND_SOURCE}`",
    )
    _require(
        list(inspect.signature(function).parameters) == ["timeout_second", "backend"],
        f"{DISTRIBUTED}.initialize_global_process_group_ray has parameters "
        f"{list(inspect.signature(function).parameters)}; expected ['timeout_second', 'backend']",
    )


def replace_once(module: Any, name: str, replacement: Callable[[Any], Callable[..., Any]]) -> None:
    """Set `module.name` (an attribute of a module or a class) to `replacement(original)`, carrying the original as
    `__wrapped__`; a name already replaced (it has `__wrapped__`) is left as it is."""
    original = getattr(module, name)
    if getattr(original, "__wrapped__", None) is None:
        setattr(module, name, functools.wraps(original, updated=())(replacement(original)))


def patch_distributed(module: ModuleType) -> None:
    check_distributed(module)

    def cpu_default(original: Callable[..., None]) -> Callable[..., None]:
        def initialize_global_process_group_ray(timeout_second: Any = None, backend: str | None = None) -> None:
            return original(timeout_second=timeout_second, backend=backend or CPU_BACKEND)

        return initialize_global_process_group_ray

    replace_once(module, "initialize_global_process_group_ray", cpu_default)


def check_engines(module: ModuleType) -> None:
    from verl.workers.engine.base import EngineRegistry

    for model_type, name in ENGINE_CLASSES.items():
        engine = getattr(module, name, None)
        _require(engine is not None, f"{FSDP_ENGINES}.{name} is missing")
        for backend in ENGINE_BACKENDS:
            registered = EngineRegistry._engines.get(model_type, {}).get(backend, {})
            _require(
                registered.get("cuda") is engine, f"EngineRegistry[{model_type!r}][{backend!r}]['cuda'] is not {name}"
            )
            _require(
                registered.get(CPU_PLATFORM) in (None, engine),
                f"EngineRegistry[{model_type!r}][{backend!r}] has another engine for device 'cpu'",
            )


def check_offload_policy(module: ModuleType) -> None:
    policy = getattr(module, "CPUOffloadPolicy", None)
    _require(policy is not None, f"{FSDP_ENGINES}.CPUOffloadPolicy is missing")
    if getattr(policy, "__wrapped__", None) is not None:
        return
    from torch.distributed.fsdp import CPUOffloadPolicy

    _require(policy is CPUOffloadPolicy, f"{FSDP_ENGINES}.CPUOffloadPolicy is not torch's")
    code = [line.split("#")[0] for line in inspect.getsource(module.FSDPEngine._build_fsdp_module).splitlines()]
    _require(
        [line.strip() for line in code if "CPUOffloadPolicy(" in line] == [PINNED_OFFLOAD],
        f"{FSDP_ENGINES}.FSDPEngine._build_fsdp_module no longer builds `{PINNED_OFFLOAD}` once",
    )


def unpin_offload_policy(module: ModuleType) -> None:
    check_offload_policy(module)

    def unpinned(policy: type) -> Callable[..., Any]:
        def build(pin_memory: bool = True) -> Any:
            return policy(pin_memory=False)

        return build

    replace_once(module, "CPUOffloadPolicy", unpinned)


def patch_engines(module: ModuleType) -> None:
    register_engines(module)
    unpin_offload_policy(module)


def register_engines(module: ModuleType) -> None:
    from verl.workers.engine.base import EngineRegistry

    check_engines(module)
    for model_type, name in ENGINE_CLASSES.items():
        missing = [b for b in ENGINE_BACKENDS if CPU_PLATFORM not in EngineRegistry._engines[model_type][b]]
        if missing:
            EngineRegistry.register(model_type=model_type, backend=missing, device=CPU_PLATFORM)(getattr(module, name))


def check_rollout_base(module: ModuleType) -> None:
    registry = getattr(module, "_ROLLOUT_REGISTRY", None)
    _require(
        isinstance(registry, dict) and ("vllm", "async") in registry,
        f"{ROLLOUT_BASE}._ROLLOUT_REGISTRY is not a dict keyed by (name, mode)",
    )
    abstract = set(module.BaseRollout.__abstractmethods__)
    _require(
        abstract == {"resume", "update_weights", "release"},
        f"{ROLLOUT_BASE}.BaseRollout's abstract methods are {sorted(abstract)}",
    )


def register_rollout_adapter(module: ModuleType) -> None:
    check_rollout_base(module)
    module._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER


def check_rollout_replica(module: ModuleType) -> None:
    _require(
        callable(getattr(getattr(module, "RolloutReplicaRegistry", None), "register", None)),
        f"{ROLLOUT_REPLICA}.RolloutReplicaRegistry.register is missing",
    )
    abstract = set(module.RolloutReplica.__abstractmethods__)
    _require(
        abstract == {"launch_servers"}, f"{ROLLOUT_REPLICA}.RolloutReplica's abstract methods are {sorted(abstract)}"
    )
    fields = set(module.TokenOutput.model_fields)
    _require(
        {"token_ids", "log_probs", "stop_reason", "extra_fields"} <= fields,
        f"{ROLLOUT_REPLICA}.TokenOutput has fields {sorted(fields)}",
    )


def _load_replica() -> type:
    from .rollout import HFReplica

    return HFReplica


def register_rollout_replica(module: ModuleType) -> None:
    check_rollout_replica(module)
    module.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)


def check_agent_loops(module: ModuleType) -> None:
    _require(
        isinstance(getattr(module, "_agent_loop_registry", None), dict),
        f"{AGENT_LOOPS}._agent_loop_registry is not a dict",
    )


def register_agent_loop(module: ModuleType) -> None:
    check_agent_loops(module)
    module._agent_loop_registry[AGENT_LOOP_NAME] = {"_target_": AGENT_LOOP}


def check_single_turn(module: ModuleType) -> None:
    run = getattr(getattr(module, "SingleTurnAgentLoop", None), "run", None)
    _require(callable(run), f"{SINGLE_TURN}.SingleTurnAgentLoop.run is missing")
    source = inspect.getsource(getattr(run, "__wrapped__", run))
    _require(
        SINGLE_TURN_REQUEST_ID in source and "priority" in inspect.signature(run).parameters,
        f"{SINGLE_TURN}.SingleTurnAgentLoop.run no longer builds `{SINGLE_TURN_REQUEST_ID}`",
    )


def check_llm_server(module: ModuleType) -> None:
    manager, client = getattr(module, "LLMServerManager", None), getattr(module, "LLMServerClient", None)
    method = getattr(manager, "_init_global_load_balancer", None)
    _require(
        callable(method) and client is not None, f"{LLM_SERVER}.LLMServerManager._init_global_load_balancer is missing"
    )
    _require(
        ROUTER_CREATION in inspect.getsource(getattr(method, "__wrapped__", method)),
        f"{LLM_SERVER}.LLMServerManager._init_global_load_balancer no longer sets `{ROUTER_CREATION}...`",
    )
    calls = set(re.findall(r"self\._load_balancer\.(\w+)\.remote", inspect.getsource(client)))
    _require(calls == set(ROUTER_CALLS), f"{LLM_SERVER}.LLMServerClient calls its router's {sorted(calls)}")


def route_through_the_server(module: ModuleType) -> None:
    check_llm_server(module)

    def one_server_routes(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        async def _init_global_load_balancer(self: Any) -> None:
            if self.rollout_config.name != ROLLOUT_NAME or len(self.server_handles) != 1:
                return await original(self)
            self.global_load_balancer = self.server_handles[0]

        return _init_global_load_balancer

    replace_once(module.LLMServerManager, "_init_global_load_balancer", one_server_routes)


def install() -> None:
    after_import(DISTRIBUTED, patch_distributed)
    after_import(FSDP_ENGINES, patch_engines)
    after_import(ROLLOUT_BASE, register_rollout_adapter)
    after_import(ROLLOUT_REPLICA, register_rollout_replica)
    after_import(AGENT_LOOPS, register_agent_loop)
    after_import(SINGLE_TURN, check_single_turn)
    after_import(LLM_SERVER, route_through_the_server)


def check_pinned() -> None:
    """Import every symbol changed here and check it is verl 0.9.1's (no change is applied)."""
    check_distributed(importlib.import_module(DISTRIBUTED))
    check_engines(importlib.import_module(FSDP_ENGINES))
    check_offload_policy(importlib.import_module(FSDP_ENGINES))
    check_rollout_base(importlib.import_module(ROLLOUT_BASE))
    check_rollout_replica(importlib.import_module(ROLLOUT_REPLICA))
    check_agent_loops(importlib.import_module(AGENT_LOOPS))
    check_single_turn(importlib.import_module(SINGLE_TURN))
    check_llm_server(importlib.import_module(LLM_SERVER))
