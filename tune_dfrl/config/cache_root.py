"""The folder tune_dfrl keeps across searches: the embedded base models (`base-<key>/`) and training pools
(`pools-<key>.json`), the control cache (`controls/`) and the empty MLflow store new search folders copy (`mlflow/`).

It is $TUNE_DFRL_CACHE (`~` expanded), else ~/.cache/tune_dfrl.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TUNE_DFRL_CACHE"


def default_cache_dir() -> Path:
    """$TUNE_DFRL_CACHE (`~` expanded), else ~/.cache/tune_dfrl."""
    chosen = os.environ.get(CACHE_ENV)
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "tune_dfrl"
