"""The `cpu` platform of verl's platform layer (verl/plugin/platform/platform_base.py).

verl asks its platform for the device ("cpu": tensors go to `torch.device("cpu")`), the
collective backend (gloo), the Ray resource its workers reserve ("GPU": the trial's private Ray
is started with logical GPUs, one per training worker) and a `torch.cuda`-like device module.
`torch.cpu` lacks the memory and RNG-state calls verl makes, so `CpuDeviceModule` adds them:
memory figures are the process's resident set size, RNG state is torch's global generator,
everything else (streams, `synchronize`, `is_available`) is `torch.cpu`'s.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from ..plugin import CPU_PLATFORM


class CpuDeviceModule:
    """`torch.cpu` plus no-op cache calls, process-RSS memory figures and torch's global RNG."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of the machine's memory."""
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        pass

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


DEVICE_MODULE = CpuDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform "cpu": one process per logical GPU, gloo collectives."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> torch.device:
        """verl passes this to `.to()` and `device=`; an index would mean a CUDA device."""
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def register() -> None:
    PlatformRegistry.register(platform=CPU_PLATFORM)(PlatformCPU)
