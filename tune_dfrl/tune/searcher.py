"""PairedRepeater: the searcher that turns arms into paired (arm, seed) trials (Ray Tune / Optuna glue).

The control arm comes first, at every seed; each arm the inner `OptunaSearch` suggests is then
fanned out to the *same* explicit seed list. One Optuna trial = one distinct arm: suggestions whose
canonical arm id was already seen are not trained again and receive the first one's outcome; one that acts
as the control is also passed, as suggested, to `on_control_equivalent` (the driver records it).
Scores and cell ends go to one `PairedLedger`; what Optuna is told (intermediate mean paired
deltas, then COMPLETE / PRUNED / FAIL) is decided by `tune_dfrl.paired.feedback.OptunaFeedback`, and
passed on here to every inner trial of the arm.

With a `log_path`, every call that changes the searcher (a cell handed out, a suggestion asked of
Optuna, a look; a result, a trial's end, a retry, a resume) is appended there as one JSON event once
it has taken effect and before the call returns; `replay` applies the events again, in order, to a
searcher built afresh on an empty study. A driver killed at any moment leaves a log whose replay is a
state the search was in (an event it cut off is lost whole: its cell runs again, its ask is asked
again). Optuna's study (TPE, seeded) is a view of that log: the same asks and tells in the same order
give the same trials and the same sampler state. A control-equivalent suggestion is passed to
`on_control_equivalent` after its event is recorded; a look is passed to `on_look` before (a look cut
off is taken again from the same ledger and gives the same history).

With a `sequential` rule (seeds=auto) every arm and the control start on the rule's starting seeds;
when every cell handed out has ended and no arm is left to suggest, `tune_dfrl.paired.seed_batches` takes
a look and the open arms and the control get the next batch of seeds (`on_look` receives the
history after each look). Optuna is told once per arm, on the starting seeds; later seeds do not
tell it again. No arm is suggested after the first look (a resume may not add arms then).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.errors import ReplayError
from tune_dfrl.paired.feedback import FAIL, INTERMEDIATE, OptunaFeedback, Told
from tune_dfrl.paired.ledger import FAILED, PairedLedger
from tune_dfrl.paired.rungs import BOOK_EVENTS
from tune_dfrl.paired.seed_batches import SeedBatches
from tune_dfrl.paired.sequential import SequentialRule
from tune_dfrl.state.records import append_record, read_records
from tune_dfrl.tune.spaces import arm_label

log = logging.getLogger(__name__)

INNER_METRIC = "paired_delta"
START, SUGGEST, RESULT, COMPLETE, RETRY, RESUME = "start", "suggest", "result", "complete", "retry", "resume"


_AGAIN = "; start the search again in another out=DIR"


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
        log_path: Path | None = None,
        sequential: SequentialRule | None = None,
        on_look: Callable[[dict[str, Any]], None] | None = None,
        while_waiting: Callable[[], None] | None = None,
        on_control_equivalent: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(metric=metric, mode="max")
        self.log_path = log_path
        self.on_look = on_look
        self.on_control_equivalent = on_control_equivalent
        self.while_waiting = while_waiting  # runs whenever suggest has nothing to give (Tune may be waiting on it)
        # not `self.searcher`: Ray Tune would take this class for a wrapper and snapshot the inner one
        self.optuna = searcher
        self._make_arm = make_arm
        self.control = control
        self.seeds = tuple(int(s) for s in seeds)
        self.n_arms = n_arms
        self.max_duplicates = max_duplicates
        # The same events as the rung book's ledger, folded in the order Tune tells the searcher (results and ends
        # reach the searcher and the scheduler at different times), so each decides on what it has been told.
        self.ledger = PairedLedger(control.arm_id)
        self.feedback = OptunaFeedback(self.ledger, self.seeds, final_step)
        self.batches = SeedBatches(sequential, control.arm_id) if sequential is not None else None
        self.arms: dict[str, ArmSpec] = {}  # arm id -> arm, in order of first suggestion (control first)
        self._queue: list[dict[str, Any]] = []  # configs still to hand out
        self._optuna_ids: dict[str, list[str]] = {}  # arm id -> inner trial ids (first one + duplicates)
        self._cells: dict[str, tuple[str, int]] = {}  # Tune trial id -> (arm id, seed)
        self._told_inner: set[str] = set()  # inner trial ids told their outcome
        self._suggested = 0  # inner suggestions made (distinct or not)
        self._started = False  # the log holds this search's START event
        self._equivalents: list[dict[str, Any]] = []  # control-equivalent suggestions met by the current `suggest`
        self._exhausted = False  # max_duplicates consecutive duplicates seen

    @property
    def told(self) -> dict[str, tuple[str, float | None]]:
        """arm id -> (Optuna state name, value) of the arms whose outcome Optuna was told."""
        return {arm: (told.state, told.value) for arm, told in self.feedback.outcome.items()}

    # -- Searcher interface -------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return metric in (None, self._metric) and mode in (None, "max")

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The next (arm, seed) config; None while arms run but none is left to hand out; FINISHED at the end.

        FINISHED waits until every handed-out cell ended: Ray Tune keeps (and reuses) idle trial
        actors only while the search is unfinished, and paused trials resume on them.
        """
        before = self._position()
        config = self._hand_out(trial_id)
        if isinstance(config, dict) or self._position() != before:
            self._record({"event": SUGGEST, "trial": trial_id, "cell": _cell(config)})
        equivalents, self._equivalents = self._equivalents, []
        for suggestion in equivalents if self.on_control_equivalent is not None else ():
            self.on_control_equivalent(suggestion)
        if config is None and self.while_waiting is not None:
            self.while_waiting()
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._take(
            {"event": RESULT, "trial": trial_id, "step": int(result["step"]), "value": float(result[self._metric])}
        )

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        # a result that made the scheduler stop the trial arrives here only
        last = (
            [int(result["step"]), float(result[self._metric])]
            if result and "step" in result and self._metric in result
            else None
        )
        self._take({"event": COMPLETE, "trial": trial_id, "error": bool(error), "last": last})

    def retry(self, trial_id: str) -> None:
        """The trial ended without a result reaching the search (`tune_dfrl.tune.trial_watch`): its cell is handed out
        again first, as a new trial."""
        self._take({"event": RETRY, "trial": trial_id})

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        """Nothing: the searcher's state is its event log (`log_path`), not Tune's experiment snapshot."""

    def replay(self) -> None:
        """Rebuild the state of a search from its events in `log_path`, applied in order to this searcher (built as
        the search built it, its Optuna study empty); the driver's callbacks are not called, and nothing is logged
        again (the duplicates and looks met were logged when they happened). ReplayError when an event does not
        apply or a handed-out cell differs from the logged one (the log belongs to another space, sampler or
        version of tune_dfrl or Optuna)."""
        on_look, self.on_look = self.on_look, None
        was_disabled, log.disabled = log.disabled, True
        try:
            for number, event in enumerate(read_records(self.log_path), 1):
                if event["event"] in BOOK_EVENTS:
                    continue  # the paired scheduler's (one log, `tune_dfrl.state.resume.STATE_LOG`)
                try:
                    if event["event"] == SUGGEST:
                        got, self._equivalents = _cell(self._hand_out(event["trial"])), []  # (announced back then)
                    else:
                        self._apply(event)
                        got = None
                except (KeyError, ValueError, TypeError) as error:
                    raise ReplayError(f"{self.log_path}: event {number} does not replay ({error!r}){_AGAIN}") from None
                if got != event.get("cell"):
                    raise ReplayError(
                        f"{self.log_path}: event {number} does not replay: the searcher hands out {got!r} where the "
                        f"log has {event['cell']!r}{_AGAIN}"
                    )
        finally:
            self.on_look, log.disabled = on_look, was_disabled

    def resume(self, n_arms: int, run_again: Callable[[str, int, str], bool] = lambda arm_id, seed, end: False) -> None:
        """Continue a search that `replay` rebuilt, with up to `n_arms` searched arms: known arms keep their ids
        and outcomes, Optuna its study; every cell that has not ended (finished, stopped or failed), and every ended
        cell for which `run_again(arm_id, seed, end)` holds, is queued again."""
        again = [[a, s] for a in self.arms for s, end in self.ledger.ends(a).items() if run_again(a, s, end)]
        self._take({"event": RESUME, "n_arms": n_arms, "reopen": again})

    # -- what the driver and tests read ---------------------------------------------------------

    def seeds_of(self, arm_id: str) -> tuple[int, ...]:
        """The seeds handed to `arm_id`: the search's seeds, or under seeds=auto its starting seeds and batches."""
        return self.batches.seeds_of(arm_id) if self.batches is not None else self.seeds

    def cells_of(self, arm_id: str) -> dict[int, str]:
        """seed -> finished | stopped | failed, for the seeds of `arm_id` that ended."""
        return self.ledger.ends(arm_id)

    def open_cells(self) -> list[tuple[str, int]]:
        """(arm id, seed) of the cells handed out that have not ended (cells ended before a resume are not
        handed out again)."""
        return [(arm_id, seed) for arm_id, seed in self._cells.values() if seed not in self.ledger.ends(arm_id)]

    def control_failed(self) -> bool:
        """True when every control seed failed: no arm can be compared, so none is suggested."""
        ends = self.ledger.ends(self.control.arm_id)
        return all(ends.get(seed) == FAILED for seed in self.seeds)

    # -- internals --------------------------------------------------------------------------

    def _position(self) -> tuple[int, int, int, bool, int]:
        """What a call to `suggest` can change besides the cell it hands out (recorded when it changes)."""
        looks = len(self.batches.looks) if self.batches is not None else 0
        return self._suggested, len(self.arms), len(self._queue), self._exhausted, looks

    def _hand_out(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._queue and not self._enqueue_next_arm():
            if self.open_cells():
                return None
            if not self._next_batch():
                return Searcher.FINISHED
        config = self._queue.pop(0)
        self._cells[trial_id] = (config["arm"]["arm_id"], config["seed"])
        return config

    def _take(self, event: dict[str, Any]) -> None:
        self._apply(event)
        self._record(event)

    def _record(self, event: dict[str, Any]) -> None:
        """Append `event` to the log; the searcher's first event says how many arms were asked for (a resume may
        change it)."""
        if self.log_path is None:
            return
        if not self._started:
            self._started = True
            append_record(self.log_path, {"event": START, "n_arms": self.n_arms})
        append_record(self.log_path, event)

    def _apply(self, event: dict[str, Any]) -> None:
        """Every event but SUGGEST (which `_hand_out` applies)."""
        kind = event["event"]
        if kind == START:
            self.n_arms, self._started = event["n_arms"], True
        elif kind == RESULT:
            arm_id, seed = self._cells[event["trial"]]
            self._tell(self.feedback.result(arm_id, seed, event["step"], event["value"]))
        elif kind == COMPLETE:
            arm_id, seed = self._cells[event["trial"]]
            last = tuple(event["last"]) if event["last"] is not None else None
            self._tell(self.feedback.end(arm_id, seed, event["error"], last))
        elif kind == RETRY:
            arm_id, seed = self._cells.pop(event["trial"])
            self._queue.insert(0, arm_config(self.arms[arm_id], seed))
        elif kind == RESUME:
            self.n_arms, self._cells = event["n_arms"], {}
            for arm_id, seed in event["reopen"]:
                self.ledger.reopen(arm_id, seed)
            self._queue = [
                arm_config(arm, seed)
                for arm_id, arm in self.arms.items()
                for seed in self.seeds_of(arm_id)
                if seed not in self.ledger.ends(arm_id)
            ]
        else:
            raise ValueError(f"{self.log_path}: unknown searcher event {kind!r}")

    def _enqueue_next_arm(self) -> bool:
        """Queue the next distinct arm's seeds (the control first); False when the search is over."""
        if not self.arms:
            return self._enqueue(self.control, inner_id=None)
        if len(self.arms) - 1 >= self.n_arms or self._exhausted or self.control_failed() or self._looked():
            return False
        for _ in range(self.max_duplicates):
            inner_id = f"arm{self._suggested:04d}"
            self._suggested += 1
            suggestion = self.optuna.suggest(inner_id)
            arm = self._make_arm(suggestion)
            if arm.arm_id not in self.arms:
                return self._enqueue(arm, inner_id)
            log.info("suggestion %s repeats arm %s: not trained again", inner_id, self.arms[arm.arm_id].label)
            if arm.arm_id == self.control.arm_id:  # passed on once the suggestion is recorded (`suggest`)
                method, params = suggestion["method"], dict(suggestion.get("params") or {})
                self._equivalents.append(
                    {
                        "suggestion": inner_id,
                        "method": method,
                        "params": params,
                        "label": arm_label(method, params),
                        "arm_id": arm.arm_id,
                    }
                )
            self._optuna_ids.setdefault(arm.arm_id, []).append(inner_id)
            self.feedback.add(arm.arm_id)  # the control, suggested again, is judged against itself (0)
            for step, value in self.feedback.intermediate.get(
                arm.arm_id, {}
            ).items():  # what the first one was told so far
                self.optuna.on_trial_result(inner_id, {INNER_METRIC: value, "training_iteration": step})
            self._tell(self.feedback.settle(arm.arm_id))
            if (outcome := self.feedback.outcome.get(arm.arm_id)) is not None:
                self._tell([outcome])
        log.warning("%d consecutive suggestions duplicated known arms: the space is exhausted", self.max_duplicates)
        self._exhausted = True
        return False

    def _enqueue(self, arm: ArmSpec, inner_id: str | None) -> bool:
        self.arms[arm.arm_id] = arm
        if inner_id is not None:
            self._optuna_ids.setdefault(arm.arm_id, []).append(inner_id)
            self.feedback.add(arm.arm_id)
        self._queue.extend(arm_config(arm, seed) for seed in self.seeds_of(arm.arm_id))
        return True

    def _looked(self) -> bool:
        return self.batches is not None and bool(self.batches.looks)

    def _next_batch(self) -> bool:
        """seeds=auto, every cell ended: take the next look; queue the new seeds of the open arms and the control."""
        if self.batches is None or self.batches.finished:
            return False
        searched = [arm_id for arm_id in self.arms if arm_id != self.control.arm_id]
        look = self.batches.look(self.ledger, searched, self.feedback.final_step)
        shown = {"open": "unsettled"} if self.batches.finished else {}  # after the last look no arm is open
        log.info(
            "sequential look %d at %d seeds: %s; next seeds %s",
            look.number,
            look.seeds,
            ", ".join(
                f"{self.arms[arm].label} {shown.get(state.status, state.status)}" for arm, state in look.states.items()
            )
            or "no arm",
            list(look.next_seeds) or "none",
        )
        open_arms = [arm_id for arm_id, state in look.states.items() if state.status == "open"]
        self._queue = [
            arm_config(self.arms[arm_id], seed)
            for arm_id in [self.control.arm_id, *open_arms]
            for seed in look.next_seeds
        ]
        if self.on_look is not None:  # before the event is recorded: a look a kill cuts off is taken, and told, again
            self.on_look({**self.batches.history(), "labels": {arm_id: arm.label for arm_id, arm in self.arms.items()}})
        return bool(self._queue)

    def _tell(self, told: list[Told]) -> None:
        """Pass each event on to every inner trial of its arm (an outcome once per inner trial)."""
        for event in told:
            for inner_id in self._optuna_ids.get(event.arm, []):
                if event.state == INTERMEDIATE:
                    self.optuna.on_trial_result(inner_id, {INNER_METRIC: event.value, "training_iteration": event.step})
                elif inner_id not in self._told_inner:
                    self._told_inner.add(inner_id)
                    result = None if event.value is None else {INNER_METRIC: event.value}
                    self.optuna.on_trial_complete(inner_id, result=result, error=event.state == FAIL)


def _cell(config: dict[str, Any] | str | None) -> list[Any] | str | None:
    """How the log names what `suggest` returned: [arm id, seed], FINISHED or None."""
    return [config["arm"]["arm_id"], config["seed"]] if isinstance(config, dict) else config
