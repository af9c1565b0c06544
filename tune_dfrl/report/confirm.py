"""Screen cheap, confirm on the target: the screen's candidates, and the two-stage report of a confirm search.

A confirm search (`confirm.screen=DIR`, `tune_dfrl.config.settings.ConfirmSettings`) trains the control and the top K
arms of a finished screen search on the target recipe, at seeds the screen did not use. Its own analysis (report/,
summary.json) uses only its own data: its Holm family is the K confirmed arms. This module adds what needs both
stages:

- `load_screen`: the screen folder, checked (a search, of this state format, finished: summary.json written and no
  driver holding it) and its candidates: the arms whose status in summary.json is `analysed` (ran to the end; not
  stopped, failed, excluded, control-equivalent or the control), ranked by their screen Δ on the screen's metric at
  its final step, highest first, ties by label. Nothing is written into the screen's folder, ever.
- `write_confirm`: OUT/report/confirm.md and OUT/confirm.json: per arm its screen Δ and confirm Δ with their
  intervals side by side, the shrinkage of the screen's pick (confirm Δ − screen Δ), the compute of each stage
  (cells, cell-steps trained = the sum over cells of the last step reached, and the trials' measured time: the sum of
  the MLflow seed runs' start-to-end times, waits at rungs included), and what a one-stage search of the screen's arms
  on the target would have cost at the same seeds ((screen's arms + 1) x confirm seeds x confirm steps); and the
  transfer check (`tune_dfrl.paired.transfer`) of the arms trained in both stages, the control included, on their
  per-seed paired Δs at each stage's final step: OUT/report/transfer.md, .json, .png.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tune_dfrl.backends.base import SCORE
from tune_dfrl.errors import FolderInUse, SearchError
from tune_dfrl.state.folder import CONFIRM, MLFLOW_DB, PLAN, REPORT, RESULTS, SUMMARY
from tune_dfrl.state.records import read_records
from tune_dfrl.state.resume import check_folder_free, check_state_format

MD = "confirm.md"
SEED_ROLE = ("tune_dfrl.role", "seed")  # the MLflow tag of a seed run (`tune_dfrl.tracking.writer`)


@dataclass(frozen=True)
class Candidate:
    """An arm of the screen that may be confirmed: its screen figures at the screen's final step."""

    arm_id: str  # the screen's
    label: str
    method: str
    params: dict[str, Any]
    delta: float
    ci_low: float | None
    ci_high: float | None
    level: float | None
    step: int | None
    seeds: list[int] = field(default_factory=list)
    verdict: str = ""

    def suggestion(self) -> dict[str, Any]:
        return {"method": self.method, "params": dict(self.params)}


@dataclass(frozen=True)
class Screen:
    """A finished screen search, read (never written)."""

    folder: Path
    plan: dict[str, Any]  # its search.json
    candidates: tuple[Candidate, ...]  # ranked (module docstring)

    @property
    def space(self) -> str:
        return str(self.plan.get("space", "?"))

    @property
    def possible_seeds(self) -> tuple[int, ...]:
        """Every seed the screen may have used: its seeds, or under seeds=auto 0..max-1."""
        sequential = self.plan.get("sequential")
        return tuple(range(int(sequential["max"]))) if sequential else tuple(int(s) for s in self.plan["seeds"])


