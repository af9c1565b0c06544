"""PairedRepeater: the searcher that turns arms into paired (arm, seed) trials.

The control arm comes first, at every seed; each arm the inner `OptunaSearch` suggests is then
fanned out to the *same* explicit seed list. One Optuna trial = one distinct arm: suggestions whose
canonical arm id was already seen are not trained again and receive the first one's outcome.

What Optuna is told (metric m, control c, seeds S_both where both have a value):
- at every milestone step t that the arm reached on all its seeds and the control on those seeds,
  the intermediate value mean_{s in S_both} [m(arm, s, t) - m(c, s, t)];
- when every seed of the arm finished: COMPLETE with the same mean paired delta at the final step;
- when the scheduler stopped the arm: PRUNED (Optuna then keeps the last intermediate value);
- when no seed finished: FAIL.
Raw means of truncated runs never reach Optuna.

With a `state_path`, the searcher's whole state (arms suggested, cell outcomes, what Optuna was
told, and the inner searcher with its study) is rewritten there atomically after every event, so
a driver killed at any moment leaves a consistent state that `resume` continues from.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from tune_dfrl.backend import ArmSpec
from tune_dfrl.resume import save_atomically

log = logging.getLogger(__name__)

INNER_METRIC = "paired_delta"
FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"


def arm_config(arm: ArmSpec, seed: int) -> dict[str, Any]:
    """The Tune trial config of one (arm, seed) cell."""
    return {"arm": asdict(arm), "seed": int(seed)}


class PairedRepeater(Searcher):
    """Control first, then each distinct suggested arm at the same seeds; tells Optuna paired deltas.

    `make_arm` turns an inner suggestion (a dict with `method` and `params`) into an `ArmSpec`
    whose `arm_id` is the canonical id. At most `n_arms` distinct arms besides the control; after
    `max_duplicates` consecutive suggestions of already-seen arms the space counts as exhausted.
    """

    def __init__(
        self,
        searcher: OptunaSearch,
        make_arm: Callable[[dict[str, Any]], ArmSpec],
        control: ArmSpec,
        seeds: Sequence[int],
        n_arms: int,
        final_step: int,
        metric: str,
        max_duplicates: int = 50,
        state_path: Path | None = None,
    ) -> None:
        super().__init__(metric=metric, mode="max")
        self.state_path = state_path
        self.searcher = searcher
        self._make_arm = make_arm
        self.control = control
        self.seeds = tuple(int(s) for s in seeds)
        self.n_arms = n_arms
        self.final_step = final_step
        self.max_duplicates = max_duplicates
        self.arms: dict[str, ArmSpec] = {}  # arm id -> arm, in order of first suggestion (control first)
        self._queue: list[dict[str, Any]] = []  # configs still to hand out
        self._optuna_ids: dict[str, list[str]] = {}  # arm id -> inner trial ids (first one + duplicates)
        self._cells: dict[str, tuple[str, int]] = {}  # Tune trial id -> (arm id, seed)
        self._scores: dict[str, dict[int, dict[int, float]]] = {}  # arm id -> seed -> step -> metric
        self._ends: dict[str, dict[int, str]] = {}  # arm id -> seed -> finished | stopped | failed
        self._intermediate: dict[str, dict[int, float]] = {}  # arm id -> step -> intermediate value told
        self.told: dict[str, tuple[str, float | None]] = {}  # arm id -> (Optuna state name, value)
        self._told_inner: set[str] = set()
        self._suggested = 0  # inner suggestions made (distinct or not)
        self._exhausted = False  # max_duplicates consecutive duplicates seen

    # -- Searcher interface -------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return metric in (None, self._metric) and mode in (None, "max")

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next (arm, seed) config; None while arms run but none is left to hand out; FINISHED at the end.

        FINISHED waits until every handed-out cell ended: Ray Tune keeps (and reuses) idle trial
        actors only while the search is unfinished, and paused trials resume on them.
        """
        if not self._queue and not self._enqueue_next_arm():
            ended = all(seed in self._ends.get(arm_id, {}) for arm_id, seed in self._cells.values())
            return Searcher.FINISHED if ended else None  # (cells ended before a resume are not handed out again)
        config = self._queue.pop(0)
        self._cells[trial_id] = (config["arm"]["arm_id"], config["seed"])
        self._persist()
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        arm_id, seed = self._cells[trial_id]
        self._record(arm_id, seed, result)
        self._report_intermediate(arm_id, int(result["step"]))
        if arm_id == self.control.arm_id:
            for other in self.arms:
                if other != arm_id:
                    self._report_intermediate(other, int(result["step"]))
                    self._maybe_tell(other)  # a stopped arm may have waited for this control value
        self._persist()

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        arm_id, seed = self._cells[trial_id]
        if result and "step" in result and self._metric in result:
            self._record(arm_id, seed, result)  # a result that made the scheduler stop the trial arrives here only
            self._report_intermediate(arm_id, int(result["step"]))
        reached = max(self._scores.get(arm_id, {}).get(seed, {0: 0.0}))
        end = FAILED if error else FINISHED if reached >= self.final_step else STOPPED
        self._ends.setdefault(arm_id, {})[seed] = end
        for other in self.arms:
            self._maybe_tell(other)
        self._persist()

    def get_state(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("searcher", "_make_arm", "state_path")}

    def set_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.get_state(), "searcher": self.searcher}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.set_state(saved["state"])
        self.searcher = saved["searcher"]

    def resume(self, checkpoint_path: str | Path, n_arms: int,
               run_again: Callable[[str, int, str], bool] = lambda arm_id, seed, end: False) -> None:
        """Continue a saved search with up to `n_arms` searched arms: known arms keep their ids and outcomes,
        Optuna its study; every cell that has not ended (finished, stopped or failed), and every ended cell
        for which `run_again(arm_id, seed, end)` holds, is queued again."""
        self.restore(str(checkpoint_path))
        self.n_arms = n_arms
        self._cells = {}
        for arm_id, ends in self._ends.items():
            for seed in [seed for seed, end in ends.items() if run_again(arm_id, seed, end)]:
                del ends[seed]
        self._queue = [arm_config(arm, seed) for arm_id, arm in self.arms.items()
                       for seed in self.seeds if seed not in self._ends.get(arm_id, {})]

    # -- what the driver and tests read ---------------------------------------------------------

    def cells_of(self, arm_id: str) -> dict[int, str]:
        """seed -> finished | stopped | failed, for the seeds of `arm_id` that ended."""
        return dict(self._ends.get(arm_id, {}))

    def control_failed(self) -> bool:
        """True when every control seed failed: no arm can be compared, so none is suggested."""
        ends = self._ends.get(self.control.arm_id, {})
        return all(ends.get(seed) == FAILED for seed in self.seeds)

    def paired_deltas(self, arm_id: str, step: int) -> dict[int, float]:
        """seed -> m(arm, seed, step) - m(control, seed, step), over the seeds where both have a value."""
        mine, control = self._scores.get(arm_id, {}), self._scores.get(self.control.arm_id, {})
        common = sorted(s for s in mine if step in mine[s] and s in control and step in control[s])
        return {s: mine[s][step] - control[s][step] for s in common}

    # -- internals --------------------------------------------------------------------------

    def _persist(self) -> None:
        if self.state_path is not None:
            save_atomically(self.state_path, self.save)

    def _enqueue_next_arm(self) -> bool:
        """Queue the next distinct arm's seeds (the control first); False when the search is over."""
        if not self.arms:
            return self._enqueue(self.control, inner_id=None)
        if len(self.arms) - 1 >= self.n_arms or self._exhausted or self.control_failed():
            return False
        for _ in range(self.max_duplicates):
            inner_id = f"arm{self._suggested:04d}"
            self._suggested += 1
            arm = self._make_arm(self.searcher.suggest(inner_id))
            if arm.arm_id not in self.arms:
                return self._enqueue(arm, inner_id)
            log.info("suggestion %s duplicates arm %s (%s): not trained again", inner_id, arm.arm_id, arm.label)
            self._optuna_ids.setdefault(arm.arm_id, []).append(inner_id)
            for step, value in self._intermediate.get(arm.arm_id, {}).items():  # what the first one was told so far
                self.searcher.on_trial_result(inner_id, {INNER_METRIC: value, "training_iteration": step})
            self._maybe_tell(arm.arm_id)
        log.warning("%d consecutive suggestions duplicated known arms: the space is exhausted", self.max_duplicates)
        self._exhausted = True
        return False

    def _enqueue(self, arm: ArmSpec, inner_id: str | None) -> bool:
        self.arms[arm.arm_id] = arm
        if inner_id is not None:
            self._optuna_ids.setdefault(arm.arm_id, []).append(inner_id)
        self._queue.extend(arm_config(arm, seed) for seed in self.seeds)
        return True

    def _record(self, arm_id: str, seed: int, result: dict) -> None:
        by_step = self._scores.setdefault(arm_id, {}).setdefault(seed, {})
        by_step.setdefault(int(result["step"]), float(result[self._metric]))

    def _report_intermediate(self, arm_id: str, step: int) -> None:
        """Tell Optuna the mean paired delta at a milestone before the last, once all live seeds reached it."""
        told = self._intermediate.setdefault(arm_id, {})
        if step >= self.final_step or step in told or arm_id in self.told or not self._optuna_ids.get(arm_id):
            return
        ended = self._ends.get(arm_id, {})
        live = [s for s in self.seeds if ended.get(s) != FAILED]
        deltas = self.paired_deltas(arm_id, step)
        if not live or set(deltas) != set(live):
            return
        value = told[step] = float(np.mean(list(deltas.values())))
        for inner_id in self._optuna_ids[arm_id]:
            self.searcher.on_trial_result(inner_id, {INNER_METRIC: value, "training_iteration": step})

    def _rung_value_told(self, arm_id: str, ends: dict[int, str], control_ends: dict[int, str]) -> bool:
        """For a stopped arm: True once its paired delta at the stopping step is told, or can never be."""
        reached = [max(self._scores[arm_id][s]) for s, end in ends.items() if end == STOPPED and s in self._scores.get(arm_id, {})]
        if not reached:
            return True
        step = min(reached)
        self._report_intermediate(arm_id, step)
        told = step in self._intermediate.get(arm_id, {})
        return told or all(s in control_ends for s in ends)

    def _maybe_tell(self, arm_id: str) -> None:
        """Tell Optuna how an arm ended, once all its seeds ended and the control values it needs exist.

        A suggestion that duplicates the control gets the control's paired delta against itself (0).
        """
        if not self._optuna_ids.get(arm_id):
            return
        if arm_id not in self.told:
            ends = self._ends.get(arm_id, {})
            control_ends = self._ends.get(self.control.arm_id, {})
            finished = [s for s, end in ends.items() if end == FINISHED]
            if len(ends) < len(self.seeds) or any(s not in control_ends for s in finished):
                return  # the arm, or the control at one of its finished seeds, is still running
            deltas = self.paired_deltas(arm_id, self.final_step)
            if STOPPED in ends.values():
                if not self._rung_value_told(arm_id, ends, control_ends):
                    return  # the control has not reached the stopping rung at every seed yet
                self.told[arm_id] = (optuna.trial.TrialState.PRUNED.name, None)
            elif deltas:
                self.told[arm_id] = (optuna.trial.TrialState.COMPLETE.name, float(np.mean(list(deltas.values()))))
            else:
                self.told[arm_id] = (optuna.trial.TrialState.FAIL.name, None)
        state, value = self.told[arm_id]
        for inner_id in self._optuna_ids[arm_id]:
            if inner_id not in self._told_inner:
                self._told_inner.add(inner_id)
                result = None if value is None else {INNER_METRIC: value}
                self.searcher.on_trial_complete(inner_id, result=result, error=state == "FAIL")
