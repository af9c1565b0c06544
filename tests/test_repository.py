"""The repository stands on its own: no tracked file points outside it, and the files it ships are there."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
from repo_files import DATAFLEX_CSV, REPO

# `../x` (any depth) and the absolute places an outside file could come from.
RELATIVE = re.compile(r"(?:\.\./)+[\w.-][\w./-]*")
OUTSIDE = re.compile(
    r"(?<![\w.])/(?:work|home|root|tmp/[\w.-]+/shared)/|\bshared/(?:DESIGN|data|notes|hooks)\b"
    r"|\.parents?(?:\[\d+\])?\.parent\s*/\s*[\"']shared"
)


def tracked_text_files() -> list[str]:
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    )
    return [n for n in names if n and not n.endswith((".csv", ".png", ".parquet"))]


def outside_references(name: str, text: str) -> list[str]:
    """`../` paths that, read from the file's own folder, leave the repository or name nothing in it, and absolute outside paths."""
    found = []
    folder = (REPO / name).parent
    for match in RELATIVE.finditer(text):
        target = (folder / match.group(0).rstrip(".")).resolve()
        if not target.is_relative_to(REPO) or not target.exists():
            found.append(match.group(0))
    found += [m.group(0) for m in OUTSIDE.finditer(text)]
    return found


def test_no_tracked_file_points_outside_the_repository():
    offenders = {}
    for name in tracked_text_files():
        if name == "tests/test_repository.py":  # this file spells the patterns out
            continue
        path = REPO / name
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        refs = outside_references(name, path.read_text(errors="replace"))
        if refs:
            offenders[name] = sorted(set(refs))
    assert offenders == {}


def test_the_checker_finds_outside_references():
    assert "../shared/data/x.csv" in outside_references(
        "README.md", "python -m tune_dfrl.report runs=../shared/data/x.csv"
    )
    assert outside_references("docs/readme_search.md", "see [the README](../README.md)") == []
    assert outside_references("docs/x.md", "`../shared/DESIGN.md`") != []  # resolves inside, names nothing there
    assert outside_references("tests/x.py", 'p = Path(__file__).resolve().parents[1].parent / "shared"') != []
    assert outside_references("x.md", "cat /work/shared/notes/a.md") != []


def test_the_shipped_run_table_is_complete():
    runs = pd.read_csv(DATAFLEX_CSV)
    assert len(runs) == 171 and runs["run_id"].is_unique
    assert runs.iloc[:, 7:].notna().all().all()
    assert (REPO / "docs" / "design.md").is_file() and (DATAFLEX_CSV.parent / "README.md").is_file()


def test_the_pinned_cpu_and_gpu_stacks_satisfy_the_projects_requirements():
    """constraints/cpu.txt (what make setup installs) and constraints/gpu.txt (the `gpu` extra's stack) each pin
    versions that pyproject's requirements and the `gpu` extra allow."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = {}
    for text in [*project["dependencies"], *project["optional-dependencies"]["gpu"]]:
        requirement = Requirement(text)
        requirements.setdefault(requirement.name.lower(), []).append(requirement.specifier)
    for stack in ("cpu", "gpu"):
        lines = (REPO / "constraints" / f"{stack}.txt").read_text().splitlines()
        pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
        assert {"torch", "transformers", "numpy"} <= {pin.name for pin in pins}, stack
        for pin in pins:
            [version] = [spec.version for spec in pin.specifier]
            for allowed in requirements.get(pin.name.lower(), []):
                assert allowed.contains(version, prereleases=True), f"{stack}: {pin} is outside {allowed}"
