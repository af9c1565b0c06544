"""Hyperparameter declarations and everything derived from them.

What a value may be is said with the project's constraints (`tune_dfrl.config.constraints`: `Interval`,
`Options`, `ListOf`, interval ends `Bound` to the `Context` a method runs in, e.g. gfpo `k <= n - 1`).

Each component declares its hyperparameters once, as `Param`s plus `LessThan` cross-constraints.
From that declaration `ParamSpec` derives validation, search ranges, an Optuna define-by-run
sample, a markdown table, and invalid example values for the tests. Nothing here imports Ray or
Optuna: `suggest` only calls the `suggest_*` methods of the trial it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tune_dfrl.config.constraints import (
    NO_CONTEXT,
    Constraint,
    Context,
    Interval,
    Options,
    Rejected,
    closed_sides,
    is_number,
)


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its valid values, default, default search range and meaning.

    `search` is the default search range where it differs from the valid one (it must, where the
    valid range is unbounded). Non-searchable parameters are validated and canonicalised but never
    sampled.
    """

    name: str
    default: Any
    valid: Constraint
    search: tuple[float, float] | None = None
    log: bool = False
    searchable: bool = True
    doc: str = ""

    @property
    def default_text(self) -> str:
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


TEMPERATURE = Param(
    "temperature",
    1.0,
    Interval(float, 0.0, None, "neither"),
    search=(0.01, 10.0),
    log=True,
    doc="softmax temperature T",
)
"""The softmax temperature T > 0 of the `softmax` reweighter and of the mixers (declared once for all)."""


Reduce = Callable[[dict[str, Any], Context, dict[str, Any]], "dict[str, Any] | None"]
"""An actuator's canonical reduction: (validated params, context, defaults) -> the params of a
configuration that acts identically, or None when it acts exactly as uniform GRPO."""


