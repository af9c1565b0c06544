"""Verifiable tasks: three domains of seeded generators, each with a strict parser and a verifier.

A prompt is completed by a bare answer followed by end-of-sequence; the answer alphabet is
strict (no spaces, no leading zeros, no alternative spellings), so `parse` accepts exactly the
canonical strings and the verifier is an exact match of the parsed answer with the reference:

    verify(item, response) = 1  if parse(item, response) == item.answer  else 0.

Domains and kinds (level 1 = easy .. 3 = hard):

- math:    single digits joined by + (`sum3`, `sum5`) or by + and - (`mix3`, `mix5`, `mix7`), e.g.
           `mix5` 9+3-4-4-7= -> -3.  Answers are integers (no leading zeros, no "-0").
- logic:   `bool3` / `bool5` boolean evaluation with 3 / 5 binary operators (~ before & before |),
           answers t / f;  `order` ordering deduction over a shuffled chain of 3 people
           ("a>d,c>a top?" -> c);  `knights` two-person knights-and-knaves puzzles with a
           unique solution ("a:b- b:a+&b+=" -> kn: a knight, b knave; `x+` says x is a knight).
- science: multiple choice over a small taxonomy, options shuffled, answer a letter:
           `mc3` / `mc4` "which is a <category>" with 3 / 4 options ("owl(a) oak(b) pig(c) mammal?"
           -> c), `mc4not` "which is not a <category>" with 4 options.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

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

_INTEGER = re.compile(r"0|-?[1-9][0-9]*")


def _digits(count: int, ops: str) -> Generator:
    """Generator of `3+4-2+7=`: `count` single digits joined by operators drawn from `ops`."""

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        digits = rng.integers(0, 10, size=count)
        signs = rng.choice(list(ops), size=count - 1)
        total = int(digits[0]) + sum(int(d) if op == "+" else -int(d) for op, d in zip(signs, digits[1:]))
        return str(digits[0]) + "".join(f"{op}{d}" for op, d in zip(signs, digits[1:])) + "=", str(total)

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
    "mammal": ("cow", "bat", "dog", "pig", "cat", "fox"),
    "bird": ("owl", "hen", "emu", "jay", "crow", "duck"),
    "fish": ("cod", "eel", "ray", "koi", "tuna", "carp"),
    "insect": ("ant", "bee", "fly", "moth", "wasp", "flea"),
    "tree": ("oak", "ash", "elm", "fir", "yew", "pine"),
}
_CATEGORIES = tuple(TAXONOMY)
_OUTSIDE = {c: tuple(m for other in _CATEGORIES if other != c for m in TAXONOMY[other]) for c in _CATEGORIES}
LETTERS = "abcde"


def _choice(num_options: int, negated: bool) -> Generator:
    """Generator of `x(a) y(b) ... [not ]<category>?`: exactly one option is (not) in the category.

    Each option's letter follows it, and the question comes last, so the answer position reads
    the question and each letter token reads its own option.
    """

    def generate(rng: np.random.Generator) -> tuple[str, str]:
        category = _CATEGORIES[int(rng.integers(len(_CATEGORIES)))]
        inside, outside = (TAXONOMY[category], _OUTSIDE[category])[:: -1 if negated else 1]
        key = str(rng.choice(inside))
        distractors = [str(d) for d in rng.choice(outside, size=num_options - 1, replace=False)]
        options = [key, *distractors]
        options = [options[i] for i in rng.permutation(num_options)]
        question = ("not " if negated else "") + category + "?"
        prompt = " ".join(f"{o}({LETTERS[i]})" for i, o in enumerate(options)) + " " + question
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
        TaskKind("sum3", "math", 1, _digits(3, "+"), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("mix3", "math", 1, _digits(3, "+-"), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("sum5", "math", 2, _digits(5, "+"), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("mix5", "math", 2, _digits(5, "+-"), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("mix7", "math", 3, _digits(7, "+-"), _fixed(_INTEGER.pattern), _off_by_one),
        TaskKind("bool3", "logic", 1, _boolean(3), _fixed("[tf]"), _negated),
        TaskKind("bool5", "logic", 2, _boolean(5), _fixed("[tf]"), _negated),
        TaskKind("order", "logic", 2, _order(3), _fixed(f"[{_PEOPLE}]"), _other_end),
        TaskKind("knights", "logic", 3, _knights, _fixed("[kn]{2}"), _roles_swapped),
        TaskKind("mc3", "science", 1, _choice(3, negated=False), _letters_offered, _next_letter),
        TaskKind("mc4", "science", 2, _choice(4, negated=False), _letters_offered, _next_letter),
        TaskKind("mc4not", "science", 3, _choice(4, negated=True), _letters_offered, _next_letter),
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
