"""verl's driver with the trial's private Ray started while it imports: `python -m tune_dfrl.trainers.verl.driver
OVERRIDES...` runs `verl.trainer.main_ppo` as `python -m verl.trainer.main_ppo OVERRIDES...` would, sooner.

`main_ppo` imports verl (seconds of one core), composes its config, then calls `ray.init(**ray_kwargs.ray_init)`,
which for the trial's `address=local` starts a new Ray node (GCS, raylet and Ray's agents: seconds more) before
verl's TaskRunner can start. Here a thread imports `main_ppo` while the main thread starts that node (Ray's own
`Node`, with the parameters `ray.init` gives it: its reaper, token authentication and loopback as the launcher's
environment sets them, usage statistics off); then `main_ppo` runs with the node's settings (`NODE_SETTINGS`) taken
out of the overrides and `ray_kwargs.ray_init.address` set to the node's, so verl's `ray.init` connects to it as
its driver (with its own runtime_env). When `main_ppo` returns or raises, the connection is closed and the node's
processes ended, as `ray.shutdown()` ends a node that `ray.init` started. With any other address (an existing
cluster) the overrides reach `main_ppo` unchanged and nothing else happens.

The node is `tune_dfrl.cluster.services.start_node`'s (Ray's private `ray._private.node.Node`, as `ray.init` and `ray start`
create theirs; pyproject.toml pins Ray), with Ray's log monitor (verl's driver prints its workers' output, which
the trial's log and timeline read) and without the autoscaler's monitor; tests/trainers/verl/test_verl_driver.py starts one through
this module.
"""

from __future__ import annotations

import importlib
import runpy
import sys
import threading
from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from tune_dfrl.cluster.services import end_node, start_node

VERL_DRIVER = "verl.trainer.main_ppo"
RAY_INIT = "ray_kwargs.ray_init."
# ray.init keyword -> RayParams field: the settings of the node `ray.init` would start (the sizes it refuses when it
# connects to a running node, its folder, its dashboard).
NODE_SETTINGS = {
    "num_cpus": "num_cpus",
    "num_gpus": "num_gpus",
    "object_store_memory": "object_store_memory",
    "_temp_dir": "temp_dir",
    "include_dashboard": "include_dashboard",
}


def split_overrides(overrides: Sequence[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """(RayParams keywords of the node to start, the overrides left for `main_ppo`): the `ray_kwargs.ray_init.*`
    settings of `NODE_SETTINGS` (the last override of a key wins, as in Hydra; a deletion drops it) when
    `ray_kwargs.ray_init.address` is `local`, without them and the address; else (None, `overrides` unchanged)."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    ray_init: dict[str, Any] = {}
    for override in parsed:
        if override.key_or_group.startswith(RAY_INIT):
            key = override.key_or_group.removeprefix(RAY_INIT)
            ray_init[key] = None if override.is_delete() else override.value()
    if ray_init.get("address") != "local":
        return None, list(overrides)
    taken = {RAY_INIT + key for key in (*NODE_SETTINGS, "address")}
    node = {NODE_SETTINGS[key]: value for key, value in ray_init.items() if key in NODE_SETTINGS and value is not None}
    return node, [line for line, override in zip(overrides, parsed) if override.key_or_group not in taken]


def run_module(module: str, overrides: Sequence[str]) -> None:
    """`python -m module overrides...`, in this process."""
    sys.argv = [module, *overrides]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: Sequence[str], driver: str = VERL_DRIVER) -> None:
    settings, overrides = split_overrides(argv)
    if settings is None:
        run_module(driver, overrides)
        return
    failed: list[BaseException] = []

    def import_driver() -> None:
        try:
            importlib.import_module(driver)
        except BaseException as error:  # raised again in the main thread
            failed.append(error)

    importing = threading.Thread(target=import_driver, name="import-verl-driver", daemon=True)
    importing.start()
    # In the main thread: Ray ties the node's processes to the thread that starts them (PR_SET_PDEATHSIG).
    node = start_node(settings)
    try:
        importing.join()
        if failed:
            raise failed[0]
        # (quoted as recipe.hydra_quote would: an address has no quote or backslash; that module is not imported
        # here, as it loads our verl plugin, which records when verl is imported)
        run_module(driver, [*overrides, f"++{RAY_INIT}address='{node.address}'"])
    finally:
        end_node(node)


if __name__ == "__main__":
    main(sys.argv[1:])
