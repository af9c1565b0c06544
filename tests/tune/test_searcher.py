"""PairedRepeater driven by hand (no Ray cluster): order, pairing, what Optuna is told, its event log and replay."""

from __future__ import annotations

import io
import itertools
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from ray.tune.experiment import Trial
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from tune_dfrl.paired.rungs import ArmDecision, RungBook, RungRule
from tune_dfrl.search.run import _carry_over
from tune_dfrl.state.records import append_record, read_records
from tune_dfrl.state.resume import STATE_FORMAT, STATE_LOG, state_dir
from tune_dfrl.tune.progress import Progress
from tune_dfrl.tune.scheduler import PairedScheduler
from tune_dfrl.tune.searcher import INNER_METRIC, PairedRepeater, ReplayError
from tune_dfrl.tune.spaces import ArmFactory, SearchSpace

SEEDS = (3, 7, 11)
CONTROL = {3: 40.0, 7: 50.0, 11: 60.0}  # control score at the final step 20, per seed
CONTROL_10 = {3: 30.0, 7: 35.0, 11: 40.0}


def repeater(
    space: SearchSpace,
    n_arms: int,
    storage: optuna.storages.BaseStorage,
    max_duplicates: int = 50,
    log_path: Path | None = None,
    binary_rewards: bool = False,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> PairedRepeater:
    sampler = sampler or optuna.samplers.TPESampler(seed=0)
    inner = OptunaSearch(
        space=space.sampler(), metric=INNER_METRIC, mode="max", sampler=sampler, storage=storage, study_name="s"
    )
    factory = ArmFactory(rollout_n=8, recipe_hash="r0", binary_rewards=binary_rewards)
    control = factory({"method": "baseline", "params": {}})
    return PairedRepeater(
        inner,
        factory,
        control,
        SEEDS,
        n_arms,
        final_step=20,
        metric="score/db",
        max_duplicates=max_duplicates,
        log_path=log_path,
    )


def hand_out(r: PairedRepeater, count: int) -> list[tuple[str, dict]]:
    ids = [f"t{len(r._cells) + i}" for i in range(count)]
    return [(tid, r.suggest(tid)) for tid in ids]


def finish(r: PairedRepeater, tid: str, scores: dict[int, float]) -> None:
    """Report milestones {step: score} then complete the trial."""
    for step, score in scores.items():
        r.on_trial_result(tid, {"step": step, "score/db": score})
    r.on_trial_complete(tid, {"step": max(scores), "score/db": scores[max(scores)]})


@pytest.fixture
def topk() -> SearchSpace:
    return SearchSpace.load("topk_keep", rollout_n=8)


def test_control_first_then_each_arm_on_the_same_explicit_seeds(topk: SearchSpace) -> None:
    r = repeater(topk, n_arms=2, storage=optuna.storages.InMemoryStorage())
    handed = hand_out(r, 9)
    arms = [cfg["arm"]["arm_id"] for _, cfg in handed]
    seeds = [cfg["seed"] for _, cfg in handed]
    assert arms[:3] == [r.control.arm_id] * 3 and handed[0][1]["arm"]["method"] == "baseline"
    assert len(set(arms[3:6])) == 1 and len(set(arms[6:9])) == 1 and arms[3] != arms[6] != r.control.arm_id
    assert seeds == list(SEEDS) * 3
    assert r.suggest("t9") is None  # nothing left to hand out, but cells still run
    for tid, _cfg in handed:
        finish(r, tid, {10: 1.0, 20: 2.0})
    assert r.suggest("t9") == Searcher.FINISHED


def test_optuna_gets_mean_paired_deltas_and_pruned_states(topk: SearchSpace) -> None:
    storage = optuna.storages.InMemoryStorage()
    r = repeater(topk, n_arms=2, storage=storage)
    handed = hand_out(r, 9)
    control, good, stopped = handed[0:3], handed[3:6], handed[6:9]
    # The good arm finishes before the control: Optuna must wait for the control's final values.
    good_scores = {3: 43.0, 7: 52.0, 11: 64.0}  # deltas +3, +2, +4 -> mean +3
    for tid, cfg in good:
        finish(r, tid, {10: CONTROL_10[cfg["seed"]] + 1.0, 20: good_scores[cfg["seed"]]})
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING] * 2
    for tid, cfg in control:
        finish(r, tid, {10: CONTROL_10[cfg["seed"]], 20: CONTROL[cfg["seed"]]})
    # The stopped arm reached step 10 on every seed (deltas -2, -4, -6), then the scheduler stopped it.
    for tid, cfg in stopped:
        r.on_trial_result(tid, {"step": 10, "score/db": CONTROL_10[cfg["seed"]] - {3: 2, 7: 4, 11: 6}[cfg["seed"]]})
    for tid, _ in stopped:
        r.on_trial_complete(tid)  # stopped while waiting: no result
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == pytest.approx(3.0)
    assert trials[0].intermediate_values == {10: pytest.approx(1.0)}
    assert trials[1].state == optuna.trial.TrialState.PRUNED
    assert trials[1].intermediate_values == {10: pytest.approx(-4.0)}
    assert r.cells_of(stopped[0][1]["arm"]["arm_id"]) == {3: "stopped", 7: "stopped", 11: "stopped"}


