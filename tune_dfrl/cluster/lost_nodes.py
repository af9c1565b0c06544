"""LostNodes: a cluster node lost mid-search is reported in one line, instead of Ray's and Tune's dumps.

When a node dies (its raylet killed, its machine gone), each trial whose actor ran there fails with a Ray actor
error (`ActorUnavailableError`, `ActorDiedError`); Tune retries it (`FailureConfig`) on a node still alive, and the
retry replays the cell's recorded milestones and trains on from its checkpoint. Ray would print a raylet log dump
and a "marked dead" message per lost node, Tune a traceback per trial. Instead, in the driver:

- Tune's traceback of a trial whose actor was lost (a `RayActorError` other than a failed start; a trial's own code
  fails with a `RayTaskError`) is not shown: the trial is remembered with its actor's node;
- Ray's node-death messages to the driver (`Raylet is terminated ...`, `The node with node id ... has been marked
  dead ...`) are not shown;
- at Tune's steps (every `poll_s`) the cluster's nodes are read; each node that was alive and is now dead gets one
  line: `note: lost node IP (id 1a2b3c4d, Ray's reason); its trials ARM seed K, ... run again from their last
  milestone` (`...; out of retries, failed: ARM seed K` for a trial out of retries). A trial whose actor
  was lost on a node that stays alive `alive_s` later gets its own note. The search's end waits up to `alive_s`
  for Ray to decide about the nodes of trials lost shortly before.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayActorError
from ray.tune import Callback
from ray.tune.experiment import Trial

POLL_S = 2.0  # how often the cluster's nodes are read
ALIVE_S = 30.0  # how long a lost trial's node may stay alive before its loss is put down to something else
TUNE_FAILURE = "Trial task failed for trial "  # Tune's log record of a trial's failure (with its traceback)
RAY_NODE_DEATH = ("Raylet is terminated", "The node with node id")  # Ray's messages to the driver on a node death


@dataclass(frozen=True)
class LostTrial:
    node: str  # id of the node its actor ran on ("" when unknown)
    label: str  # ARM seed K
    retried: bool
    error: str  # the first line of the actor error
    at: float  # time.monotonic() when Tune reported it


class LostNodes(Callback):
    """Notes each node lost mid-search once, with the trials that ran there; hides Ray's and Tune's dumps of it."""

    def __init__(self, poll_s: float = POLL_S, alive_s: float = ALIVE_S) -> None:
        self.poll_s = poll_s
        self.alive_s = alive_s
        self.errors: dict[str, RayActorError] = {}  # str(trial) -> its actor error, from Tune's log record
        self.lost: list[LostTrial] = []  # lost trials not yet noted
        self.alive: set[str] = set()  # ids of the nodes alive at the last read
        self.dead: set[str] = set()  # node ids noted as lost
        self.polled = float("-inf")

    def setup(self, **info: Any) -> None:
        logger = logging.getLogger("ray.tune.execution.tune_controller")
        for earlier in [f for f in logger.filters if isinstance(getattr(f, "__self__", None), LostNodes)]:
            logger.removeFilter(earlier)  # an earlier search's in this process, which would take this one's records
        logger.addFilter(self._hide_actor_loss)
        _hide_node_deaths()

    def on_trial_recover(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        self._remember(trial, retried=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Trial, **info: Any) -> None:
        self._remember(trial, retried=False)

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if time.monotonic() - self.polled >= self.poll_s:
            self._read_nodes()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        deadline = time.monotonic() + self.alive_s
        while self.lost and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, 1.0))
            self._read_nodes()
        self._read_nodes(final=True)

    # -- internals --------------------------------------------------------------------------------

    def _hide_actor_loss(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        message = str(record.msg)
        if isinstance(error, RayActorError) and not error.actor_init_failed and message.startswith(TUNE_FAILURE):
            self.errors[message.removeprefix(TUNE_FAILURE)] = error
            return False
        return True

    def _remember(self, trial: Trial, retried: bool) -> None:
        error = self.errors.pop(str(trial), None)
        if error is not None:
            label = f"{trial.config['arm']['label']} seed {trial.config['seed']}"
            first = str(error).strip().splitlines()[0]
            self.lost.append(LostTrial(_actor_node(error.actor_id), label, retried, first, time.monotonic()))

    def _read_nodes(self, final: bool = False) -> None:
        import ray

        self.polled = time.monotonic()
        try:
            nodes = {node["NodeID"]: node for node in ray.nodes()}
        except Exception:  # noqa: BLE001 - reading the cluster never fails the search; the next read tries again
            return
        for node_id, node in nodes.items():
            if not node["Alive"] and node_id not in self.dead and (node_id in self.alive or self._lost_on(node_id)):
                self.dead.add(node_id)
                on_node = [lost for lost in self.lost if lost.node == node_id]
                self.lost = [lost for lost in self.lost if lost.node != node_id]
                print(_node_note(node, on_node), file=sys.stderr, flush=True)
        self.alive = {node_id for node_id, node in nodes.items() if node["Alive"]}
        settled = [t for t in self.lost if final or t.node in self.dead or self.polled - t.at > self.alive_s]
        self.lost = [lost for lost in self.lost if lost not in settled]
        for lost in settled:
            where = f"lost node {lost.node[:8]}" if lost.node in self.dead else f"node {lost.node[:8] or '?'}"
            then = "it runs again from its last milestone" if lost.retried else "no retry left: the cell failed"
            print(
                f"note: the trial of {lost.label} lost its Ray actor on {where} ({lost.error}); {then}",
                file=sys.stderr,
                flush=True,
            )

    def _lost_on(self, node_id: str) -> bool:
        return any(lost.node == node_id for lost in self.lost)


def _node_note(node: dict[str, Any], lost: list[LostTrial]) -> str:
    reason = node.get("DeathReasonMessage") or "no reason given"
    note = f"note: lost node {node.get('NodeManagerAddress', '?')} (id {node['NodeID'][:8]}, {reason})"
    retried = [trial.label for trial in lost if trial.retried]
    failed = [trial.label for trial in lost if not trial.retried]
    if retried:
        note += f"; its trials {', '.join(retried)} run again from their last milestone"
    if failed:
        note += f"; out of retries, failed: {', '.join(failed)}"
    return note if lost else note + "; no trial of this search lost there so far"


def _actor_node(actor_id: str | None) -> str:
    """The id of the node the actor ran on, from the cluster's actor table ("" when unknown)."""
    from ray._private import state

    try:
        return state.actors(actor_id)["Address"]["NodeID"] if actor_id else ""
    except Exception:  # noqa: BLE001 - an actor the cluster no longer knows, or a cluster that does not answer
        return ""


def _hide_node_deaths() -> None:
    """Drop Ray's node-death messages to this driver (its `ray_listen_error_messages` thread prints them)."""
    from ray._private import worker

    shown = worker.print_to_stdstream
    if getattr(shown, "hides_node_deaths", False):
        return

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = data.get("lines") or [""]
        if not (data.get("pid") == "raylet" and str(lines[0]).startswith(RAY_NODE_DEATH)):
            shown(data, ignore_prefix)

    print_to_stdstream.hides_node_deaths = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_to_stdstream
