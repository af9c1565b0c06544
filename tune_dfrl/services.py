"""The services a search plugs into: a Ray cluster, an MLflow tracking server, and the storage it writes.

Both are checked before anything is written or any trial starts, with short timeouts, so a
typo in an address is an error in seconds rather than a hang or a crash an hour in:

- tracking server (`http(s)://...`): `GET <uri>/health` must answer 200;
- Ray cluster (`ray.address=auto|HOST:PORT|ray://HOST:PORT`, else `RAY_ADDRESS`): the address
  resolves (`auto` finds a running `ray start` cluster) and its port accepts a TCP connection.

Attaching to a running cluster passes no resource arguments (the cluster owns its resources)
and ships the project to the workers as one `py_modules` package (`project_package`), so
workers that never saw tune_dfrl can run its trials.

Storage (the output folder, the sqlite stores, the caches) is checked the same way, up front: each
folder must be creatable (a probe folder is made there and removed), no name longer than 255 bytes,
no sqlite path longer than sqlite opens (511 bytes).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 5.0
SUBPACKAGES = ("policies", "trainers", "search_spaces")  # installed as tune_dfrl.<name> from their own folders
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


class ServiceError(ValueError):
    """A service the search needs does not answer."""


def check_tracking_uri(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """An http(s) tracking URI must answer `GET <uri>/health` with 200; other stores (sqlite) need no server."""
    if not uri.startswith(("http://", "https://")):
        return
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ServiceError(
            f"MLflow tracking server {uri} is unreachable ({reason}); start it, or fix "
            "mlflow.tracking_uri (null logs to sqlite in the output directory)"
        ) from None
    if status != 200:
        raise ServiceError(
            f"MLflow tracking server {uri} answered {health} with HTTP {status}; is this the URL of an MLflow server?"
        )


def ray_address(configured: str | None) -> str | None:
    """The cluster to attach to: `ray.address`, else the `RAY_ADDRESS` environment variable; None = a private local cluster."""
    address = configured or os.environ.get("RAY_ADDRESS") or None
    return None if address == "local" else address


def check_ray_address(address: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Resolve `address` (`auto`, `HOST:PORT`, `ray://HOST:PORT`) and check that its port answers; returns HOST:PORT."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    client = address.startswith("ray://")
    try:
        resolved = address.removeprefix("ray://") if client else canonicalize_bootstrap_address_or_die(address)
        host, _, port = resolved.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (ConnectionError, ValueError, OSError) as error:
        raise ServiceError(
            f"Ray cluster at ray.address={address!r} does not answer ({error}); start it with "
            "`ray start --head`, or fix ray.address / RAY_ADDRESS (null runs a private local cluster)"
        ) from None
    return resolved


def project_package(staging: Path) -> Path:
    """Assemble the installed tune_dfrl package, with its subpackages in place, under `staging`; returns its folder.

    `policies/`, `trainers/` and `search_spaces/` live beside `tune_dfrl/` in a source checkout
    and install as `tune_dfrl.<name>`; a copy with them inside is importable on any worker.
    """
    root = Path(_location("tune_dfrl"))
    package = staging / "tune_dfrl"
    shutil.copytree(root, package, ignore=SKIP)
    for name in SUBPACKAGES:
        folder = Path(_location(f"tune_dfrl.{name}"))
        if not folder.is_relative_to(root):
            shutil.copytree(folder, package / name, ignore=SKIP)
    return package


def _location(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.submodule_search_locations, f"{module} is not an installed package"
    return list(spec.submodule_search_locations)[0]


TRIAL_THREAD_END_S = 30


def connect_ray(address: str | None, num_cpus: int | None) -> None:
    """Start a private local cluster (address None), or attach to a running one and ship the project to it
    (`ray.init` uploads the package, so its staging copy is removed right after)."""
    import ray

    common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        # A reused trial actor first waits this long for its previous trial's thread to end (Tune's default, 2 s,
        # refuses the reuse on a loaded machine); the workers of the private cluster inherit it.
        os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(TRIAL_THREAD_END_S))
        ray.init(
            address="local", num_cpus=num_cpus, include_dashboard=False, object_store_memory=100 * 1024**2, **common
        )
        return
    with tempfile.TemporaryDirectory(prefix="tune_dfrl-package-") as staging:
        ray.init(address=address, runtime_env={"py_modules": [str(project_package(Path(staging)))]}, **common)


# -- storage: every folder and sqlite file a search writes, checked before anything is written ----------------

NAME_MAX = 255  # bytes in one file name (Linux, macOS)
SQLITE_MAX_PATH = 511  # sqlite opens no longer path (SQLITE_MAX_PATHLEN 512, with its terminator)


class StorageError(ValueError):
    """A folder or file the search must write cannot be written."""


def check_folder(key: str, path: Path) -> None:
    """`path` is a folder the search can write in, or one it can create: no name in it is too long, its
    nearest existing ancestor is a folder, and a probe folder can be made (and is removed) there."""
    long_names = [part for part in path.parts if len(part.encode()) > NAME_MAX]
    if long_names:
        raise StorageError(
            f"{key}={_short(path)}: the name {_short(long_names[0])} is longer than {NAME_MAX} bytes "
            "(the file system's limit)"
        )
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # (exists() is False below a file, too)
    if not existing.is_dir():
        raise StorageError(f"{key}={_short(path)}: {existing} is a file, not a folder; choose another {key}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tune_dfrl-probe-", dir=existing))
    except OSError as error:
        raise StorageError(
            f"{key}={_short(path)}: cannot create anything in {existing} ({error.strerror}); choose a writable {key}"
        ) from None


def check_sqlite_file(key: str, path: Path) -> None:
    """A sqlite database the search creates or opens at `path`: a short enough path in a writable folder."""
    if len(str(path).encode()) > SQLITE_MAX_PATH:
        raise StorageError(
            f"{key}: the sqlite file {_short(path)} is {len(str(path).encode())} bytes long; sqlite "
            f"opens paths of at most {SQLITE_MAX_PATH}: choose a shorter {key}"
        )
    if path.is_dir():
        raise StorageError(f"{key}: the sqlite file {path} is a folder")
    check_folder(key, path.parent)


def _short(path: Path | str) -> str:
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-30:]} ({len(text)} characters)"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI (None for any other store)."""
    return Path(uri.removeprefix("sqlite:///")).absolute() if uri.startswith("sqlite:///") else None