def test_duplicate_canonical_arms_run_once_and_share_the_outcome(tmp_path, caplog, monkeypatch) -> None:
    gfpo = SearchSpace.from_mapping(
        {"name": "tiny", "mechanism": "selection", "methods": {"gfpo": {"search": {"k": [2, 3]}}}}, rollout_n=8
    )
    storage = optuna.storages.InMemoryStorage()
    monkeypatch.setattr(
        logging.getLogger("tune_dfrl.tune.searcher"), "disabled", False
    )  # (an in-process Hydra run may)
    caplog.set_level(logging.INFO, logger="tune_dfrl.tune.searcher")
    r = repeater(gfpo, n_arms=5, storage=storage, max_duplicates=20, log_path=tmp_path / STATE_LOG)
    handed = []
    while (cfg := r.suggest(f"t{len(handed)}")) not in (None, Searcher.FINISHED):
        handed.append((f"t{len(handed)}", cfg))
    ids = [cfg["arm"]["arm_id"] for _, cfg in handed]
    assert len(handed) == 9 and len(set(ids)) == 3  # control + k=2 + k=3, three seeds each
    assert sorted(cfg["arm"]["params"]["k"] for _, cfg in handed[3:9:3]) == [2, 3]
    for tid, cfg in handed:
        base = CONTROL[cfg["seed"]]
        finish(r, tid, {10: base, 20: base + cfg["arm"]["params"].get("k", 0)})
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert len(trials) > 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.value == pytest.approx(t.params["gfpo.k"]) for t in trials)  # delta = k at every seed

    def logged() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == "tune_dfrl.tune.searcher"]

    assert len(logged()) > 20 and "the space is exhausted" in logged()[-1]  # the duplicates met, then the end
    caplog.clear()
    replayed = repeater(gfpo, 5, optuna.storages.InMemoryStorage(), max_duplicates=20, log_path=tmp_path / STATE_LOG)
    replayed.replay()  # a resume: the duplicates it meets again are not logged again
    assert logged() == [] and replayed.told == r.told


def test_a_suggestion_that_acts_as_the_control_is_passed_on_as_suggested_and_never_trained() -> None:
    band = SearchSpace.from_mapping(
        {
            "name": "tiny",
            "mechanism": "selection",
            "methods": {"difffilter": {"search": {"low": [0.0, 0.2], "high": [0.9, 1.0]}}},
        },
        rollout_n=8,
    )
    storage = optuna.storages.InMemoryStorage()
    r = repeater(band, n_arms=2, storage=storage, max_duplicates=8, binary_rewards=True)
    seen: list[dict] = []
    r.on_control_equivalent = seen.append
    handed = []
    while (cfg := r.suggest(f"t{len(handed)}")) not in (None, Searcher.FINISHED):
        handed.append((f"t{len(handed)}", cfg))
    trained = {cfg["arm"]["arm_id"] for _, cfg in handed}
    trials = optuna.load_study(study_name="s", storage=storage).trials
    # with binary rewards at n = 8 a band from below 1/8 to above 7/8 keeps every group: uniform GRPO
    as_control = [t for t in trials if t.params["difffilter.low"] < 0.125]
    assert as_control and [s["suggestion"] for s in seen] == [f"arm{t.number:04d}" for t in as_control]
    for s, t in zip(seen, as_control, strict=True):
        params = {"low": t.params["difffilter.low"], "high": t.params["difffilter.high"]}
        label = f"difffilter(low={params['low']:.3g}, high={params['high']:.3g})"
        assert (s["method"], s["params"], s["label"], s["arm_id"]) == ("difffilter", params, label, r.control.arm_id)
    assert len(handed) == len(trained) * len(SEEDS) and r.control.arm_id in trained  # the control's cells once


