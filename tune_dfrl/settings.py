"""Typed settings of a search and of the report: each setting declared once, with its default and what it allows.

The dataclasses below are the only place the defaults live: `register_settings` stores them in Hydra's
ConfigStore (group `settings`), from which `conf/search.yaml` and `conf/report.yaml` take them. A
composed config is read back with `from_mapping`, which checks every value by type and range and
raises `SettingsError` with one line naming the key, the value and what is allowed:

    scheduler.eta='abc': allowed: a number > 1
    unknown key 'seed'; allowed keys: seeds, arms, ...

Pure: no Ray, no Optuna, no MLflow imports (the planning step runs before any of them starts).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

SCHEDULERS = ("paired_asha", "race", "asha", "fifo")
PAIRED_SCHEDULERS = ("paired_asha", "race")  # decide per arm on paired deltas (`tune_dfrl.rungs`)
AUTO_SEEDS = "auto"  # seeds=auto: sequential seeds (`SequentialSettings`)


class SettingsError(ValueError):
    """A setting with a value it does not allow, or a key that does not exist."""


# -- what a setting allows ------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """An integer (`integer=True`) or a real number within [low, high], each end open when `*_open`; None if `optional`."""

    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low, high = (f"{int(v)}" if self.integer else f"{v:g}" for v in (self.low or 0, self.high or 0))
        if self.low is not None and self.high is not None:
            kind += f" in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        elif self.low is not None:
            kind += f" {'>' if self.low_open else '>='} {low}"
        return f"null or {kind}" if self.optional else kind

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below


@dataclass(frozen=True)
class OneOf:
    choices: tuple[Any, ...]

    def text(self) -> str:
        return "one of " + ", ".join(
            "null" if c is None else str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices
        )

    def accepts(self, value: Any) -> bool:
        return any(value is c or (type(value) is type(c) and value == c) for c in self.choices)


@dataclass(frozen=True)
class Text:
    """A non-empty string (a path, a URI, a name); None if `optional`."""

    optional: bool = True

    def text(self) -> str:
        return "null or a non-empty string" if self.optional else "a non-empty string"

    def accepts(self, value: Any) -> bool:
        return (value is None and self.optional) or (isinstance(value, str) and bool(value.strip()))


@dataclass(frozen=True)
class Seeds:
    """`auto` (sequential seeds), a count n >= 2 (seeds 0..n-1) or a list of at least 2 distinct integers >= 0."""

    def text(self) -> str:
        return "auto, a count >= 2 or a list of at least 2 distinct integers >= 0"

    def accepts(self, value: Any) -> bool:
        if value == AUTO_SEEDS:
            return True
        if isinstance(value, int) and not isinstance(value, bool):
            return value >= 2
        whole = isinstance(value, list) and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value
        )
        return whole and len(value) >= 2 and len(set(value)) == len(value)


@dataclass(frozen=True)
class Anything:
    """Checked by its consumer (fault_injection: `tune_dfrl.search`)."""

    def text(self) -> str:
        return "anything"

    def accepts(self, value: Any) -> bool:
        return True


FLAG = OneOf((True, False))


def setting(default: Any, allowed: Any) -> Any:
    """A dataclass field with its default and what it allows."""
    return field(default=default, metadata={"allowed": allowed})


def section(kind: type) -> Any:
    """A dataclass field holding a nested settings section."""
    return field(default_factory=kind)


# -- the settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerSettings:
    """How arms are continued or stopped at milestone rungs (`tune_dfrl.rungs` states the paired rules)."""

    name: str = setting("paired_asha", OneOf(SCHEDULERS))  # paired_asha | race (paired, per arm) | asha (Ray's) | fifo
    eta: float = setting(3.0, Number(low=1.0, low_open=True))  # paired_asha / asha: keep the top 1/eta at each rung
    confidence: float = setting(0.8, Number(low=0.0, high=1.0, low_open=True, high_open=True))  # paired interval level
    min_seeds: int = setting(2, Number(integer=True, low=2))  # fewer common seeds than this never stops an arm
    grace_fraction: float = setting(0.2, Number(low=0.0, high=1.0, high_open=True))  # no rung before this fraction


@dataclass(frozen=True)
class SearcherSettings:
    """Optuna's TPE sampler behind the paired searcher (`tune_dfrl.pairing`)."""

    seed: int = setting(0, Number(integer=True, low=0, high=2**32 - 1))  # TPE sampler seed
    n_startup_trials: int = setting(3, Number(integer=True, low=0))  # random arms before TPE models the paired deltas
    max_duplicates: int = setting(50, Number(integer=True, low=1))  # consecutive seen suggestions -> space exhausted


@dataclass(frozen=True)
class SequentialSettings:
    """seeds=auto: seeds in batches while an arm's verdict is open (`tune_dfrl.sequential` states the rule)."""

    start: int = setting(4, Number(integer=True, low=2))  # seeds every arm and the control start on (0..start-1)
    batch: int = setting(4, Number(integer=True, low=1))  # seeds added per look to the open arms and the control
    max: int = setting(16, Number(integer=True, low=2))  # the most seeds an arm receives (the last look); >= start
    futility_confidence: float = setting(0.8, Number(low=0.5, high=1.0, high_open=True))  # one-sided upper bound level
    futility_margin: float = setting(1.0, Number(low=0.0))  # points: upper bound below it -> out of the running


