"""Backend registry: a backend name -> its constructor, `constructor(recipe overrides) -> Backend`.

Backends are imported lazily, so the verl backend (and its GPU stack) loads only when chosen.
`backend_errors` turns whatever a backend raises before any trial starts into a `BackendError`,
which the search reports as `error: ...` with exit code 2.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tune_dfrl.backends.base import Backend
from tune_dfrl.errors import BackendError


def _embedded(cfg: dict[str, Any]) -> Backend:
    """EmbeddedRecipe holds the defaults; `cfg` holds only the keys to override."""
    from tune_dfrl.trainers.embedded.backend import EmbeddedBackend

    return EmbeddedBackend(cfg)


def _verl(cfg: dict[str, Any]) -> Backend:
    """conf/backend/verl.yaml holds the whole recipe."""
    from tune_dfrl.trainers.verl.backend import VerlBackend

    return VerlBackend(cfg)


BACKENDS: dict[str, Callable[[dict[str, Any]], Backend]] = {"embedded": _embedded, "verl": _verl}


@contextmanager
def backend_errors(name: str, task: str) -> Iterator[None]:
    """Re-raise any exception of the block as `BackendError`: a ValueError's message as it is (backends
    word those for the user), anything else as 'the NAME backend failed to TASK: Type: message'."""
    try:
        yield
    except BackendError:
        raise
    except ValueError as error:
        raise BackendError(str(error)) from error
    except Exception as error:
        raise BackendError(f"the {name} backend failed to {task}: {type(error).__name__}: {error}") from error


def get_backend(name: str, cfg: Mapping[str, Any] | None = None) -> Backend:
    """The backend called `name`, built from its recipe overrides `cfg` (its `recipe` holds the full recipe)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    with backend_errors(name, "read its recipe"):
        return BACKENDS[name](dict(cfg or {}))