def test_state_survives_a_replay_of_its_log(topk: SearchSpace, tmp_path) -> None:
    first = repeater(topk, n_arms=3, storage=optuna.storages.InMemoryStorage(), log_path=tmp_path / STATE_LOG)
    handed = hand_out(first, 6)
    for tid, cfg in handed[:3]:
        finish(first, tid, {10: CONTROL_10[cfg["seed"]], 20: CONTROL[cfg["seed"]]})
    replayed = repeater(topk, n_arms=3, storage=optuna.storages.InMemoryStorage(), log_path=tmp_path / STATE_LOG)
    replayed.replay()
    assert replayed.ledger.ends(first.control.arm_id) == first.ledger.ends(first.control.arm_id)
    for tid, cfg in handed[3:6]:
        for r in (first, replayed):
            finish(r, tid, {10: 1.0, 20: CONTROL[cfg["seed"]] + 1.0})
    assert replayed.told == first.told and list(replayed.told.values()) == [("COMPLETE", pytest.approx(1.0))]
    assert [cfg for _, cfg in hand_out(replayed, 7)] == [cfg for _, cfg in hand_out(first, 7)]


def test_a_log_that_hands_out_another_cell_is_refused_by_name(topk: SearchSpace, tmp_path) -> None:
    log = tmp_path / STATE_LOG
    first = repeater(topk, n_arms=1, storage=optuna.storages.InMemoryStorage(), log_path=log)
    hand_out(first, 4)  # the control's three cells and the arm's first
    other = repeater(
        topk, 1, optuna.storages.InMemoryStorage(), log_path=log, sampler=optuna.samplers.TPESampler(seed=1)
    )
    with pytest.raises(
        ReplayError, match=rf"{log}: event 5 does not replay: the searcher hands out \['[0-9a-f]{{12}}', 3\]"
    ):
        other.replay()
    append_record(log, {"event": "result", "trial": "t9", "step": 10, "value": 1.0})  # a trial it never handed out
    again = repeater(topk, n_arms=1, storage=optuna.storages.InMemoryStorage(), log_path=log)
    with pytest.raises(ReplayError, match=r"event 6 does not replay \(KeyError\('t9'\)\); start the search again"):
        again.replay()


def test_a_stopped_arm_is_pruned_only_after_its_rung_delta_is_told(topk: SearchSpace) -> None:
    """The scheduler can stop an arm on a control value the searcher has not seen yet (same event)."""
    storage = optuna.storages.InMemoryStorage()
    r = repeater(topk, n_arms=1, storage=storage)
    handed = hand_out(r, 6)
    control, arm = handed[:3], handed[3:]
    for tid, cfg in control[:2]:
        r.on_trial_result(tid, {"step": 10, "score/db": CONTROL_10[cfg["seed"]]})
    for tid, cfg in arm:
        r.on_trial_result(tid, {"step": 10, "score/db": CONTROL_10[cfg["seed"]] - 3.0})
        r.on_trial_complete(tid)
    study = optuna.load_study(study_name="s", storage=storage)
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING
    r.on_trial_result(control[2][0], {"step": 10, "score/db": CONTROL_10[control[2][1]["seed"]]})
    trial = optuna.load_study(study_name="s", storage=storage).trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values == {10: pytest.approx(-3.0)}


