"""Hyperparameter declarations and everything derived from them.

Each component declares its hyperparameters once, as `Param`s plus `LessThan` constraints. From
that one declaration this module derives validation (`ParamSpec.validate`), a Ray Tune search
space (`ParamSpec.tune_space`), an Optuna define-by-run sample (`ParamSpec.suggest`) and a
markdown description (`ParamSpec.describe`). Ray and Optuna are imported only inside the
functions that need them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

Kind = Literal["float", "int", "bool", "choice", "floats"]


@dataclass(frozen=True)
class Param:
    """One hyperparameter.

    `low`/`high` bound the valid values (None = unbounded; `*_open` makes a bound strict).
    `search` is the default search range where it differs from the valid one (it must, where the
    valid range is unbounded). `high_from_n` = j bounds an int by `rollout_n + j` when n is known.
    Non-searchable parameters are validated and canonicalised but never sampled.
    """

    name: str
    kind: Kind
    default: Any
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    log: bool = False
    choices: tuple[Any, ...] = ()
    search: tuple[float, float] | None = None
    searchable: bool = True
    high_from_n: int | None = None
    doc: str = ""

    def range_text(self, rollout_n: int | None = None) -> str:
        """The valid range in interval notation, e.g. `(0, inf)` or `{batch, informative}`."""
        if self.kind == "bool":
            return "{false, true}"
        if self.kind == "choice":
            return "{" + ", ".join(str(c) for c in self.choices) + "}"
        if self.kind == "floats":
            return "list of floats >= 0"
        lo = "-inf" if self.low is None else _fmt(self.low)
        hi = "inf" if self.high is None else _fmt(self.high)
        if self.high_from_n is not None:
            hi = f"n{self.high_from_n:+d}" if rollout_n is None else str(rollout_n + self.high_from_n)
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if (self.high_open or self.high is None) and self.high_from_n is None else "]"
        return f"{left}{lo}, {hi}{right}"

    def search_text(self, bounds: tuple[float, float] | list[Any]) -> str:
        """A search range for display; a bound stepped off an open valid bound shows as open."""
        if isinstance(bounds, list):
            return "{" + ", ".join(map(str, bounds)) + "}"
        lo, hi = bounds
        left = "(" if self.low_open and lo == math.nextafter(self.low, math.inf) else "["
        right = ")" if self.high_open and hi == math.nextafter(self.high, -math.inf) else "]"
        shown_lo = self.low if left == "(" else lo
        shown_hi = self.high if right == ")" else hi
        return f"{left}{_fmt(shown_lo)}, {_fmt(shown_hi)}{right}"


@dataclass(frozen=True)
class LessThan:
    """Cross-parameter constraint `lower < upper`."""

    lower: str
    upper: str


def _fmt(x: float) -> str:
    return f"{x:g}"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class ParamSpec:
    """The declared hyperparameters of one method (scorer + actuator + semantics flags)."""

    owner: str
    params: tuple[Param, ...]
    constraints: tuple[LessThan, ...] = ()

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {self.owner}: {names}")

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def searchable(self) -> list[Param]:
        return [p for p in self.params if p.searchable]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"unknown parameter '{name}' for {self.owner}; allowed: {', '.join(self.names)}")

    # --- validation -------------------------------------------------------------------------

    def validate(self, values: Mapping[str, Any] | None, rollout_n: int | None = None) -> dict[str, Any]:
        """Check names, types, ranges and constraints; return the values with defaults filled in."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            raise ValueError(
                f"unknown parameter '{unknown[0]}' for {self.owner}; allowed: {', '.join(self.names) or '(none)'}"
            )
        out = {p.name: self._check(p, values.get(p.name, p.default), rollout_n) for p in self.params}
        for c in self.constraints:
            if not out[c.lower] < out[c.upper]:
                raise ValueError(
                    f"parameters for {self.owner} must satisfy {c.lower} < {c.upper}; "
                    f"got {c.lower}={out[c.lower]}, {c.upper}={out[c.upper]}"
                )
        return out

    def _check(self, p: Param, v: Any, rollout_n: int | None) -> Any:
        where = f"parameter '{p.name}' for {self.owner}"
        if p.kind == "bool":
            if not isinstance(v, bool):
                raise ValueError(f"{where} must be true or false; got {v!r}")
            return v
        if p.kind == "choice":
            if v not in p.choices:
                raise ValueError(f"{where} must be one of {', '.join(map(str, p.choices))}; got {v!r}")
            return v
        if p.kind == "floats":
            if v is None:
                return None
            if not isinstance(v, Sequence) or not all(_is_number(x) and math.isfinite(x) and x >= 0 for x in v):
                raise ValueError(f"{where} must be a list of finite numbers >= 0; got {v!r}")
            return [float(x) for x in v]
        if not _is_number(v) or not math.isfinite(v):
            raise ValueError(f"{where} must be a finite number; got {v!r}")
        if p.kind == "int":
            if v != int(v):
                raise ValueError(f"{where} must be an integer; got {v!r}")
            v = int(v)
        else:
            v = float(v)
        below = p.low is not None and (v <= p.low if p.low_open else v < p.low)
        above = p.high is not None and (v >= p.high if p.high_open else v > p.high)
        if below or above:
            raise ValueError(f"{where} must be in {p.range_text()}; got {v!r}")
        if p.high_from_n is not None and rollout_n is not None and v > rollout_n + p.high_from_n:
            raise ValueError(f"{where} must be in {p.range_text(rollout_n)} at rollout_n={rollout_n}; got {v!r}")
        return v

    # --- search ranges ----------------------------------------------------------------------

    def search_ranges(
        self, ranges: Mapping[str, Any] | None = None, rollout_n: int | None = None
    ) -> dict[str, tuple[float, float] | list[Any]]:
        """Per searchable parameter: `(lo, hi)` (inclusive sampling bounds) or the list of choices.

        `ranges` narrows a parameter: `(lo, hi)` for numbers, a subset of the choices otherwise;
        a narrowed range must lie inside the declared valid range.
        """
        ranges = dict(ranges or {})
        allowed = [p.name for p in self.searchable]
        unknown = sorted(set(ranges) - set(allowed))
        if unknown:
            raise ValueError(
                f"cannot search parameter '{unknown[0]}' of {self.owner}; searchable: {', '.join(allowed) or '(none)'}"
            )
        out: dict[str, tuple[float, float] | list[Any]] = {}
        for p in self.searchable:
            out[p.name] = self._search_range(p, ranges.get(p.name), rollout_n)
        for c in self.constraints:
            lo_range, hi_range = out.get(c.lower), out.get(c.upper)
            if isinstance(lo_range, tuple) and isinstance(hi_range, tuple) and not lo_range[0] < hi_range[1]:
                raise ValueError(
                    f"impossible search range for {self.owner}: {c.lower} in {list(lo_range)} "
                    f"and {c.upper} in {list(hi_range)} cannot satisfy {c.lower} < {c.upper}"
                )
        return out

    def _search_range(self, p: Param, narrowed: Any, rollout_n: int | None) -> tuple[float, float] | list[Any]:
        where = f"search range for '{p.name}' of {self.owner}"
        if p.kind in ("bool", "choice"):
            choices = list(p.choices) if p.kind == "choice" else [False, True]
            if narrowed is None:
                return choices
            if not isinstance(narrowed, Sequence) or isinstance(narrowed, str) or not narrowed:
                raise ValueError(f"{where} must be a non-empty list drawn from {choices}; got {narrowed!r}")
            bad = [c for c in narrowed if c not in choices]
            if bad:
                raise ValueError(f"{where}: {bad[0]!r} is not allowed; allowed: {choices}")
            return list(dict.fromkeys(narrowed))
        if narrowed is None:
            lo, hi = p.search if p.search is not None else (p.low, p.high)
        else:
            if not (isinstance(narrowed, Sequence) and len(narrowed) == 2 and all(map(_is_number, narrowed))):
                raise ValueError(f"{where} must be a pair (low, high); got {narrowed!r}")
            lo, hi = float(narrowed[0]), float(narrowed[1])
            outside = (p.low is not None and lo < p.low) or (p.high is not None and hi > p.high)
            if outside or not lo <= hi or (p.kind == "float" and lo == hi):
                raise ValueError(f"{where} {[lo, hi]} is not a non-empty interval inside {p.range_text()}")
        if p.high_from_n is not None and rollout_n is not None:
            hi = min(hi, rollout_n + p.high_from_n)
        if p.kind == "int":
            lo, hi = math.ceil(lo), math.floor(hi)
            if lo > hi:
                raise ValueError(f"{where} holds no integer in {p.range_text(rollout_n)}")
            return (lo, hi)
        if p.log and lo <= 0:
            raise ValueError(f"{where} is on a log scale and needs low > 0; got {lo}")
        # Sampling bounds are inclusive: step off an open bound by one ulp.
        if p.low_open and lo == p.low:
            lo = math.nextafter(lo, math.inf)
        if p.high_open and hi == p.high:
            hi = math.nextafter(hi, -math.inf)
        return (lo, hi)

    def _lower_of(self, name: str) -> str | None:
        """The parameter that must stay below `name` (sampled first), if any."""
        for c in self.constraints:
            if c.upper == name:
                return c.lower
        return None

    def tune_space(self, ranges: Mapping[str, Any] | None = None, rollout_n: int | None = None) -> dict[str, Any]:
        """Ray Tune domains for the searchable parameters.

        A constrained parameter (`upper` of `lower < upper`) gets a uniform domain whose sampler
        reads the already-sampled sibling from the same config dict and draws from
        (max(range low, sibling), range high], using Tune's random state; wherever the space is
        nested in the Tune config, the sibling is found next to the domain itself.
        """
        from ray import tune

        out: dict[str, Any] = {}
        for name, r in self.search_ranges(ranges, rollout_n).items():
            p = self.param(name)
            if isinstance(r, list):
                out[name] = tune.choice(r)
            elif p.kind == "int":
                out[name] = tune.lograndint(r[0], r[1] + 1) if p.log else tune.randint(r[0], r[1] + 1)
            elif self._lower_of(name) is not None:
                out[name] = _tune_above_sibling(r, self._lower_of(name))
            else:
                out[name] = tune.loguniform(*r) if p.log else tune.uniform(*r)
        return out

    def suggest(
        self, trial: Any, ranges: Mapping[str, Any] | None = None, rollout_n: int | None = None, prefix: str = ""
    ) -> dict[str, Any]:
        """Sample the searchable parameters through Optuna's define-by-run `trial.suggest_*`.

        Parameters are suggested in declaration order, so for `lower < upper` the lower one is
        drawn first and the upper one from [max(range low, nextafter(lower)), range high]; the
        Optuna names are `prefix + name`. Returns the values without the prefix.
        """
        out: dict[str, Any] = {}
        for name, r in self.search_ranges(ranges, rollout_n).items():
            p, key = self.param(name), prefix + name
            if isinstance(r, list):
                out[name] = trial.suggest_categorical(key, r)
            elif p.kind == "int":
                out[name] = trial.suggest_int(key, r[0], r[1], log=p.log)
            else:
                lo, hi = r
                lower = self._lower_of(name)
                if lower is not None and lower in out:
                    lo = max(lo, math.nextafter(out[lower], math.inf))
                out[name] = trial.suggest_float(key, lo, hi, log=p.log)
        return out

    def describe(self, rollout_n: int | None = None) -> str:
        """Markdown table: name, type, default, valid range, search range (— = not searched), log, meaning."""
        rows = [
            "| parameter | type | default | valid range | search range | log | meaning |",
            "|---|---|---|---|---|---|---|",
        ]
        ranges = self.search_ranges(rollout_n=rollout_n)
        for p in self.params:
            search = p.search_text(ranges[p.name]) if p.name in ranges else "—"
            rows.append(
                f"| `{p.name}` | {p.kind} | {p.default} | {p.range_text(rollout_n)} | {search} | "
                f"{'yes' if p.log else 'no'} | {p.doc} |"
            )
        for c in self.constraints:
            rows.append(f"| *constraint* | | | `{c.lower} < {c.upper}` | | | |")
        return "\n".join(rows)


