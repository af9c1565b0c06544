"""Typed settings of a search and of the report: each setting declared once, with its default and what it allows.

The dataclasses below are the only place the defaults live: `register_settings` stores them in Hydra's
ConfigStore (group `settings`), from which `conf/search.yaml` and `conf/report.yaml` take them. A
composed config is read back with `from_mapping`, which checks every value with its constraint
(`tune_dfrl.config.constraints`, the vocabulary of the policies' hyperparameters and the backend recipes too)
and raises a ValueError with one line naming the key, the value and what is allowed:

    scheduler.eta='abc': allowed: a number > 1
    unknown key 'seed'; allowed keys: seeds, arms, ...

Pure: no Ray, no Optuna, no MLflow imports (the planning step runs before any of them starts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tune_dfrl.config.constraints import (
    COUNT,
    NO_CONTEXT,
    POSITIVE,
    Context,
    Interval,
    Options,
    OrNull,
    Text,
    check_value,
    declared,
)
from tune_dfrl.errors import Rejected, SettingsError

SCHEDULERS = ("paired_asha", "race", "asha", "fifo")
PAIRED_SCHEDULERS = ("paired_asha", "race")  # decide per arm on paired deltas (`tune_dfrl.paired.rungs`)
AUTO_SEEDS = "auto"  # seeds=auto: sequential seeds (`SequentialSettings`)


# -- what a setting allows (besides `tune_dfrl.config.constraints`) ----------------------------------------


@dataclass(frozen=True)
class Seeds:
    """`auto` (sequential seeds), a count n >= 2 (seeds 0..n-1) or a list of at least 2 distinct integers >= 0."""

    kind = "seeds"

    def accept(self, value: Any, ctx: Context = NO_CONTEXT) -> Any:
        whole = isinstance(value, list) and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value
        )
        if (
            value == AUTO_SEEDS
            or (isinstance(value, int) and not isinstance(value, bool) and value >= 2)
            or (whole and len(value) >= 2 and len(set(value)) == len(value))
        ):
            return value
        raise Rejected(self.words())

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return self.words()

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return "auto, a count >= 2 or a list of at least 2 distinct integers >= 0"


@dataclass(frozen=True)
class Anything:
    """Checked by its consumer (fault_injection: `tune_dfrl.search.plan`)."""

    kind = "any"

    def accept(self, value: Any, ctx: Context = NO_CONTEXT) -> Any:
        return value

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return "anything"

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return "anything"


FLAG = Options((True, False))
NAME = OrNull(Text())  # null or a non-empty string: a path, a URI, a name


def section(kind: type) -> Any:
    """A dataclass field holding a nested settings section."""
    return field(default_factory=kind)


# -- the settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerSettings:
    """How arms are continued or stopped at milestone rungs (`tune_dfrl.paired.rungs` states the paired rules)."""

    name: str = declared(
        "paired_asha", Options(SCHEDULERS)
    )  # paired_asha | race (paired, per arm) | asha (Ray's) | fifo
    eta: float = declared(
        3.0, Interval(float, 1.0, None, "right")
    )  # paired_asha / asha: keep the top 1/eta at each rung
    confidence: float = declared(0.8, Interval(float, 0.0, 1.0, "neither"))  # paired interval level
    min_seeds: int = declared(2, Interval(int, 2, None))  # fewer common seeds than this never stops an arm
    grace_fraction: float = declared(0.2, Interval(float, 0.0, 1.0, "left"))  # no rung before this fraction


@dataclass(frozen=True)
class SearcherSettings:
    """Optuna's TPE sampler behind the paired searcher (`tune_dfrl.tune.searcher`)."""

    seed: int = declared(0, Interval(int, 0, 2**32 - 1))  # TPE sampler seed
    n_startup_trials: int = declared(3, Interval(int, 0, None))  # random arms before TPE models the paired deltas
    max_duplicates: int = declared(50, COUNT)  # consecutive seen suggestions -> space exhausted


@dataclass(frozen=True)
class SequentialSettings:
    """seeds=auto: seeds in batches while an arm's verdict is open (`tune_dfrl.paired.sequential` states the rule)."""

    start: int = declared(4, Interval(int, 2, None))  # seeds every arm and the control start on (0..start-1)
    batch: int = declared(4, COUNT)  # seeds added per look to the open arms and the control
    max: int = declared(16, Interval(int, 2, None))  # the most seeds an arm receives (the last look); >= start
    futility_confidence: float = declared(0.8, Interval(float, 0.5, 1.0, "left"))  # one-sided upper bound level
    futility_margin: float = declared(
        1.0, Interval(float, 0.0, None)
    )  # points: upper bound below it -> out of the running


