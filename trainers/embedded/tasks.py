"""Verifiable tasks: three domains of seeded generators, each with a strict parser and a verifier.

A prompt is completed by a bare answer followed by end-of-sequence; the answer alphabet is
strict (no spaces, no leading zeros, no alternative spellings), so `parse` accepts exactly the
canonical strings and the verifier is an exact match of the parsed answer with the reference:

    verify(item, response) = 1  if parse(item, response) == item.answer  else 0.

Domains and kinds (level 1 = easy .. 3 = hard):

- math:    `add` 47+18=, `sub` 47-18=, `add2` 47+38=, `chain` 47+8-3=, `mul` 147*8= (left to right;
           templates never mix * with + or -).  Answers are non-negative integers.
- logic:   `bool3` / `bool5` boolean evaluation with 3 / 5 binary operators (~ before & before |),
           answers t / f;  `order` ordering deduction over a shuffled chain of 4 people
           ("c>a,a>d,d>b top?" -> c);  `knights` two-person knights-and-knaves puzzles with a
           unique solution ("a:b- b:a+&b+=" -> kn: a knight, b knave; `x+` says x is a knight).
- science: multiple choice over a small taxonomy, options shuffled, answer a letter:
           `mc3` / `mc4` "which is a <category>" with 3 / 4 options, `mc5not` "which is not a
           <category>" with 5 options.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

DOMAINS: tuple[str, ...] = ("math", "logic", "science")


@dataclass(frozen=True)
class Item:
    """One verifiable prompt with its canonical reference answer."""

    domain: str
    kind: str
    prompt: str
    answer: str


Generator = Callable[[np.random.Generator], tuple[str, str]]


@dataclass(frozen=True)
class TaskKind:
    """A family of items: its generator, the well-formed-answer pattern for a given prompt, and
    `mistake`, the systematic wrong answer (well-formed, never correct) the warm-up plants."""

    name: str
    domain: str
    level: int
    generate: Generator
    answer_pattern: Callable[[str], re.Pattern[str]]
    mistake: Callable[[Item], str]


# ----------------------------------------------------------------------------- math

_INTEGER = re.compile(r"0|[1-9][0-9]*")
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _arithmetic(*terms: tuple[str, int, int]) -> Generator:
    """Generator of `a op b op c =` with operand i uniform in [low_i, high_i], evaluated left to right."""

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        values = [int(rng.integers(low, high + 1)) for _, low, high in terms]
        prompt = "".join(f"{op}{v}" for (op, _, _), v in zip(terms, values)) + "="
        total = values[0]
        for (op, _, _), v in zip(terms[1:], values[1:]):
            total = _OPS[op](total, v)
        return prompt, str(total)

    return generate


def _off_by_one(item: Item) -> str:
    return str(int(item.answer) + 1)


# ----------------------------------------------------------------------------- logic

_PEOPLE = "abcdefghij"


def _boolean(num_ops: int, negate_p: float = 0.3) -> Generator:
    """Generator of boolean expressions over t/f with `num_ops` binary operators & and |; answers balanced."""

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        target = bool(rng.random() < 0.5)  # balance the answers: resample until the value is `target`
        while True:
            values = rng.random(num_ops + 1) < 0.5
            negated = rng.random(num_ops + 1) < negate_p
            ops = np.where(rng.random(num_ops) < 0.5, "&", "|")
            literals = [("~" if n else "") + ("t" if v else "f") for v, n in zip(values, negated)]
            expr = literals[0] + "".join(op + lit for op, lit in zip(ops, literals[1:]))
            if _eval_boolean(expr) == target:
                return expr + "=", "t" if target else "f"

    return generate


def _eval_boolean(expr: str) -> bool:
    """Evaluate t/f literals with ~, & and | under the usual precedence (~ > & > |)."""
    return any(all((lit[-1] == "t") != lit.startswith("~") for lit in term.split("&")) for term in expr.split("|"))


def _negated(item: Item) -> str:
    return "f" if item.answer == "t" else "t"


def _other_end(item: Item) -> str:
    """The bottom of the chain when the top was asked, and vice versa."""
    pairs = item.prompt.split(" ")[0].split(",")
    higher, lower = {p[0] for p in pairs}, {p[2] for p in pairs}
    return (lower - higher if item.prompt.endswith("top?") else higher - lower).pop()


def _order(num_people: int) -> Generator:
    """Generator of ordering deductions: the chain p1>p2>...>pk given as shuffled pairs; ask top or bottom."""

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        chain = rng.choice(list(_PEOPLE), size=num_people, replace=False)
        pairs = [f"{a}>{b}" for a, b in zip(chain[:-1], chain[1:])]
        pairs = [pairs[i] for i in rng.permutation(len(pairs))]
        ask_top = bool(rng.random() < 0.5)
        return ",".join(pairs) + (" top?" if ask_top else " bot?"), str(chain[0] if ask_top else chain[-1])

    return generate


def _statement(rng: np.random.Generator, names: tuple[str, str]) -> str:
    """A claim about roles: one atom `x+`/`x-` or two atoms joined by & or |."""
    atoms = [f"{names[i]}{'+' if rng.random() < 0.5 else '-'}" for i in rng.integers(0, 2, size=2)]
    if rng.random() < 0.4:
        return atoms[0]
    return atoms[0] + ("&" if rng.random() < 0.5 else "|") + atoms[1]


def _holds(statement: str, roles: dict[str, bool]) -> bool:
    """Truth of a claim given roles (True = knight)."""
    return any(all(roles[a[0]] == (a[1] == "+") for a in term.split("&")) for term in statement.split("|"))


def _knights(rng: np.random.Generator) -> tuple[str, str]:
    """Two speakers; knights tell the truth, knaves lie; resample until exactly one assignment fits."""
    while True:
        names = tuple(str(p) for p in rng.choice(list(_PEOPLE), size=2, replace=False))
        claims = [_statement(rng, names) for _ in names]
        solutions = [
            roles
            for roles in ({names[0]: r0, names[1]: r1} for r0 in (True, False) for r1 in (True, False))
            if all(_holds(c, roles) == roles[n] for n, c in zip(names, claims))
        ]
        if len(solutions) == 1:
            prompt = " ".join(f"{n}:{c}" for n, c in zip(names, claims)) + "="
            return prompt, "".join("k" if solutions[0][n] else "n" for n in names)


def _roles_swapped(item: Item) -> str:
    return item.answer.translate(str.maketrans("kn", "nk"))


# ----------------------------------------------------------------------------- science

TAXONOMY: dict[str, tuple[str, ...]] = {
    "mammal": ("whale", "bat", "dog", "cow", "horse", "mouse", "lion", "seal", "goat", "bear"),
    "bird": ("eagle", "owl", "crow", "duck", "hawk", "swan", "robin", "goose", "wren"),
    "fish": ("shark", "trout", "salmon", "cod", "tuna", "eel", "carp", "pike"),
    "reptile": ("snake", "lizard", "turtle", "gecko", "iguana", "cobra", "viper"),
    "insect": ("ant", "bee", "wasp", "moth", "beetle", "fly", "flea"),
    "metal": ("iron", "copper", "gold", "zinc", "tin", "lead", "silver", "nickel"),
    "gas": ("oxygen", "helium", "neon", "argon", "nitrogen", "hydrogen", "radon"),
    "planet": ("mars", "venus", "earth", "saturn", "jupiter", "mercury", "uranus", "neptune"),
}
_CATEGORIES = tuple(TAXONOMY)
LETTERS = "abcde"


def _choice(num_options: int, negated: bool) -> Generator:
    """Generator of `[not ]<category>? a)x b)y ...`: exactly one option is (not) in the category."""

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        category = _CATEGORIES[int(rng.integers(len(_CATEGORIES)))]
        members = list(TAXONOMY[category])
        others = [m for c in _CATEGORIES if c != category for m in TAXONOMY[c]]
        inside, outside = (members, others) if not negated else (others, members)
        key = str(rng.choice(inside))
        distractors = [str(d) for d in rng.choice(outside, size=num_options - 1, replace=False)]
        options = [key, *distractors]
        options = [options[i] for i in rng.permutation(num_options)]
        prompt = ("not " if negated else "") + category + "? " + " ".join(f"{LETTERS[i]}){o}" for i, o in enumerate(options))
        return prompt, LETTERS[options.index(key)]

    return generate


def _next_letter(item: Item) -> str:
    """The option after the key, cyclically."""
    offered = item.prompt.count(")")
    return LETTERS[(LETTERS.index(item.answer) + 1) % offered]


def _fixed(pattern: str) -> Callable[[str], re.Pattern[str]]:
    compiled = re.compile(pattern)
    return lambda prompt: compiled


def _letters_offered(prompt: str) -> re.Pattern[str]:
    return re.compile(f"[a-{LETTERS[prompt.count(')') - 1]}]")


KINDS: dict[str, TaskKind] = {
    k.name: k
    for k in (
        TaskKind("add", "math", 1, _arithmetic(("", 10, 99), ("+", 1, 19)), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("sub", "math", 1, _arithmetic(("", 20, 99), ("-", 1, 19)), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("add2", "math", 2, _arithmetic(("", 10, 99), ("+", 10, 99)), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("chain", "math", 2, _arithmetic(("", 10, 99), ("+", 1, 9), ("-", 1, 9)), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("mul", "math", 3, _arithmetic(("", 10, 199), ("*", 2, 9)), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("bool3", "logic", 1, _boolean(3), _fixed("[tf]"), _negated),
        TaskKind("bool5", "logic", 2, _boolean(5), _fixed("[tf]"), _negated),
        TaskKind("order", "logic", 2, _order(4), _fixed(f"[{_PEOPLE}]"), _other_end),
        TaskKind("knights", "logic", 3, _knights, _fixed("[kn]{2}"), _roles_swapped),
        TaskKind("mc3", "science", 1, _choice(3, negated=False), _letters_offered, _next_letter),
        TaskKind("mc4", "science", 2, _choice(4, negated=False), _letters_offered, _next_letter),
        TaskKind("mc5not", "science", 3, _choice(5, negated=True), _letters_offered, _next_letter),
    )
}


def make_item(kind: str, rng: np.random.Generator) -> Item:
    """Draw one item of `kind` from `rng`."""
    spec = KINDS[kind]
    prompt, answer = spec.generate(rng)
    return Item(spec.domain, kind, prompt, answer)


def parse(item: Item, response: str) -> str | None:
    """The canonical answer in `response`, or None when it is not exactly a well-formed answer."""
    return response if KINDS[item.kind].answer_pattern(item.prompt).fullmatch(response) else None


def verify(item: Item, response: str) -> float:
    """1.0 when the parsed response equals the reference answer, else 0.0 (malformed counts as wrong)."""
    return float(parse(item, response) == item.answer)
