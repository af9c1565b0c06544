"""Bad input around resuming, the tracking server and the Ray address: each a clear error, found by
`plan_search` before anything is written or any trial starts, in seconds, and nothing on disk changes.
Plus what resuming relies on, without Ray: the searcher's and scheduler's saved state, the control cache's
entries, and results lines replayed as Tune results."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import optuna
import pytest
from ray.tune.experiment import Trial
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch
from reliability_helpers import TINY, free_port, tree_bytes
from search_helpers import search_cfg

from tune_dfrl.cluster.services import ServiceError, check_ray_address, check_tracking_uri
from tune_dfrl.config.settings import SchedulerSettings
from tune_dfrl.search.cli import plan_search, save_plan
from tune_dfrl.state.control_cache import ControlCache, code_digest
from tune_dfrl.state.records import flat_result, milestone_record, read_records
from tune_dfrl.state.resume import STATE_FORMAT
from tune_dfrl.tune.scheduler import make_scheduler
from tune_dfrl.tune.searcher import INNER_METRIC, PairedRepeater
from tune_dfrl.tune.spaces import ArmFactory, SearchSpace

FAST_S = 8.0  # a probe of an address that does not answer must not hang (probes time out after 5 s)


def plan(out: Path, *overrides: str):
    return plan_search(search_cfg(*TINY, "control_cache=null", *overrides, f"out={out}"))


def stored_settings(*changes: str) -> list[str]:
    """The overrides of the `stored` search, with `changes` (key=value) replacing or adding keys."""
    settings = dict(item.split("=", 1) for item in ("space=difffilter_band", "seeds=2", *changes))
    return [f"{key}={value}" for key, value in settings.items()]


def refused(out: Path, *overrides: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan(out, *overrides)


def probe_seconds(check: Callable[[str], object], address: str) -> float:
    """How long a service check takes to refuse `address`."""
    began = time.monotonic()
    with pytest.raises(ServiceError):
        check(address)
    return time.monotonic() - began


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """An output directory holding a search (search.json as run_search writes it) and a results line."""
    out = tmp_path / "out"
    out.mkdir()
    save_plan(plan(out, *stored_settings()))
    (out / "results.jsonl").write_text('{"arm_id": "0123456789ab", "seed": 0, "step": 2}\n')
    return out


# ------------------------------------------------------------------------------------- tracking server


def test_an_unreachable_tracking_server_is_refused_in_seconds(tmp_path: Path) -> None:
    port = free_port()
    refused(
        tmp_path / "out",
        f"mlflow.tracking_uri=http://127.0.0.1:{port}",
        match=rf"MLflow tracking server http://127.0.0.1:{port} is unreachable .*fix mlflow.tracking_uri",
    )
    assert not (tmp_path / "out").exists()
    assert probe_seconds(check_tracking_uri, f"http://127.0.0.1:{port}") < FAST_S


@pytest.fixture
def not_mlflow() -> Iterator[str]:
    """A real HTTP server on loopback that is not MLflow: every path answers 404."""

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook name
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_a_tracking_uri_that_is_not_an_mlflow_server_is_refused(tmp_path: Path, not_mlflow: str) -> None:
    refused(
        tmp_path / "out",
        f"mlflow.tracking_uri={not_mlflow}",
        match=rf"MLflow tracking server {not_mlflow} answered {not_mlflow}/health with HTTP 404",
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ Ray address


def test_a_ray_address_that_does_not_answer_is_refused_in_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    refused(
        tmp_path / "out",
        f"ray.address=127.0.0.1:{port}",
        match=rf"Ray cluster at ray.address='127.0.0.1:{port}' does not answer .*ray start --head",
    )
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # the environment variable is honoured, and checked too
    refused(tmp_path / "out", match=rf"Ray cluster at ray.address='127.0.0.1:{port}' does not answer")
    assert not (tmp_path / "out").exists()
    assert probe_seconds(check_ray_address, f"127.0.0.1:{port}") < FAST_S
    assert probe_seconds(check_ray_address, f"ray://127.0.0.1:{port}") < FAST_S


def test_resources_are_not_passed_to_a_running_cluster(tmp_path: Path) -> None:
    refused(
        tmp_path / "out",
        "ray.address=127.0.0.1:6379",
        "ray.num_cpus=2",
        match="ray.num_cpus sizes a private local cluster; the running cluster at '127.0.0.1:6379' owns its resources",
    )


# ----------------------------------------------------------------------------------------------- resume


def test_resume_needs_a_previous_search(tmp_path: Path) -> None:
    refused(
        tmp_path / "missing",
        "resume=true",
        match=r"resume=true: there is no previous search in .*missing \(no search.json\)",
    )
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "resume=true", match="there is no previous search in")
    with pytest.raises(ValueError, match="resume=true needs out=DIR"):
        plan_search(search_cfg(*TINY, "resume=true"))


@pytest.mark.parametrize(
    ("override", "difference"),
    [
        ("space=topk_keep", r"space.name: 'difffilter_band' -> 'topk_keep'"),
        (
            "space.methods.difffilter.search.high=[0.6,1.0]",
            r"space.methods.0.ranges.high: \[5e-324, 1.0\] -> \[0.6, 1.0\]",
        ),
        ("backend.lr=0.002", r"recipe.lr: 0.001 -> 0.002"),
        ("seeds=3", r"seeds: \[0, 1\] -> \[0, 1, 2\]"),
    ],
)
def test_resume_with_another_space_or_recipe_is_refused_and_changes_nothing(
    stored: Path, override: str, difference: str
) -> None:
    before = tree_bytes(stored)
    refused(
        stored,
        *stored_settings("resume=true", override),
        match=rf"resume=true: {stored} holds a different search \(.*{difference}.*\); resume with the settings it was started with",
    )
    assert tree_bytes(stored) == before


def test_resume_with_the_stored_settings_is_accepted_and_may_add_arms(stored: Path) -> None:
    resumed = plan(stored, *stored_settings("resume=true", "arms=9"))
    assert resumed.resume and resumed.n_arms == 9 and resumed.tracking_uri == f"sqlite:///{stored / 'mlflow.db'}"


@pytest.mark.parametrize("found", [0, STATE_FORMAT + 1, None])
def test_a_folder_of_another_state_format_is_refused_naming_both_versions(stored: Path, found: int | None) -> None:
    """A folder written by another tune_dfrl (its search.json names another `state_format`; None: the key absent,
    which is format 1) is refused before any of its state is read, and nothing changes; format 1 is accepted."""
    plan_file = stored / "search.json"
    written = json.loads(plan_file.read_text())
    assert written["state_format"] == STATE_FORMAT
    if found is None:
        del written["state_format"]
    else:
        written["state_format"] = found
    plan_file.write_text(json.dumps(written))
    if found is None and STATE_FORMAT == 1:
        assert plan(stored, *stored_settings("resume=true")).resume
        return
    before = tree_bytes(stored)
    shown = 1 if found is None else found
    refused(
        stored,
        *stored_settings("resume=true"),
        match=rf"resume=true: {stored} holds search state format {shown}; this tune_dfrl reads state format "
        rf"{STATE_FORMAT} only: continue it with the tune_dfrl version that started it",
    )
    assert tree_bytes(stored) == before


def test_a_new_search_never_overwrites_a_stored_one(stored: Path) -> None:
    before = tree_bytes(stored)
    refused(stored, *stored_settings(), match=f"{stored} already holds a search; pass resume=true to continue it")
    assert tree_bytes(stored) == before


def test_planted_faults_are_checked(tmp_path: Path) -> None:
    out = tmp_path / "out"
    refused(out, "fault_injection={arm: control, seed: 0, step: 2, when: 1}", match="keys arm, seed, step")
    refused(out, "fault_injection={arm: control, seed: 7, step: 2}", match=r"seed must be one of \[0, 1, 2, 3, 4, 5\]")
    refused(out, "fault_injection={arm: control, seed: 0, step: 3}", match=r"step one of the milestones \[2, 4\]")
    faults = plan(
        out, "fault_injection=[{arm: searched, seed: 1, step: 2}, {arm: control, seed: 0, step: 4, times: 1}]"
    ).faults
    assert [(f.arm, f.seed, f.step, f.times) for f in faults] == [("searched", 1, 2, None), ("control", 0, 4, 1)]


# ------------------------------------------------------------------------------------------ stored forms


def line(seed: int, step: int, final: bool) -> dict:
    """A results line as the driver writes it (with the driver-only fields `replayed` and `attempt`)."""
    return {
        "arm_id": "c0ffee000000",
        "label": "baseline",
        "method": "baseline",
        "params": {},
        "seed": seed,
        "step": step,
        "final": final,
        "threads": 1,
        "accuracy": {"math_add": 50.0},
        "length_chars": {"math_add": 12.5},
        "format_failure": {"math_add": 0.0},
        "aggregates": {"db": 50.0, "efficiency": 40.0},
        "train": {"loss": 0.1},
        "replayed": False,
        "attempt": 0,
    }


def test_a_results_line_replays_as_the_tune_result_it_came_from() -> None:
    record = line(3, 4, True)
    result = flat_result(record)
    assert result["score/db"] == 50.0 and result["acc/math_add"] == 50.0 and result["train/loss"] == 0.1
    rebuilt = milestone_record({k: record[k] for k in ("arm_id", "label", "method", "params")}, 3, result)
    assert rebuilt == {k: v for k, v in record.items() if k != "attempt"}


def test_the_control_cache_holds_only_complete_controls(tmp_path: Path) -> None:
    cache = ControlCache(tmp_path, "embedded", "5eed5eed5eed", "c0ffee000000", milestones=[2, 4])
    assert cache.get(0) is None
    cache.put(0, [line(0, 2, False), line(0, 4, True)])
    cache.put(1, [line(1, 2, False)])  # an unfinished control: never served
    assert cache.path(0) == tmp_path / "embedded" / f"5eed5eed5eed-{code_digest()}" / "c0ffee000000" / "seed0.jsonl"
    assert [r["step"] for r in cache.get(0)] == [2, 4] and "attempt" not in cache.get(0)[0]
    assert cache.get(1) is None
    assert ControlCache(tmp_path, "embedded", "5eed5eed5eed", "c0ffee000000", milestones=[2, 4, 6]).get(0) is None
    assert sorted(p.name for p in cache.folder.iterdir()) == ["seed0.jsonl", "seed1.jsonl"]  # no temporary files left


def test_the_control_cache_never_serves_results_of_other_training_code(tmp_path: Path, monkeypatch) -> None:
    import tune_dfrl.state.control_cache as control_cache

    assert control_cache.code_digest() == control_cache.code_digest() and len(control_cache.code_digest()) == 12
    ControlCache(tmp_path, "embedded", "5eed5eed5eed", "c0ffee000000", milestones=[2]).put(0, [line(0, 2, True)])
    assert ControlCache(tmp_path, "embedded", "5eed5eed5eed", "c0ffee000000", milestones=[2]).get(0) is not None
    monkeypatch.setattr(control_cache, "code_digest", lambda: "0123456789ab")  # the trainers' source changed
    assert ControlCache(tmp_path, "embedded", "5eed5eed5eed", "c0ffee000000", milestones=[2]).get(0) is None


# ------------------------------------------------------------------------------------------ saved state


def repeater(storage: str, state: Path) -> PairedRepeater:
    """A searcher as run_search builds it: Optuna on sqlite, every event appended to its log `state`."""
    inner = OptunaSearch(
        space=SearchSpace.load("topk_keep", rollout_n=8).sampler(),
        metric=INNER_METRIC,
        mode="max",
        sampler=optuna.samplers.TPESampler(seed=0),
        storage=optuna.storages.RDBStorage(storage),
        study_name="s",
    )
    factory = ArmFactory(rollout_n=8, recipe_hash="r0")
    return PairedRepeater(
        inner,
        factory,
        factory({"method": "baseline", "params": {}}),
        (0, 1),
        n_arms=1,
        final_step=4,
        metric="score/db",
        log_path=state,
    )


def report(r: PairedRepeater, trial_id: str, scores: dict[int, float], complete: bool) -> None:
    for step, score in scores.items():
        r.on_trial_result(trial_id, {"step": step, "score/db": score})
    if complete:
        r.on_trial_complete(trial_id, {"step": max(scores), "score/db": scores[max(scores)]})


def test_a_resumed_searcher_hands_out_only_the_cells_that_had_not_ended(tmp_path: Path) -> None:
    storage, state = f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path / "events.jsonl"
    first = repeater(storage, state)
    handed = {
        (cfg["arm"]["arm_id"], cfg["seed"]): tid for tid, cfg in ((f"t{i}", first.suggest(f"t{i}")) for i in range(4))
    }
    control, arm = first.control.arm_id, next(a for a, _ in handed if a != first.control.arm_id)
    report(first, handed[(control, 0)], {2: 30.0, 4: 40.0}, complete=True)
    report(first, handed[(control, 1)], {2: 31.0}, complete=False)  # killed mid-trial
    report(first, handed[(arm, 0)], {2: 33.0, 4: 45.0}, complete=True)  # (arm, 1) never reported
    del first  # the driver dies: only the searcher's log remains (the resume writes the study again from it)

    (tmp_path / "optuna.db").unlink()
    resumed = repeater(storage, state)
    resumed.replay()
    resumed.resume(n_arms=1)
    again = {
        (cfg["arm"]["arm_id"], cfg["seed"]): tid for tid, cfg in ((f"u{i}", resumed.suggest(f"u{i}")) for i in range(2))
    }
    assert set(again) == {(control, 1), (arm, 1)} and resumed.suggest("u2") is None  # nothing finished is handed out
    report(resumed, again[(control, 1)], {2: 31.0, 4: 41.0}, complete=True)
    report(resumed, again[(arm, 1)], {2: 35.0, 4: 47.0}, complete=True)
    assert resumed.suggest("u3") == Searcher.FINISHED
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) == 1 and study.trials[0].value == pytest.approx(((45 - 40) + (47 - 41)) / 2)


def test_the_paired_scheduler_leaves_out_a_seed_only_after_its_last_retry(tmp_path: Path) -> None:
    def scheduler():
        settings = SchedulerSettings()
        return make_scheduler(
            settings, metric="score/db", control="c", seeds=(0, 1), milestones=(2, 4), log_path=tmp_path / "rungs.jsonl"
        )

    live = scheduler()
    trial = Trial("__fake", config={"arm": {"arm_id": "a"}, "seed": 1}, stub=True, max_failures=1)
    trial.run_metadata.num_failures = 1
    trial.set_status(Trial.ERROR)  # Tune's state while it requeues a crashed trial for a retry
    live.on_trial_error(None, trial)
    assert live.book._seeds_for("a") == (0, 1)
    trial.run_metadata.num_failures = 2
    trial.set_status(Trial.RUNNING)  # the last crash: Tune reports the error of a trial it will not retry
    live.on_trial_error(None, trial)
    assert live.book._seeds_for("a") == (0,)
    restored = scheduler()
    restored.replay()  # the failure was logged, the retried crash was not
    assert restored.book._seeds_for("a") == (0,) and len(read_records(tmp_path / "rungs.jsonl")) == 1
