"""A small search folder and MLflow store written by the search's own callbacks, without Ray (tests only).

`ResultsLog` and `SearchTracker` (on a real sqlite store) receive the trial events a search would deliver; the rung
stop goes through `ResultsLog.note_decision` and `SearchTracker.note_decision` as the scheduler's decisions do, the
looks of `seeds=auto` through `SeedBatches` and `SearchTracker.note_look` as the searcher's do; then
`search_finish.finish` reports it as a search does. The arms end every way an arm can: the control and two arms at
the full budget, one stopped at rung 20, one failed at every seed after its step-10 milestone; and a suggestion that
acts as the control, suggested twice, goes through `ResultsLog.note_control_equivalent` as the searcher's does.

score(arm, seed, step) = 40 + 5 seed + effect(arm) step / 30 + 0.3 z(seed, step, arm) on every benchmark.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from mlflow import MlflowClient
from search_helpers import BENCHMARKS

from tune_dfrl.paired.ledger import FAILED as FAILED_END
from tune_dfrl.paired.ledger import FINISHED, PairedLedger
from tune_dfrl.paired.ledger import STOPPED as STOPPED_END
from tune_dfrl.paired.rungs import ArmDecision, RungDecision
from tune_dfrl.paired.seed_batches import SeedBatches
from tune_dfrl.paired.sequential import SequentialRule
from tune_dfrl.report.schema import Summary
from tune_dfrl.search.finish import finish
from tune_dfrl.search.run import Trained
from tune_dfrl.state.folder import LOOKS
from tune_dfrl.tracking.writer import SearchTracker
from tune_dfrl.tune.guarded import Guarded
from tune_dfrl.tune.results_log import ResultsLog

STEPS, SEEDS, METRIC = (10, 20, 30), (0, 1, 2, 3), "score/db"
CONTROL = {"arm_id": "c0", "label": "baseline", "method": "baseline", "params": {}}
BETTER = {"arm_id": "a1", "label": "topk(f=0.9)", "method": "topk", "params": {"f": 0.9}}
CLOSE = {"arm_id": "a2", "label": "topk(f=0.6)", "method": "topk", "params": {"f": 0.6}}
STOPPED = {"arm_id": "a3", "label": "topk(f=0.1)", "method": "topk", "params": {"f": 0.1}}
FAILED = {"arm_id": "a4", "label": "maxvar(f=0.5)", "method": "maxvar", "params": {"f": 0.5}}
EQUIVALENT = {"method": "topk", "params": {"f": 1.0}, "label": "topk(f=1)", "arm_id": "c0"}  # never trained
ARMS = (CONTROL, BETTER, CLOSE, STOPPED, FAILED)
EFFECT = {"c0": 0.0, "a1": 6.0, "a2": 0.5, "a3": -5.0, "a4": 0.0}
LAST_STEP = {"a3": 20, "a4": 10}  # stopped at rung 20; failed after its step-10 milestone
RULE = SequentialRule(start=2, batch=2, max=4, alpha=0.05)
ERROR = "RuntimeError: planted failure of the test search"
STATUS_FIELDS = ("status", "text", "verdict", "step", "seeds", "mean", "delta", "ci_low", "ci_high", "level", "reason")
FIXED_FIELDS = ("verdict", "level", "delta", "ci_low", "ci_high", "p_holm", "seeds")


def score(arm: dict, seed: int, step: int) -> float:
    """A per-seed offset shared by all arms, the arm's effect growing with the step, and a little noise."""
    noise = float(np.random.default_rng([seed, step, int(arm["arm_id"][1:])]).standard_normal())
    return 40.0 + 5.0 * seed + EFFECT[arm["arm_id"]] * step / STEPS[-1] + 0.3 * noise


def result(arm: dict, seed: int, step: int) -> dict:
    s = score(arm, seed, step)
    return {
        "step": step,
        "final": step == STEPS[-1],
        "threads": 1,
        **{f"acc/{b.name}": s for b in BENCHMARKS},
        **{f"score/{agg}": s for agg in ("db", "macro", "item")},
    }


