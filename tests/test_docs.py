"""The docs state behaviour; measured figures, with their dates, live on one generated page (docs/performance.md).

README.md and docs/*.md other than docs/performance.md name no commit, clock time or date; docs/performance.md is
what benchmarks/performance_page.py writes from benchmarks/results/; every relative link resolves.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from repo_files import REPO

PERFORMANCE = REPO / "docs" / "performance.md"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DATED = [p for p in DOCS if p != PERFORMANCE]

# 7 to 40 hex digits with at least one digit and one letter, standing alone: a commit hash (or an arm id, which the
# docs do not spell out either). Plain numbers and words of the letters a-f alone do not match.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
CLOCK = re.compile(r"(?<![\d.:])(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?![\d:])(?:\s*UTC)?")
DATE = re.compile(r"(?<!\d)\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def dated(text: str) -> list[str]:
    """Every commit hash, clock time and date in `text`, each with its line number."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in (("commit", COMMIT), ("clock time", CLOCK), ("date", DATE)):
            found += [f"line {number}: {kind} {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M)
    return {slug(h) for h in headings}


def broken_links(path: Path) -> list[str]:
    """Relative links in `path` whose file does not exist, or whose #anchor names no heading of a Markdown file."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # links inside code blocks are not links
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        file = (path.parent / name).resolve() if name else path
        shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
        if not file.exists():
            found.append(f"{target}: no file {shown}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            found.append(f"{target}: no heading #{anchor} in {shown}")
    return found


def performance_page() -> ModuleType:
    """benchmarks/performance_page.py (a script, not a package module), loaded afresh."""
    spec = importlib.util.spec_from_file_location("performance_page", REPO / "benchmarks" / "performance_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_patterns_catch_dates_clock_times_and_commits_and_nothing_else():
    planted = "Measured 2026-12-07 07:01 UTC at commit 1d675ca; 05:53–06:58; run 2026-12-07T07:01:00."
    assert [f.split(": ", 1)[1] for f in dated(planted)] == [
        "commit '1d675ca'",
        "clock time '07:01 UTC'",
        "clock time '05:53'",
        "clock time '06:58'",
        "clock time '07:01:00'",
        "date '2026-12-07'",
        "date '2026-12-07'",
    ]
    assert dated("the arm a4922f3ffb6a stopped; commit 470bef3f") != []
    ordinary = (
        "make test runs 732 tests; 0.10000000000000002 over 3 tokens; the facade deadbeef; "
        "mlflow ui --host 127.0.0.1 --port 5000; ray.address=10.0.0.5:6379; http://127.0.0.1:5000/#/experiments/1; "
        "a 1:1 ratio; Qwen2.5-1.5B-Instruct; seeds [3,7,11,19]; sha256; 1e-6; 2 min 34 s; step 20 of 30; 2026; 12-07"
    )
    assert dated(ordinary) == []


def test_readme_and_docs_hold_no_commit_clock_time_or_date():
    offenders = {str(p.relative_to(REPO)): dated(p.read_text()) for p in DATED}
    assert {name: found for name, found in offenders.items() if found} == {}, (
        "measured figures and their dates go to docs/performance.md (benchmarks/results/*.json)"
    )


def test_the_performance_page_is_what_the_results_files_make():
    page = performance_page()
    assert PERFORMANCE.read_text() == page.page(), "run python benchmarks/performance_page.py"
    assert page.main(["--check"]) == 0


def test_the_performance_page_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    page = performance_page()
    stale = tmp_path / "performance.md"
    stale.write_text(page.page().replace("## ", "## stale ", 1))
    monkeypatch.setattr(page, "PAGE", stale)
    monkeypatch.setattr(page, "ROOT", tmp_path)
    assert page.main(["--check"]) == 1
    stale.unlink()
    assert page.main(["--check"]) == 1  # no page at all


def test_every_results_file_has_the_shape_the_benchmarks_write():
    page = performance_page()
    records = page.load()
    assert records, "benchmarks/results/ holds no results file"
    for stem, record in records:
        assert {"benchmark", "script", "what", "command", "machine", "date", "wall_s", "rows"} <= set(record), stem
        assert set(record["machine"]) == {"cores", "memory_gib", "cpu_model", "python", "torch", "load_average"}, stem
        assert (REPO / record["script"]).is_file(), stem
        assert record["rows"] and all(isinstance(row, dict) for row in record["rows"]), stem
        assert record["date"] is None or DATE.match(record["date"]), stem


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = {str(p.relative_to(REPO)): broken_links(p) for p in DOCS}
    assert {name: links for name, links in broken.items() if links} == {}


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n\n## The `second` one (b)\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [ok](there.md#the-second-one-b) [web](https://example.org/x)\n"
        "[gone](missing.md) [no heading](there.md#nowhere)\n```\n[in code](ignored.md)\n```\n"
    )
    assert [line.split(":")[0] for line in broken_links(doc)] == ["missing.md", "there.md#nowhere"]
