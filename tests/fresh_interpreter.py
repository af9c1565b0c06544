"""What a fresh Python interpreter imports: the import-cost tests of the trial, the driver and pure modules."""

from __future__ import annotations

import ast
import subprocess
import sys


def imported(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh interpreter has imported after running `code`."""
    probe = f"{code}\nimport sys; print(sorted(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return ast.literal_eval(done.stdout.splitlines()[-1])