def _tune_above_sibling(bounds: tuple[float, float], lower_name: str) -> Any:
    """A Tune float domain on `bounds` whose draws stay strictly above the sibling `lower_name`."""
    from ray.tune.search.sample import Domain, Float, Uniform, _BackwardsCompatibleNumpyRng
    from ray.tune.search.variant_generator import RecursiveDependencyError

    class AboveSibling(Uniform):
        def sample(self, domain: Float, config: Any = None, size: int = 1, random_state: Any = None) -> Any:
            holder = _dict_holding(config, domain)
            if holder is None or lower_name not in holder:
                raise ValueError(f"sibling '{lower_name}' not found next to its dependent parameter")
            lower = holder[lower_name]
            if isinstance(lower, Domain):
                raise RecursiveDependencyError(f"waiting for '{lower_name}'")
            if not isinstance(random_state, _BackwardsCompatibleNumpyRng):
                random_state = _BackwardsCompatibleNumpyRng(random_state)
            lo = max(domain.lower, math.nextafter(float(lower), math.inf))
            items = random_state.uniform(lo, domain.upper, size=size)
            return items if len(items) > 1 else domain.cast(items[0])

    domain = Float(*bounds)
    domain.set_sampler(AboveSibling())
    return domain


def _dict_holding(tree: Any, target: Any) -> dict | None:
    """The dict in a nested config whose values include `target` (by identity)."""
    if not isinstance(tree, dict):
        return None
    if any(v is target for v in dict.values(tree)):
        return tree
    for v in dict.values(tree):
        found = _dict_holding(v, target)
        if found is not None:
            return found
    return None
