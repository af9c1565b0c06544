"""The search service: `python -m tune_dfrl.search space=NAME [key=value ...]`.

One search = the control arm and up to `arms` searched arms, each trained at the same explicit
seeds (one Ray Tune trial per (arm, seed)); arms are suggested by Optuna through the
`PairedRepeater` and continued or stopped together by the paired scheduler; every milestone goes
to OUT/results.jsonl and MLflow; the paired-CI report ends it. Everything the user can get wrong
is checked by `plan_search` before anything is written or any trial starts.

Output directory (OUT):

    search.json        the resolved plan (space, seeds, recipe, scheduler, ...)
    benchmarks.json    the backend's benchmarks (name, domain, items)
    results.jsonl      one line per (arm, seed, milestone)
    failures.jsonl     (arm, seed) cells that failed after their last retry
    cells/<arm_id>/seed<k>/checkpoint/   per-cell backend checkpoints (stable, keyed by arm id)
    cells/<arm_id>/seed<k>/milestones.jsonl   the milestones each cell reported (replayed on restart)
    state/             searcher and scheduler state, driver attempts (what `resume=true` continues from)
    optuna.db          the Optuna study (sqlite): one trial per distinct arm, value = mean paired delta
    ray/               Ray Tune's experiment state (tune/, then resume<k>/ per resumed attempt)
    mlflow.db, mlartifacts/   the default MLflow store
    report/            report.md, report.html, figures, summary.json
    summary.json       the report's summary
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tune_dfrl.backend import ArmSpec, Backend, BackendError, BenchmarkInfo
from tune_dfrl.backends import backend_errors, get_backend
from tune_dfrl.control_cache import ControlCache, default_cache_root
from tune_dfrl.resume import describe_differences, start_attempt, state_dir
from tune_dfrl.results import read_records, write_records
from tune_dfrl.rungs import RungRule
from tune_dfrl.scheduler import SCHEDULERS, make_scheduler
from tune_dfrl.services import check_ray_address, check_tracking_uri, connect_ray, ray_address
from tune_dfrl.spaces import ArmFactory, SearchSpace, available_spaces, recipe_hash, space_file_text
from tune_dfrl.tracking import default_tracking_uri, ui_command
from tune_dfrl.trial import MILESTONES, PlantedFault, cell_dir

METRIC_PREFIX = "score/"
AGGREGATIONS = ("db", "macro", "item", "efficiency")  # DESIGN §6; named benchmark subsets add their own
OPTUNA_STUDY = "tune_dfrl"  # study name in OUT/optuna.db: one trial per distinct arm, valued by its mean paired delta


class SearchError(ValueError):
    """Bad input, found before any trial starts."""


@dataclass(frozen=True)
class Plan:
    """A validated search: everything `run_search` needs, nothing written yet."""

    space: SearchSpace
    seeds: tuple[int, ...]
    n_arms: int
    backend_name: str
    backend: Backend
    recipe: dict[str, Any]
    milestones: tuple[int, ...]
    control: ArmSpec
    make_arm: ArmFactory
    aggregate: str
    scheduler: dict[str, Any]
    searcher: dict[str, Any]
    report: dict[str, Any]
    out: Path
    tracking_uri: str
    experiment: str
    ray_address: str | None
    ray_num_cpus: int | None
    resume: bool = False
    max_retries: int = 0
    control_cache: Path | None = None
    faults: tuple[PlantedFault, ...] = ()

    @property
    def metric(self) -> str:
        return METRIC_PREFIX + self.aggregate

    @property
    def total_cells(self) -> int:
        return (self.n_arms + 1) * len(self.seeds)

    def describe(self) -> dict[str, Any]:
        """The plan as JSON-able settings (search.json, MLflow params)."""
        return {"space": self.space.name, "seeds": list(self.seeds), "arms": self.n_arms, "backend": self.backend_name,
                "recipe": self.recipe, "recipe_hash": self.make_arm.recipe_hash, "milestones": list(self.milestones),
                "control": asdict(self.control), "metric": self.metric, "scheduler": self.scheduler,
                "searcher": self.searcher, "report": self.report, "out": str(self.out),
                "tracking_uri": self.tracking_uri, "experiment": self.experiment, "ray_address": self.ray_address,
                "max_retries": self.max_retries, "control_cache": str(self.control_cache) if self.control_cache else None}

    def fingerprint(self) -> dict[str, Any]:
        """What `resume=true` must find unchanged in the stored search (JSON-normalised)."""
        space = {k: v for k, v in asdict(self.space).items() if k != "description"}
        return json.loads(json.dumps({"space": space, "backend": self.backend_name, "recipe": self.recipe,
                                      "seeds": list(self.seeds), "metric": self.metric, "scheduler": self.scheduler,
                                      "searcher": self.searcher}, default=str))


def plan_search(cfg: dict[str, Any]) -> Plan:
    """Validate a search config (the Hydra config as a plain dict) and build the plan; writes nothing."""
    backend_cfg = dict(cfg["backend"])
    backend_name = backend_cfg.pop("name")
    overrides = {k: v for k, v in (("steps", cfg.get("steps")), ("milestone_every", cfg.get("milestone_every"))) if v is not None}
    backend = get_backend(backend_name, {**backend_cfg, **overrides})
    recipe = backend.recipe
    steps, every = int(recipe["steps"]), int(recipe["milestone_every"])
    if every < 1 or steps < every:
        raise SearchError(f"step budget steps={steps} is shorter than one milestone (milestone_every={every}); "
                          "need steps >= milestone_every >= 1")
    milestones = tuple(sorted({*range(every, steps + 1, every), steps}))

    space_cfg = dict(cfg["space"])
    space = SearchSpace.from_mapping(space_cfg, int(recipe["rollout_n"]))
    seeds = _seeds(cfg["seeds"])
    n_arms = int(cfg["arms"])
    if n_arms < 1:
        raise SearchError(f"arms={n_arms}: a search needs at least 1 searched arm besides the control")
    aggregate = str(cfg["metric"])
    aggregations = [*AGGREGATIONS, *(recipe.get("subsets") or {})]
    if aggregate not in aggregations:
        raise SearchError(f"unknown metric {aggregate!r}; allowed (aggregations the backend reports): {', '.join(aggregations)}")

    scheduler = dict(cfg["scheduler"])
    if scheduler["name"] not in SCHEDULERS:
        raise SearchError(f"unknown scheduler {scheduler['name']!r}; allowed: {', '.join(SCHEDULERS)}")
    if scheduler["name"] in ("paired_asha", "race"):
        RungRule(scheduler["name"], scheduler["eta"], scheduler["confidence"], scheduler["min_seeds"], scheduler["grace_fraction"])

    make_arm = ArmFactory(int(recipe["rollout_n"]), recipe_hash(recipe))
    control = make_arm({"method": space.control_method, "params": space.control_params})
    with backend_errors(backend_name, "validate the arms"):
        for suggestion in [{"method": space.control_method, "params": space.control_params}, *space.default_suggestions()]:
            backend.validate(make_arm(suggestion))

    resume = bool(cfg["resume"])
    if resume and not cfg["out"]:
        raise SearchError("resume=true needs out=DIR: the output directory of the search to continue")
    out = Path(cfg["out"] or f"runs/{space.name}-{time.strftime('%Y%m%d-%H%M%S')}").expanduser().absolute()
    max_retries = cfg["max_retries"]
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise SearchError(f"max_retries={max_retries!r}: give an integer >= 0 (retries of a crashing trial)")
    address = ray_address(cfg["ray"]["address"])
    if address is not None and cfg["ray"]["num_cpus"] is not None:
        raise SearchError(f"ray.num_cpus sizes a private local cluster; the running cluster at {address!r} owns its "
                          "resources: drop ray.num_cpus, or drop ray.address (and RAY_ADDRESS)")
    faults = _faults(cfg["fault_injection"], seeds, milestones)
    cache = cfg["control_cache"]
    control_cache = None if cache is None else default_cache_root() if cache == "auto" else Path(cache).expanduser().absolute()

    plan = Plan(space, seeds, n_arms, backend_name, backend, recipe, milestones, control, make_arm, aggregate,
                scheduler, dict(cfg["searcher"]), dict(cfg["report"]), out, cfg["mlflow"]["tracking_uri"] or "",
                cfg["mlflow"]["experiment"] or "", address, cfg["ray"]["num_cpus"], resume, max_retries, control_cache, faults)
    stored = _check_out(plan)
    plan = replace(plan, tracking_uri=plan.tracking_uri or stored.get("tracking_uri") or default_tracking_uri(out),
                   experiment=plan.experiment or stored.get("experiment") or f"tune_dfrl/{out.name}")
    check_tracking_uri(plan.tracking_uri)
    if address is not None:
        check_ray_address(address)
    return plan


def _check_out(plan: Plan) -> dict[str, Any]:
    """A new search needs an empty `out`; a resumed one the same search in it. Returns the stored search.json ({} if new)."""
    out, stored = plan.out, plan.out / "search.json"
    if not plan.resume:
        if stored.exists():
            raise SearchError(f"{out} already holds a search; pass resume=true to continue it, or choose another out=DIR")
        if out.exists() and any(out.iterdir()):
            raise SearchError(f"output directory {out} is not empty; choose another out=DIR")
        return {}
    if not stored.exists():
        raise SearchError(f"resume=true: there is no previous search in {out} (no search.json); "
                          "run without resume=true to start one")
    previous = json.loads(stored.read_text())
    before, now = previous.get("fingerprint", {}), plan.fingerprint()
    if before != now:
        raise SearchError(f"resume=true: {out} holds a different search ({describe_differences(before, now)}); "
                          "resume with the settings it was started with, or choose another out=DIR")
    return previous


def _faults(value: Any, seeds: tuple[int, ...], milestones: tuple[int, ...]) -> tuple[PlantedFault, ...]:
    """TEST ONLY: `fault_injection` (one fault or a list) -> planted faults, each at a seed and milestone of the search."""
    faults = []
    for entry in [] if value is None else value if isinstance(value, list) else [value]:
        unknown = sorted(set(entry) - {"arm", "seed", "step", "times"})
        if unknown or not {"arm", "seed", "step"} <= set(entry):
            raise SearchError(f"fault_injection {entry}: keys arm, seed, step (required) and times; got {sorted(entry)}")
        if entry["seed"] not in seeds or entry["step"] not in milestones:
            raise SearchError(f"fault_injection {entry}: seed must be one of {list(seeds)}, step one of the milestones {list(milestones)}")
        faults.append(PlantedFault(str(entry["arm"]), int(entry["seed"]), int(entry["step"]), entry.get("times")))
    return tuple(faults)


def _seeds(value: Any) -> tuple[int, ...]:
    """A count n -> (0, ..., n-1); a list -> itself (distinct integers >= 0); at least 2 seeds."""
    if isinstance(value, bool):
        raise SearchError(f"seeds={value!r}: give a count or a list of integers")
    seeds = tuple(range(value)) if isinstance(value, int) else tuple(value)
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise SearchError(f"seeds={list(seeds)}: seeds must be integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise SearchError(f"seeds={list(seeds)}: seeds must be distinct")
    if len(seeds) < 2:
        raise SearchError(f"seeds={value!r} gives {len(seeds)} seed(s); paired intervals need at least 2 seeds per arm")
    return seeds


def evaluated_benchmarks(backend: Backend, recipe: dict[str, Any]) -> list[BenchmarkInfo]:
    """The backend's benchmarks that the recipe evaluates (`eval_benchmarks`, when the recipe narrows them)."""
    chosen = recipe.get("eval_benchmarks")
    return [b for b in backend.benchmarks() if not chosen or b.name in chosen]


