"""Files the repository owns that tests read: a missing one fails the test that needs it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATAFLEX_CSV = REPO / "data" / "dataflex_rl" / "dataflex_rl_all_runs_171.csv"
