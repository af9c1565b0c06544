"""ClusterWatch: the driver notices that its Ray cluster's head is gone and stops with a clear error.

When the head node dies (its GCS with it), Ray keeps the driver waiting for the GCS and, 60 s later, ends the
process from C++ with its own log line (`Failed to connect to GCS within 60 seconds ...`): no word from the
search, no resume line. A daemon thread here opens a TCP connection to the GCS address every `every_s` seconds;
`misses` refusals in a row (`head_lost`, the pure rule) mean the head is gone. The driver checks `lost` where it
checks for signals (at Tune's every step, and in the searcher while Tune waits on it) and raises `ClusterLost`;
a driver that does not get there within `grace_s` (blocked in a call to the dead GCS) is ended by the thread,
with the same error line, before Ray's 60 s run out. Either way nothing recorded is lost: `resume=true` continues
the search once a cluster runs again (or on the machine's own, `ray.address=null`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence

from tune_dfrl.errors import ClusterLost

EVERY_S = 2.0  # seconds between two probes of the GCS
MISSES = 3  # refused probes in a row that mean the head is gone
GRACE_S = 10.0  # how long the driver has to stop by itself once the head is gone
CONNECT_TIMEOUT_S = 2.0


def head_lost(probes: Sequence[bool], misses: int = MISSES) -> bool:
    """True when the last `misses` probes (True: the GCS accepted a connection) all failed."""
    return len(probes) >= misses and not any(probes[-misses:])


def gcs_answers(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """A TCP connection to `host:port` is accepted (what any GCS, with or without token authentication, does)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class ClusterWatch:
    """Probes the GCS at `address` in a daemon thread until `stop`; `lost` is the error once `head_lost` holds;
    `hint` says how to continue."""

    def __init__(
        self,
        address: str,
        hint: str,
        every_s: float = EVERY_S,
        misses: int = MISSES,
        grace_s: float = GRACE_S,
        probe: Callable[[str], bool] = gcs_answers,
        on_timeout: Callable[[str], None] | None = None,
    ) -> None:
        self.address, self.hint, self.every_s, self.misses, self.grace_s = address, hint, every_s, misses, grace_s
        self.probe, self.on_timeout = probe, on_timeout or _end_process
        self.lost: ClusterLost | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tune_dfrl-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """The driver is done with the cluster (its Ray shut down): no more probes, and no forced end."""
        self._stopped.set()

    def check(self) -> None:
        """Raise `ClusterLost` once the head is gone (called from the driver's main thread; the forced end stays
        armed until `stop`, in case the shutdown that follows blocks on the dead GCS)."""
        if self.lost is not None:
            raise self.lost

    def _run(self) -> None:
        probes: list[bool] = []
        while not self._stopped.wait(self.every_s):
            probes = [*probes, self.probe(self.address)][-self.misses :]
            if head_lost(probes, self.misses):
                break
        else:
            return
        seconds = self.every_s * self.misses
        self.lost = ClusterLost(
            f"lost the Ray cluster: its head (GCS at {self.address}) refused {self.misses} connections over "
            f"{seconds:g} s; nothing recorded is lost",
            self.hint,
        )
        if not self._stopped.wait(self.grace_s):
            self.on_timeout(f"error: {self.lost}; to continue, {self.hint}")


def _end_process(line: str) -> None:
    """The driver is blocked in a call to the dead cluster: say why, then end it (Ray would, without a word)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(1)
