"""The services a search plugs into: a Ray cluster, an MLflow tracking server, and the storage it writes.

Both are checked before anything is written or any trial starts, with short timeouts, so a
typo in an address is an error in seconds rather than a hang or a crash an hour in:

- tracking server (`http(s)://...`): `GET <uri>/health` must answer 200;
- Ray cluster (`ray.address=auto|HOST:PORT|ray://HOST:PORT`, else `RAY_ADDRESS`): the address
  resolves (`auto` finds a running `ray start` cluster) and its port accepts a TCP connection.

Attaching to a running cluster passes no resource arguments (the cluster owns its resources)
and ships the project to the workers as one `py_modules` package (`project_package`), so
workers that never saw tune_dfrl can run its trials. It authenticates as the user's environment
says (Ray's `RAY_AUTH_MODE`, `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`); a
cluster that refuses it is an error before anything is written.

A private cluster (`start_private_ray`) is closed to everyone but this user: loopback only, token
authentication with a fresh token that is never written to a file, no dashboard, its folders inside
one only this user can open.

Storage (the output folder, the sqlite stores, the caches) is checked the same way, up front: each
folder must be creatable (a probe folder is made there and removed), no name longer than 255 bytes,
no sqlite path longer than sqlite opens (511 bytes).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tune_dfrl.errors import ServiceError, StorageError

PROBE_TIMEOUT_S = 5.0
SUBPACKAGES = ("policies", "trainers", "search_spaces")  # installed as tune_dfrl.<name> from their own folders
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


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
    if not client:
        check_ray_auth(address, resolved)
    return resolved


def check_ray_auth(address: str, resolved: str) -> None:
    """The cluster's GCS at `resolved` answers, and accepts this process's credentials as `ray.init(address)` will
    send them (with `auto`, token mode is on when a token is at hand); the error names what to set, never the token."""
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, InnerGcsClient, get_authentication_mode
    from ray.exceptions import AuthenticationError, RpcError

    try:
        has_token = AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True)
    except AuthenticationError as error:  # RAY_AUTH_TOKEN_PATH names a missing or empty file
        raise ServiceError(_first_sentence(error)) from None
    if address == "auto" and "RAY_AUTH_MODE" not in os.environ and has_token:
        token_mode_on()
    token_mode = get_authentication_mode() == AuthenticationMode.TOKEN
    where = "RAY_AUTH_TOKEN, or in a file named by RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token)"
    if token_mode and not has_token:
        raise ServiceError(
            f"RAY_AUTH_MODE=token but no Ray authentication token is set: put the cluster's token in {where}"
        )
    try:
        with _quiet_stderr():  # Ray's C++ client logs each refused or unanswered attempt
            InnerGcsClient.standalone(resolved, None, int(PROBE_TIMEOUT_S * 1000))
    except AuthenticationError:
        held = "refused this search's authentication token" if token_mode else "demands an authentication token"
        raise ServiceError(
            f"Ray cluster at ray.address={address!r} {held}; set RAY_AUTH_MODE=token and the cluster's token in {where}"
        ) from None
    except RpcError as error:
        raise ServiceError(
            f"ray.address={address!r} ({resolved}) accepts connections but does not answer as a Ray cluster ({error})"
        ) from None


def _first_sentence(error: Exception) -> str:
    """Ray's message without its generic advice (which follows its first sentence)."""
    return str(error).split(". ", 1)[0]


