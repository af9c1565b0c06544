"""The verl recipe (Hydra group `backend/verl.yaml`) and the verl Hydra overrides of one trial.

A trial (arm, seed) becomes `python -m verl.trainer.main_ppo <overrides>` (through driver.py, which starts the
private Ray below while `main_ppo` imports). The overrides compose
with verl's own config (`verl/trainer/config/ppo_trainer.yaml`) and, in order:

- the recipe: model, parquet files, lengths, batch sizes, learning rate, GPUs, rollout engine,
  with dynamic micro-batches of at most max(16384, prompt + response) tokens per GPU;
- GRPO (`algorithm.adv_estimator=grpo`) on verl's v1 trainer under our registered mode
  `trainer.v1.trainer_mode=tune_dfrl` (see `trainer.py`);
- the seed, fanned out to `data.seed`, `actor_rollout_ref.actor.data_loader_seed` and
  `actor_rollout_ref.rollout.seed`;
- milestones: `trainer.test_freq` = `trainer.save_freq` = `milestone_every`, checkpoints (one kept)
  in the trial's checkpoint folder, resumed automatically; validation before training only when
  asked (`validate_first`: a resumed run whose checkpoint's milestone the search lacks, backend.py);
- logging: `trainer.logger=[console,file]` (the launcher points `VERL_FILE_LOGGER_PATH` into the
  trial folder), no wandb, no hub;
- a private Ray instance per trial (`private_ray_settings`, both devices): `address=local`, no dashboard, its
  logical CPUs and object store bounded, its temporary folder the trial's (`ray_temp_dir`, removed after the
  trial); loopback only and token authentication come from the environment the trial inherits (launcher.py);
- the arm: `+tune_dfrl.policy` (JSON of method + params) and `+tune_dfrl.domain_column`;
- the reward: `tune_dfrl.trainers.verl.reward.compute_score`;
- the recipe's verl settings that no recipe key names (`SHARED_SETTINGS`, `helper_settings`: verl's helper
  processes sized by `cpus_per_trial`; on cuda also `cuda_settings`:
  vLLM's memory share, the attention implementation), each with the reason it is chosen;
- the recipe's own `overrides`, so they win over ours;
- on `device: cpu`, last, `tune_dfrl.trainers.verl.cpu.cpu_overrides` (the CPU platform's settings: device,
  no torch.compile, sdpa, deterministic HF rollout, one logical GPU in the trial's private Ray).

On `device: cpu` the rollout engine is `tune_dfrl.trainers.verl.cpu.ROLLOUT_NAME` (HF `generate`). That package's
`__init__` imports nothing from verl; its patches and rollout load only in processes started with `VERL_PLATFORM=cpu`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.resources
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.backends.benchmarks import BenchmarkInfo, BenchmarkSet
from tune_dfrl.config.constraints import COUNT, POSITIVE, Interval, Options, OrNull, Text, check_value

from .cpu import ROLLOUT_NAME, cpu_overrides
from .plugin import TRAINER_MODE

RECIPE_FILE = importlib.resources.files("tune_dfrl") / "conf" / "backend" / "verl.yaml"
REWARD_MODULE = "pkg://tune_dfrl.trainers.verl.reward"
ROLLOUT_ENGINES = ("vllm", "sglang")  # GPU engines; the first is the default on cuda
DEVICES = ("cuda", "cpu")
TOKENS_PER_GPU = 16384  # verl's default micro-batch token budget (dynamic batch size); at least one sequence
MAX_EPOCHS = 1_000_000  # verl stops at trainer.total_training_steps; epochs must not end the run first
# what each key allows on its own (relations between keys, paths and lists are checked in `VerlRecipe.from_dict`)
KEY_CONSTRAINTS = {
    "device": Options(DEVICES),
    "gpus_per_trial": OrNull(Interval(int, 0, None)),
    "cpus_per_trial": COUNT,
    "rollout_n": COUNT,
    "max_prompt_length": COUNT,
    "max_response_length": COUNT,
    "lr": POSITIVE,
    "steps": COUNT,
    "milestone_every": COUNT,
    "train_batch_size": COUNT,
    "ppo_mini_batch_size": OrNull(COUNT),
    "domain_column": Text(),
    "rollout_engine": OrNull(Options(ROLLOUT_ENGINES)),
}
DEVICE_GPUS = {"cuda": 8, "cpu": 1}  # gpus_per_trial when the recipe leaves it null: a node; cpu's one logical GPU
# The recipe's verl settings on every device, before the recipe's `overrides` (which win):
SHARED_SETTINGS = (
    # GRPO's KL penalty to the reference model, as verl's GRPO examples train
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    # FSDP2 (`fully_shard`): verl's recommended engine; the only one that trains on CPU (gloo), so both devices
    # run the same actor and reference model (verl's default is FSDP1)
    "actor_rollout_ref.actor.strategy=fsdp2",
    # one rollout replica per GPU: verl's default of 2 fails on one GPU (`checks.check_parallelism`)
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
)
# verl starts 8 agent-loop workers, 8 reward workers and 8 TransferQueue storage units per trial, whatever its
# size; a trial gets one of each per CPUS_PER_HELPER CPUs Tune gives it (at least one, at most verl's 8)
CPUS_PER_HELPER = 2
VERL_HELPERS = 8
# The trial's private Ray. Its logical CPUs only admit verl's actors (their processes mostly wait; the trial's real
# CPU use is bounded by the helper counts above): verl's GPU bundles hold VERL_COLOCATE CPUs each
# (ResourcePoolManager.max_colocate_count), TransferQueue's controller and each storage unit one, and every other
# actor one while it is placed; RAY_LOGICAL_CPUS is what a one-GPU trial was measured to need on CPU.
RAY_LOGICAL_CPUS = 16
VERL_COLOCATE = 3
# Ray's default object store is 30% of the node's RAM per Ray instance, i.e. per trial; bounded here (Ray spills
# to the trial's temporary folder past it). verl 0.9.1 moves batches through TransferQueue's storage units, not the
# object store. Raise it with `ray_kwargs.ray_init.object_store_memory=<bytes>` in the recipe's overrides.
OBJECT_STORE_BYTES = 2 * 1024**3
# Ray's sockets live at <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store (64 more
# characters) and a Unix socket path holds at most 107.
RAY_TEMP_DIR_MAX_CHARS = 40
# vLLM's share of each GPU (weights and KV cache); the FSDP actor and the reference model use the rest
GPU_MEMORY_SHARE = "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"
ATTENTION_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
VERL_ATTENTION = "flash_attention_2"  # verl's when override_config names none (verl/workers/config/model.py)


def default_recipe(**changes: Any) -> dict[str, Any]:
    """The packaged `backend/verl.yaml` as a dict, with `changes` applied (unknown keys raise)."""
    recipe = yaml.safe_load(RECIPE_FILE.read_text())
    unknown = sorted(set(changes) - set(recipe))
    if unknown:
        raise ValueError(f"unknown verl recipe keys {unknown}; allowed: {', '.join(sorted(recipe))}")
    return {**recipe, **changes}


@dataclass(frozen=True)
class BenchmarkSource:
    """One validation benchmark: verl `data_source` -> our benchmark name, domain and item count.

    `reference_format` (optional) renders a ground truth as a correct model answer, e.g.
    'The answer is \\boxed{{{answer}}}'; calibration scores it with the reward function.
    """

    data_source: str
    name: str
    domain: str
    items: int
    reference_format: str | None = None

    def info(self) -> BenchmarkInfo:
        return BenchmarkInfo(self.name, self.domain, self.items)


@dataclass(frozen=True)
class VerlRecipe:
    """A validated verl recipe; see `tune_dfrl/conf/backend/verl.yaml` for every key."""

    model_path: Path
    train_files: tuple[Path, ...]
    val_files: tuple[Path, ...]
    gpus_per_trial: int  # the recipe's, or DEVICE_GPUS[device] when it is null
    rollout_n: int
    max_prompt_length: int
    max_response_length: int
    lr: float
    steps: int
    milestone_every: int
    train_batch_size: int
    ppo_mini_batch_size: int
    domain_column: str
    benchmarks: tuple[BenchmarkSource, ...] | None  # None: the embedded backend's generated tasks
    subsets: dict[str, tuple[str, ...]]
    rollout_engine: str | None  # None: the device's engine (see `engine`)
    overrides: tuple[str, ...]
    device: str
    cpus_per_trial: int
    command: tuple[str, ...] | None  # None: this Python's `-m tune_dfrl.trainers.verl.driver` (backend.VERL_MAIN)

    @classmethod
    def from_dict(cls, recipe: Mapping[str, Any]) -> VerlRecipe:
        """Parse a recipe mapping (Hydra node or dict); errors name the key and what is allowed."""
        expected = set(default_recipe())
        keys = set(recipe)
        if keys - expected:
            raise ValueError(
                f"unknown verl recipe keys {sorted(keys - expected)}; allowed: {', '.join(sorted(expected))}"
            )
        if expected - keys - {"name"}:
            raise ValueError(f"verl recipe lacks keys {sorted(expected - keys - {'name'})}")
        if recipe.get("name", "verl") != "verl":
            raise ValueError(f"verl recipe has name={recipe['name']!r}; expected 'verl'")
        for key in ("model_path", "train_files", "val_files"):
            if recipe[key] in (None, "???", [], ""):
                raise ValueError(f"verl recipe key '{key}' must be set (it is {recipe[key]!r})")
        v = {key: check_value(f"backend.{key}", recipe[key], allowed) for key, allowed in KEY_CONSTRAINTS.items()}
        device, engine = v["device"], v["rollout_engine"]
        v["gpus_per_trial"] = DEVICE_GPUS[device] if v["gpus_per_trial"] is None else v["gpus_per_trial"]
        v["ppo_mini_batch_size"] = v["ppo_mini_batch_size"] or v["train_batch_size"]
        if v["train_batch_size"] % v["ppo_mini_batch_size"]:
            raise ValueError(
                f"ppo_mini_batch_size={v['ppo_mini_batch_size']} must divide train_batch_size={v['train_batch_size']}"
            )
        if device == "cpu" and engine is not None:
            raise ValueError(
                f"device=cpu rolls out with tune_dfrl's HF rollout; rollout_engine={engine} needs GPUs: "
                "set rollout_engine=null"
            )
        if device == "cpu" and v["gpus_per_trial"] != 1:
            raise ValueError(
                f"device=cpu trains in one process, which verl places on one logical GPU of the trial's "
                f"private Ray: gpus_per_trial must be 1; got {v['gpus_per_trial']}"
            )
        command = recipe["command"]
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise ValueError(f"verl recipe key 'command' must be null or a non-empty list of strings; got {command!r}")
        return cls(
            model_path=_paths(recipe, "model_path")[0],
            train_files=_paths(recipe, "train_files"),
            val_files=_paths(recipe, "val_files"),
            benchmarks=None if recipe["benchmarks"] is None else tuple(_benchmark(r) for r in recipe["benchmarks"]),
            subsets={str(k): tuple(v) for k, v in dict(recipe["subsets"] or {}).items()},
            overrides=tuple(str(o) for o in recipe["overrides"] or ()),
            command=None if command is None else tuple(command),
            **v,
        )

    @property
    def engine(self) -> str:
        """verl's `actor_rollout_ref.rollout.name`: `rollout_engine`, else vllm on cuda and the HF rollout on cpu."""
        if self.device == "cpu":
            return ROLLOUT_NAME
        return self.rollout_engine or ROLLOUT_ENGINES[0]

    def benchmark_sources(self) -> tuple[BenchmarkSource, ...]:
        """The validation benchmarks; when the recipe leaves them null, the generated tasks' twelve
        (data_source = benchmark name; a correct response is the bare answer)."""
        if self.benchmarks is not None:
            return self.benchmarks
        from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS

        return tuple(BenchmarkSource(b.name, b.name, b.domain, b.size, "{answer}") for b in BENCHMARKS)

    def benchmark_set(self) -> BenchmarkSet:
        return BenchmarkSet(tuple(b.info() for b in self.benchmark_sources()), dict(self.subsets))


