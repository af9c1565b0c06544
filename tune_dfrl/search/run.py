"""Stage 2 of a search, the run: hold the output folder, start Ray Tune with the paired searcher and scheduler,
record every milestone; `train` returns what the report (`tune_dfrl.search.finish`) needs as a `Trained`.

Order: `holding` runs the calibration smoke test (it writes nothing in OUT), then takes the folder lock
(`tune_dfrl.state.resume.hold_folder`), before anything else is written, until the search ends; `train` repairs torn
last lines in the append-only logs; writes search.json, the attempt, benchmarks.json; prepares the backend; builds
the callbacks (results log, MLflow, control cache, progress), each `Guarded` so that nothing it writes can fail a
trial; then runs `Tuner.fit`.

SIGINT (Ctrl-C, to the driver or its process group) and SIGTERM raise `Interrupted` in the driver
(inside `Tuner.fit`, at Tune's next step):
the MLflow runs are marked KILLED (in a thread given `CLOSE_TIMEOUT_S`, so a locked store cannot
hold the exit), Ray is shut down, and the CLI exits 128 + the signal number with one line that says
how to resume.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from tune_dfrl.backends.base import Backend
from tune_dfrl.backends.benchmarks import BenchmarkInfo
from tune_dfrl.backends.registry import backend_errors
from tune_dfrl.cluster.head_watch import ClusterWatch
from tune_dfrl.errors import Interrupted, SearchError
from tune_dfrl.search.plan import Plan, check_out, save_plan
from tune_dfrl.state.control_cache import ControlCache
from tune_dfrl.state.folder import BENCHMARKS, CELLS, FAILURES, LOOKS, MILESTONES, OPTUNA_DB, RAY, RESULTS
from tune_dfrl.state.records import read_records, repair_log, write_records
from tune_dfrl.state.resume import STATE_LOG, attempts_log, hold_folder, start_attempt, state_dir
from tune_dfrl.tracking.writer import default_tracking_uri, folder_artifacts, repoint_folder_store
from tune_dfrl.tune.guarded import Guarded
from tune_dfrl.tune.trial import cell_dir

if TYPE_CHECKING:
    from tune_dfrl.tracking.writer import SearchTracker
    from tune_dfrl.tune.progress import Progress
    from tune_dfrl.tune.results_log import ResultsLog

OPTUNA_STUDY = "tune_dfrl"  # study name in OUT/optuna.db: one trial per distinct arm, valued by its mean paired delta
CLOSE_TIMEOUT_S = 10.0  # the most an interrupted driver waits for MLflow to mark its runs KILLED


class _Signals:
    """The signal received, and whether the driver is inside `Tuner.fit`: there the handler only records it and
    `RaiseOnSignal` raises at Tune's next step (an exception raised inside Ray's C calls comes out garbled)."""

    received: int | None = None
    deferred: bool = False
    cluster: ClusterWatch | None = None  # the cluster the driver connected to, while it runs


def _interrupt(signum: int, frame: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # one is enough: the clean-up that follows is bounded
    _Signals.received = signum
    if not _Signals.deferred:
        raise Interrupted(signum)


def raise_if_signalled() -> None:
    """Raise `Interrupted` once a signal was received, `ClusterLost` once the cluster's head is gone (called where
    the driver's Python runs: Tune's step, and the searcher while Tune waits on it)."""
    if _Signals.received is not None:
        raise Interrupted(_Signals.received)
    if _Signals.cluster is not None:
        _Signals.cluster.check()


class RaiseOnSignal(Callback):
    """Raises `Interrupted` (a signal was received) or `ClusterLost` at the beginning of Tune's next step (every
    0.1 s or so)."""

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        raise_if_signalled()


def handle_interrupts() -> dict[int, Any]:
    """SIGINT and SIGTERM raise `Interrupted` (this also replaces the handler `ray.init` installs for SIGTERM);
    returns the handlers replaced (none off the main thread, where Python cannot set them)."""
    _Signals.received, _Signals.deferred = None, False
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}


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


@dataclass(frozen=True)
class Trained:
    """What the run hands to the finish."""

    tracker: Guarded[SearchTracker]  # the MLflow runs, still open
    results_error: str | None  # why OUT/results.jsonl misses lines (None: it holds every milestone)
    control_failed: bool  # every control seed failed


@contextmanager
def holding(plan: Plan) -> Iterator[None]:
    """Calibrate, then hold the output folder while the block runs; SIGINT and SIGTERM raise `Interrupted` (its
    hint says how to resume) until the block ends."""
    replaced = handle_interrupts()
    try:
        calibrate(plan.backend)  # writes nothing in OUT
        lock = hold_folder(plan.out)
        try:
            check_out(plan)  # again, holding the folder: another driver may have started a search here since planning
            yield
        finally:
            os.close(lock)
    except Interrupted as interrupted:
        interrupted.hint = plan.resume_hint()
        raise
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)


def train(plan: Plan) -> Trained:
    """Train the planned search in its held folder (`holding`) until the searcher ends it."""
    from tune_dfrl.tune.progress import Progress
    from tune_dfrl.tune.scheduler import PairedScheduler

    with backend_errors(plan.backend_name, "size a trial"):
        resources = plan.backend.resources()  # first: a backend that cannot size a trial leaves OUT untouched
    benchmarks, attempt = _open_folder(plan)
    _prepare_backend(plan)
    writers = _open_writers(plan, benchmarks, attempt)
    searcher, earlier_study = _paired_searcher(plan, writers)
    scheduler = _paired_scheduler(plan, writers)
    book = scheduler.book if isinstance(scheduler, PairedScheduler) else None
    writers.progress = Progress(searcher, book, plan.metric, plan.total_cells, max(plan.milestones))
    if plan.resume:
        _resume(plan, searcher, scheduler, writers, earlier_study)
    callbacks = _callbacks(plan, searcher, scheduler, writers)
    _run_tune(plan, searcher, scheduler, callbacks, resources, attempt, writers)
    return Trained(writers.tracker, writers.results_log.error, searcher.control_failed())


@dataclass
class Writers:
    """What the driver writes while the search runs, each `Guarded` (a write error never fails a trial): the MLflow
    runs (`tracker`), OUT's record files (`results_log`) and the progress line (`progress`, which reads the searcher
    and the rung book, so it is set once they exist). The searcher's and the scheduler's events reach them here."""

    out: Path
    tracker: Guarded[SearchTracker]
    results_log: Guarded[ResultsLog]
    progress: Progress | None = None

    def on_decision(self, decided: Any) -> None:
        """A rung decision of the paired scheduler (a resume's replay may announce the first)."""
        assert self.progress is not None, "the progress line is set before the scheduler decides"
        self.progress.note_decision(decided)
        self.results_log.call(self.results_log.inner.note_decision, decided)
        self.tracker.call(self.tracker.inner.note_decision, decided)

    def on_look(self, history: dict[str, Any]) -> None:
        """A sequential look of `seeds=auto`: OUT/sequential.json and MLflow."""
        (self.out / LOOKS).write_text(json.dumps(history, indent=2))
        self.tracker.call(self.tracker.inner.note_look, history)

    def on_control_equivalent(self, suggestion: dict[str, Any]) -> None:
        """A suggestion that acts as the control (never trained)."""
        self.results_log.call(self.results_log.inner.note_control_equivalent, suggestion)


def _open_folder(plan: Plan) -> tuple[list[BenchmarkInfo], int]:
    """Repair torn last lines of the append-only logs; write search.json, the attempt and benchmarks.json; say
    what runs. Returns the benchmarks evaluated and the attempt's number (0: the first)."""
    out = plan.out
    for log in (out / RESULTS, out / FAILURES, attempts_log(out), state_dir(out) / STATE_LOG):
        if (note := repair_log(log)) is not None:
            print(f"note: {note}", flush=True)
    save_plan(plan)
    attempt = start_attempt(out, plan.resume)
    with backend_errors(plan.backend_name, "list its benchmarks"):
        benchmarks = evaluated_benchmarks(plan.backend, plan.recipe)
    (out / BENCHMARKS).write_text(json.dumps([asdict(b) for b in benchmarks], indent=2))
    seeds = (
        f"seeds=auto ({plan.sequential.start} to {plan.sequential.max})"
        if plan.sequential
        else f"{len(plan.seeds)} seeds"
    )
    print(
        f"search {plan.space.name}: {plan.n_arms} arms + control x {seeds}, "
        f"{plan.scheduler.name} at steps {list(plan.milestones)}; output in {out}"
        + (f" (resumed, attempt {attempt})" if plan.resume else ""),
        flush=True,
    )
    return benchmarks, attempt


def _prepare_backend(plan: Plan) -> None:
    """The backend builds what it caches (e.g. the embedded base model) before any trial."""
    began = time.monotonic()
    print(
        f"preparing the {plan.backend_name} backend (a first run builds what it caches, e.g. the embedded base model)",
        flush=True,
    )
    with backend_errors(plan.backend_name, "prepare"):
        plan.backend.prepare()
    print(f"backend ready after {time.monotonic() - began:.0f} s", flush=True)


def _open_writers(plan: Plan, benchmarks: list[BenchmarkInfo], attempt: int) -> Writers:
    """The MLflow tracker (its experiment and search run opened now) and the results log."""
    from tune_dfrl.tracking.writer import SearchTracker
    from tune_dfrl.tune.results_log import ResultsLog

    if plan.tracking_uri == default_tracking_uri(plan.out):
        repoint_folder_store(plan.out)  # a search folder copied or moved, then resumed, writes only in its new place
    tracker = Guarded(
        SearchTracker(
            plan.tracking_uri,
            plan.experiment,
            _artifact_location(plan),
            plan.space.name,
            plan.control.arm_id,
            plan.metric,
            _flat_settings(plan.describe()),
            benchmarks,
            resume=plan.resume,
        ),
        "MLflow logging",
        "the search goes on without it; results.jsonl holds every milestone",
    )
    results_log = Guarded(
        ResultsLog(plan.out / RESULTS, plan.out / FAILURES, plan.metric, attempt),
        f"writing {plan.out / RESULTS}",
        "the search goes on (each cell keeps its milestones); it ends without a report",
    )
    return Writers(plan.out, tracker, results_log)


def _paired_searcher(plan: Plan, writers: Writers) -> tuple[Any, Path]:
    """`PairedRepeater` around Optuna's TPE on OUT/optuna.db. The study is a view of the searcher's events: a resume
    moves the earlier one aside (returned: restored if the replay fails) and the replay writes it anew. A confirm
    search (`plan.confirm`) searches nothing: `FixedArms` suggests the screen's top arms in order (no study)."""
    from tune_dfrl.tune.searcher import INNER_METRIC, PairedRepeater

    study, earlier_study = plan.out / OPTUNA_DB, plan.out / (OPTUNA_DB + ".before-resume")
    if plan.confirm is not None:
        from tune_dfrl.tune.fixed_arms import FixedArms

        inner: Any = FixedArms(plan.confirm.suggestions(), metric=INNER_METRIC)
    else:
        inner = _optuna_search(plan, study, earlier_study, INNER_METRIC)
    searcher = PairedRepeater(
        inner,
        plan.make_arm,
        plan.control,
        plan.seeds,
        plan.n_arms,
        max(plan.milestones),
        plan.metric,
        plan.searcher.max_duplicates,
        log_path=state_dir(plan.out) / STATE_LOG,
        sequential=plan.sequential,
        on_look=writers.on_look,
        on_control_equivalent=writers.on_control_equivalent,
    )
    return searcher, earlier_study


def _optuna_search(plan: Plan, study: Path, earlier_study: Path, metric: str) -> Any:
    """Optuna's TPE on `study` (a resume moves the earlier one aside to `earlier_study`)."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Define-by-run function passed in the `space` argument took")  # busy CPU
    sampler = optuna.samplers.TPESampler(
        seed=plan.searcher.seed, n_startup_trials=plan.searcher.n_startup_trials, multivariate=True, group=True
    )
    if plan.resume and earlier_study.exists():  # a driver killed while replaying left the earlier study aside
        study.unlink(missing_ok=True)
    elif plan.resume and study.exists():
        os.replace(study, earlier_study)
    return OptunaSearch(
        space=plan.space.sampler(),
        metric=metric,
        mode="max",
        sampler=sampler,
        storage=optuna.storages.RDBStorage(f"sqlite:///{study}"),
        study_name=OPTUNA_STUDY,
    )


def _paired_scheduler(plan: Plan, writers: Writers) -> Any:
    """The scheduler the settings name (`PairedScheduler` for the paired ones), its decisions to `writers`."""
    from tune_dfrl.tune.scheduler import make_scheduler

    return make_scheduler(
        plan.scheduler,
        metric=plan.metric,
        control=plan.control.arm_id,
        seeds=plan.seeds,
        milestones=plan.milestones,
        on_decision=writers.on_decision,
        log_path=state_dir(plan.out) / STATE_LOG,
    )


def _resume(plan: Plan, searcher: Any, scheduler: Any, writers: Writers, earlier_study: Path) -> None:
    """Replay the event log into the searcher and the scheduler (`_carry_over`). A log that does not replay leaves
    the folder as it was: the earlier study back in place, the MLflow runs ended."""
    try:
        _carry_over(plan, searcher, scheduler)  # may announce decisions (`Writers.on_decision`)
    except BaseException:
        _close_within(writers.tracker, "KILLED", CLOSE_TIMEOUT_S)
        if earlier_study.exists():
            os.replace(earlier_study, plan.out / OPTUNA_DB)
        raise
    earlier_study.unlink(missing_ok=True)


def _callbacks(plan: Plan, searcher: Any, scheduler: Any, writers: Writers) -> list[Callback]:
    """Tune's callbacks, in order: signals and a lost head first (`RaiseOnSignal`), every trial end booked
    (`TrialWatch`, which also hears of lost nodes), then the writers and the control cache."""
    from tune_dfrl.state.control_cache import ControlCacheWriter
    from tune_dfrl.tune.scheduler import PairedScheduler
    from tune_dfrl.tune.trial_watch import TrialWatch

    shown_progress = Guarded(writers.progress, "the progress line", "no more progress lines")
    watch = TrialWatch(
        searcher,
        scheduler.leave_out if isinstance(scheduler, PairedScheduler) else lambda trial: None,
        notify=[writers.results_log, writers.tracker, shown_progress],
        max_retries=plan.max_retries,
        on_wait=raise_if_signalled,
    )
    searcher.while_waiting = watch.while_waiting
    callbacks = [RaiseOnSignal(), watch, watch.lost_nodes, writers.results_log, writers.tracker, shown_progress]
    if plan.control_cache is not None:
        cache = ControlCache(
            plan.control_cache, plan.backend_name, plan.make_arm.recipe_hash, plan.control.arm_id, plan.milestones
        )
        _seed_control_cells(plan, cache)
        callbacks.append(
            Guarded(
                ControlCacheWriter(cache, plan.control.arm_id, plan.out / RESULTS),
                f"storing control results in the cache {plan.control_cache}",
                "the search goes on; later searches train their control again",
            )
        )
    return callbacks


def _run_tune(
    plan: Plan,
    searcher: Any,
    scheduler: Any,
    callbacks: list[Callback],
    resources: dict[str, float],
    attempt: int,
    writers: Writers,
) -> None:
    """Connect to Ray (a private node, or `ray.address`) and run `Tuner.fit`, each trial with `resources`, until the
    searcher ends the search; a signal or a lost head ends the MLflow runs as KILLED and raises."""
    import ray
    from ray import tune

    from tune_dfrl.tune.trial import CellJob, run_cell, trial_dirname

    job = CellJob(
        plan.backend, str(plan.out / CELLS), max(1, int(resources.get("cpu", 1))), plan.control.arm_id, plan.faults
    )
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Ray Tune status tables
    os.environ.setdefault(
        "TUNE_DISABLE_SIGINT_HANDLER", "1"
    )  # Ctrl-C raises Interrupted at once; resume=true continues
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)  # results live in results.jsonl
    logging.getLogger("ray.tune.utils.util").setLevel(
        logging.ERROR
    )  # "... may be a performance bottleneck" on a busy machine
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            from tune_dfrl.cluster.services import connect_ray

            connect_ray(plan.ray.address, plan.ray.num_cpus)
            handle_interrupts()
            _Signals.cluster = ClusterWatch(ray.get_runtime_context().gcs_address, _lost_cluster_hint(plan)).start()
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(run_cell, job=job), resources),
            tune_config=tune.TuneConfig(
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=-1,  # the searcher ends it
                metric=plan.metric,
                mode="max",
                reuse_actors=plan.backend.reuses_trial_actors,
                trial_dirname_creator=trial_dirname,
            ),
            run_config=tune.RunConfig(
                storage_path=str(plan.out / RAY),
                name="tune" if attempt == 0 else f"resume{attempt}",
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=plan.max_retries),
                callbacks=callbacks,
            ),
        )
        _Signals.deferred = True
        tuner.fit()
        if _Signals.received is not None:  # arrived after Tune's last step
            raise Interrupted(_Signals.received)
    except BaseException:
        _close_within(writers.tracker, "KILLED", CLOSE_TIMEOUT_S)
        raise
    finally:
        _Signals.deferred = False
        watch, _Signals.cluster = _Signals.cluster, None
        if watch is not None and watch.lost is None:
            watch.stop()  # the shutdown below stops the GCS: not a loss
        if started_ray:
            from tune_dfrl.cluster.services import stop_ray

            stop_ray()  # may block on a lost cluster: its watch ends the driver after GRACE_S
        if watch is not None:
            watch.stop()


def _lost_cluster_hint(plan: Plan) -> str:
    if plan.ray.address is None:
        return plan.resume_hint()
    return f"start the cluster again (or set ray.address=null to run on this machine), then {plan.resume_hint()}"


def _close_within(tracker: Guarded[SearchTracker], status: str, timeout_s: float) -> None:
    """End the MLflow runs with `status`, waiting at most `timeout_s` (a resume reopens runs left RUNNING)."""
    closing = threading.Thread(target=tracker.call, args=(tracker.inner.close, status), daemon=True)
    closing.start()
    closing.join(timeout_s)
    if closing.is_alive():
        print(
            f"warning: MLflow did not mark the runs {status} within {timeout_s:g} s; a resume reopens them", flush=True
        )


def _carry_over(plan: Plan, searcher: Any, scheduler: Any) -> None:
    """A resumed search replays the searcher's events (first: a decision announced below names its arms) and the
    rung book's, then continues them. With `retry_failed`, the cells that failed, and those of arms stopped for want
    of a seed to pair, run again."""
    from tune_dfrl.paired.ledger import FAILED, STOPPED
    from tune_dfrl.tune.scheduler import PairedScheduler

    searcher.replay()
    book = scheduler.book if isinstance(scheduler, PairedScheduler) else None
    if book is not None:
        scheduler.replay()
        if plan.retry_failed:
            scheduler.retry_failed()

    def run_again(arm_id: str, seed: int, end: str) -> bool:
        unpaired_stop = end == STOPPED and book is not None and book.stopped(arm_id) is None
        return plan.retry_failed and (end == FAILED or unpaired_stop)

    searcher.resume(plan.n_arms, run_again)


def _seed_control_cells(plan: Plan, cache: ControlCache) -> None:
    """Control seeds found in the cache get their milestone log from it: their trials replay it instead of training.
    A cache that cannot be read is reported once and left alone (the control is trained)."""
    for seed in plan.possible_seeds:
        log = cell_dir(plan.out / CELLS, plan.control.arm_id, seed) / MILESTONES
        try:
            cached = cache.get(seed)
        except (OSError, ValueError) as error:
            print(
                f"warning: the control cache {cache.folder} cannot be read ({error}); the control is trained",
                flush=True,
            )
            return
        if cached is not None and not any(r["final"] for r in read_records(log)):
            write_records(log, cached)


def _artifact_location(plan: Plan) -> str | None:
    """Artifacts next to a sqlite store; a tracking server decides its own."""
    return folder_artifacts(plan.out) if plan.tracking_uri.startswith("sqlite:") else None


def _flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            out.update(_flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