def calibrate(backend: Backend) -> None:
    """The backend's calibration smoke test; a failure refuses the search."""
    with backend_errors(backend.name, "calibrate"):
        result = backend.calibrate()
    if not result.ok:
        lines = "\n  ".join(result.failures)
        raise SearchError(f"calibration smoke test failed; refusing to start the search:\n  {lines}")


def run_search(plan: Plan) -> dict[str, Any]:
    """Run a planned search to the end; returns the report summary (also in OUT/summary.json)."""
    import optuna
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from tune_dfrl.control_cache import ControlCacheWriter
    from tune_dfrl.pairing import INNER_METRIC, PairedRepeater
    from tune_dfrl.progress import Progress
    from tune_dfrl.results import ResultsLog
    from tune_dfrl.tracking import SearchTracker
    from tune_dfrl.trial import CellJob, run_cell, trial_dirname

    calibrate(plan.backend)
    with backend_errors(plan.backend_name, "size a trial"):
        resources = plan.backend.resources()
    out = plan.out
    out.mkdir(parents=True, exist_ok=True)
    save_plan(plan)
    attempt = start_attempt(out, plan.resume)
    with backend_errors(plan.backend_name, "list its benchmarks"):
        benchmarks = evaluated_benchmarks(plan.backend, plan.recipe)
    (out / "benchmarks.json").write_text(json.dumps([asdict(b) for b in benchmarks], indent=2))
    print(f"search {plan.space.name}: {plan.n_arms} arms + control x {len(plan.seeds)} seeds, "
          f"{plan.scheduler['name']} at steps {list(plan.milestones)}; output in {out}"
          + (f" (resumed, attempt {attempt})" if plan.resume else ""), flush=True)
    began = time.monotonic()
    print(f"preparing the {plan.backend_name} backend (a first run builds what it caches, e.g. the embedded base model)", flush=True)
    with backend_errors(plan.backend_name, "prepare"):
        plan.backend.prepare()
    print(f"backend ready after {time.monotonic() - began:.0f} s", flush=True)

    tracker = SearchTracker(plan.tracking_uri, plan.experiment, _artifact_location(plan), plan.space.name,
                            plan.control.arm_id, _flat_settings(plan.describe()), benchmarks, resume=plan.resume)
    progress = Progress(plan.control.arm_id, plan.metric, plan.total_cells)

    def on_decision(decided: Any) -> None:
        progress.note_decision(decided)
        tracker.note_decision(decided)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sampler = optuna.samplers.TPESampler(seed=plan.searcher["seed"], n_startup_trials=plan.searcher["n_startup_trials"],
                                         multivariate=True, group=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'optuna.db'}")
    inner = OptunaSearch(space=plan.space.sampler(), metric=INNER_METRIC, mode="max", sampler=sampler,
                         storage=storage, study_name=OPTUNA_STUDY)
    state = state_dir(out)
    searcher = PairedRepeater(inner, plan.make_arm, plan.control, plan.seeds, plan.n_arms, max(plan.milestones),
                              plan.metric, plan.searcher["max_duplicates"], state_path=state / "searcher.pkl")
    scheduler = make_scheduler(plan.scheduler["name"], metric=plan.metric, control=plan.control.arm_id, seeds=plan.seeds,
                               milestones=plan.milestones, eta=plan.scheduler["eta"], confidence=plan.scheduler["confidence"],
                               min_seeds=plan.scheduler["min_seeds"], grace_fraction=plan.scheduler["grace_fraction"],
                               on_decision=on_decision, state_path=state / "scheduler.pkl")
    if plan.resume:
        _carry_over(plan, searcher, scheduler, progress)
    callbacks = [ResultsLog(out / "results.jsonl", out / "failures.jsonl", attempt), tracker, progress]
    if plan.control_cache is not None:
        cache = ControlCache(plan.control_cache, plan.backend_name, plan.make_arm.recipe_hash, plan.control.arm_id, plan.milestones)
        _seed_control_cells(plan, cache)
        callbacks.append(ControlCacheWriter(cache, plan.control.arm_id, out / "results.jsonl"))
    job = CellJob(plan.backend, str(out / "cells"), max(1, int(resources.get("cpu", 1))), plan.control.arm_id,
                  plan.faults)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Ray Tune status tables
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # Ctrl-C interrupts at once; resume=true continues
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)  # results live in results.jsonl
    started_ray = not ray.is_initialized()
    if started_ray:
        connect_ray(plan.ray_address, plan.ray_num_cpus)
    try:
        trainable = tune.with_resources(tune.with_parameters(run_cell, job=job), resources)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=-1,  # the searcher ends it
                                        metric=plan.metric, mode="max", reuse_actors=True,
                                        trial_dirname_creator=trial_dirname),
            run_config=tune.RunConfig(storage_path=str(out / "ray"), name="tune" if attempt == 0 else f"resume{attempt}",
                                      verbose=0, failure_config=tune.FailureConfig(max_failures=plan.max_retries),
                                      callbacks=callbacks),
        )
        tuner.fit()
    except BaseException as error:
        tracker.close("KILLED")
        if isinstance(error, KeyboardInterrupt):
            print(f"interrupted; to continue, run the same command with resume=true out={out}", file=sys.stderr, flush=True)
        raise
    finally:
        if started_ray:
            ray.shutdown()
    return _report(plan, tracker, scheduler)