def _paths(recipe: Mapping[str, Any], key: str) -> tuple[Path, ...]:
    """Absolute paths (`~` expanded): trials run in their own folders, on Ray workers."""
    value = recipe[key]
    paths = tuple(Path(str(p)).expanduser() for p in ([value] if isinstance(value, (str, Path)) else value))
    relative = [str(p) for p in paths if not p.is_absolute()]
    if relative:
        raise ValueError(
            f"verl recipe key '{key}' needs absolute paths (trials run in their own folders); got {relative}"
        )
    return paths


def _benchmark(record: Mapping[str, Any]) -> BenchmarkSource:
    allowed = {"data_source", "name", "domain", "items", "reference_format"}
    record = dict(record)
    if set(record) - allowed or not {"data_source", "domain", "items"} <= set(record):
        raise ValueError(
            f"verl benchmark entry {record} is malformed; keys: data_source, domain, items (required), "
            "name, reference_format (optional)"
        )
    items = check_value(f"verl benchmark {record['data_source']!r}: items", record["items"], COUNT)
    return BenchmarkSource(
        data_source=str(record["data_source"]),
        name=str(record.get("name") or record["data_source"]),
        domain=str(record["domain"]),
        items=items,
        reference_format=record.get("reference_format"),
    )


def hydra_quote(text: str) -> str:
    """`text` as a single-quoted Hydra override value that parses back to `text`.

    Hydra treats a backslash as an escape only before a quote (or at the end of the string), so
    those backslash runs are doubled and quotes escaped. `${` is refused: verl resolves its config
    (`OmegaConf.resolve`) and then reads it again, so no escape survives both.
    """
    if "${" in text:
        raise ValueError(f"cannot pass {text!r} to verl: '${{' would be read as an OmegaConf interpolation")
    escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return "'" + escaped + "'"


