"""Loads the decision benchmarks of benchmarks/ (scripts, not package modules) for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str = "search_decisions") -> ModuleType:
    """benchmarks/<name>.py as a module (registered in sys.modules so its dataclasses resolve, and so that a script
    importing another, as two_stage_decisions imports search_decisions, finds it)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
