"""TrialWatch decision by decision: trials Tune ended in ERROR without telling anyone are retried as new trials of
their cell `max_retries` times, then failed through the same hooks as a crash; a search that has nothing to give
while no trial is live ends with SearchStalled after `stall_s`, and a signal ends it at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.tune.experiment import Trial

from tune_dfrl.tune import trial_watch
from tune_dfrl.tune.trial_watch import SearchStalled, TrialWatch


class Searcher:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.open: list[tuple[str, int]] = []

    def retry(self, trial_id: str) -> None:
        self.calls.append(("retry", trial_id))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.calls.append(("complete", trial_id, error))

    def open_cells(self) -> list[tuple[str, int]]:
        return self.open


class Recorder:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_trial_error(self, iteration: int, trials: list, trial: SimpleNamespace, **info) -> None:
        self.errors.append((trial.trial_id, info["attempts"]))


def trial(trial_id: str, status: str, seed: int = 0, error_file: str | None = None) -> SimpleNamespace:
    config = {"arm": {"arm_id": "a1", "label": "topk(k=2)"}, "seed": seed}
    return SimpleNamespace(trial_id=trial_id, status=status, config=config, error_file=error_file)


def watch(max_retries: int, **kwargs) -> tuple[TrialWatch, Searcher, list, Recorder]:
    searcher, left_out, recorder = Searcher(), [], Recorder()
    return TrialWatch(searcher, left_out.append, [recorder], max_retries, **kwargs), searcher, left_out, recorder


def test_a_lost_trial_is_retried_max_retries_times_then_failed_like_a_crash(tmp_path, capsys) -> None:
    error = tmp_path / "error.txt"
    error.write_text("Traceback\n_AbortTrialExecution: Trainable runner reuse requires reset_config()\n")
    w, searcher, left_out, recorder = watch(max_retries=2)
    trials: list[SimpleNamespace] = []
    for attempt in range(3):
        trials.append(trial(f"t{attempt}", Trial.ERROR, error_file=str(error)))
        w.on_step_begin(attempt, trials)
        w.on_step_begin(attempt, trials)  # seen once only
    assert searcher.calls == [("retry", "t0"), ("retry", "t1"), ("complete", "t2", True)]
    assert [t.trial_id for t in left_out] == ["t2"] and recorder.errors == [("t2", 3)]
    notes = capsys.readouterr().err.splitlines()
    assert notes[0].startswith("note: the trial of topk(k=2) seed 0 ended outside its run (_AbortTrialExecution")
    assert [n.split("; ")[-1] for n in notes] == [
        "running the cell again (retry 1 of 2)",
        "running the cell again (retry 2 of 2)",
        "no retry left: the cell failed",
    ]


def test_trials_whose_end_tune_reported_are_left_to_tune() -> None:
    w, searcher, left_out, recorder = watch(max_retries=0)
    crashed, done = trial("t0", Trial.ERROR), trial("t1", Trial.TERMINATED, seed=1)
    w.on_trial_error(0, [crashed, done], crashed)
    w.on_trial_complete(0, [crashed, done], done)
    w.on_step_begin(1, [crashed, done])
    assert searcher.calls == [] and left_out == [] and recorder.errors == []


def test_each_cell_has_its_own_retries() -> None:
    w, searcher, _, _ = watch(max_retries=1)
    w.on_step_begin(0, [trial("t0", Trial.ERROR, seed=0), trial("t1", Trial.ERROR, seed=1)])
    assert searcher.calls == [("retry", "t0"), ("retry", "t1")]


def test_waiting_with_no_live_trial_ends_the_search_after_stall_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch's clock is the test's (`time.monotonic` as trial_watch reads it), so a slow machine cannot stretch the
    time between two calls past `stall_s`."""
    now = [100.0]
    monkeypatch.setattr(trial_watch, "time", SimpleNamespace(monotonic=lambda: now[0]))
    w, searcher, _, _ = watch(max_retries=0, stall_s=0.2)
    searcher.open = [("a1", 3)]
    w.on_step_begin(0, [trial("t0", Trial.RUNNING)])
    now[0] += 0.3
    w.while_waiting()  # a trial was live when the step began: a normal wait
    w.on_step_begin(1, [trial("t0", Trial.TERMINATED)])
    w.while_waiting()
    now[0] += 0.15
    w.while_waiting()  # idle for less than stall_s
    now[0] += 0.15
    with pytest.raises(SearchStalled, match=r"no trial has run for 0.2 s .* \(cells it still waits for: a1 seed 3\)"):
        w.while_waiting()


def test_a_signal_ends_the_wait_at_once() -> None:
    class Signalled(BaseException):
        pass

    def on_wait() -> None:
        raise Signalled

    w, _, _, _ = watch(max_retries=0, on_wait=on_wait)
    w.on_step_begin(0, [])
    with pytest.raises(Signalled):
        w.while_waiting()