def searched_arms(topk: SearchSpace, tmp_path: Path, kill_after: int | None) -> tuple[list[str], list]:
    """Arm ids in the order a 6-arm search hands them out (the search's kind of sampler: multivariate, grouped TPE,
    here after 2 random arms; each arm's score a function of its id), its cells ending one at a time; with `kill_after`, the driver is
    killed once that many arms have ended, between Optuna's ask of the next arm and its log line, and resumed as
    the driver does (the study deleted, the log replayed). Returns the arms and the study's trials."""
    tmp_path.mkdir()
    db, log = tmp_path / "optuna.db", tmp_path / STATE_LOG

    def start() -> PairedRepeater:
        sampler = optuna.samplers.TPESampler(seed=5, n_startup_trials=2, multivariate=True, group=True)
        return repeater(topk, 6, optuna.storages.RDBStorage(f"sqlite:///{db}"), log_path=log, sampler=sampler)

    r, order = start(), []
    while True:
        if kill_after is not None and len(r.arms) - 1 == kill_after and not r._queue and not r.open_cells():
            r.optuna.suggest(f"arm{r._suggested:04d}")  # the ask is stored; the kill lands before the log line
            db.unlink()
            r, kill_after = start(), None
            r.replay()
            r.resume(n_arms=6)
        [(tid, cfg)] = hand_out(r, 1)
        if cfg == Searcher.FINISHED:
            return order, optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials
        arm = cfg["arm"]["arm_id"]
        order += [arm] if arm not in order else []
        up = 0.0 if arm == r.control.arm_id else int(arm[:4], 16) % 7 / 2  # the arm's paired gain
        finish(r, tid, {10: CONTROL_10[cfg["seed"]] + up, 20: CONTROL[cfg["seed"]] + 2 * up})


@pytest.mark.parametrize("kill_after", [1, 4])
def test_a_search_killed_between_an_ask_and_its_log_line_resumes_into_the_uninterrupted_search(
    topk: SearchSpace, tmp_path, kill_after
) -> None:
    """The replay rebuilds the study and the sampler from the log (the lost ask is not in it), so the resumed search
    asks the same arms, in the random phase (1) and under TPE (4), and its study is the uninterrupted one's."""
    uninterrupted, trials = searched_arms(topk, tmp_path / "a", None)
    killed, again = searched_arms(topk, tmp_path / "b", kill_after)
    assert killed == uninterrupted and len(set(uninterrupted)) == 7
    shown = [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in trials]
    assert [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in again] == shown


def searched_to_the_end(topk: SearchSpace, log: Path, resumed: bool) -> tuple:
    """Drive a 3-arm search (grouped TPE after 2 random arms, in memory) one cell at a time to its end, each arm's
    scores a function of its id, its events appended to `log`; with `resumed`, first replay `log` and resume, as a
    restarted driver does. Returns what the search ended with: its arms in order, how each cell ended, what Optuna
    was told, and the study's trials."""
    storage = optuna.storages.InMemoryStorage()
    sampler = optuna.samplers.TPESampler(seed=5, n_startup_trials=2, multivariate=True, group=True)
    r = repeater(topk, 3, storage, log_path=log, sampler=sampler)
    if resumed:
        r.replay()
        r.resume(n_arms=3)
    for number in itertools.count():
        tid = f"{'r' if resumed else 't'}{number}"
        if (cfg := r.suggest(tid)) == Searcher.FINISHED:
            break
        arm, seed = cfg["arm"]["arm_id"], cfg["seed"]
        up = 0.0 if arm == r.control.arm_id else int(arm[:4], 16) % 7 / 2  # the arm's paired gain
        finish(r, tid, {10: CONTROL_10[seed] + up, 20: CONTROL[seed] + 2 * up})
    trials = optuna.load_study(study_name="s", storage=storage).trials
    return (
        list(r.arms),
        {arm: r.cells_of(arm) for arm in r.arms},
        r.told,
        [(t.number, t.state, t.params, t.value, t.intermediate_values) for t in trials],
    )


def test_a_search_cut_at_every_event_of_its_log_resumes_into_the_uninterrupted_search(
    topk: SearchSpace, tmp_path
) -> None:
    """A driver killed anywhere leaves a prefix of the searcher's log (each event is one appended line): for every
    prefix, the replayed and resumed search ends as the uninterrupted one did."""
    whole = tmp_path / "whole.jsonl"
    uninterrupted = searched_to_the_end(topk, whole, resumed=False)
    lines = whole.read_text().splitlines(keepends=True)
    assert len(uninterrupted[0]) == 4 and len(lines) > 40  # the control and 3 arms, 12 cells of 3-4 events each
    for cut in range(len(lines) + 1):
        log = tmp_path / f"cut{cut}.jsonl"
        log.write_text("".join(lines[:cut]))
        assert searched_to_the_end(topk, log, resumed=True) == uninterrupted, f"cut after {cut} events"