def save_plan(plan: Plan) -> None:
    """OUT/search.json: the plan and its fingerprint (what `resume=true` checks)."""
    (plan.out / "search.json").write_text(json.dumps({**plan.describe(), "fingerprint": plan.fingerprint()}, indent=2))


def _carry_over(plan: Plan, searcher: Any, scheduler: Any, progress: Any) -> None:
    """A resumed search continues the stored searcher and rung book; progress starts from what ended before."""
    state = state_dir(plan.out)
    if (state / "searcher.pkl").exists():
        searcher.resume(state / "searcher.pkl", plan.n_arms)
    book = getattr(scheduler, "book", None)
    if book is not None and (state / "scheduler.pkl").exists():
        scheduler.restore(str(state / "scheduler.pkl"))
        book = scheduler.book
    ended = {(arm_id, seed) for arm_id in searcher.arms for seed in searcher.cells_of(arm_id)}
    stopped = {d.arm: d.rung for d in book.decisions.values() if not d.decision.keep} if book is not None else {}
    progress.carry_over(read_records(plan.out / "results.jsonl"), ended, stopped)


def _seed_control_cells(plan: Plan, cache: ControlCache) -> None:
    """Control seeds found in the cache get their milestone log from it: their trials replay it instead of training."""
    for seed in plan.seeds:
        log = cell_dir(plan.out / "cells", plan.control.arm_id, seed) / MILESTONES
        cached = cache.get(seed)
        if cached is not None and not any(r["final"] for r in read_records(log)):
            write_records(log, cached)


