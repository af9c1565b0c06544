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

import secrets
from pathlib import Path

ROLLOUT_NAME = "hf_cpu"
AGENT_LOOP_NAME = "hf_cpu_single_turn"
VERL_VERSION = "0.9.1"
PYTHONHASHSEED = "0"


def cpu_overrides() -> list[str]:
    """verl Hydra overrides of a CPU trial, composed after the recipe's own (which give it one GPU per trial, the HF
    rollout, FSDP2 and the KL loss, its private Ray sized and in the trial's folder)."""
    return [
        "trainer.device=cpu",
        # torch.compile of verl's entropy: inductor builds C++ per process on the trial's first step
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        # flash-attn is CUDA-only
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # request ids `det-<index of the response in its group>`: the HF rollout seeds by it (rollout.py)
        "actor_rollout_ref.rollout.full_determinism=true",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
        # the logical GPU verl places its one training process on
        "+ray_kwargs.ray_init.num_gpus=1",
    ]


def cpu_env(trial_dir: Path) -> dict[str, str]:
    """Environment of a CPU trial's driver (Ray workers inherit it). Creates the trial's temporary
    folders: torch's compile cache and temporary files stay inside the trial folder.

    `DIST_INIT_METHOD`: verl 0.9.1 starts its process group with `init_method=$DIST_INIT_METHOD`
    (`verl.utils.distributed`), else env://, whose TCPStore server listens on every interface for the trial's
    life (torch has no setting for its address). A CPU trial trains in one process: its rendezvous is a file in
    the trial's temporary folder instead, a new one per start (a killed start's file is never read again)."""
    trial_dir = Path(trial_dir).resolve()
    folders = {"TORCHINDUCTOR_CACHE_DIR": trial_dir / "inductor", "TMPDIR": trial_dir / "tmp"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "DIST_INIT_METHOD": f"file://{folders['TMPDIR']}/process_group-{secrets.token_hex(8)}",
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