@dataclass(frozen=True)
class LessThan:
    """Cross-parameter constraint `lower < upper`."""

    lower: str
    upper: str


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
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    @property
    def searchable(self) -> list[Param]:
        return [p for p in self.params if p.searchable]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise ValueError(f"unknown parameter '{name}' for {self.owner}; allowed: {', '.join(self.names)}")

    # --- validation -------------------------------------------------------------------------

    def validate(self, values: Mapping[str, Any] | None, ctx: Context = NO_CONTEXT) -> dict[str, Any]:
        """Check names, types, ranges and constraints; return the values with defaults filled in."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            raise ValueError(
                f"unknown parameter '{unknown[0]}' for {self.owner}; allowed: {', '.join(self.names) or '(none)'}"
            )
        out = {}
        for p in self.params:
            v = values.get(p.name, p.default)
            try:
                out[p.name] = p.valid.accept(v, ctx)
            except Rejected as e:
                raise ValueError(f"parameter '{p.name}' for {self.owner} must be {e}; got {v!r}") from None
        for c in self.constraints:
            if not out[c.lower] < out[c.upper]:
                raise ValueError(
                    f"parameters for {self.owner} must satisfy {c.lower} < {c.upper}; "
                    f"got {c.lower}={out[c.lower]}, {c.upper}={out[c.upper]}"
                )
        return out

    def invalid_examples(self, ctx: Context) -> list[dict[str, Any]]:
        """Parameter dicts `validate` must reject: each constraint's invalid values, and each
        `lower < upper` with both at one value valid for each."""
        out = [{p.name: v} for p in self.params for v in p.valid.invalid(ctx)]
        for c in self.constraints:
            lo, hi = self._search_range(self.param(c.lower), None, ctx).sampling_bounds()
            out.append({c.lower: (lo + hi) / 2, c.upper: (lo + hi) / 2})
        return out

    # --- search ranges ----------------------------------------------------------------------

    def search_ranges(
        self, ranges: Mapping[str, Any] | None = None, ctx: Context = NO_CONTEXT, fixed: Mapping[str, Any] | None = None
    ) -> dict[str, tuple[float, float] | list[Any]]:
        """Per searchable parameter: inclusive sampling bounds `(lo, hi)` or the list of choices.

        `ranges` narrows a parameter: `(lo, hi)` for numbers, a subset of the choices otherwise;
        a narrowed range must lie inside the declared valid range. `fixed` values of parameters
        not searched narrow their `lower < upper` partners.
        """
        ranges, fixed = dict(ranges or {}), dict(fixed or {})
        allowed = [p.name for p in self.searchable]
        unknown = sorted(set(ranges) - set(allowed))
        if unknown:
            raise ValueError(
                f"cannot search parameter '{unknown[0]}' of {self.owner}; searchable: {', '.join(allowed) or '(none)'}"
            )
        out = {}
        for p in self.searchable:
            r = self._search_range(p, ranges.get(p.name), ctx)
            if isinstance(r, Interval):
                r = self._below_or_above_fixed(p.name, r, fixed)
                bounds = r.sampling_bounds()
                if bounds is None:
                    where = f"search range for '{p.name}' of {self.owner}"
                    raise ValueError(f"{where} holds no {p.valid.kind} in {r.text()}")
                r = bounds
            out[p.name] = r
        for c in self.constraints:
            lo_range, hi_range = out.get(c.lower), out.get(c.upper)
            if isinstance(lo_range, tuple) and isinstance(hi_range, tuple) and not lo_range[0] < hi_range[1]:
                raise ValueError(
                    f"impossible search range for {self.owner}: {c.lower} in {list(lo_range)} "
                    f"and {c.upper} in {list(hi_range)} cannot satisfy {c.lower} < {c.upper}"
                )
        return out

    def _search_range(self, p: Param, narrowed: Any, ctx: Context) -> Interval | list[Any]:
        """The search range as an Interval (numbers) or the list of choices."""
        where = f"search range for '{p.name}' of {self.owner}"
        valid = p.valid
        if isinstance(valid, Options):
            if narrowed is None:
                return list(valid.values)
            if not isinstance(narrowed, Sequence) or isinstance(narrowed, str) or not narrowed:
                raise ValueError(f"{where} must be a non-empty list drawn from {list(valid.values)}; got {narrowed!r}")
            chosen = []
            for c in narrowed:
                try:
                    chosen.append(valid.accept(c, ctx))
                except Rejected:
                    raise ValueError(f"{where}: {c!r} is not allowed; allowed: {list(valid.values)}") from None
            return list(dict.fromkeys(chosen))
        if narrowed is None:
            lo, hi = p.search if p.search is not None else valid.ends(NO_CONTEXT)
        else:
            if not (isinstance(narrowed, Sequence) and len(narrowed) == 2 and all(map(is_number, narrowed))):
                raise ValueError(f"{where} must be a pair (low, high); got {narrowed!r}")
            lo, hi = float(narrowed[0]), float(narrowed[1])
            valid_lo, valid_hi = valid.ends(NO_CONTEXT)
            outside = (valid_lo is not None and lo < valid_lo) or (valid_hi is not None and hi > valid_hi)
            if outside or not lo <= hi or (valid.type is float and lo == hi):
                raise ValueError(f"{where} {[lo, hi]} is not a non-empty interval inside {valid.text()}")
        if p.log and lo <= 0:
            raise ValueError(f"{where} is on a log scale and needs low > 0; got {lo}")
        return valid.narrow(lo, hi, ctx)

    def _below_or_above_fixed(self, name: str, r: Interval, fixed: Mapping[str, Any]) -> Interval:
        """Cut a searched range to stay above a fixed `lower` partner, or below a fixed `upper` one."""
        for c in self.constraints:
            if c.upper == name and c.lower in fixed and fixed[c.lower] >= r.left:
                partner, relation = c.lower, "exceed"
                cut = Interval(r.type, fixed[c.lower], r.right, closed_sides(True, r.right_open()))
            elif c.lower == name and c.upper in fixed and fixed[c.upper] <= r.right:
                partner, relation = c.upper, "stay below"
                cut = Interval(r.type, r.left, fixed[c.upper], closed_sides(r.left_open(), True))
            else:
                continue
            if cut.sampling_bounds() is None:
                raise ValueError(
                    f"impossible search range for {self.owner}: {name} in {r.text()} "
                    f"cannot {relation} fixed {partner}={fixed[partner]}"
                )
            r = cut
        return r

    def _lower_of(self, name: str) -> str | None:
        """The parameter that must stay below `name` (sampled first), if any."""
        for c in self.constraints:
            if c.upper == name:
                return c.lower
        return None

    def suggest(
        self, trial: Any, ranges: Mapping[str, Any] | None = None, ctx: Context = NO_CONTEXT, prefix: str = ""
    ) -> dict[str, Any]:
        """Sample the searchable parameters through Optuna's define-by-run `trial.suggest_*`.

        Parameters are suggested in declaration order, so for `lower < upper` the lower one is
        drawn first and the upper one from [max(range low, nextafter(lower)), range high]; the
        Optuna names are `prefix + name`. Returns the values without the prefix.
        """
        out: dict[str, Any] = {}
        for name, r in self.search_ranges(ranges, ctx).items():
            p, key = self.param(name), prefix + name
            if isinstance(r, list):
                out[name] = trial.suggest_categorical(key, r)
            elif p.valid.type is int:
                out[name] = trial.suggest_int(key, r[0], r[1], log=p.log)
            else:
                lo, hi = r
                lower = self._lower_of(name)
                if lower is not None and lower in out:
                    lo = max(lo, math.nextafter(out[lower], math.inf))
                out[name] = trial.suggest_float(key, lo, hi, log=p.log)
        return out

    # --- docs -------------------------------------------------------------------------------

    def search_text(self, name: str, ctx: Context = NO_CONTEXT) -> str:
        """A searchable parameter's default search range, e.g. `(0, 1]`, `[0.01, 10] log`, `{a, b}`."""
        p = self.param(name)
        r = self._search_range(p, None, ctx)
        return (r.text() if isinstance(r, Interval) else Options(tuple(r)).text()) + (" log" if p.log else "")

    def describe(self, ctx: Context = NO_CONTEXT) -> str:
        """Markdown table: name, type, default, valid range, search range (— = not searched), meaning."""
        rows = [
            "| parameter | type | default | valid range | search range | meaning |",
            "|---|---|---|---|---|---|",
        ]
        for p in self.params:
            search = self.search_text(p.name, ctx) if p.searchable else "—"
            valid = p.valid.text(ctx)
            rows.append(f"| `{p.name}` | {p.valid.kind} | {p.default_text} | {valid} | {search} | {p.doc} |")
        for c in self.constraints:
            rows.append(f"| *constraint* | | | `{c.lower} < {c.upper}` | | |")
        return "\n".join(rows)
