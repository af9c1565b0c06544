"""Tasks, parsers and verifiers of the embedded backend, on hand-made answers."""

from __future__ import annotations

import numpy as np
import pytest

from tune_dfrl.trainers.embedded import benchmarks
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS, get_benchmarks, training_pools
from tune_dfrl.trainers.embedded.overlap import max_jaccard, ngrams, normal_form
from tune_dfrl.trainers.embedded.tasks import DOMAINS, KINDS, Item, make_item, parse, verify

# (kind, prompt, reference, correct variants, wrong but well-formed, malformed)
HAND_MADE = [
    ("sum3", "3+4+2=", "9", ["9"], ["8", "10", "0"], ["09", "9 ", " 9", "+9", "9.0", "", "nine", "-0"]),
    ("mix5", "9+3-4-4-7=", "-3", ["-3"], ["-2", "3", "0"], ["- 3", "--3", "-03", "3-", "(-3)"]),
    ("bool3", "t&~f|f=", "t", ["t"], ["f"], ["T", "true", "tt", " t", "1"]),
    ("order", "a>d,c>a top?", "c", ["c"], ["a", "d", "e"], ["C", "c,a", "", "1"]),
    ("knights", "a:b- b:a+&b+=", "kn", ["kn"], ["nk", "kk", "nn"], ["k", "knn", "k n", "KN", "ab"]),
    ("mc3", "owl(a) tin(b) pig(c) mammal?", "c", ["c"], ["a", "b"], ["d", "e", "C", "(c)", "pig", ""]),
    ("mc4not", "hen(a) owl(b) cat(c) jay(d) not bird?", "c", ["c"], ["b", "d"], ["e", "c)", "cat"]),
]


@pytest.mark.parametrize("kind,prompt,answer,correct,wrong,malformed", HAND_MADE)
def test_verifier_on_hand_made_answers(kind, prompt, answer, correct, wrong, malformed):
    item = Item(KINDS[kind].domain, kind, prompt, answer)
    for r in correct:
        assert parse(item, r) == answer and verify(item, r) == 1.0
    for r in wrong:
        assert parse(item, r) == r and verify(item, r) == 0.0
    for r in malformed:
        assert parse(item, r) is None and verify(item, r) == 0.0


def test_hand_computed_answers_of_generators():
    """The reference answers of the hand-made prompts are what the task semantics say."""
    from tune_dfrl.trainers.embedded.tasks import _eval_boolean, _holds

    assert _eval_boolean("t&~f|f") is True
    assert _eval_boolean("f|t&f") is False  # & binds tighter: f | (t & f)
    assert _eval_boolean("~t|~f&t") is True
    # a: "b is a knave"; b: "a and b are knights" -> a knight, b knave is the only consistent assignment
    claims = {"a": "b-", "b": "a+&b+"}
    fits = [
        (ra, rb)
        for ra in (True, False)
        for rb in (True, False)
        if all(_holds(c, {"a": ra, "b": rb}) == {"a": ra, "b": rb}[n] for n, c in claims.items())
    ]
    assert fits == [(True, False)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_generated_items_verify_and_mistakes_are_wrong_but_well_formed(kind):
    rng = np.random.default_rng(7)
    for _ in range(200):
        item = make_item(kind, rng)
        assert verify(item, item.answer) == 1.0
        mistake = KINDS[kind].mistake(item)
        assert parse(item, mistake) == mistake and verify(item, mistake) == 0.0


def test_generators_are_seeded():
    a = [make_item("knights", np.random.default_rng(3)) for _ in range(3)]
    b = [make_item("knights", np.random.default_rng(3)) for _ in range(3)]
    assert a == b


def test_twelve_benchmarks_with_sizes_and_domains():
    assert [b.domain for b in BENCHMARKS].count("math") == 5
    assert [b.domain for b in BENCHMARKS].count("logic") == 4
    assert [b.domain for b in BENCHMARKS].count("science") == 3
    assert len({b.size for b in BENCHMARKS}) > 1 and len({b.level for b in BENCHMARKS}) == 3
    for b in BENCHMARKS:
        items = b.items()
        assert len(items) == b.size == b.info().items
        assert len({normal_form(i.prompt) for i in items}) == b.size
        assert all(i.kind == b.kind for i in items)


def test_mc_options_are_shuffled():
    positions = [i.answer for i in get_benchmarks(["sci_mc4"])[0].items()]
    counts = np.bincount([ord(p) - ord("a") for p in positions], minlength=4)
    assert counts.min() > 0.15 * len(positions)


def test_training_pools_cover_every_kind_of_each_domain():
    pools = training_pools()
    assert set(pools) == set(DOMAINS)
    for domain, items in pools.items():
        assert {i.kind for i in items} == {k for k, spec in KINDS.items() if spec.domain == domain}


def test_benchmark_and_domain_names_are_checked():
    assert [b.name for b in get_benchmarks(["science"])] == ["sci_mc3", "sci_mc4", "sci_not4"]
    with pytest.raises(ValueError, match=r"unknown benchmark or domain name\(s\) \['maths'\].*allowed domains: math"):
        get_benchmarks(["maths"])
    with pytest.raises(ValueError, match="empty"):
        get_benchmarks([])


def test_normal_form_and_jaccard():
    a = "owl(a) tin(b) pig(c) mammal?"
    shuffled = "pig(a)  owl(b) tin(c) mammal?"
    assert normal_form(a) == normal_form(shuffled) == "mammal? owl pig tin"
    assert normal_form("  47+18= ") == "47+18="
    assert ngrams("47+18=") == {"47+18="}  # shorter than n: one gram
    assert len(ngrams("x" * 12 + "yz")) == 2
    # hand-computed: 20-char strings differing in the last character share 7 of 8 grams -> J = 7 / 9
    s = "abcdefghijklmnopqrst"
    jac, ref = max_jaccard([s], ["zzz", s[:-1] + "u"])
    assert ref[0] == 1 and jac[0] == pytest.approx(7 / 9)
    jac, ref = max_jaccard(["12+3="], ["12+4="])
    assert jac[0] == 0.0 and ref[0] == -1


def test_training_pools_are_drawn_once_then_read_from_the_cache_folder(tmp_path, monkeypatch):
    """The first process draws the pools and writes them to the cache folder; the next reads the same pools back;
    an unreadable file is drawn again and rewritten; an unwritable folder only means drawing."""
    drawn = benchmarks.draw_training_pools()
    monkeypatch.setenv("TUNE_DFRL_CACHE", str(tmp_path / "cache"))
    path = benchmarks.pools_file()
    assert path.parent == tmp_path / "cache" and path.name.startswith("pools-")

    def fresh_process_pools() -> dict:
        benchmarks.training_pools.cache_clear()
        return benchmarks.training_pools()

    try:
        assert fresh_process_pools() == drawn and path.exists()
        path.write_text('{"math": [["math", "add"]]}')  # torn: the next process draws and rewrites it
        assert fresh_process_pools() == drawn
        stored = path.read_text()
        assert fresh_process_pools() == drawn and path.read_text() == stored
        monkeypatch.setenv("TUNE_DFRL_CACHE", str(path))  # a file where the folder goes
        assert fresh_process_pools() == drawn
    finally:
        benchmarks.training_pools.cache_clear()