def _report(plan: Plan, tracker: Any, scheduler: Any) -> dict[str, Any]:
    """Analyse the arms that ran their full budget on the seeds that did not fail; note the stopped arms and the
    failed seeds; save, log and print the report."""
    from tune_dfrl.aggregate import default_aggregations
    from tune_dfrl.report import analyze, print_summary, write_report
    from tune_dfrl.scores import load_results

    table, failed = _without_failed_cells(load_results(plan.out), read_records(plan.out / "failures.jsonl"))
    final = max(plan.milestones)
    reached = table.frame.groupby("arm")["step"].max()
    complete = [arm for arm in table.arms if reached[arm] >= final]
    stopped = {arm: table.arm_info.get(arm, {}).get("arm_id", "") for arm in table.arms if reached[arm] < final}
    control = next(arm for arm in table.arms if table.arm_info.get(arm, {}).get("arm_id") == plan.control.arm_id)
    stop_notes = {arm: _stop_note(arm, arm_id, scheduler) for arm, arm_id in stopped.items()}
    if complete == [control]:
        return _control_only(plan, tracker, control, stop_notes)
    table = replace(table, frame=table.frame[table.frame["arm"].isin(complete)], notes=table.notes + tuple(stop_notes.values()))
    report = plan.report
    defaults = default_aggregations(table.bench, table.has_lengths)
    aggregations = [plan.aggregate] + [a for a in defaults if a != plan.aggregate]
    family = len(complete) - 1 + len(stopped)  # Holm family: every searched arm, stopped ones as untested hypotheses
    summary = analyze(table, control, aggregations, report["delta"], report["alpha"], report["seed"], report["flip_k"],
                      family_size=family)
    summary["stopped"] = stop_notes
    summary["failed"] = failed
    paths = write_report(summary, table, plan.out / "report")
    (plan.out / "summary.json").write_text(json.dumps(summary, indent=2))
    arm_ids = {arm: info.get("arm_id", "") for arm, info in table.arm_info.items()}
    tracker.finish(summary, arm_ids, plan.aggregate, plan.out / "report")
    print_summary(summary)
    print(f"report:  {paths.get('markdown', plan.out / 'report')}")
    print(f"summary: {plan.out / 'summary.json'}")
    print(f"browse:  {ui_command(plan.tracking_uri)}")
    return summary


