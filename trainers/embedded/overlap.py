"""Overlap between prompt sets: a normal form for exact matches and n-gram Jaccard for near matches.

The study flags 13-gram overlap.  Our tokeniser is character-level, so the n-grams are over
characters (the model's tokens) of the normal form, with N = 13; a normal form shorter than N
is a single gram, so for short prompts (most arithmetic) Jaccard reduces to exact equality.
Two prompts are near-duplicates when

    J(a, b) = |G(a) & G(b)| / |G(a) | G(b)|  >  JACCARD_THRESHOLD,   G(x) = {N-grams of normal_form(x)}.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from scipy import sparse

NGRAM = 13
JACCARD_THRESHOLD = 0.5

_OPTION = re.compile(r"([a-z]+)\([a-e]\) ")


def normal_form(prompt: str) -> str:
    """Lower-cased, whitespace-collapsed prompt; multiple-choice options sorted and unlettered
    (question first), so that a copy with shuffled options has the same normal form."""
    text = " ".join(prompt.lower().split())
    options = _OPTION.findall(text + " ")
    question = _OPTION.sub("", text + " ").strip()
    if options and text.endswith("?") and " " not in question.removeprefix("not "):
        return question + " " + " ".join(sorted(options))
    return text


def ngrams(text: str, n: int = NGRAM) -> set[str]:
    """Character n-grams of `text` (the whole text when it is shorter than n)."""
    return {text[i : i + n] for i in range(max(1, len(text) - n + 1))}


def max_jaccard(queries: Sequence[str], references: Sequence[str], n: int = NGRAM) -> tuple[np.ndarray, np.ndarray]:
    """For each query, the largest n-gram Jaccard with any reference and that reference's index.

    Normal forms are taken here. Intersections come from one sparse product of binary
    (prompt x gram) matrices, processed in row chunks; queries sharing no gram get (0, -1).
    """
    grams_q = [ngrams(normal_form(q), n) for q in queries]
    grams_r = [ngrams(normal_form(r), n) for r in references]
    vocab: dict[str, int] = {}
    q = _incidence(grams_q, vocab)
    r = _incidence(grams_r, vocab)
    q.resize((q.shape[0], len(vocab)))
    r.resize((r.shape[0], len(vocab)))
    size_q = np.asarray(q.sum(axis=1)).ravel()
    size_r = np.asarray(r.sum(axis=1)).ravel()
    best = np.zeros(len(queries))
    best_ref = np.full(len(queries), -1)
    r_t = r.T.tocsc()
    for start in range(0, len(queries), 2048):
        inter = (q[start : start + 2048] @ r_t).tocoo()
        order = np.lexsort((inter.data / (size_q[inter.row + start] + size_r[inter.col] - inter.data), inter.row))
        rows, cols, shared = inter.row[order] + start, inter.col[order], inter.data[order]
        last = np.r_[rows[1:] != rows[:-1], True][: len(rows)]  # per row, the largest Jaccard comes last
        best[rows[last]] = shared[last] / (size_q[rows[last]] + size_r[cols[last]] - shared[last])
        best_ref[rows[last]] = cols[last]
    return best, best_ref


def _incidence(gram_sets: list[set[str]], vocab: dict[str, int]) -> sparse.csr_matrix:
    """Binary (set x gram) matrix; grams are added to `vocab` as they are met."""
    cols = [vocab.setdefault(g, len(vocab)) for s in gram_sets for g in s]
    indptr = np.cumsum([0] + [len(s) for s in gram_sets])
    data = np.ones(len(cols), dtype=np.float64)
    return sparse.csr_matrix(
        (data, np.asarray(cols, dtype=np.int64), indptr), shape=(len(gram_sets), max(len(vocab), 1))
    )