@dataclass(frozen=True)
class ReportSettings:
    """The paired-CI report (`tune_dfrl.report`)."""

    delta: float = setting(1.0, Number(low=0.0, low_open=True))  # equivalence margin (points)
    alpha: float = setting(0.05, Number(low=0.0, high=0.5, low_open=True, high_open=True))  # family-wise error rate
    flip_k: int = setting(3, Number(integer=True, low=1))  # seed-subset size of the winner-flip rate
    seed: int = setting(0, Number(integer=True, low=0, high=2**32 - 1))  # bootstrap / subset sampling seed


@dataclass(frozen=True)
class RaySettings:
    address: str | None = setting(
        None, Text()
    )  # null = $RAY_ADDRESS or a private local cluster; auto | HOST:PORT | ray://...
    num_cpus: int | None = setting(
        None, Number(integer=True, low=1, optional=True)
    )  # private cluster size; null = all cores


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None = setting(None, Text())  # null = sqlite:///<out>/mlflow.db; a server URL works too
    experiment: str | None = setting(None, Text())  # null = tune_dfrl/<out directory name>


@dataclass(frozen=True)
class SearchSettings:
    """Everything `python -m tune_dfrl.search` takes besides `space` and `backend` (their own groups)."""

    seeds: Any = setting(6, Seeds())  # a count (seeds 0..n-1) or a list, e.g. [3,7,11]; every arm runs on all of them;
    # auto: sequential seeds (section `sequential`)
    arms: int = setting(6, Number(integer=True, low=1))  # searched arms besides the control (distinct configurations)
    steps: int | None = setting(None, Number(integer=True, low=1, optional=True))  # null = the backend recipe's
    milestone_every: int | None = setting(None, Number(integer=True, low=1, optional=True))  # null = the recipe's
    metric: str = setting("db", Text(optional=False))  # the aggregation optimised (checked against the backend's)
    out: str | None = setting(None, Text())  # output directory; null = ./runs/<space>-<timestamp>
    resume: bool = setting(False, FLAG)  # continue the search in `out` (docs/readme_reliability.md)
    retry_failed: bool = setting(
        False, FLAG
    )  # with resume=true: run the cells that failed after their last retry again
    max_retries: int = setting(1, Number(integer=True, low=0))  # retries of a crashing trial, then recorded as failed
    control_cache: str | None = setting(
        "auto", Text()
    )  # auto = $TUNE_DFRL_CACHE/controls or ~/.cache/...; DIR; null = off
    dry_run: bool = setting(False, FLAG)  # check all, print the plan and first trial command; start nothing
    fault_injection: Any = setting(None, Anything())  # TEST ONLY: {arm, seed, step, times} crashes that trial
    scheduler: SchedulerSettings = section(SchedulerSettings)
    searcher: SearcherSettings = section(SearcherSettings)
    sequential: SequentialSettings = section(SequentialSettings)
    report: ReportSettings = section(ReportSettings)
    ray: RaySettings = section(RaySettings)
    mlflow: MlflowSettings = section(MlflowSettings)


# -- reading and storing them -------------------------------------------------------------------------

T = TypeVar("T")


def from_mapping(kind: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """The settings `kind` with `values` (a composed config, plain containers); SettingsError on the first bad key."""
    fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SettingsError(
            f"unknown key {prefix + unknown[0]!r}; allowed keys: {', '.join(prefix + k for k in fields)}"
        )
    chosen: dict[str, Any] = {}
    for name, value in values.items():
        spec, key = fields[name], prefix + name
        if dataclasses.is_dataclass(spec.default_factory):  # a section
            if not isinstance(value, Mapping):
                raise SettingsError(
                    f"{key}={value!r}: allowed: a mapping of {', '.join(f.name for f in dataclasses.fields(spec.default_factory))}"
                )
            chosen[name] = from_mapping(spec.default_factory, value, key + ".")
        else:
            chosen[name] = checked(key, value, spec.metadata["allowed"])
    return kind(**chosen)


def checked(key: str, value: Any, allowed: Any) -> Any:
    """`value` if `allowed` accepts it (integers given for a real number become floats), else SettingsError."""
    if not allowed.accepts(value):
        raise SettingsError(f"{key}={value!r}: allowed: {allowed.text()}")
    if isinstance(allowed, Number) and not allowed.integer and value is not None:
        return float(value)
    return value


def check_fields(obj: Any, declared: type, prefix: str) -> None:
    """Check the fields of `obj` that `declared` declares (e.g. a `RungRule` against `SchedulerSettings`)."""
    specs = {f.name: f for f in dataclasses.fields(declared)}
    for f in dataclasses.fields(obj):
        if f.name in specs:
            checked(prefix + f.name, getattr(obj, f.name), specs[f.name].metadata["allowed"])


def as_dict(settings: Any) -> dict[str, Any]:
    return dataclasses.asdict(settings)


def register_settings() -> None:
    """Store the defaults as Hydra configs `settings/search` and `settings/report`."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="settings", name="search", node=as_dict(SearchSettings()))
    store.store(group="settings", name="report", node=as_dict(ReportSettings()))
