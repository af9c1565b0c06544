"""Process-group supervisor: `python -m tune_dfrl.trainers.verl.supervise PARENT_PID -- CMD ...`.

The launcher starts this in a new session, so it leads a process group holding CMD (verl's
driver) and everything CMD starts (its private Ray instance, workers, rollout servers). It
exits with CMD's status. When PARENT_PID (the Tune trial process) disappears without ending
the run itself, e.g. because Tune stopped the trial and ended its actor, the supervisor ends
the whole group: SIGTERM, then SIGKILL after `GRACE_S`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 10.0


def end_group(child: subprocess.Popen) -> None:
    """SIGTERM the group (not this process), wait up to GRACE_S for CMD, then SIGKILL the group."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(os.getpgrp(), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m tune_dfrl.trainers.verl.supervise PARENT_PID -- CMD ...")
    parent = int(argv[0])
    child = subprocess.Popen(argv[2:])
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                end_group(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