def _hydra_list(items: Sequence[Any]) -> str:
    return "[" + ",".join(hydra_quote(str(i)) for i in items) + "]"


def policy_json(arm: ArmSpec) -> str:
    """The arm as the plugin trainer reads it from `tune_dfrl.policy`."""
    return json.dumps({"method": arm.method, "params": arm.params, "arm_id": arm.arm_id}, sort_keys=True)


# verl settings under which a run still writes something the user may want after it logs its final step: other
# loggers (`trainer.logger`), rollout dumps (`trainer.rollout_data_dir`, written by a background executor), an
# asynchronous checkpoint (`...checkpoint.async_save`)
WRITES_AFTER_LAST_LOG = ("trainer.logger", "trainer.rollout_data_dir", "async_save")


def ends_at_final_milestone(recipe: VerlRecipe) -> bool:
    """Whether a trial's verl run may be killed once its final milestone is delivered: verl has then saved the
    final checkpoint (before it validates) and logged everything the search reads. Only on `device: cpu` (on cuda,
    vLLM's shutdown releases its shared memory, which a killed run could leave in /dev/shm), and not when the
    recipe's `overrides` set a key of WRITES_AFTER_LAST_LOG (the last dotted parts)."""
    keys = [override.split("=", 1)[0].lstrip("+~") for override in recipe.overrides]
    writes_after = any(key == name or key.endswith(f".{name}") for key in keys for name in WRITES_AFTER_LAST_LOG)
    return recipe.device == "cpu" and not writes_after


