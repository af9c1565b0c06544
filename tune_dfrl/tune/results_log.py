"""`ResultsLog`: the driver's Ray Tune callback that writes a search's record files (their lines:
`tune_dfrl.state.records`). A module of its own so that trial workers, which read and write a cell's milestones with
`tune_dfrl.state.records`, import neither Ray Tune's callbacks nor the ledger's statistics (scipy)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.tune import Callback

from tune_dfrl.paired.ledger import milestone
from tune_dfrl.state.records import EQUIVALENTS, STOPS, append_record, milestone_record, read_records


class ResultsLog(Callback):
    """Appends every new milestone of every trial to `path` (the first report of a milestone, by the ledger's
    duplicate rule, also across resumes), and every failed cell to `failures`."""

    def __init__(self, path: Path, failures: Path, metric: str, attempt: int = 0) -> None:
        self.path = path
        self.failures = failures
        self.metric = metric
        self.attempt = attempt
        self.written = {milestone(r["arm_id"], r["seed"], r["step"]) for r in read_records(path)}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        key = milestone(arm["arm_id"], seed, result["step"])
        if key not in self.written:
            self.written.add(key)
            append_record(self.path, {**milestone_record(arm, seed, result), "attempt": self.attempt})

    def note_decision(self, decided: Any) -> None:
        """A rung decision (`scheduler.ArmDecision`): a stop becomes a line of OUT/stops.jsonl."""
        if not decided.decision.keep:
            append_record(
                self.path.with_name(STOPS),
                {
                    "arm_id": decided.arm,
                    "step": int(decided.rung),
                    "seeds": [int(s) for s in decided.seeds],
                    "reason": decided.decision.reason,
                    "leader": decided.decision.leader,
                    "attempt": self.attempt,
                },
            )

    def note_control_equivalent(self, suggestion: Mapping[str, Any]) -> None:
        """A suggestion the searcher did not train because it acts as the control: a line of
        OUT/control_equivalent.jsonl."""
        append_record(self.path.with_name(EQUIVALENTS), {**suggestion, "attempt": self.attempt})

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        arm, seed = trial.config["arm"], int(trial.config["seed"])
        error = (
            Path(trial.error_file).read_text().strip() if trial.error_file and Path(trial.error_file).exists() else ""
        )
        append_record(
            self.failures,
            {
                "arm_id": arm["arm_id"],
                "label": arm["label"],
                "seed": seed,
                "step": int((trial.last_result or {}).get("step", 0)),
                "failures": int(info.get("attempts", trial.num_failures)),
                "error": error.splitlines()[-1] if error else "",
                "attempt": self.attempt,
            },
        )
