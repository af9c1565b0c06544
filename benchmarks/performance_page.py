"""Writes docs/performance.md, the one page of measured figures, from the benchmarks' results files.

    python benchmarks/performance_page.py           # (re)write docs/performance.md from benchmarks/results/*.json
    python benchmarks/performance_page.py --check   # exit 1 when docs/performance.md differs from what it would write

One section per results file (benchmarks/results_file.py writes them): what the benchmark measures, the
command, the machine, the date, the figures. A benchmark script in benchmarks/ without a results file is
listed as not measured. The page depends on nothing but those files, so it is written the same anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"

# The page's order: the user's commands first, then the backends, the decisions, the services; others after these.
ORDER = (
    "make_test",
    "default_search",
    "embedded_throughput",
    "embedded_sanity",
    "policy_overhead",
    "search_decisions",
    "two_stage_decisions",
    "private_ray_start",
    "verl_cpu_e2e",
    "verl_gpu_smoke",
    "report_dataflex",
)
# Scripts that write no results file of their own name (helpers, or results under another name).
NOT_BENCHMARKS = {"performance_page", "results_file", "timed_command"}
# Why a benchmark has no figures, where there is more to say than that it has none.
NOT_MEASURED = {
    "verl_gpu_smoke": "it needs an NVIDIA GPU with vLLM (the `gpu` extra) and has never run on one, so there are no "
    "figures; it writes `benchmarks/results/verl_gpu_smoke.json` when it runs",
}

INTRO = """\
# Performance

Every measured figure of tune_dfrl is on this page, one section per benchmark run: what it measures, the command,
the machine, the date and the figures. The other pages state what the product does and link here for the numbers.

This page is generated: `python benchmarks/performance_page.py` writes it from `benchmarks/results/*.json`, which
each benchmark writes when it runs (`benchmarks/results_file.py`; the commands a user runs whole are timed by
`benchmarks/timed_command.py`). Re-measuring replaces a benchmark's file and its section; git keeps the earlier
figures. `python benchmarks/performance_page.py --check` (run by `tests/test_docs.py`) fails when this page differs
from the results files.

Timings depend on the machine and on what else runs on it: the load average is the one-minute load when the run
ended (for a transcribed run, the load its record gave). The decision benchmark's figures are simulated and depend
only on its seed.
"""


def load(folder: Path = RESULTS) -> list[tuple[str, dict[str, Any]]]:
    """(file stem, record) of every results file, in the page's order."""
    records = [(path.stem, json.loads(path.read_text())) for path in folder.glob("*.json")]
    return sorted(records, key=lambda item: (_rank(item[1]["benchmark"]), item[1]["benchmark"], item[0]))


def _rank(benchmark: str) -> int:
    return ORDER.index(benchmark) if benchmark in ORDER else len(ORDER)


def scripts(folder: Path = ROOT / "benchmarks") -> dict[str, str]:
    """Benchmark name -> the script that measures it, for every benchmark script in `folder`."""
    found = {p.stem: f"benchmarks/{p.name}" for p in folder.iterdir() if p.suffix in (".py", ".sh")}
    return {name: script for name, script in sorted(found.items()) if name not in NOT_BENCHMARKS}


def cell(value: Any) -> str:
    """A value as the results file holds it: numbers unchanged, null as a dash, lists comma-separated."""
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value) or "—"
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def flat(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A row with nested mappings spelt `outer.inner`."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One row: a figure | value table; several: a column per figure, in the order they first appear."""
    rows = [flat(row) for row in rows]
    if len(rows) == 1:
        return ["| figure | value |", "|---|---|", *(f"| {key} | {cell(value)} |" for key, value in rows[0].items())]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows),
    ]


def describe_machine(machine: dict[str, Any]) -> str:
    parts, missing = [], []
    for key, shown, name in (
        ("cores", "{} cores", "cores"),
        ("cpu_model", "{}", "CPU model"),
        ("memory_gib", "{} GiB memory", "memory"),
        ("python", "Python {}", "Python"),
        ("torch", "torch {}", "torch"),
        ("load_average", "load average {}", "load average"),
    ):
        value = machine.get(key)
        if value is None:
            missing.append(name)
        else:
            parts.append(shown.format(value))
    if missing:
        parts.append("not recorded: " + ", ".join(missing))
    return "; ".join(parts)


def when(date: str | None) -> str:
    """An ISO date as it reads: `2026-12-07`, or `2026-12-07 07:01 UTC` for a moment."""
    if not date:
        return "not recorded"
    if "T" not in date:
        return date
    moment = datetime.datetime.fromisoformat(date).astimezone(datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def section(stem: str, record: dict[str, Any]) -> list[str]:
    took = f"; the run took {record['wall_s']:g} s" if record.get("wall_s") is not None else ""
    by = "" if record["script"] in record["command"] else f", timed by `{record['script']}`"
    lines = [
        f"## {stem}",
        "",
        record["what"],
        "",
        f"- Command: `{record['command']}`{by}",
        f"- Machine: {describe_machine(record.get('machine') or {})}",
        f"- Date: {when(record.get('date'))}{took}",
    ]
    if record.get("source"):
        lines.append(f"- Source: {record['source']}")
    return [*lines, "", *table(record["rows"]), ""]


def not_measured(names: Iterable[tuple[str, str]]) -> list[str]:
    lines = []
    for name, script in names:
        runner = "bash" if script.endswith(".sh") else "python"
        why = NOT_MEASURED.get(name, f"it writes `benchmarks/results/{name}.json` when it runs")
        lines += [f"## {name}", "", f"Not measured: `{runner} {script}` has no results file; {why}.", ""]
    return lines


def page(results: Path = RESULTS, benchmarks: Path = ROOT / "benchmarks") -> str:
    records = load(results)
    measured = {record["benchmark"] for _, record in records} | {stem for stem, _ in records}
    missing = sorted(((n, s) for n, s in scripts(benchmarks).items() if n not in measured), key=lambda i: _rank(i[0]))
    contents = [f"- [{stem}](#{stem.lower()})" for stem, _ in records] + [f"- [{n}](#{n})" for n, _ in missing]
    body = [line for stem, record in records for line in section(stem, record)]
    return "\n".join([INTRO, *contents, "", *body, *not_measured(missing)]).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/performance.md is not up to date")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        if PAGE.is_file() and PAGE.read_text() == text:
            return 0
        print(
            f"{PAGE.relative_to(ROOT)} differs from benchmarks/results/: run python benchmarks/performance_page.py",
            file=sys.stderr,
        )
        return 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} from {len(load())} results files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