def test_a_result_lost_before_its_log_line_is_trained_again_and_told_once(topk: SearchSpace, tmp_path) -> None:
    """Killed after the arm's last cell ended but before its log line: the resume rebuilds the study without that
    end (Optuna's trial open again), the cell runs again, and Optuna is told the outcome the ledger holds, once."""
    log = tmp_path / STATE_LOG
    first = repeater(topk, n_arms=1, storage=optuna.storages.InMemoryStorage(), log_path=log)
    handed = hand_out(first, 6)
    for tid, cfg in handed[:5]:
        up = 0.0 if cfg["arm"]["arm_id"] == first.control.arm_id else 1.0  # the arm: +1 at step 10, +3 at 20
        finish(first, tid, {10: CONTROL_10[cfg["seed"]] + up, 20: CONTROL[cfg["seed"]] + 3 * up})
    shutil.copy(log, tmp_path / "before-the-end.jsonl")
    finish(first, "t5", {10: CONTROL_10[handed[5][1]["seed"]] + 1.0, 20: CONTROL[handed[5][1]["seed"]] + 3.0})
    assert first.told == {handed[3][1]["arm"]["arm_id"]: ("COMPLETE", pytest.approx(3.0))}
    shutil.copy(tmp_path / "before-the-end.jsonl", log)
    storage = optuna.storages.InMemoryStorage()
    resumed = repeater(topk, n_arms=1, storage=storage, log_path=log)
    resumed.replay()
    assert resumed.told == {} and optuna.load_study(study_name="s", storage=storage).trials[0].state.name == "RUNNING"
    resumed.resume(n_arms=1)
    [(tid, cfg)] = hand_out(resumed, 1)
    assert (cfg["arm"]["arm_id"], cfg["seed"]) == (handed[5][1]["arm"]["arm_id"], handed[5][1]["seed"])
    finish(resumed, tid, {10: CONTROL_10[cfg["seed"]] + 5.0, 20: CONTROL[cfg["seed"]] + 9.0})
    [trial] = optuna.load_study(study_name="s", storage=storage).trials
    assert (trial.state.name, trial.value) == ("COMPLETE", pytest.approx((3 + 3 + 9) / 3))
    assert trial.intermediate_values == {10: pytest.approx((1 + 1 + 5) / 3)}  # the rung's, told once
    assert resumed.suggest("t1") == Searcher.FINISHED


STATE_SHAPES = {  # the persisted shape of each state format (tune_dfrl.state.resume.STATE_FORMAT): each event's sorted keys
    3: {
        "events.jsonl": [
            ["arm", "event", "score", "seed", "step"], ["arm", "event", "seed"], ["cell", "event", "trial"],
            ["error", "event", "last", "trial"], ["event"], ["event", "n_arms"], ["event", "n_arms", "reopen"],
            ["event", "step", "trial", "value"], ["event", "trial"],
        ],
    },
}  # fmt: skip


def cell_trial(arm: str, seed: int) -> Trial:
    """A Tune trial of the cell (arm, seed), as the paired scheduler reads it (never run)."""
    return Trial("__fake", config={"arm": {"arm_id": arm}, "seed": seed}, stub=True)


