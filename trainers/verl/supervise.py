"""Process-group supervisor: `python -m tune_dfrl.trainers.verl.supervise PARENT_PID -- CMD ...`.

The launcher starts this in a new session, so it leads a process group holding CMD (verl's
driver) and everything CMD starts (its private Ray instance, workers, rollout servers). It
exits with CMD's status. When PARENT_PID (the Tune trial process) disappears without ending
the run itself, e.g. because Tune stopped the trial and ended its actor, the supervisor ends
the whole group (`end_group`: SIGKILL).

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

POLL_S = 0.5
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_group(pgid: int) -> None:
    """SIGKILL process group `pgid` (a group that no longer exists is no error); from inside the group, the caller
    too. The one way a verl run's group is ended (here and in launcher.py): a run keeps nothing the trial needs in
    memory (verl writes a milestone's checkpoint before it validates, and its metrics line before the trial reads
    it), while its own shutdown on SIGTERM takes seconds (5.1 s for a CPU trial of ~30 processes)."""
    signal_group(pgid, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to process group `pgid`; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def guard(supervisor: int) -> int:
    """Wait for SIGTERM (the supervisor's death signal), then end the group."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # the supervisor died before the death signal was set
        os.kill(os.getpid(), signal.SIGTERM)
    signal.sigwait({signal.SIGTERM})
    end_group(os.getpgrp())
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
                end_group(os.getpgrp())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
