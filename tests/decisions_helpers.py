"""Loads benchmarks/search_decisions.py (a script, not a package module) for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "search_decisions.py"


def load_benchmark() -> ModuleType:
    """The decision benchmark as a module (registered in sys.modules so its dataclasses resolve)."""
    if "search_decisions" not in sys.modules:
        spec = importlib.util.spec_from_file_location("search_decisions", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["search_decisions"]