def test_the_persisted_state_has_the_shape_of_its_format_version(topk: SearchSpace, tmp_path) -> None:
    """The keys of each kind of event in OUT/state/events.jsonl (the searcher's and the paired scheduler's) are the
    shape recorded for STATE_FORMAT: a change of shape must raise STATE_FORMAT (and record the new shape here), so that
    a folder of the old shape is refused with a message instead of failing inside a replay."""
    log = tmp_path / STATE_LOG
    searcher = repeater(topk, n_arms=3, storage=optuna.storages.InMemoryStorage(), log_path=log)
    handed = hand_out(searcher, 6)  # the control's three cells, then an arm's
    for tid, cfg in handed[:3]:
        finish(searcher, tid, {10: CONTROL_10[cfg["seed"]], 20: CONTROL[cfg["seed"]]})
    searcher.retry(handed[3][0])  # handed out again, as a new trial
    for tid, cfg in [("t6", searcher.suggest("t6")), *handed[4:]]:
        finish(searcher, tid, {10: 1.0, 20: CONTROL[cfg["seed"]] + 1.0})
    book = RungBook(RungRule(mode="race", confidence=0.8), rungs=[10, 20], control="C", seeds=(0, 1))
    scheduler = PairedScheduler(book, "score/db", log_path=log)
    for arm, seed, score in (("C", 0, 1.0), ("A", 0, 2.0), ("C", 1, 1.0), ("A", 1, 3.0)):
        scheduler.on_trial_result(None, cell_trial(arm, seed), {"step": 10, "score/db": score})
    scheduler.leave_out(cell_trial("A", 1))
    scheduler.retry_failed()
    searcher.resume(n_arms=3)

    shape = {STATE_LOG: sorted({tuple(sorted(event)) for event in read_records(log)})}
    assert book.decisions and searcher.told  # every kind of event a search persists is there
    expected = {log: sorted(tuple(keys) for keys in kinds) for log, kinds in STATE_SHAPES[STATE_FORMAT].items()}
    assert shape == expected, "the persisted state changed shape: raise tune_dfrl.state.resume.STATE_FORMAT"


def test_a_resume_whose_retry_stops_an_arm_at_once_names_the_arm_by_its_label(topk: SearchSpace, tmp_path) -> None:
    """`resume=true retry_failed=true`: the retry forgets the stop of an arm left with no seed to pair (every control
    seed failed after scoring the rung) and the book's scores decide that rung at once, during the carry-over. The
    driver restores the searcher before the book's replay, so the progress line names the arm by its label."""
    out = tmp_path / "out"
    state_dir(out).mkdir(parents=True)
    first = repeater(topk, n_arms=1, storage=optuna.storages.InMemoryStorage(), log_path=state_dir(out) / STATE_LOG)
    handed = hand_out(first, 6)  # the control's three cells, then the arm's
    arm = first.arms[handed[3][1]["arm"]["arm_id"]]
    book = RungBook(RungRule(mode="race", confidence=0.8), rungs=[10], control=first.control.arm_id, seeds=SEEDS)
    scheduler = PairedScheduler(book, "score/db", log_path=state_dir(out) / STATE_LOG)
    for _, cfg in handed[:3]:
        scheduler.on_trial_result(None, cell_trial(first.control.arm_id, cfg["seed"]), {"step": 10, "score/db": 50.0})
        scheduler.leave_out(cell_trial(first.control.arm_id, cfg["seed"]))
    for _, cfg in handed[3:]:
        scheduler.on_trial_result(
            None, cell_trial(arm.arm_id, cfg["seed"]), {"step": 10, "score/db": 10.0 + cfg["seed"]}
        )
    assert book.stopped(arm.arm_id).seeds == ()  # no seed to pair

    resumed = repeater(topk, n_arms=1, storage=optuna.storages.InMemoryStorage(), log_path=state_dir(out) / STATE_LOG)
    again, decided, lines = RungBook(book.rule, book.rungs, book.control, SEEDS), [], io.StringIO()
    progress = Progress(resumed, again, "score/db", total_cells=6, last_step=20, stream=lines)

    def on_decision(made: ArmDecision) -> None:  # as the driver's
        decided.append(made)
        progress.note_decision(made)

    scheduler = PairedScheduler(again, "score/db", on_decision, state_dir(out) / STATE_LOG)
    _carry_over(SimpleNamespace(out=out, retry_failed=True, n_arms=1), resumed, scheduler)
    [stop] = [d for d in decided if d.arm == arm.arm_id]
    assert not stop.decision.keep and stop.seeds == SEEDS  # decided on the scores, at once
    assert lines.getvalue().startswith(f"[0/6 cells] | stopped arm {arm.label} at step 10: ")
    assert arm.arm_id not in lines.getvalue() and arm.label != arm.arm_id
    handed_again = [cfg for _, cfg in hand_out(resumed, 3)]
    assert handed_again == [cfg for _, cfg in handed[:3]]  # the control's failed cells run again
