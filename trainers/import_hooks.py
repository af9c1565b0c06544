"""Hooks on module imports: `after_import` runs a callback the moment a module finishes executing, and
`lighten_transformers` uses it to keep transformers from importing scikit-learn and scipy.

Both backends run transformers' models in Ray workers that each pay its imports: the verl plugin
(trainers/verl/plugin.py) and the embedded backend's model module (trainers/embedded/model.py) call
`lighten_transformers()` before anything imports transformers."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


def after_import(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `module_name` has executed: now if it is imported, else right
    after its import. A module importing itself partly executed counts as imported."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    _PENDING.setdefault(module_name, []).append(callback)
    if not any(isinstance(finder, _HookOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HookOnImport())


class _RunAfterExec(importlib.abc.Loader):
    """Runs the real loader, then the callbacks waiting for the module."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callable[[ModuleType], None]]):
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _HookOnImport(importlib.abc.MetaPathFinder):
    """Finds a hooked module through the other finders, with a loader that runs its callbacks."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RunAfterExec(spec.loader, _PENDING.pop(fullname))
                return spec
        return None


HIDDEN_FROM_TRANSFORMERS = ("sklearn", "scipy")


def _not_installed() -> bool:
    return False


def hide_from_transformers(utils: ModuleType) -> None:
    """Answer False to transformers' `is_sklearn_available` and `is_scipy_available`, in `transformers.utils`
    and in `transformers.utils.import_utils`, which defines them.

    Both are installed (mlflow requires them), and transformers imports them, with pandas, as soon as
    `transformers.models.auto` is imported: `generation.candidate_generator` imports scikit-learn and
    `loss.loss_for_object_detection` imports scipy. That is 0.85 of the 5 CPU-s it takes to import verl's worker
    stack, in each of a trial's ~8 verl processes, and ~1 CPU-s in each embedded trial worker. transformers uses scikit-learn only to tune assisted
    generation's confidence threshold (skipped when the answer is False) and scipy only in the losses and
    modelling code of vision, audio and FNet models (which then raise transformers' "requires the scipy library"
    error); verl's trainer and rollouts and the embedded backend use neither."""
    import_utils = importlib.import_module("transformers.utils.import_utils")
    for name in HIDDEN_FROM_TRANSFORMERS:
        setattr(utils, f"is_{name}_available", _not_installed)
        setattr(import_utils, f"is_{name}_available", _not_installed)


def lighten_transformers() -> None:
    """From now on (or at once, when transformers is imported already), transformers sees scikit-learn and scipy
    as not installed (`hide_from_transformers`)."""
    after_import("transformers.utils", hide_from_transformers)