def load_screen(given: str, top: int) -> Screen:
    """The screen in the folder `given` with at least `top` candidates; SearchError (one line) otherwise."""
    where = f"confirm.screen={given}"
    folder = Path(given).expanduser().absolute()
    if not folder.is_dir():
        raise SearchError(f"{where}: no such folder; give the output folder of a finished screen search")
    if not (folder / PLAN).is_file():
        raise SearchError(f"{where}: {folder} holds no search (no {PLAN}); give the output folder of a screen search")
    plan = json.loads((folder / PLAN).read_text())
    check_state_format(folder, plan, where, advice="run the screen again with this version")
    try:
        check_folder_free(folder)
    except FolderInUse as busy:
        raise SearchError(
            f"{where}: the screen is unfinished, a driver still runs it ({busy}); confirm it once it has ended"
        ) from None
    if not (folder / SUMMARY).is_file():
        raise SearchError(
            f"{where}: the screen is unfinished (no {SUMMARY}); finish it first (resume=true out={folder})"
        )
    summary = json.loads((folder / SUMMARY).read_text())
    candidates = screen_candidates(summary, read_records(folder / RESULTS), plan["control"]["arm_id"])
    if len(candidates) < top:
        raise SearchError(
            f"{where}: the screen has {len(candidates)} candidate arm(s) (analysed to the end, not stopped, failed or "
            f"control-equivalent) but confirm.top={top}; give confirm.top={len(candidates)} or fewer"
            if candidates
            else f"{where}: the screen has no candidate arm (none was analysed to the end); nothing to confirm"
        )
    return Screen(folder, plan, tuple(candidates))


def screen_candidates(summary: dict[str, Any], results: list[dict[str, Any]], control_id: str) -> list[Candidate]:
    """The screen's arms analysed to the end, best screen Δ first, ties by label (module docstring)."""
    arms = {r["arm_id"]: r for r in results}  # method and params of each arm, as trained
    found = []
    for label, status in (summary.get("statuses") or {}).items():
        arm_id = status.get("arm_id", "")
        if status.get("status") != "analysed" or arm_id == control_id or status.get("delta") is None:
            continue
        if arm_id not in arms:
            continue
        found.append(
            Candidate(
                arm_id,
                label,
                arms[arm_id]["method"],
                dict(arms[arm_id]["params"]),
                float(status["delta"]),
                status.get("ci_low"),
                status.get("ci_high"),
                status.get("level"),
                status.get("step"),
                list(status.get("seeds") or []),
                status.get("verdict", ""),
            )
        )
    return sorted(found, key=lambda c: (-c.delta, c.label))


# ------------------------------------------------------------------------------------------------ the report


