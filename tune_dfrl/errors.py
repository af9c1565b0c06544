"""Every exception tune_dfrl raises on purpose, in one place.

Bad input, found before any trial starts (ValueError: the commands print `error: ...` and exit 2):
`Rejected` (a value outside a constraint), `SettingsError`, `SearchError`, `BackendError`, `ServiceError`,
`StorageError`, `FolderInUse`, `StateFormatError`, `ReplayError`, `NothingToCompare`.
A search that ends without its report: `SearchFailed` (exit 1). Ends that no `except Exception` may hold
(BaseException): `Interrupted` (SIGINT/SIGTERM, exit 130/143) and `ClusterLost` (the Ray head stopped answering).
`PlantedFaultError` is the crash a test's planted fault raises inside a trial.
"""

from __future__ import annotations

import signal


class Rejected(ValueError):
    """A value outside a constraint; the message is the requirement ("in [0, 1)", "an integer")."""


class SettingsError(ValueError):
    """A setting with a value it does not allow, or a key that does not exist."""


class SearchError(ValueError):
    """Bad input, found before any trial starts."""


class BackendError(ValueError):
    """A backend failed before any trial started (building, validating, calibrating, preparing):
    the search reports it as `error: ...` and exits with code 2."""


class ServiceError(ValueError):
    """A service the search needs does not answer."""


class StorageError(ValueError):
    """A folder or file the search must write cannot be written."""


class FolderInUse(ValueError):
    """Another driver holds the output folder."""


class StateFormatError(ValueError):
    """OUT was written with another state format than this version of tune_dfrl reads."""


class ReplayError(ValueError):
    """The searcher's event log does not replay: the searcher built now hands out another cell than the log says."""


class NothingToCompare(ValueError):
    """A search with nothing to compare (`what`, and `why` when known): its control has no milestone left, or no arm
    that ran its full budget shares 2 finished seeds with it."""

    def __init__(self, what: str, why: str | None = None) -> None:
        super().__init__(what + (f" ({why})" if why else ""))
        self.what, self.why = what, why


class SearchFailed(RuntimeError):
    """The search ended without a report; the message says why and what to run next."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the driver (a BaseException, so that no `except Exception` on the way holds it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.hint = "run the same command with resume=true"  # completed with OUT by `holding`


class ClusterLost(BaseException):
    """The Ray cluster's head stopped answering (a BaseException, like `Interrupted`: no `except Exception` holds
    it). `hint` says how to continue."""

    def __init__(self, why: str, hint: str) -> None:
        super().__init__(why)
        self.hint = hint


class PlantedFaultError(RuntimeError):
    """The crash a `PlantedFault` plants (tests of retries and failure reporting)."""