def build_overrides(
    recipe: VerlRecipe, arm: ArmSpec, seed: int, checkpoint_dir: Path, validate_first: bool = False
) -> list[str]:
    """verl Hydra overrides for (arm, seed) under `recipe` (see the module docstring)."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={_hydra_list(recipe.train_files)}",
        f"data.val_files={_hydra_list(recipe.val_files)}",
        f"data.train_batch_size={recipe.train_batch_size}",
        f"data.max_prompt_length={recipe.max_prompt_length}",
        f"data.max_response_length={recipe.max_response_length}",
        f"data.seed={seed}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={hydra_quote(str(recipe.model_path))}",
        f"actor_rollout_ref.actor.optim.lr={recipe.lr!r}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={recipe.ppo_mini_batch_size}",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max(TOKENS_PER_GPU, recipe.max_prompt_length + recipe.max_response_length)}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        f"actor_rollout_ref.rollout.name={recipe.engine}",
        f"actor_rollout_ref.rollout.n={recipe.rollout_n}",
        f"actor_rollout_ref.rollout.seed={seed}",
        "reward.custom_reward_function.path=" + REWARD_MODULE,
        "reward.custom_reward_function.name=compute_score",
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"trainer.n_gpus_per_node={recipe.gpus_per_trial}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={recipe.steps}",
        f"trainer.total_epochs={MAX_EPOCHS}",
        f"trainer.test_freq={recipe.milestone_every}",
        f"trainer.save_freq={recipe.milestone_every}",
        f"trainer.val_before_train={str(validate_first).lower()}",
        "trainer.max_actor_ckpt_to_keep=1",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={hydra_quote(str(checkpoint_dir.resolve() / 'verl'))}",
        "trainer.logger=[console,file]",
        "trainer.log_val_generations=0",
        "trainer.project_name=tune_dfrl",
        f"trainer.experiment_name={hydra_quote(f'{arm.arm_id}-seed{seed}')}",
        *private_ray_settings(recipe, checkpoint_dir),
        f"+tune_dfrl.policy={hydra_quote(policy_json(arm))}",
        f"+tune_dfrl.domain_column={hydra_quote(recipe.domain_column)}",
        *SHARED_SETTINGS,
        *helper_settings(recipe.cpus_per_trial),
        *(cuda_settings(recipe) if recipe.device == "cuda" else ()),
        *recipe.overrides,
        *(cpu_overrides() if recipe.device == "cpu" else ()),
    ]


def helper_count(cpus_per_trial: int) -> int:
    """n = clamp(cpus_per_trial // CPUS_PER_HELPER, 1, VERL_HELPERS)."""
    return min(max(cpus_per_trial // CPUS_PER_HELPER, 1), VERL_HELPERS)


def helper_settings(cpus_per_trial: int) -> list[str]:
    """verl's helper processes of a trial with `cpus_per_trial` CPUs: `helper_count` agent-loop workers, reward
    workers and TransferQueue storage units."""
    n = helper_count(cpus_per_trial)
    return [
        f"actor_rollout_ref.rollout.agent.num_workers={n}",
        f"reward.num_workers={n}",
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={n}",
    ]


def private_ray_logical_cpus(recipe: VerlRecipe) -> int:
    """max(cpus_per_trial, RAY_LOGICAL_CPUS, VERL_COLOCATE x gpus + 3 x helpers + 4): room for every actor verl
    places (see RAY_LOGICAL_CPUS), whatever the trial's size."""
    helpers = helper_count(recipe.cpus_per_trial)
    return max(recipe.cpus_per_trial, RAY_LOGICAL_CPUS, VERL_COLOCATE * recipe.gpus_per_trial + 3 * helpers + 4)


def private_ray_settings(recipe: VerlRecipe, checkpoint_dir: Path) -> list[str]:
    """The trial's own Ray instance, on both devices: a new local one (two trials never share verl's named
    actors), no dashboard, `private_ray_logical_cpus`, an object store of OBJECT_STORE_BYTES, and its temporary
    folder `ray_temp_dir` (the backend removes it when the trial ends). It sees the GPUs the trial inherits
    (`CUDA_VISIBLE_DEVICES`, set by Ray Tune)."""
    return [
        "+ray_kwargs.ray_init.address=local",
        "+ray_kwargs.ray_init.include_dashboard=false",
        f"+ray_kwargs.ray_init.num_cpus={private_ray_logical_cpus(recipe)}",
        f"+ray_kwargs.ray_init.object_store_memory={OBJECT_STORE_BYTES}",
        f"+ray_kwargs.ray_init._temp_dir={ray_temp_dir(checkpoint_dir)}",
    ]


def ray_temp_dir(trial_dir: Path) -> Path:
    """The private Ray's temporary folder: <trial>/ray, or, when that path is too long for Ray's sockets, a folder in
    the system's temporary folder named by the trial folder's hash; never the default folder that every Ray instance
    on the machine shares."""
    inside = Path(trial_dir).resolve() / "ray"
    if len(str(inside)) <= RAY_TEMP_DIR_MAX_CHARS:
        return inside
    return Path(tempfile.gettempdir()) / f"ray-{hashlib.sha256(str(inside).encode()).hexdigest()[:12]}"


def cuda_settings(recipe: VerlRecipe) -> list[str]:
    """The recipe's settings on cuda only: vLLM's memory share, and the attention implementation unless the
    recipe's overrides name one."""
    named = any(o.lstrip("+~").split("=", 1)[0] == ATTENTION_KEY for o in recipe.overrides)
    return [GPU_MEMORY_SHARE, *([] if named else [f"+{ATTENTION_KEY}={attention_implementation()}"])]


@functools.cache
def attention_implementation() -> str:
    """flash_attention_2 when flash-attn imports in this process, else sdpa: verl's default, flash_attention_2, fails
    at model build without flash-attn, which verl[vllm] does not install, and `HF_HUB_OFFLINE=1` stops transformers
    from fetching a kernel instead."""
    try:
        importlib.import_module("flash_attn")
    except Exception:  # not installed, or built for another torch
        return "sdpa"
    return VERL_ATTENTION


def verl_config_dir() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str]) -> Any:
    """verl's `ppo_trainer` config composed with `overrides`, as `main_ppo` would see it.

    Works inside a running Hydra app too: the global Hydra state is set aside and restored.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))
    finally:
        restore_gh_from_backup(backup)


def check_verl_config(config: Any) -> None:
    """Run verl's own `validate_config` (verl/utils/config.py) as `main_ppo.main` does."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
