"""verl plugin entry point: registers `DataPolicyTrainer` (trainer.py) as verl v1 trainer mode `tune_dfrl`.

`import verl` loads every entry point of the `verl.plugins` group (verl/__init__.py; ours is
declared in pyproject.toml), in the driver and in every Ray worker, and swallows their import
errors. Registering means importing verl's v1 trainer stack (verl/trainer/ppo/v1), which costs
seconds, so this module does not import it eagerly: it registers the trainer the moment
`verl.trainer.ppo.v1` finishes importing (at once, when it already has). `get_trainer_cls`
lives in that package, so verl's `TaskRunnerV1` always finds the trainer, while processes that
only need e.g. `verl.trainer.ppo.core_algos` pay nothing. Errors in our trainer then surface as
import errors of `verl.trainer.ppo.v1` instead of being swallowed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

TRAINER_MODE = "tune_dfrl"
V1_PACKAGE = "verl.trainer.ppo.v1"


def register() -> None:
    """Import the trainer module, whose class `register_trainer` registers under `TRAINER_MODE`.

    When that module itself triggered the import of `verl.trainer.ppo.v1`, it is only partly
    executed here; importing it again returns it as is and it registers when it finishes.
    """
    importlib.import_module("tune_dfrl.trainers.verl.trainer")


class _RegisterAfterExec(importlib.abc.Loader):
    """Runs the real loader, then `register()`."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        register()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds `verl.trainer.ppo.v1` as usual, with a loader that registers after executing it."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != V1_PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfterExec(spec.loader)
        return spec


if V1_PACKAGE in sys.modules:
    register()
elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterOnImport())
