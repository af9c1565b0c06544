"""Hyperparameter declarations and everything derived from them.

A constraint owns its containment rule and its text: `Interval` (numbers between two ends, each
open or closed), `Options` (one of a few values) and `ListOf` (a list of constrained numbers). An
interval end may be a `Bound` read from the `Context` a method runs in (the group size n, the
number of domains K): the one mechanism for context-dependent limits such as gfpo `k <= n - 1`
and a mixer's `floor < 1/K`.

Each component declares its hyperparameters once, as `Param`s plus `LessThan` cross-constraints.
From that declaration `ParamSpec` derives validation, search ranges, an Optuna define-by-run
sample, a markdown table, and invalid example values for the tests. Nothing here imports Ray or
Optuna: `suggest` only calls the `suggest_*` methods of the trial it is given.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Closed = Literal["both", "left", "right", "neither"]
CLOSED_BY_OPEN_SIDES: dict[tuple[bool, bool], Closed] = {
    (False, False): "both",
    (False, True): "left",
    (True, False): "right",
    (True, True): "neither",
}
SYMBOLS = {"rollout_n": "n", "num_domains": "K"}


class Rejected(ValueError):
    """A value outside a constraint; the message is the requirement ("in [0, 1)", "an integer")."""


@dataclass(frozen=True)
class Context:
    """What a method runs under; None = not known (bounds that need it are not applied).

    rollout_n: responses per group n. num_domains: K. binary_rewards: every reward is 0 or 1 and
    advantages are GRPO's (used by canonical forms only: a group of n >= 2 that is all solved or
    all unsolved then has advantage 0).
    """

    rollout_n: int | None = None
    num_domains: int | None = None
    binary_rewards: bool = False


@dataclass(frozen=True)
class Bound:
    """An interval end read from the context: `field + offset`, or `1 / field` when `reciprocal`.

    When the context lacks the field, containment uses `unknown` (None = unbounded) and the text
    shows the symbol (`n-1`, `1/K`).
    """

    field: Literal["rollout_n", "num_domains"]
    offset: int = 0
    reciprocal: bool = False
    unknown: float | None = None

    def value(self, ctx: Context) -> float | None:
        known = getattr(ctx, self.field)
        if known is None:
            return self.unknown
        return 1 / known if self.reciprocal else known + self.offset

    def text(self, ctx: Context) -> str:
        if getattr(ctx, self.field) is not None:
            return _fmt(self.value(ctx))
        symbol = SYMBOLS[self.field]
        return f"1/{symbol}" if self.reciprocal else f"{symbol}{self.offset:+d}" if self.offset else symbol


def _fmt(x: float) -> str:
    return f"{x:g}"


def _scalar(v: Any) -> Any:
    """numpy scalars (np.int64(2), np.float32(0.5), np.bool_) as the Python values they hold."""
    return v.item() if isinstance(v, np.generic) else v


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class Interval:
    """Numbers of `type` (int or float) from `left` to `right` (None = unbounded), `closed` on those sides."""

    type: type
    left: float | Bound | None
    right: float | Bound | None
    closed: Closed = "both"

    @property
    def kind(self) -> str:
        return self.type.__name__

    def ends(self, ctx: Context) -> tuple[float | None, float | None]:
        return tuple(e.value(ctx) if isinstance(e, Bound) else e for e in (self.left, self.right))

    def left_open(self) -> bool:
        return self.closed in ("right", "neither")

    def right_open(self) -> bool:
        return self.closed in ("left", "neither")

    def contains(self, v: float, ctx: Context) -> bool:
        lo, hi = self.ends(ctx)
        above = lo is None or (v > lo if self.left_open() else v >= lo)
        below = hi is None or (v < hi if self.right_open() else v <= hi)
        return above and below

    def accept(self, v: Any, ctx: Context) -> int | float:
        """The value as int or float; `Rejected` when it is not a finite number inside."""
        v = _scalar(v)
        if not _is_number(v) or not math.isfinite(v):
            raise Rejected("a finite number")
        if self.type is int and v != int(v):
            raise Rejected("an integer")
        v = self.type(v)
        if not self.contains(v, ctx):
            raise Rejected(f"in {self.text(ctx)}{self.at(ctx)}")
        return v

    def text(self, ctx: Context = Context()) -> str:
        """Interval notation, e.g. `(0, inf)`, `[1, n-1]`, `[0, 0.25)`."""

        def end(e: float | Bound | None, infinite: str) -> str:
            return infinite if e is None else e.text(ctx) if isinstance(e, Bound) else _fmt(e)

        left = "(" if self.left is None or self.left_open() else "["
        right = ")" if self.right is None or self.right_open() else "]"
        return f"{left}{end(self.left, '-inf')}, {end(self.right, 'inf')}{right}"

    def at(self, ctx: Context) -> str:
        """` at rollout_n=5` for each context field a bound of this interval reads."""
        used = [e.field for e in (self.left, self.right) if isinstance(e, Bound) and getattr(ctx, e.field) is not None]
        return "".join(f" at {f}={getattr(ctx, f)}" for f in used)

    def narrow(self, lo: float, hi: float, ctx: Context) -> Interval:
        """[lo, hi] cut to this interval in `ctx`; a side that lands on an open end stays open."""
        valid_lo, valid_hi = self.ends(ctx)
        left_open = valid_lo is not None and lo <= valid_lo and self.left_open()
        right_open = valid_hi is not None and hi >= valid_hi and self.right_open()
        lo = lo if valid_lo is None else max(lo, valid_lo)
        hi = hi if valid_hi is None else min(hi, valid_hi)
        return Interval(self.type, lo, hi, _sides(left_open, right_open))

    def sampling_bounds(self) -> tuple[float, float] | None:
        """Inclusive (lo, hi) for a sampler, stepping off open ends; None when nothing is inside.

        For a range from `narrow` (both ends numbers).
        """
        lo, hi = self.left, self.right
        if self.type is int:
            lo = math.floor(lo) + 1 if self.left_open() else math.ceil(lo)
            hi = math.ceil(hi) - 1 if self.right_open() else math.floor(hi)
        else:
            lo = math.nextafter(lo, math.inf) if self.left_open() else lo
            hi = math.nextafter(hi, -math.inf) if self.right_open() else hi
        return (lo, hi) if lo <= hi else None

    def invalid(self, ctx: Context) -> list[Any]:
        """Values this interval must reject: wrong types, non-finite, just outside each end."""

        def past(end: float, direction: int) -> float:
            return end + direction if self.type is int else math.nextafter(end, direction * math.inf)

        out: list[Any] = ["x", True, None, math.nan, math.inf, -math.inf]
        lo, hi = self.ends(ctx)
        if lo is not None:
            out.append(lo if self.left_open() else past(lo, -1))
        if hi is not None:
            out.append(hi if self.right_open() else past(hi, 1))
        if self.type is int:
            out.append((lo if lo is not None else 0) + 0.5)
        return out


@dataclass(frozen=True)
class Options:
    """One of `values`, of the same Python type (a bool option refuses 1, a string option refuses 1)."""

    values: tuple[Any, ...]

    @property
    def kind(self) -> str:
        return "bool" if all(isinstance(v, bool) for v in self.values) else "choice"

    def accept(self, v: Any, ctx: Context) -> Any:
        v = _scalar(v)
        for option in self.values:
            if type(option) is type(v) and option == v:
                return option
        raise Rejected("true or false" if self.kind == "bool" else f"one of {', '.join(map(str, self.values))}")

    def text(self, ctx: Context = Context()) -> str:
        return "{" + ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in self.values) + "}"

    def invalid(self, ctx: Context) -> list[Any]:
        return [1, "true", None] if self.kind == "bool" else ["bogus", 1, None]


@dataclass(frozen=True)
class ListOf:
    """None (not given) or a list of numbers each inside `item`."""

    item: Interval

    kind = "floats"

    def accept(self, v: Any, ctx: Context) -> list[float] | None:
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)):
            raise Rejected(f"a list of numbers in {self.item.text(ctx)}")
        try:
            return [float(self.item.accept(x, ctx)) for x in v]
        except Rejected:
            raise Rejected(f"a list of numbers in {self.item.text(ctx)}") from None

    def text(self, ctx: Context = Context()) -> str:
        return f"list of numbers in {self.item.text(ctx)}"

    def invalid(self, ctx: Context) -> list[Any]:
        return ["x", 1.0, *([x] for x in self.item.invalid(ctx))]


Constraint = Interval | Options | ListOf
BOOL = Options((False, True))


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

    def validate(self, values: Mapping[str, Any] | None, ctx: Context = Context()) -> dict[str, Any]:
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
        self, ranges: Mapping[str, Any] | None = None, ctx: Context = Context(), fixed: Mapping[str, Any] | None = None
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
            lo, hi = p.search if p.search is not None else valid.ends(Context())
        else:
            if not (isinstance(narrowed, Sequence) and len(narrowed) == 2 and all(map(_is_number, narrowed))):
                raise ValueError(f"{where} must be a pair (low, high); got {narrowed!r}")
            lo, hi = float(narrowed[0]), float(narrowed[1])
            valid_lo, valid_hi = valid.ends(Context())
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
                cut = Interval(r.type, fixed[c.lower], r.right, _sides(True, r.right_open()))
            elif c.lower == name and c.upper in fixed and fixed[c.upper] <= r.right:
                partner, relation = c.upper, "stay below"
                cut = Interval(r.type, r.left, fixed[c.upper], _sides(r.left_open(), True))
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
        self, trial: Any, ranges: Mapping[str, Any] | None = None, ctx: Context = Context(), prefix: str = ""
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

    def search_text(self, name: str, ctx: Context = Context()) -> str:
        """A searchable parameter's default search range, e.g. `(0, 1]`, `[0.01, 10] log`, `{a, b}`."""
        p = self.param(name)
        r = self._search_range(p, None, ctx)
        return (r.text() if isinstance(r, Interval) else Options(tuple(r)).text()) + (" log" if p.log else "")

    def describe(self, ctx: Context = Context()) -> str:
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


def _sides(left_open: bool, right_open: bool) -> Closed:
    """The `closed` value of an interval with these open sides."""
    return CLOSED_BY_OPEN_SIDES[left_open, right_open]