def token_mode_on() -> None:
    """Ray's token authentication on for this process and what it starts (`RAY_AUTH_MODE=token`)."""
    from ray._raylet import Config

    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # how Ray itself makes a running process see a new RAY_AUTH_MODE


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null meanwhile (what native code writes there too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


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
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's local-only mode, the node's address is 127.0.0.1
# Ray's raylet starts idle workers ahead of demand (as many as the node's CPUs, when the first driver connects). An
# actor gets a process of its own, so the search's trials (Tune's actors) and verl's never use them: they only take
# CPU (~0.6 s each) and memory while a search or a verl trial starts.
NO_WORKER_PRESTART = {"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}


_private_node: Any = None  # the node `start_private_ray` started, ended by `stop_ray`


def start_private_ray(num_cpus: int | None, num_gpus: int | None = None, **options: Any) -> None:
    """Start this process's private Ray cluster of `num_cpus` and `num_gpus` (None: Ray counts the machine's; it never
    joins one already on the machine), closed to others, and connect to it (`ray.init(address=...)` with
    `options`); `stop_ray` ends it:

    - loopback only: in Ray's local-only mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) the node's address is
      127.0.0.1, and Ray binds its gRPC servers (GCS, raylet, object manager, every worker), its agents and
      the dashboard agent to it; no dashboard;
    - token authentication, with a fresh random token in this process's environment only (`RAY_AUTH_TOKEN`):
      the cluster's processes inherit it, and so does the private Ray of each verl trial; no file holds it;
    - Ray's folders (which Ray makes world-writable) inside `private_folder()`;
    - no idle workers started ahead of demand (`NO_WORKER_PRESTART`);
    - the node `ray.init(address="local")` would start (`start_node`), without Ray's log monitor when
      `log_to_driver=False` (nobody reads what it collects).

    The environment keeps these settings for the life of the process: whatever it starts inherits them.
    """
    import ray
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader

    global _private_node
    temp_dir = private_folder() / "ray"
    os.environ[LOCAL_ONLY] = "0"
    os.environ.update(NO_WORKER_PRESTART)
    ray_constants.ENABLE_RAY_CLUSTER = False  # read from the environment when ray was imported
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    token_mode_on()
    AuthenticationTokenLoader.instance().reset_cache()
    settings = {
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "object_store_memory": 100 * 1024**2,
        "temp_dir": str(temp_dir),
        "include_dashboard": False,
    }
    node = start_node(settings, log_monitor=options.get("log_to_driver", True))
    try:
        ray.init(address=node.address, **options)
    except BaseException:
        end_node(node)
        raise
    _private_node = node


def stop_ray() -> None:
    """Disconnect this process from Ray (`ray.shutdown()`), and end the private cluster it started, if any."""
    import ray

    global _private_node
    node, _private_node = _private_node, None
    if node is None:
        ray.shutdown()
    else:
        end_node(node)


def start_node(settings: dict[str, Any], log_monitor: bool = True) -> Any:
    """The head node `ray.init(address="local", ...)` starts (ray/_private/worker.py, Ray 2.60), with the `RayParams`
    `settings`: token authentication set up first, usage statistics off, a reaper that ends the node if this process
    dies; without the autoscaler's monitor process (a one-node private Ray never scales; ~0.5 CPU-s of imports),
    without Ray's log monitor unless `log_monitor` (it sends the workers' output to drivers that ask for it), and
    without Ray's API server (`dashboard.py`) when `settings` say `include_dashboard=False`: it would then load only
    the usage-statistics module, off here, and the node's start waits for it (its cost: docs/readme_reliability.md).

    Ray's private `ray._private.node.Node`, as `ray.init` and `ray start` create theirs (pyproject.toml pins Ray).
    In the main thread: Ray ties the node's processes to the thread that starts them (`PR_SET_PDEATHSIG`)."""
    from ray._common.usage import usage_lib
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    class HeadNode(Node):
        def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
            if include_dashboard is False:
                self._webui_url = ""  # what Ray records for a node without a dashboard
            else:
                super().start_api_server(include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)

    enable_token_auth_by_default()
    ensure_token_if_auth_enabled({}, create_token_if_missing=True)
    usage_lib.set_usage_stats_enabled_via_env_var(False)
    return HeadNode(
        RayParams(**settings, no_monitor=True, include_log_monitor=log_monitor),
        head=True,
        shutdown_at_exit=False,
        spawn_reaper=True,
        ray_init_cluster=True,
    )


def end_node(node: Any) -> None:
    """What `ray.shutdown()` does for the node `ray.init` started: this process's connection closed, then the node's
    processes ended (SIGTERM, then SIGKILL), its reaper included."""
    import ray

    ray.shutdown()
    node.destroy_external_storage()
    node.kill_all_processes(check_alive=False, allow_graceful=True)


def private_folder() -> Path:
    """`<Ray's temporary folder>/tdfrl-<uid>` (`RAY_TMPDIR`, else `TMPDIR`, else /tmp; a short name: Ray's socket
    paths below it must stay under 108 characters), mode 0700 and owned by this user, else an error."""
    from ray._common.utils import get_default_system_temp_dir

    folder = Path(get_default_system_temp_dir()) / f"tdfrl-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ServiceError(
            f"{folder} holds the private Ray cluster's files and must be your folder with mode 0700; it is "
            f"{stat.filemode(info.st_mode)}, owned by uid {info.st_uid}: remove it"
        )
    return folder


def connect_ray(address: str | None, num_cpus: int | None) -> None:
    """Start a private local cluster (address None, `start_private_ray`), or attach to a running one with the
    user's credentials and ship the project to it (`ray.init` uploads the package, so its staging copy is
    removed right after). A verl trial's child started there runs its own Ray in local-only mode (loopback)."""
    import ray

    common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        # A reused trial actor first waits this long for its previous trial's thread to end (Tune's default, 2 s,
        # refuses the reuse on a loaded machine); the workers of the private cluster inherit it.
        os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(TRIAL_THREAD_END_S))
        start_private_ray(num_cpus, **common)
        return
    with tempfile.TemporaryDirectory(prefix="tune_dfrl-package-") as staging:
        runtime_env = {"py_modules": [str(project_package(Path(staging)))], "env_vars": {LOCAL_ONLY: "0"}}
        try:
            ray.init(address=address, runtime_env=runtime_env, **common)
        except ray.exceptions.AuthenticationError as error:  # a `ray://` address, which is not probed
            raise ServiceError(f"Ray cluster at ray.address={address!r}: {_first_sentence(error)}") from None


# -- storage: every folder and sqlite file a search writes, checked before anything is written ----------------

NAME_MAX = 255  # bytes in one file name (Linux, macOS)
SQLITE_MAX_PATH = 511  # sqlite opens no longer path (SQLITE_MAX_PATHLEN 512, with its terminator)


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
