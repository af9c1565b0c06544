"""verl 0.9.1 on CPU: what `python -m verl.trainer.main_ppo` needs to train on a machine without GPUs.

verl 0.9.1 has no CPU platform and no CPU rollout engine. Added from outside, through verl's
extension points, only in processes started with `VERL_PLATFORM=cpu` (plugin.py calls
`activate()`; `cpu_env` sets the variable):

- platform.py: the `cpu` platform (`PlatformRegistry.register`): device "cpu", gloo, a device
  module stand-in, Ray resource "GPU" (the trial's private Ray gets logical GPUs);
- patches.py: the one process-wide patch (verl's default process-group backend string), the
  FSDP engines registered for device "cpu" and the rollout registered; each changed verl
  symbol is checked against what verl 0.9.1 ships (`check_pinned`), anything else is an error;
- rollout.py: rollout engine `ROLLOUT_NAME`: sampling with the Hugging Face model in a Ray actor,
  and agent loop `AGENT_LOOP_NAME`, which tells it each request's index in its group.

This module imports nothing from verl, so a parent process can build a trial's overrides and
environment cheaply.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

ROLLOUT_NAME = "hf_cpu"
AGENT_LOOP_NAME = "hf_cpu_single_turn"
VERL_VERSION = "0.9.1"
PYTHONHASHSEED = "0"
RAY_LOGICAL_CPUS = 16
# Ray's sockets live at <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store (64 more
# characters) and a Unix socket path holds at most 107.
RAY_TEMP_DIR_MAX_CHARS = 40


def cpu_overrides(trial_dir: Path, num_cpus: int) -> list[str]:
    """verl Hydra overrides of a CPU trial using `num_cpus` CPUs, composed after the recipe's own.

    The trial's private Ray gets one logical GPU (verl places its one training process there) and
    max(num_cpus, RAY_LOGICAL_CPUS) logical CPUs: verl's actors, TransferQueue's controller and
    storage unit and the rollout server each reserve one while mostly waiting.
    """
    if num_cpus < 1:
        raise ValueError(f"a verl CPU trial needs num_cpus >= 1; got {num_cpus}")
    return [
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # verl's reference model offloads with CPUOffloadPolicy(pin_memory=True), which fails without CUDA
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false",
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        # request ids `det-<index of the response in its group>`: the HF rollout seeds by it (rollout.py)
        "actor_rollout_ref.rollout.full_determinism=true",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        "data.dataloader_num_workers=0",
        f"+ray_kwargs.ray_init.num_cpus={max(num_cpus, RAY_LOGICAL_CPUS)}",
        "+ray_kwargs.ray_init.num_gpus=1",
        f"+ray_kwargs.ray_init._temp_dir={ray_temp_dir(trial_dir)}",
    ]


def ray_temp_dir(trial_dir: Path) -> Path:
    """The private Ray's temporary folder: <trial>/ray, or, when that path is too long for Ray's
    sockets, a folder in the system's temporary folder named by the trial folder's hash; never the
    default folder that every Ray instance on the machine shares."""
    inside = Path(trial_dir).resolve() / "ray"
    if len(str(inside)) <= RAY_TEMP_DIR_MAX_CHARS:
        return inside
    return Path(tempfile.gettempdir()) / f"ray-{hashlib.sha256(str(inside).encode()).hexdigest()[:12]}"


def cpu_env(trial_dir: Path) -> dict[str, str]:
    """Environment of a CPU trial's driver (Ray workers inherit it). Creates the trial's temporary
    folders: torch's compile cache and temporary files stay inside the trial folder."""
    trial_dir = Path(trial_dir).resolve()
    folders = {"TORCHINDUCTOR_CACHE_DIR": trial_dir / "inductor", "TMPDIR": trial_dir / "tmp"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "VERL_PLATFORM": "cpu",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONHASHSEED": PYTHONHASHSEED,
        "WANDB_MODE": "disabled",
        **{name: str(path) for name, path in folders.items()},
    }


def activate() -> None:
    """Install the CPU support in this process (plugin.py, when `VERL_PLATFORM=cpu`).

    The platform registers last: if anything before it fails, `VERL_PLATFORM=cpu` names an
    unknown platform and verl stops with an error instead of running half-patched.
    """
    import verl

    if verl.__version__ != VERL_VERSION:
        raise RuntimeError(f"tune_dfrl's verl CPU support is pinned to verl {VERL_VERSION}; found {verl.__version__}")
    from . import patches, platform

    patches.install()
    platform.register()
