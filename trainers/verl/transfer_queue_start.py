"""TransferQueue's start in a verl trial, on both devices: its storage units start beside its controller.

verl's TaskRunner calls `transfer_queue.init` once per trial (TransferQueue 0.1.11 with verl 0.9.1). That function
creates the controller actor, waits for its address (`process_zmq_server_info(_TQ_CONTROLLER)`), and only then creates
the storage-unit actors (`_maybe_create_tq_storage`) and waits for theirs: two Ray worker processes, each importing
torch and tensordict for seconds, one after the other, while the trial waits. The storage units read nothing of the
controller's (only `backend.<storage>` of the config; the controller gets both addresses afterwards, in
`store_config`). `start_storage_beside_controller` swaps those two steps in the installed function's own code, so that
the storage units' processes start while the controller's does; nothing else of the function changes.

It is pinned to the exact text of the two steps (`CONTROLLER_WAIT`, `STORAGE_START`). Where `init` does not contain
them, it stays as it is, with a warning: the start is then slower, and the results are the same.
"""

from __future__ import annotations

import inspect
import warnings
from types import ModuleType

INTERFACE = "transfer_queue.interface"
CONTROLLER_WAIT = (
    "    controller_zmq_info = process_zmq_server_info(_TQ_CONTROLLER)\n"
    "    final_conf.controller.zmq_info = controller_zmq_info\n"
)
STORAGE_START = "    final_conf = _maybe_create_tq_storage(final_conf)\n"
SWAPPED = "_tune_dfrl_storage_first"  # set on `init` once its code is swapped


def storage_first(source: str) -> str | None:
    """`source` (of `init`) with `STORAGE_START` moved before `CONTROLLER_WAIT`, or None unless it holds the two,
    in that order, once."""
    block = CONTROLLER_WAIT + "\n" + STORAGE_START
    if source.count(block) != 1:
        return None
    return source.replace(block, STORAGE_START + CONTROLLER_WAIT + "\n")


def start_storage_beside_controller(interface: ModuleType) -> None:
    """Give `interface.init` (also `transfer_queue.init`: the same function object) the code of `storage_first`
    of its source, compiled in `interface`'s namespace at the source's own lines."""
    init = interface.init
    if getattr(init, SWAPPED, False):
        return
    lines, first = inspect.getsourcelines(init)
    swapped = storage_first("".join(lines))
    if swapped is None:
        warnings.warn(
            f"{INTERFACE}.init is not TransferQueue 0.1.11's: its storage units start after its controller",
            stacklevel=2,
        )
        return
    defined: dict = {}
    exec(compile("\n" * (first - 1) + swapped, inspect.getsourcefile(init), "exec"), vars(interface), defined)
    init.__code__ = defined["init"].__code__
    setattr(init, SWAPPED, True)
