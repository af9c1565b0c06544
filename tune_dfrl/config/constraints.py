"""What a value may be: one vocabulary for policy hyperparameters, search settings and backend recipes.

A constraint owns its containment rule and its texts: `accept(value, ctx)` returns the value in its
canonical type or raises `Rejected` (the message is the requirement, e.g. "in [0, 1)"); `text(ctx)` is
the compact form of tables ("[1, n-1]", "{false, true}"); `words(ctx)` the phrase of error lines ("an
integer >= 1", "one of true, false"). `Interval` (numbers between two ends, each open or closed),
`Options` (one of a few values), `ListOf` (a list of constrained numbers), `Text` (a non-empty string)
and `OrNull` (null, or what another constraint accepts). An interval end may be a `Bound` read from
the `Context` a policy runs in (the group size n, the number of domains K): the one mechanism for
context-dependent limits such as gfpo `k <= n - 1` and a mixer's `floor < 1/K`.

Fields are declared with their constraint once (`declared`), and `check_declared` checks an object's
fields against their declarations. Pure: numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from tune_dfrl.errors import Rejected

Closed = Literal["both", "left", "right", "neither"]
CLOSED_BY_OPEN_SIDES: dict[tuple[bool, bool], Closed] = {
    (False, False): "both",
    (False, True): "left",
    (True, False): "right",
    (True, True): "neither",
}
SYMBOLS = {"rollout_n": "n", "num_domains": "K"}


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


NO_CONTEXT = Context()  # nothing known: bounds that need the context are not applied


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
    """A number as written in a requirement: integral values in full (4294967295), others with %g."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 2**63 else f"{x:g}"


def _end(e: float | Bound | None, ctx: Context, infinite: str) -> str:
    return infinite if e is None else e.text(ctx) if isinstance(e, Bound) else _fmt(e)


def _scalar(v: Any) -> Any:
    """numpy scalars (np.int64(2), np.float32(0.5), np.bool_) as the Python values they hold."""
    return v.item() if isinstance(v, np.generic) else v


def is_number(v: Any) -> bool:
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
        if not is_number(v) or not math.isfinite(v):
            raise Rejected("a finite number")
        if self.type is int and v != int(v):
            raise Rejected("an integer")
        v = self.type(v)
        if not self.contains(v, ctx):
            raise Rejected(f"in {self.text(ctx)}{self.at(ctx)}")
        return v

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        """Interval notation, e.g. `(0, inf)`, `[1, n-1]`, `[0, 0.25)`."""
        left = "(" if self.left is None or self.left_open() else "["
        right = ")" if self.right is None or self.right_open() else "]"
        return f"{left}{_end(self.left, ctx, '-inf')}, {_end(self.right, ctx, 'inf')}{right}"

    def at(self, ctx: Context) -> str:
        """` at rollout_n=5` for each context field a bound of this interval reads."""
        used = [e.field for e in (self.left, self.right) if isinstance(e, Bound) and getattr(ctx, e.field) is not None]
        return "".join(f" at {f}={getattr(ctx, f)}" for f in used)

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        """The requirement as a phrase: `an integer >= 1`, `a number > 0`, `a number in (0, 0.5)`."""
        kind = "an integer" if self.type is int else "a number"
        if self.left is not None and self.right is not None:
            return f"{kind} in {self.text(ctx)}"
        if self.left is not None:
            return f"{kind} {'>' if self.left_open() else '>='} {_end(self.left, ctx, '')}"
        if self.right is not None:
            return f"{kind} {'<' if self.right_open() else '<='} {_end(self.right, ctx, '')}"
        return kind

    def narrow(self, lo: float, hi: float, ctx: Context) -> Interval:
        """[lo, hi] cut to this interval in `ctx`; a side that lands on an open end stays open."""
        valid_lo, valid_hi = self.ends(ctx)
        left_open = valid_lo is not None and lo <= valid_lo and self.left_open()
        right_open = valid_hi is not None and hi >= valid_hi and self.right_open()
        lo = lo if valid_lo is None else max(lo, valid_lo)
        hi = hi if valid_hi is None else min(hi, valid_hi)
        return Interval(self.type, lo, hi, closed_sides(left_open, right_open))

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

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return "{" + ", ".join(map(_option, self.values)) + "}"

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return "one of " + ", ".join(map(_option, self.values))

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

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return f"list of numbers in {self.item.text(ctx)}"

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return f"null or a {self.text(ctx)}"

    def invalid(self, ctx: Context) -> list[Any]:
        return ["x", 1.0, *([x] for x in self.item.invalid(ctx))]


@dataclass(frozen=True)
class Text:
    """A non-empty string (a path, a URI, a name)."""

    kind = "text"

    def accept(self, v: Any, ctx: Context = NO_CONTEXT) -> str:
        if not (isinstance(v, str) and v.strip()):
            raise Rejected(self.words())
        return v

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return "non-empty string"

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return "a non-empty string"


@dataclass(frozen=True)
class OrNull:
    """None, or a value `inner` accepts."""

    inner: Interval | Options | Text

    @property
    def kind(self) -> str:
        return self.inner.kind

    def accept(self, v: Any, ctx: Context = NO_CONTEXT) -> Any:
        return None if v is None else self.inner.accept(v, ctx)

    def text(self, ctx: Context = NO_CONTEXT) -> str:
        return f"null or {self.inner.text(ctx)}"

    def words(self, ctx: Context = NO_CONTEXT) -> str:
        return f"null or {self.inner.words(ctx)}"


Constraint = Interval | Options | ListOf | Text | OrNull
BOOL = Options((False, True))
COUNT = Interval(int, 1, None)  # an integer >= 1
POSITIVE = Interval(float, 0.0, None, "right")  # a number > 0


def _option(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def declared(default: Any, allowed: Any) -> Any:
    """A dataclass field with its default and what it allows (`allowed`: a constraint)."""
    return field(default=default, metadata={"allowed": allowed})


def check_value(key: str, value: Any, allowed: Any, ctx: Context = NO_CONTEXT) -> Any:
    """`value` in the canonical type `allowed` gives it (an integer given for a real number becomes a float), else
    ValueError `key=value: allowed: <words>`."""
    try:
        return allowed.accept(value, ctx)
    except Rejected:
        raise ValueError(f"{key}={value!r}: allowed: {allowed.words(ctx)}") from None


def check_declared(obj: Any, prefix: str = "", declared_by: type | None = None) -> dict[str, Any]:
    """Check each field of the dataclass `obj` that `declared_by` (default: obj's class) declares with `declared`;
    returns {name: canonical value} of those fields."""
    specs = {f.name: f for f in dataclasses.fields(declared_by or type(obj)) if "allowed" in f.metadata}
    return {
        f.name: check_value(prefix + f.name, getattr(obj, f.name), specs[f.name].metadata["allowed"])
        for f in dataclasses.fields(obj)
        if f.name in specs
    }


def closed_sides(left_open: bool, right_open: bool) -> Closed:
    """The `closed` value of an interval with these open sides."""
    return CLOSED_BY_OPEN_SIDES[left_open, right_open]
