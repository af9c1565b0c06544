"""LostNodes step by step, with the cluster's node and actor tables stubbed (the real cluster case is
`test_reliability_servers.py::test_a_search_that_loses_a_node_finishes_every_cell_once_and_says_so`): Tune's traceback
of a trial whose actor was lost is hidden and the trial noted with its node, once per node that Ray marks dead; a trial
lost on a node still alive `alive_s` later gets its own note; Ray's node-death messages are dropped."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import ray
from ray._private import state, worker
from ray.exceptions import ActorUnavailableError, RayTaskError

from tune_dfrl.cluster.lost_nodes import LostNodes

ACTOR = b"\x01" * 16


class Trial(SimpleNamespace):
    def __str__(self) -> str:
        return self.name


def trial(name: str, seed: int) -> Trial:
    return Trial(name=name, config={"arm": {"arm_id": "a1", "label": "topk(k=2)"}, "seed": seed})


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bool]]:
    alive = {"n1": True, "n2": True}
    monkeypatch.setattr(
        ray,
        "nodes",
        lambda: [{"NodeID": n * 20, "Alive": a, "NodeManagerAddress": "10.0.0.9"} for n, a in alive.items()],
    )
    monkeypatch.setattr(state, "actors", lambda actor_id: {"Address": {"NodeID": "n2" * 20}})
    monkeypatch.setattr(worker, "print_to_stdstream", lambda data, ignore_prefix: print("RAY", data["lines"][0]))
    yield alive
    tune_log = logging.getLogger("ray.tune.execution.tune_controller")
    for hiding in [f for f in tune_log.filters if isinstance(getattr(f, "__self__", None), LostNodes)]:
        tune_log.removeFilter(hiding)


def fail(watch: LostNodes, name: str, error: Exception) -> bool:
    """Tune's log record of a trial's failure; returns whether it is shown."""
    record = logging.LogRecord("ray.tune.execution.tune_controller", logging.ERROR, "", 0, "", (), None)
    record.msg, record.exc_info = f"Trial task failed for trial {name}", (type(error), error, None)
    return watch._hide_actor_loss(record)


def test_a_lost_node_is_noted_once_with_its_trials(cluster: dict, capsys: pytest.CaptureFixture) -> None:
    watch = LostNodes(poll_s=0)
    watch.setup()
    watch.on_step_begin(0, [])  # both nodes alive
    assert fail(watch, "run_a", ActorUnavailableError("RpcError: Socket closed", ACTOR)) is False
    assert fail(watch, "run_b", RayTaskError("run_cell", "Traceback ...", ValueError("bad"))) is True
    watch.on_trial_recover(0, [], trial("run_a", 1))
    watch.on_trial_recover(0, [], trial("run_b", 2))  # its own code: not lost
    watch.on_step_begin(1, [])
    assert capsys.readouterr().err == ""  # n2 not yet marked dead
    cluster["n2"] = False
    watch.on_step_begin(2, [])
    watch.on_step_begin(3, [])
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        "note: lost node 10.0.0.9 (id n2n2n2n2, no reason given); its trials topk(k=2) seed 1 run again from their "
        "last milestone"
    ]
    worker.print_to_stdstream({"pid": "raylet", "lines": ["Raylet is terminated. ..."]}, False)
    worker.print_to_stdstream({"pid": "raylet", "lines": ["The node with node id: n2 ... marked dead"]}, False)
    worker.print_to_stdstream({"pid": "raylet", "lines": ["something else"]}, False)
    assert capsys.readouterr().out == "RAY something else\n"


def test_a_trial_lost_on_a_live_node_is_noted_alone(cluster: dict, capsys: pytest.CaptureFixture) -> None:
    watch = LostNodes(poll_s=0, alive_s=0)
    watch.setup()
    fail(watch, "run_a", ActorUnavailableError("RpcError: Socket closed", ACTOR))
    watch.on_trial_error(0, [], trial("run_a", 0))
    watch.on_experiment_end([])
    assert capsys.readouterr().err.splitlines() == [
        "note: the trial of topk(k=2) seed 0 lost its Ray actor on node n2n2n2n2 (The actor "
        "01010101010101010101010101010101 is unavailable: RpcError: Socket closed. The task may or may not have "
        "been executed on the actor.); no retry left: the cell failed"
    ]