def _without_failed_cells(table: Any, failures: list[dict[str, Any]]) -> tuple[Any, dict[str, list[int]]]:
    """Drop the milestones of (arm, seed) cells that failed after their last retry, with a note naming each;
    the report then compares each arm on the seeds it shares with the control. Returns (table, {arm: failed seeds})."""
    import pandas as pd

    names = {info.get("arm_id"): name for name, info in table.arm_info.items()}
    failures = [r for r in failures if r["arm_id"] in names]
    cells = {(names[r["arm_id"]], r["seed"]) for r in failures}
    notes = tuple(f"arm {names[r['arm_id']]!r}: seed {r['seed']} failed after {r['failures']} attempt(s), at step {r['step']} "
                  f"({r['error'] or 'no error message'}); it is missing from the analysis" for r in failures)
    keep = ~pd.MultiIndex.from_frame(table.frame[["arm", "seed"]]).isin(cells)
    failed: dict[str, list[int]] = {}
    for arm, seed in sorted(cells):
        failed.setdefault(arm, []).append(seed)
    return replace(table, frame=table.frame[keep], notes=table.notes + notes), failed


def _control_only(plan: Plan, tracker: Any, control: str, stop_notes: dict[str, str]) -> dict[str, Any]:
    """Every searched arm was stopped at a rung: nothing to compare at the full budget; keep the control."""
    reason = "every searched arm was stopped by the scheduler at a rung; keep the control"
    summary = {"control": control, "seeds": list(plan.seeds), "primary": plan.aggregate, "arms": {}, "stopped": stop_notes,
               "recommendation": {"recommended": control, "is_control": True, "reason": reason}, "notes": list(stop_notes.values())}
    (plan.out / "summary.json").write_text(json.dumps(summary, indent=2))
    tracker.close("FINISHED")
    print(f"recommended: {control} — {reason}")
    print(f"summary: {plan.out / 'summary.json'}\nbrowse:  {ui_command(plan.tracking_uri)}")
    return summary


