"""verl plugin entry point: registers `DataPolicyTrainer` (trainer.py) as verl v1 trainer mode `tune_dfrl`,
and, when `VERL_PLATFORM=cpu`, verl's CPU support (package `cpu/`).

`import verl` loads every entry point of the `verl.plugins` group (verl/__init__.py; ours is
declared in pyproject.toml), in the driver and in every Ray worker, and swallows their import
errors. Registering means importing verl's v1 trainer stack (verl/trainer/ppo/v1), which costs
seconds, so this module does not import it eagerly: `after_import` (trainers/import_hooks.py) runs a callback
the moment a module finishes executing (at once, when it already has). The trainer registers when
`verl.trainer.ppo.v1` is imported; `get_trainer_cls` lives in that package, so verl's
`TaskRunnerV1` always finds the trainer, while processes that only need e.g.
`verl.trainer.ppo.core_algos` pay nothing. Errors in our code then surface as import errors of
the hooked verl module instead of being swallowed. A CPU setup that fails leaves the `cpu`
platform unregistered, so verl's `get_platform()` fails loudly on `VERL_PLATFORM=cpu`.

On both devices, in every process that loads this plugin, transformers sees scikit-learn and scipy as not
installed (`import_hooks.lighten_transformers`), and TransferQueue starts its storage units beside its controller
(transfer_queue_start.py).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from ..import_hooks import after_import, lighten_transformers
from .transfer_queue_start import INTERFACE, start_storage_beside_controller

TRAINER_MODE = "tune_dfrl"
V1_PACKAGE = "verl.trainer.ppo.v1"
CPU_PLATFORM = "cpu"


def register_trainer(_: ModuleType) -> None:
    """Import the trainer module, whose class `register_trainer` registers under `TRAINER_MODE`.

    When that module itself triggered the import of `verl.trainer.ppo.v1`, it is only partly
    executed here; importing it again returns it as is and it registers when it finishes.
    """
    importlib.import_module("tune_dfrl.trainers.verl.trainer")
    importlib.import_module("tune_dfrl.trainers.verl.timeline").record("v1_imported")


importlib.import_module("tune_dfrl.trainers.verl.timeline").record_process_start()
if os.environ.get("VERL_PLATFORM", "").strip().lower() == CPU_PLATFORM:
    importlib.import_module("tune_dfrl.trainers.verl.cpu").activate()
lighten_transformers()
after_import(INTERFACE, start_storage_beside_controller)
after_import(V1_PACKAGE, register_trainer)
