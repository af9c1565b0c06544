"""Process-group supervisor: `python -m tune_dfrl.trainers.verl.supervise PARENT_PID -- CMD ...`.

The launcher starts this in a new session, so it leads a process group holding CMD (verl's
driver) and everything CMD starts (its private Ray instance, workers, rollout servers). It
exits with CMD's status. When PARENT_PID (the Tune trial process) disappears without ending
the run itself, e.g. because Tune stopped the trial and ended its actor, the supervisor ends
the whole group: SIGTERM, then SIGKILL after `GRACE_S`.

Ray may SIGKILL the supervisor itself (a dead worker's child processes are killed), which would
leave the group running. So the supervisor first starts a guard in the group,
`supervise --guard SUPERVISOR_PID`, which the kernel sends SIGTERM when the supervisor dies
(`PR_SET_PDEATHSIG`), however it dies; the guard then ends the group the same way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

POLL_S = 0.5
GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_group(pgid: int, alive: Callable[[], bool]) -> None:
    """SIGTERM process group `pgid`, wait up to `GRACE_S` while `alive()`, then SIGKILL the group.

    The one way a verl run's group is ended (here and in launcher.py). A group that no longer
    exists is no error; a caller inside the group blocks SIGTERM first.
    """
    if not signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + GRACE_S
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def group_members() -> list[int]:
    """The live processes of this process group other than this one."""
    group, me, members = os.getpgrp(), os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


def guard(supervisor: int) -> int:
    """Wait for SIGTERM (the supervisor's death signal, or the group being ended), then end the group."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # the supervisor died before the death signal was set
        os.kill(os.getpid(), signal.SIGTERM)
    signal.sigwait({signal.SIGTERM})
    end_group(os.getpgrp(), lambda: bool(group_members()))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--guard":
        return guard(int(argv[1]))
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m tune_dfrl.trainers.verl.supervise PARENT_PID -- CMD ...")
    parent = int(argv[0])
    subprocess.Popen([sys.executable, os.path.abspath(__file__), "--guard", str(os.getpid())])
    child = subprocess.Popen(argv[2:])
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                end_group(os.getpgrp(), lambda: child.poll() is None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