def _stop_note(arm: str, arm_id: str, scheduler: Any) -> str:
    book = getattr(scheduler, "book", None)
    decided = book.stopped(arm_id) if book is not None else None
    if decided is None:
        return f"arm {arm!r} was stopped before its last milestone; not analysed"
    return f"arm {arm!r} was stopped at step {decided.rung} ({decided.decision.reason}); not analysed"


def _artifact_location(plan: Plan) -> str | None:
    """Artifacts next to a sqlite store; a tracking server decides its own."""
    return (plan.out / "mlartifacts").as_uri() if plan.tracking_uri.startswith("sqlite:") else None


def _flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def register_configs() -> None:
    """Hydra configs that are derived, not written: every file of `search_spaces/` as an option of the
    group `space`, and the embedded recipe's dataclass defaults as `backend_defaults/embedded`."""
    from hydra.core.config_store import ConfigStore

    from tune_dfrl.trainers.embedded.recipe import EmbeddedRecipe

    store = ConfigStore.instance()
    for name in available_spaces():
        store.store(group="space", name=name, node=yaml.safe_load(space_file_text(name)))
    store.store(group="backend_defaults", name="embedded", node=asdict(EmbeddedRecipe()))


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    register_configs()

    @hydra.main(config_path="pkg://tune_dfrl.conf", config_name="search", version_base="1.3")
    def run(cfg: Any) -> None:
        try:
            plan = plan_search(OmegaConf.to_container(cfg, resolve=True))
        except ValueError as error:  # bad input: nothing written, no trial started
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        try:
            run_search(plan)
        except (SearchError, BackendError) as error:  # found before any trial started
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)

    run()


if __name__ == "__main__":
    main()