def build_search(out: Path, sequential: bool = False) -> SimpleNamespace:
    """Write the search (module docstring) into the new folder `out`; fixed seeds 0..3, or seeds=auto from 2 to 4.
    Returns the folder, store, experiment, summary and what the finish printed."""
    out.mkdir(parents=True)
    (out / "benchmarks.json").write_text(json.dumps([asdict(b) for b in BENCHMARKS]))
    (out / "error.txt").write_text(f"Traceback (most recent call last):\n  ...\n{ERROR}\n")
    plan = {
        "seeds": list(SEEDS),
        "milestones": list(STEPS),
        "control": CONTROL,
        "metric": METRIC,
        "report": {"delta": 1.0, "alpha": RULE.alpha, "seed": 0, "flip_k": 2},
        **({"sequential": asdict(RULE)} if sequential else {}),
    }
    (out / "search.json").write_text(json.dumps(plan))
    uri, experiment = f"sqlite:///{out / 'mlflow.db'}", f"tune_dfrl/{out.name}"
    tracker = open_tracker(out)
    log = ResultsLog(out / "results.jsonl", out / "failures.jsonl", METRIC)
    ledger = PairedLedger("c0")  # the searcher's: final scores and how cells ended

    def run(arm: dict, seeds: tuple[int, ...]) -> None:
        last = LAST_STEP.get(arm["arm_id"], STEPS[-1])
        for seed in seeds:
            trial = SimpleNamespace(
                config={"arm": arm, "seed": seed}, last_result=None, error_file=str(out / "error.txt"), num_failures=2
            )
            tracker.on_trial_start(0, [], trial)
            for step in (s for s in STEPS if s <= last):
                trial.last_result = result(arm, seed, step)
                ledger.record(arm["arm_id"], seed, step, trial.last_result[METRIC])
                for callback in (log, tracker):
                    callback.on_trial_result(0, [], trial, trial.last_result)
            for callback in (log, tracker):
                if arm is FAILED:
                    callback.on_trial_error(0, [], trial)
                else:
                    callback.on_trial_complete(0, [], trial)
            ledger.end(arm["arm_id"], seed, {"a3": STOPPED_END, "a4": FAILED_END}.get(arm["arm_id"], FINISHED))
        if arm is STOPPED:
            decided = ArmDecision("a3", 20, seeds, RungDecision(False, "80% interval below the leader", "a1"))
            log.note_decision(decided)
            tracker.note_decision(decided)

    seeds = tuple(range(RULE.start)) if sequential else SEEDS
    for arm in ARMS:
        run(arm, seeds)
        if arm is BETTER:
            for suggestion in ("arm0001", "arm0003"):
                log.note_control_equivalent({"suggestion": suggestion, **EQUIVALENT})
    if sequential:
        batches = SeedBatches(RULE, "c0")
        while not batches.finished:
            look = batches.look(ledger, [a["arm_id"] for a in ARMS[1:]], STEPS[-1])
            history = batches.history() | {"labels": {a["arm_id"]: a["label"] for a in ARMS}}
            (out / LOOKS).write_text(json.dumps(history))
            tracker.note_look(history)
            opened = [a for a in ARMS[1:] if a["arm_id"] in look.states and look.states[a["arm_id"]].status == "open"]
            for arm in [CONTROL, *opened] if look.next_seeds else []:
                run(arm, look.next_seeds)
    summary, printed = finish_search(out, tracker)
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=200)
    parents = {r.data.tags["arm_id"]: r for r in runs if r.data.tags["tune_dfrl.role"] == "arm"}
    return SimpleNamespace(
        out=out,
        uri=uri,
        name=experiment,
        client=client,
        experiment=found,
        parents=parents,
        summary=summary,
        printed=printed,
    )


def open_tracker(out: Path, resume: bool = False) -> SearchTracker:
    """The test search's `SearchTracker` on its store (`resume`: reopen the experiment, as `resume=true` does)."""
    uri, experiment = f"sqlite:///{out / 'mlflow.db'}", f"tune_dfrl/{out.name}"
    return SearchTracker(
        uri, experiment, (out / "mlartifacts").as_uri(), "topk_keep", "c0", METRIC, {"arms": 4}, BENCHMARKS, resume
    )


def finish_search(out: Path, tracker: SearchTracker) -> tuple[Summary, str]:
    """`search_finish.finish` of the search in `out`, as a search's last stage runs it: (summary, what it printed)."""
    printed, logging = io.StringIO(), Guarded(tracker, "MLflow logging", "the test fails")
    with contextlib.redirect_stdout(printed):
        summary = finish(
            SimpleNamespace(out=out, tracking_uri=tracker.tracking_uri, confirm=None), Trained(logging, None, False)
        )
    assert logging.error is None, logging.error
    return summary, printed.getvalue()


def answer(summary: dict) -> dict:
    """What a summary answers: every arm's status and figures, the fixed-sample figures, the recommendation."""
    return {
        "rule": summary["rule"],
        "holm_family": summary["holm_family"],
        "statuses": {arm: {k: s[k] for k in STATUS_FIELDS} for arm, s in summary["statuses"].items()},
        "fixed": {
            arm: {agg: {k: f[k] for k in FIXED_FIELDS} for agg, f in by_agg.items()}
            for arm, by_agg in summary["arms"].items()
        },
        "verdicts": summary["verdicts"],
        "recommendation": summary["recommendation"],
    }