def write_confirm(out: Path, seconds: dict[str, float | None] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The two-stage report of the confirm search in `out` (module docstring), from its search.json (its `confirm`
    section names the screen and the arms), its summary.json and results.jsonl, and the screen's. `seconds`: the
    trials' measured time per stage ("screen", "confirm"; None: not recorded). Returns (confirm.json's content, the
    lines to print)."""
    from tune_dfrl.paired.transfer import transfer_check
    from tune_dfrl.report.transfer import transfer_figure, transfer_markdown, verdict_text

    plan = json.loads((out / PLAN).read_text())
    confirm = plan["confirm"]
    screen_dir = Path(confirm["screen_folder"])
    screen_plan = json.loads((screen_dir / PLAN).read_text())
    screen_summary = json.loads((screen_dir / SUMMARY).read_text())
    summary = json.loads((out / SUMMARY).read_text())
    seconds = seconds or {}
    by_id = {s.get("arm_id"): s for label, s in summary["statuses"].items() if s.get("status") != "control-equivalent"}
    screen_by_id = {s.get("arm_id"): s for s in screen_summary["statuses"].values()}
    metric = plan["metric"]
    arms = []
    for arm_id, entry in confirm["arms"].items():
        mine, theirs = by_id.get(arm_id, {}), screen_by_id.get(entry["screen_arm_id"], {})
        shrinkage = (
            mine["delta"] - theirs["delta"]
            if mine.get("delta") is not None and theirs.get("delta") is not None
            else None
        )
        arms.append(
            {
                "label": entry["label"],
                "arm_id": arm_id,
                "screen_arm_id": entry["screen_arm_id"],
                "screen": _figures(theirs),
                "confirm": _figures(mine),
                "shrinkage": shrinkage,
            }
        )
    pick = arms[0] if arms else None  # the screen's best candidate (`confirm.arms` keeps the screen's order)
    costs = {
        "screen": _cost(screen_dir, screen_plan, seconds.get("screen")),
        "confirm": _cost(out, plan, seconds.get("confirm")),
    }
    screen_arms = costs["screen"]["arms"]
    confirm_seeds = len(plan["seeds"]) if "sequential" not in plan else int(plan["sequential"]["max"])
    one_stage = (screen_arms + 1) * confirm_seeds * max(plan["milestones"])
    costs["one_stage"] = {
        "arms": screen_arms,
        "seeds": confirm_seeds,
        "steps": max(plan["milestones"]),
        "cell_steps": one_stage,
        "rule": "(screen's arms + 1) x confirm seeds x confirm steps",
    }
    report_dir = out / REPORT
    report_dir.mkdir(parents=True, exist_ok=True)

    # the transfer check on per-seed paired Δs at each stage's final step, arms keyed by their screen label
    control_label = screen_plan["control"]["label"]
    screen_deltas = _seed_deltas(
        screen_dir, screen_plan, {a["screen_arm_id"]: a["label"] for a in arms}, screen_plan["control"]["arm_id"]
    )
    confirm_deltas = _seed_deltas(out, plan, {a["arm_id"]: a["label"] for a in arms}, plan["control"]["arm_id"])
    both = [
        a["label"]
        for a in arms
        if np.isfinite(screen_deltas.get(a["label"], [])).sum() >= 2
        and np.isfinite(confirm_deltas.get(a["label"], [])).sum() >= 2
    ]
    transfer: dict[str, Any] = {"verdict": None, "note": "no arm has 2 seeds at the final step of both stages"}
    lines_transfer = "The transfer check needs an arm with 2 seeds at the final step of both stages; none has."
    if both:
        alpha, seed = float(plan["report"]["alpha"]), int(plan["report"]["seed"])
        check = transfer_check(
            {a: screen_deltas[a] for a in both},
            {a: confirm_deltas[a] for a in both},
            control_label,
            alpha,
            seed,
            screen_label=screen_dir.name,
            target_label=out.name,
            aggregation=metric.removeprefix(SCORE),
        )
        source = f"screen {screen_dir} -> confirm {out}"
        notes = [
            f"not in the check (fewer than 2 seeds at a stage's final step): {a['label']}"
            for a in arms
            if a["label"] not in both
        ]
        counts = {"screen": len(next(iter(screen_deltas.values()))), "target": len(next(iter(confirm_deltas.values())))}
        (report_dir / "transfer.json").write_text(
            json.dumps({**check.to_dict(), "source": source, "notes": notes}, indent=2, allow_nan=False) + "\n"
        )
        transfer_figure(check, report_dir / "transfer.png")
        (report_dir / "transfer.md").write_text(transfer_markdown(check, source, counts, notes, "transfer.png"))
        transfer = {
            "verdict": check.verdict,
            "spearman": _finite(check.spearman),
            "k": check.k,
            "pick_note": check.pick_note,
            "reasons": list(check.reasons),
            "files": ["report/transfer.md", "report/transfer.json", "report/transfer.png"],
        }
        lines_transfer = verdict_text(check)

    record = {
        "screen": confirm["screen"],
        "screen_folder": str(screen_dir),
        "screen_experiment": screen_plan.get("experiment", ""),
        "top": confirm["top"],
        "metric": metric,
        "screen_step": max(screen_plan["milestones"]),
        "confirm_step": max(plan["milestones"]),
        "screen_seeds": sorted(int(s) for s in screen_summary.get("seeds", [])),
        "confirm_seeds": sorted(int(s) for s in summary.get("seeds", [])),
        "holm_family": summary.get("holm_family"),
        "arms": arms,
        "pick": pick["label"] if pick else None,
        "pick_shrinkage": pick["shrinkage"] if pick else None,
        "costs": costs,
        "transfer": transfer,
    }
    (out / CONFIRM).write_text(json.dumps(_json_safe(record), indent=2) + "\n")
    (report_dir / MD).write_text(_markdown(record, lines_transfer))
    printed = []
    if pick:
        printed.append(
            f"confirm: the screen's pick {pick['label']}: screen Δ {_num(pick['screen']['delta'])}, confirm Δ "
            f"{_num(pick['confirm']['delta'])}, shrinkage {_num(pick['shrinkage'])}"
        )
    printed.append(
        f"transfer check: {transfer['verdict']} (K = {transfer.get('k')} arms, the control included)"
        if transfer["verdict"]
        else f"transfer check: not run ({transfer['note']})"
    )
    printed.append(
        f"compute: screen {costs['screen']['cell_steps']} cell-steps ({_time(costs['screen']['seconds'])}), confirm "
        f"{costs['confirm']['cell_steps']} ({_time(costs['confirm']['seconds'])}); a one-stage search of the "
        f"screen's {screen_arms} arms on the target: {one_stage} cell-steps"
    )
    printed.append(f"confirm: {report_dir / MD} and {out / CONFIRM}")
    return record, printed


def _figures(status: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "verdict", "step", "seeds", "delta", "ci_low", "ci_high", "level")
    return {k: status.get(k) for k in keys}


def _cost(folder: Path, plan: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    """Cells trained (distinct (arm, seed) in results.jsonl), cell-steps (the sum of each cell's last step), arms
    besides the control, and the measured time."""
    last: dict[tuple[str, int], int] = {}
    for r in read_records(folder / RESULTS):
        key = (r["arm_id"], int(r["seed"]))
        last[key] = max(last.get(key, 0), int(r["step"]))
    control = plan["control"]["arm_id"]
    return {
        "cells": len(last),
        "cell_steps": sum(last.values()),
        "steps_per_cell": max(plan["milestones"]),
        "arms": len({arm for arm, _ in last} - {control}),
        "seconds": seconds,
    }


def _seed_deltas(folder: Path, plan: dict[str, Any], labels: dict[str, str], control: str) -> dict[str, np.ndarray]:
    """{label: paired Δ at each of the control's seeds, NaN where the arm has none} at the stage's final step."""
    final, metric = max(plan["milestones"]), plan["metric"].removeprefix(SCORE)
    score: dict[tuple[str, int], float] = {}
    for r in read_records(folder / RESULTS):
        if int(r["step"]) == final and metric in r["aggregates"]:
            score.setdefault((r["arm_id"], int(r["seed"])), float(r["aggregates"][metric]))  # first line kept
    seeds = sorted(s for a, s in score if a == control)
    return {
        label: np.array([score.get((arm_id, s), math.nan) - score[(control, s)] for s in seeds])
        for arm_id, label in labels.items()
    }


def trial_seconds(tracking_uri: str, experiment: str, folder_store: Path | None = None) -> float | None:
    """The sum of the MLflow seed runs' start-to-end times of `experiment` (None when it cannot be read).
    `folder_store`: a search folder's own sqlite store, read from a copy (so that nothing is written there)."""
    try:
        from mlflow import MlflowClient

        with tempfile.TemporaryDirectory() as tmp:
            if folder_store is not None:
                shutil.copy2(folder_store, Path(tmp) / MLFLOW_DB)
                tracking_uri = f"sqlite:///{Path(tmp) / MLFLOW_DB}"
            client = MlflowClient(tracking_uri)
            found = client.get_experiment_by_name(experiment)
            if found is None:
                return None
            runs = client.search_runs(
                [found.experiment_id], filter_string=f"tags.`{SEED_ROLE[0]}` = '{SEED_ROLE[1]}'", max_results=10000
            )
            ended = [(r.info.end_time - r.info.start_time) / 1000.0 for r in runs if r.info.end_time]
            return float(sum(ended)) if ended else None
    except Exception:  # noqa: BLE001 - the time is a figure of the page, never a reason to fail the report
        return None


def _markdown(record: dict[str, Any], transfer_text: str) -> str:
    levels = {
        stage: sorted({f"{a[stage]['level']:.1%}" for a in record["arms"] if a[stage]["level"]})
        for stage in ("screen", "confirm")
    }
    metric = record["metric"].removeprefix(SCORE)
    lines = [
        "# Screen cheap, confirm on the target",
        "",
        f"Screen `{record['screen']}` (seeds {record['screen_seeds']}, {record['screen_step']} steps); confirm: this "
        f"search (seeds {record['confirm_seeds']}, disjoint from the screen's, {record['confirm_step']} steps). "
        f"Paired Δ = arm − control on `{metric}` (points). The confirm's verdicts use only its own data: its Holm "
        f"family is the {record['holm_family']} confirmed arms (report.md). Each interval is its stage's own answer "
        f"interval (summary.json; screen at {', '.join(levels['screen']) or '—'}, confirm at "
        f"{', '.join(levels['confirm']) or '—'}).",
        "",
        f"| arm | screen Δ [interval] at step {record['screen_step']} | confirm Δ [interval] at its step | "
        "confirm verdict | shrinkage (confirm Δ − screen Δ) |",
        "|---|---|---|---|---|",
    ]
    for arm in record["arms"]:
        s, c = arm["screen"], arm["confirm"]
        lines.append(
            f"| {arm['label']} | {_interval(s)} | {_interval(c)} (step {c['step']}) | {c['verdict'] or c['status']} | "
            f"{_num(arm['shrinkage'])} |"
        )
    if record["pick"]:
        first = record["arms"][0]
        lines += [
            "",
            f"The screen's pick, {record['pick']}: screen Δ {_num(first['screen']['delta'])}, confirm Δ "
            f"{_num(first['confirm']['delta'])}; shrinkage {_num(record['pick_shrinkage'])} points.",
        ]
    costs = record["costs"]
    lines += [
        "",
        "## Compute",
        "",
        "| stage | cells | steps per cell | cell-steps trained | trials' measured time |",
        "|---|---|---|---|---|",
    ]
    for stage in ("screen", "confirm"):
        c = costs[stage]
        lines.append(
            f"| {stage} ({c['arms']} arms + control) | {c['cells']} | {c['steps_per_cell']} | {c['cell_steps']} | "
            f"{_time(c['seconds'])} |"
        )
    one = costs["one_stage"]
    both = costs["screen"]["cell_steps"] + costs["confirm"]["cell_steps"]
    lines += [
        f"| one-stage search of the screen's {one['arms']} arms on the target | {(one['arms'] + 1) * one['seeds']} | "
        f"{one['steps']} | {one['cell_steps']} | — |",
        "",
        f"Cell-steps: the sum over cells of the last step each reached (stopped cells count their rung). The two "
        f"stages trained {both} cell-steps against {one['cell_steps']} for the one-stage search "
        f"({one['rule']}); a cell-step of the screen may cost less than one of the target. Measured time: the sum of "
        "the trials' MLflow seed runs, start to end (waits at rungs included); — where not recorded.",
        "",
        "## Transfer check (the arms trained in both stages, the control included)",
        "",
        transfer_text,
        "",
        "Details: transfer.md, transfer.json, transfer.png." if record["transfer"]["verdict"] else "",
        "",
    ]
    return "\n".join(lines)


def _interval(figures: dict[str, Any]) -> str:
    if figures.get("delta") is None:
        return "—"
    low, high = figures.get("ci_low"), figures.get("ci_high")
    ends = (
        "[" + (f"{low:+.2f}" if low is not None else "−∞") + ", " + (f"{high:+.2f}" if high is not None else "+∞") + "]"
    )
    return f"{figures['delta']:+.2f} {ends}"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _time(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.0f} s"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value
