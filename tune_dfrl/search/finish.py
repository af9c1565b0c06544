"""Stage 3 of a search, the finish: `tune_dfrl.report.analysis.analyze_search` of the folder, written and logged.

The analysis reads what the search recorded (results.jsonl, search.json, failures.jsonl, stops.jsonl,
sequential.json), so `python -m tune_dfrl.report runs=OUT` gives the same answer. The report's settings were
checked in the plan, so nothing here fails on a setting after hours of training. When there is nothing to compare
(every control seed failed, or no arm shares 2 seeds with the control) or the report fails anyway, `SearchFailed`
says so in one line: results.jsonl is complete, `python -m tune_dfrl.report runs=OUT` re-renders it, and
`resume=true retry_failed=true` trains failed cells again.
"""

from __future__ import annotations

from tune_dfrl.errors import NothingToCompare, SearchFailed
from tune_dfrl.report.schema import Summary
from tune_dfrl.search.plan import Plan
from tune_dfrl.search.run import Trained
from tune_dfrl.state.folder import REPORT, RESULTS, SUMMARY
from tune_dfrl.tracking.writer import SearchTracker, browse_lines
from tune_dfrl.tune.guarded import Guarded


def finish(plan: Plan, trained: Trained) -> Summary:
    """Report the search (OUT/report, OUT/summary.json, MLflow), or raise SearchFailed saying what to do."""
    results, tracker = plan.out / RESULTS, trained.tracker
    if trained.results_error is not None:
        tracker.call(tracker.inner.close, "KILLED")
        raise SearchFailed(
            f"{results} could not be written ({trained.results_error}); every cell kept its milestones: "
            f"fix the cause, then {plan.resume_hint()} to write the missing lines and the report"
        )
    if trained.control_failed:
        tracker.call(tracker.inner.close, "FAILED")
        raise SearchFailed(
            f"every control seed failed (see {plan.out / 'failures.jsonl'}), so no arm could be compared; "
            f"fix the cause, then {plan.resume_hint(' retry_failed=true')} to train them again"
        )
    try:
        summary = _report(plan, tracker)
        if plan.confirm is not None:
            _confirm_report(plan, tracker)
        return summary
    except SearchFailed:
        tracker.call(tracker.inner.close, "FINISHED")
        raise
    except Exception as error:  # noqa: BLE001 - training is over and recorded: say how to report it again
        tracker.call(tracker.inner.close, "FINISHED")
        raise SearchFailed(
            f"the report failed ({type(error).__name__}: {error}); training is complete and {results} "
            f"holds every milestone: `python -m tune_dfrl.report runs={plan.out}` re-renders the report"
        ) from error


def _report(plan: Plan, tracker: Guarded[SearchTracker]) -> Summary:
    """Analyse the folder; save, log and print the report (no report/ folder when no arm ran its full budget)."""
    from tune_dfrl.report.analysis import analyze_search, print_summary, write_report
    from tune_dfrl.report.scores import load_results
    from tune_dfrl.state.records import SearchRecord

    table = load_results(plan.out)
    try:
        summary = analyze_search(table, SearchRecord.read(plan.out))
    except NothingToCompare as nothing:
        see = f"see {plan.out / 'failures.jsonl'}"
        raise SearchFailed(
            f"{nothing.what} ({f'{nothing.why}; {see}' if nothing.why else see}); fix the cause, "
            f"then {plan.resume_hint(' retry_failed=true')} to train the failed cells again"
        ) from None
    report_dir = plan.out / REPORT if summary.arms else None
    paths = write_report(summary, table, report_dir) if report_dir else {}
    (plan.out / SUMMARY).write_text(summary.to_json())
    tracker.call(tracker.inner.finish, summary, report_dir, plan.out)
    print_summary(summary)
    if paths:
        print(f"report:  {paths['markdown']}")
    print(f"summary: {plan.out / 'summary.json'}")
    print(*browse_lines(plan.tracking_uri, tracker.inner.experiment_id), sep="\n")
    return summary


def _confirm_report(plan: Plan, tracker: Guarded[SearchTracker]) -> None:
    """A confirm search: both stages side by side (`tune_dfrl.report.confirm.write_confirm`), the MLflow runs linked
    to the screen's, the key lines printed."""
    from tune_dfrl.report.confirm import trial_seconds, write_confirm
    from tune_dfrl.state.folder import MLFLOW_DB
    from tune_dfrl.tracking.writer import default_tracking_uri

    assert plan.confirm is not None
    screen = plan.confirm.screen
    own_store = screen.folder / MLFLOW_DB if not screen.plan.get("tracking_uri") else None
    seconds = {
        "screen": trial_seconds(
            screen.plan.get("tracking_uri") or default_tracking_uri(screen.folder),
            screen.plan.get("experiment", ""),
            own_store if own_store is not None and own_store.is_file() else None,
        ),
        "confirm": trial_seconds(plan.tracking_uri, plan.experiment),
    }
    record, lines = write_confirm(plan.out, seconds)
    tracker.call(
        tracker.inner.tag_runs,
        {"confirm.screen_folder": plan.confirm.given, "confirm.screen_experiment": record["screen_experiment"]},
        {
            arm["arm_id"]: {"screen_arm_id": arm["screen_arm_id"], "screen_delta": f"{arm['screen']['delta']:.6g}"}
            for arm in record["arms"]
        },
    )
    print(*lines, sep="\n")
