"""`write_atomically`: a file's new content appears whole or not at all (readers never see a partial write).

Kept free of heavy imports: processes that only read tasks or records use it too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file in `path`'s folder (created if missing), then rename it onto `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(staging, path)
