"""Pre-flight checks of the embedded data: calibration and contamination.

    python -m tune_dfrl.trainers.embedded.checks calibrate       # exit status 1 on failure
    python -m tune_dfrl.trainers.embedded.checks contamination

Calibration runs the evaluator's own scoring path (tokenise -> decode -> parse -> verify) on
responses written in the model's output format: every reference answer followed by eos must
score 1, and malformed responses (empty, a trailing or leading extra character, no eos) must
score 0 and count as format failures. Contamination: no training item may equal an evaluation
item after normalisation, nor exceed the n-gram Jaccard threshold with one (overlap.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tune_dfrl.backends.base import CalibrationResult

from .benchmarks import BENCHMARKS, training_pools
from .evaluate import score_responses
from .model import EOS_ID, build_tokenizer, decode_responses
from .overlap import JACCARD_THRESHOLD, NGRAM, max_jaccard, normal_form
from .tasks import DOMAINS, Item

MALFORMED: dict[str, Callable[[str], tuple[str, bool]]] = {
    "empty": lambda a: ("", True),
    "trailing space": lambda a: (a + " ", True),
    "leading '='": lambda a: ("=" + a, True),
    "trailing '.'": lambda a: (a + ".", True),
    "no eos": lambda a: (a, False),
}


def calibrate(suites: dict[str, list[Item]] | None = None) -> CalibrationResult:
    """Reference answers in the output format score 1; every MALFORMED variant scores 0 (per suite)."""
    suites = suites if suites is not None else {b.name: b.items() for b in BENCHMARKS}
    tokenizer = build_tokenizer()
    failures = []
    cases = {"reference": lambda a: (a, True), **MALFORMED}
    for name, items in suites.items():
        for case, make in cases.items():
            texts, with_eos = zip(*(make(i.answer) for i in items))
            ids = [tokenizer.encode(t, add_special_tokens=False) + [EOS_ID] * e for t, e in zip(texts, with_eos)]
            width = max(len(x) for x in ids)
            responses = torch.tensor([x + [0] * (width - len(x)) for x in ids])
            scored = score_responses(items, *decode_responses(tokenizer, responses))
            if case == "reference":
                bad = int((~scored.correct).sum())
                if bad:
                    example = _example(items, scored.correct)
                    failures.append(f"{name}: {bad}/{len(items)} reference answers do not score 1 (e.g. {example})")
            else:
                bad = int((scored.correct | scored.well_formed).sum())
                if bad:
                    failures.append(f"{name}: {bad}/{len(items)} malformed responses ({case}) parse or score 1")
    return CalibrationResult(ok=not failures, failures=failures)


def _example(items: list[Item], correct: np.ndarray) -> str:
    item = next(i for i, c in zip(items, correct) if not c)
    return f"prompt {item.prompt!r}, answer {item.answer!r}"


@dataclass(frozen=True)
class ContaminationResult:
    ok: bool
    failures: list[str]
    exact: int
    near: int
    max_jaccard: float


def contamination_check(
    eval_items: list[Item] | None = None, pools: dict[str, list[Item]] | None = None, limit: int = 10
) -> ContaminationResult:
    """Training items that match an evaluation item exactly (normal form) or nearly (Jaccard > threshold)."""
    eval_items = eval_items if eval_items is not None else [i for b in BENCHMARKS for i in b.items()]
    pools = pools if pools is not None else {d: list(v) for d, v in training_pools().items()}
    train = [i for d in DOMAINS for i in pools.get(d, [])]
    eval_forms = {normal_form(i.prompt): i for i in eval_items}
    is_exact = np.array([normal_form(t.prompt) in eval_forms for t in train], dtype=bool)
    failures = [
        f"exact: training {train[k].prompt!r} = evaluation {eval_forms[normal_form(train[k].prompt)].prompt!r}"
        for k in np.flatnonzero(is_exact)
    ]
    exact = len(failures)
    jaccard, nearest = max_jaccard([t.prompt for t in train], [e.prompt for e in eval_items])
    near = np.flatnonzero((jaccard > JACCARD_THRESHOLD) & ~is_exact)
    failures += [
        f"near: training {train[k].prompt!r} ~ evaluation {eval_items[nearest[k]].prompt!r} "
        f"(J{NGRAM} = {jaccard[k]:.2f})"
        for k in near
    ]
    return ContaminationResult(
        ok=not failures,
        failures=failures[:limit],
        exact=exact,
        near=len(near),
        max_jaccard=float(jaccard.max(initial=0.0)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tune_dfrl.trainers.embedded.checks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("check", choices=["calibrate", "contamination"])
    args = parser.parse_args(argv)
    if args.check == "calibrate":
        result = calibrate()
        print(f"calibration on {len(BENCHMARKS)} benchmarks: {'ok' if result.ok else 'FAILED'}")
        ok = result.ok
    else:
        found = contamination_check()
        print(
            f"contamination: {found.exact} exact and {found.near} near matches "
            f"(max {NGRAM}-gram Jaccard {found.max_jaccard:.2f}, threshold {JACCARD_THRESHOLD}): "
            f"{'ok' if found.ok else 'FAILED'}"
        )
        result, ok = found, found.ok
    for line in result.failures:
        print("  " + line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