@dataclass(frozen=True)
class ReportSettings:
    """The paired-CI report (`tune_dfrl.report`)."""

    delta: float = declared(1.0, POSITIVE)  # equivalence margin (points)
    alpha: float = declared(0.05, Interval(float, 0.0, 0.5, "neither"))  # family-wise error rate
    flip_k: int = declared(3, COUNT)  # seed-subset size of the winner-flip rate
    seed: int = declared(0, Interval(int, 0, 2**32 - 1))  # bootstrap / subset sampling seed


@dataclass(frozen=True)
class RaySettings:
    address: str | None = declared(
        None, NAME
    )  # null = $RAY_ADDRESS or a private local cluster; auto | HOST:PORT | ray://...
    num_cpus: int | None = declared(None, OrNull(COUNT))  # private cluster size; null = all cores


@dataclass(frozen=True)
class MlflowSettings:
    tracking_uri: str | None = declared(None, NAME)  # null = sqlite:///<out>/mlflow.db; a server URL works too
    experiment: str | None = declared(None, NAME)  # null = tune_dfrl/<out directory name>


@dataclass(frozen=True)
class ConfirmSettings:
    """Screen cheap, confirm on the target (docs/readme_search.md): this search trains the control and the screen's
    top arms on the target recipe. With `screen` set, `space` must be the screen's and `arms` is ignored (the arms
    are the `top` candidates); `seeds=n` then means the n smallest seeds >= 0 the screen did not use, and a seed list
    must share none with the screen's (for a seeds=auto screen: every seed it may have used)."""

    screen: str | None = declared(None, NAME)  # the screen's search folder; null = an ordinary search
    top: int = declared(3, COUNT)  # K: the screen's top K arms by screen Δ (analysed to the end only) are confirmed


@dataclass(frozen=True)
class SearchSettings:
    """Everything `python -m tune_dfrl.search` takes besides `space` and `backend` (their own groups)."""

    seeds: Any = declared(6, Seeds())  # a count (seeds 0..n-1) or a list, e.g. [3,7,11]; every arm runs on all of them;
    # auto: sequential seeds (section `sequential`)
    arms: int = declared(6, COUNT)  # searched arms besides the control (distinct configurations)
    steps: int | None = declared(None, OrNull(COUNT))  # null = the backend recipe's
    milestone_every: int | None = declared(None, OrNull(COUNT))  # null = the recipe's
    metric: str = declared("db", NAME)  # the aggregation optimised (checked against the backend's)
    out: str | None = declared(None, NAME)  # output directory; null = ./runs/<space>-<timestamp>
    resume: bool = declared(False, FLAG)  # continue the search in `out` (docs/readme_reliability.md)
    retry_failed: bool = declared(
        False, FLAG
    )  # with resume=true: run the cells that failed after their last retry again
    max_retries: int = declared(1, Interval(int, 0, None))  # retries of a crashing trial, then recorded as failed
    control_cache: str | None = declared(
        "auto", NAME
    )  # auto = $TUNE_DFRL_CACHE/controls or ~/.cache/...; DIR; null = off
    dry_run: bool = declared(False, FLAG)  # check all, print the plan and first trial command; start nothing
    fault_injection: Any = declared(None, Anything())  # TEST ONLY: {arm, seed, step, times} crashes that trial
    scheduler: SchedulerSettings = section(SchedulerSettings)
    searcher: SearcherSettings = section(SearcherSettings)
    sequential: SequentialSettings = section(SequentialSettings)
    report: ReportSettings = section(ReportSettings)
    ray: RaySettings = section(RaySettings)
    mlflow: MlflowSettings = section(MlflowSettings)
    confirm: ConfirmSettings = section(ConfirmSettings)


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
            chosen[name] = check_value(key, value, spec.metadata["allowed"])
    return kind(**chosen)


def as_dict(settings: Any) -> dict[str, Any]:
    return dataclasses.asdict(settings)


def register_settings() -> None:
    """Store the defaults as Hydra configs `settings/search` and `settings/report`."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="settings", name="search", node=as_dict(SearchSettings()))
    store.store(group="settings", name="report", node=as_dict(ReportSettings()))
