"""A Ray Tune callback that cannot fail a trial: what it writes (results log, MLflow, control cache) is its own affair.

Tune runs callbacks inside its trial bookkeeping: an exception there turns a finished trial into
an errored one, which is retried and ends FAILED. `Guarded` runs the callback's hooks instead and
catches every error: the first is reported once, on stderr, with what it means for the search
(`consequence`), and the callback is switched off for the rest of the run; `error` keeps the
message so the driver can decide at the end (e.g. no report on an incomplete results log).

A hook is passed as the method itself (`guarded.call(guarded.inner.close, "KILLED")`), never by name: a method
that does not exist fails where it is named, loudly, instead of being reported as the writer's failure.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ray.tune import Callback

Inner = TypeVar("Inner", bound=Callback)


class Guarded(Callback, Generic[Inner]):
    """Forwards the trial hooks to `inner`; its first error is reported once and switches it off."""

    def __init__(self, inner: Inner, what: str, consequence: str) -> None:
        self.inner = inner
        self.what = what
        self.consequence = consequence
        self.error: str | None = None

    def call(self, hook: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run `hook`, a method of `inner`, unless an earlier call failed; report a failure once."""
        if getattr(hook, "__self__", None) is not self.inner:
            raise TypeError(f"{hook!r} is not a method of the guarded {type(self.inner).__name__}")
        if self.error is not None:
            return
        try:
            hook(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of a writer: reported, never raised into Tune
            self.error = f"{type(error).__name__}: {error}"
            print(f"warning: {self.what} failed ({self.error}); {self.consequence}", file=sys.stderr, flush=True)

    def on_trial_start(self, *args: Any, **kwargs: Any) -> None:
        self.call(self.inner.on_trial_start, *args, **kwargs)

    def on_trial_result(self, *args: Any, **kwargs: Any) -> None:
        self.call(self.inner.on_trial_result, *args, **kwargs)

    def on_trial_complete(self, *args: Any, **kwargs: Any) -> None:
        self.call(self.inner.on_trial_complete, *args, **kwargs)

    def on_trial_error(self, *args: Any, **kwargs: Any) -> None:
        self.call(self.inner.on_trial_error, *args, **kwargs)
