"""Stage 3 of a search, the finish: the paired-CI report on what training left in OUT/results.jsonl.

The arms that ran their full budget are analysed on the seeds that did not fail; stopped arms and
failed seeds become notes. The report's settings were checked in the plan, so nothing here fails
on a setting after hours of training. When there is nothing to compare (every control seed
failed, or no arm shares 2 seeds with the control) or the report fails anyway, `SearchFailed`
says so in one line: results.jsonl is complete, `python -m tune_dfrl.report runs=OUT` re-renders
it, and `resume=true retry_failed=true` trains failed cells again.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tune_dfrl.results import read_records
from tune_dfrl.schema import Recommendation, Summary, default_aggregations
from tune_dfrl.search_plan import Plan
from tune_dfrl.seed_batches import HISTORY_FILE
from tune_dfrl.tracking import browse_lines

MIN_PAIRED_SEEDS = 2  # a paired interval needs 2 seeds shared with the control


class SearchFailed(RuntimeError):
    """The search ended without a report; the message says why and what to run next."""


def resume_hint(out: Path, extra: str = "") -> str:
    return f"run the same command with resume=true{extra} out={out}"


def finish(plan: Plan, tracker: Any, scheduler: Any, results_log: Any, searcher: Any) -> Summary:
    """Report the search (OUT/report, OUT/summary.json, MLflow), or raise SearchFailed saying what to do."""
    results = plan.out / "results.jsonl"
    if results_log.error is not None:
        tracker.call("close", "KILLED")
        raise SearchFailed(
            f"{results} could not be written ({results_log.error}); every cell kept its milestones: "
            f"fix the cause, then {resume_hint(plan.out)} to write the missing lines and the report"
        )
    if searcher.control_failed():
        tracker.call("close", "FAILED")
        raise SearchFailed(
            f"every control seed failed (see {plan.out / 'failures.jsonl'}), so no arm could be compared; "
            f"fix the cause, then {resume_hint(plan.out, ' retry_failed=true')} to train them again"
        )
    try:
        return _report(plan, tracker, scheduler)
    except SearchFailed:
        tracker.call("close", "FINISHED")
        raise
    except Exception as error:  # noqa: BLE001 - training is over and recorded: say how to report it again
        tracker.call("close", "FINISHED")
        raise SearchFailed(
            f"the report failed ({type(error).__name__}: {error}); training is complete and {results} "
            f"holds every milestone: `python -m tune_dfrl.report runs={plan.out}` re-renders the report"
        ) from error


def _report(plan: Plan, tracker: Any, scheduler: Any) -> Summary:
    """Analyse the arms that ran their full budget on the seeds that did not fail; note the stopped arms and the
    failed seeds; save, log and print the report."""
    from tune_dfrl.report import analyze, print_summary, write_report
    from tune_dfrl.scores import load_results

    final = max(plan.milestones)
    table, failed = _without_failed_cells(load_results(plan.out), read_records(plan.out / "failures.jsonl"), final)
    reached = table.frame.groupby("arm")["step"].max()
    complete = [arm for arm in table.arms if reached.get(arm, 0) >= final]
    stopped = {arm: table.arm_info.get(arm, {}).get("arm_id", "") for arm in table.arms if reached.get(arm, 0) < final}
    control = next(
        (arm for arm in table.arms if table.arm_info.get(arm, {}).get("arm_id") == plan.control.arm_id), None
    )
    if control is None:
        raise SearchFailed(
            f"the control has no milestone left to compare with (see {plan.out / 'failures.jsonl'}); fix "
            f"the cause, then {resume_hint(plan.out, ' retry_failed=true')} to train the failed cells again"
        )
    stop_notes = {arm: _stop_note(arm, arm_id, scheduler) for arm, arm_id in stopped.items()}
    if complete == [control]:
        return _control_only(plan, tracker, control, stop_notes)
    _check_pairs(plan, table, control, [arm for arm in complete if arm != control], failed)
    table = replace(
        table, frame=table.frame[table.frame["arm"].isin(complete)], notes=table.notes + tuple(stop_notes.values())
    )
    report = plan.report
    defaults = default_aggregations(table.bench, table.has_lengths)
    aggregations = [plan.aggregate] + [a for a in defaults if a != plan.aggregate]
    family = len(complete) - 1 + len(stopped)  # Holm family: every searched arm, stopped ones as untested hypotheses
    sequential = json.loads((plan.out / HISTORY_FILE).read_text()) if (plan.out / HISTORY_FILE).exists() else None
    summary = replace(
        analyze(
            table, control, aggregations, report.delta, report.alpha, report.seed, report.flip_k, family_size=family
        ),
        stopped=stop_notes,
        failed=failed,
        sequential=sequential,
    )
    paths = write_report(summary, table, plan.out / "report")
    (plan.out / "summary.json").write_text(summary.to_json())
    arm_ids = {arm: info.get("arm_id", "") for arm, info in table.arm_info.items()}
    tracker.call("finish", summary, arm_ids, plan.aggregate, plan.out / "report")
    print_summary(summary)
    print(f"report:  {paths.get('markdown', plan.out / 'report')}")
    print(f"summary: {plan.out / 'summary.json'}")
    print(*browse_lines(plan.tracking_uri, tracker.inner.experiment_id), sep="\n")
    return summary


def _check_pairs(plan: Plan, table: Any, control: str, arms: list[str], failed: dict[str, list[int]]) -> None:
    """SearchFailed unless some finished arm shares at least 2 seeds with the control."""
    seeds = table.frame.groupby("arm")["seed"].agg(set)
    if any(len(seeds[arm] & seeds[control]) >= MIN_PAIRED_SEEDS for arm in arms):
        return
    why = f"the control failed at seeds {failed[control]}" if control in failed else "too few seeds finished"
    raise SearchFailed(
        f"no arm shares {MIN_PAIRED_SEEDS} finished seeds with the control ({why}; see "
        f"{plan.out / 'failures.jsonl'}); fix the cause, then {resume_hint(plan.out, ' retry_failed=true')} "
        "to train the failed cells again"
    )


def _without_failed_cells(table: Any, failures: list[dict[str, Any]], final: int) -> tuple[Any, dict[str, list[int]]]:
    """Drop the milestones of (arm, seed) cells that failed after their last retry (and did not finish later, on
    a `retry_failed` resume), with a note naming each; the report then compares each arm on the seeds it shares
    with the control. Returns (table, {arm: failed seeds})."""
    import pandas as pd

    names = {info.get("arm_id"): name for name, info in table.arm_info.items()}
    finished = set(map(tuple, table.frame.loc[table.frame["step"] >= final, ["arm", "seed"]].to_numpy()))
    failures = [r for r in failures if r["arm_id"] in names and (names[r["arm_id"]], r["seed"]) not in finished]
    cells = {(names[r["arm_id"]], r["seed"]) for r in failures}
    notes = tuple(
        f"arm {names[r['arm_id']]!r}: seed {r['seed']} failed after {r['failures']} attempt(s), at step {r['step']} "
        f"({r['error'] or 'no error message'}); it is missing from the analysis"
        for r in failures
    )
    keep = ~pd.MultiIndex.from_frame(table.frame[["arm", "seed"]]).isin(cells)
    failed: dict[str, list[int]] = {}
    for arm, seed in sorted(cells):
        failed.setdefault(arm, []).append(seed)
    return replace(table, frame=table.frame[keep], notes=table.notes + notes), failed


def _control_only(plan: Plan, tracker: Any, control: str, stop_notes: dict[str, str]) -> Summary:
    """Every searched arm was stopped at a rung: nothing to compare at the full budget; keep the control."""
    reason = "every searched arm was stopped by the scheduler at a rung; keep the control"
    summary = Summary(
        control,
        list(plan.seeds),
        plan.aggregate,
        Recommendation(control, True, reason, plan.aggregate),
        stopped=stop_notes,
        notes=list(stop_notes.values()),
    )
    (plan.out / "summary.json").write_text(summary.to_json())
    tracker.call("close", "FINISHED")
    print(f"recommended: {control} — {reason}")
    print(
        f"summary: {plan.out / 'summary.json'}", *browse_lines(plan.tracking_uri, tracker.inner.experiment_id), sep="\n"
    )
    return summary


def _stop_note(arm: str, arm_id: str, scheduler: Any) -> str:
    book = getattr(scheduler, "book", None)
    decided = book.stopped(arm_id) if book is not None else None
    if decided is None:
        return f"arm {arm!r} was stopped before its last milestone; not analysed"
    return f"arm {arm!r} was stopped at step {decided.rung} ({decided.decision.reason}); not analysed"
