"""`Guarded` takes a writer's hooks as methods, never by name: a renamed method fails the search loudly where it is
named, instead of being reported as the writer failing and switching MLflow off for the rest of the run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tune_dfrl.search.finish import finish
from tune_dfrl.search.run import Trained
from tune_dfrl.tracking.writer import SearchTracker
from tune_dfrl.tune.guarded import Guarded
from tune_dfrl.tune.results_log import ResultsLog


def test_a_renamed_tracker_method_fails_loudly_not_as_an_mlflow_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delattr(SearchTracker, "close")  # as if renamed: the finish still calls it
    # Never initialised: the finish fails naming the method, before MLflow is touched.
    tracker = Guarded(SearchTracker.__new__(SearchTracker), "MLflow logging", "the search goes on without it")
    trained = Trained(tracker, results_error="OSError: disk full", control_failed=False)
    with pytest.raises(AttributeError, match="close"):
        finish(SimpleNamespace(out=tmp_path), trained)
    assert tracker.error is None and "MLflow logging failed" not in capsys.readouterr().err


def test_a_hook_of_another_object_is_refused(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl", tmp_path / "failures.jsonl", "score/db")
    guarded = Guarded(ResultsLog(tmp_path / "b.jsonl", tmp_path / "c.jsonl", "score/db"), "results", "goes on")
    with pytest.raises(TypeError, match="not a method of the guarded ResultsLog"):
        guarded.call(log.note_decision, None)
    assert guarded.error is None
