"""Real verl GRPO steps on CPU: `VerlBackend.run_trial` starts `python -m verl.trainer.main_ppo` with our
plugin trainer (device cpu: cpu platform, HF rollout) on the embedded backend's base model, exported.

Each run is 2 steps of 8 prompts x 4 responses, validation at step 2 on 4 items of each of the
twelve benchmarks, verl's own token-level rollout importance weights switched on. Runs are
started on first use and shared by the tests of this module (a run: ~30 processes, about a
minute of start-up on an idle 2-core machine); with `-s`, each run prints one JSON line of
figures (`run_figures`). Three verl starts: the control, and a control killed and rerun. That a selector drops
responses and changes verl's loss is checked on the arm of tests/test_verl_search_cpu.py's search (the same seeds'
rollouts as its control); a reweighter's and a mixer's hook and batches on verl's own TransferQueue and dataloader
fetch, without a run (tests/test_verl_trainer.py).
"""

from __future__ import annotations

import json
import math
import signal
import tempfile
import time
from pathlib import Path

import pytest
from reliability_helpers import LOOPBACK, alive, listening, records, signal_all, trained_steps, verl_trees
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS
from tune_dfrl.trainers.verl import timeline
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.export import export_model, export_tasks, rows, write_parquet
from tune_dfrl.trainers.verl.recipe import (
    OBJECT_STORE_BYTES,
    default_recipe,
    private_ray_logical_cpus,
    ray_temp_dir,
)

from tune_dfrl.backend import ArmSpec

pytestmark = pytest.mark.timeout(3600)

SEED = 1
STEPS = 2
VAL_ITEMS = 4
BASE_STEPS = 150  # a briefly warmed-up base model: some groups solved, some not
ARMS = {"control": ArmSpec("baseline", {}, "control", "control")}


def verl_log(trial: Path) -> dict[int, dict]:
    """verl's metrics by step, as its latest start logged them (every start rewrites verl_metrics.jsonl)."""
    return {r["step"]: r["data"] for r in records(trial / "verl_metrics.jsonl")}


def trained(trial: Path) -> list[int]:
    """Steps verl trained in its latest start."""
    return trained_steps(records(trial / "verl_metrics.jsonl"))


def run_figures(trial: Path) -> dict:
    """The child's start-up (`run_trial` writes it to verl_runs.jsonl) and verl's seconds per step
    (`timing_s/step`, validation excluded) and per validation (`timing_s/testing`)."""
    steps = [r["data"] for r in records(trial / "verl_metrics.jsonl")]
    return {
        "startup_s": [round(start["startup_s"], 1) for start in records(trial / "verl_runs.jsonl")],
        "step_s": [round(s["timing_s/step"], 2) for s in steps],
        "validation_s": [round(s["timing_s/testing"], 2) for s in steps if "timing_s/testing" in s],
    }


class Runs:
    """(milestones, verl metrics records by step) of each arm in `ARMS`, run on first request."""

    def __init__(self, root: Path, backend: VerlBackend):
        self.root, self.backend, self.done = root, backend, {}

    def __call__(self, name: str) -> tuple[list, dict[int, dict]]:
        if name not in self.done:
            milestones: list = []
            trial = self.root / name
            started = time.monotonic()
            self.backend.run_trial(ARMS[name], SEED, milestones.append, trial)
            print(json.dumps({"arm": name, "wall_s": round(time.monotonic() - started, 1), **run_figures(trial)}))
            self.done[name] = milestones, verl_log(trial)
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, embedded_cache) -> Runs:
    root = tmp_path_factory.mktemp("verl_cpu_run")
    model = export_model(ensure_base_model(BaseRecipe(steps=BASE_STEPS), embedded_cache), root / "model")
    train, _ = export_tasks(root / "data", per_domain=32)
    val = write_parquet(
        [r for b in BENCHMARKS for r in rows(b.items()[:VAL_ITEMS], data_source=b.name)],
        root / "data" / "val_small.parquet",
    )
    recipe = default_recipe(
        model_path=str(model),
        train_files=[str(train)],
        val_files=[str(val)],
        device="cpu",
        gpus_per_trial=1,
        cpus_per_trial=2,
        rollout_n=4,
        train_batch_size=8,
        max_prompt_length=48,
        max_response_length=8,
        steps=STEPS,
        milestone_every=STEPS,
        lr=1e-4,
        benchmarks=[{"data_source": b.name, "domain": b.domain, "items": VAL_ITEMS} for b in BENCHMARKS],
        overrides=["algorithm.rollout_correction.rollout_is=token"],
    )
    return Runs(root, VerlBackend(recipe))


def test_grpo_steps_with_validation_milestones(runs):
    milestones, records = runs("control")
    ray_folder = ray_temp_dir(runs.root / "control")  # the trial path is too long for Ray's sockets: in /tmp
    assert ray_folder.parent == Path(tempfile.gettempdir()) and not ray_folder.exists()  # removed at the end
    assert sorted(records) == [1, 2]
    assert [m.step for m in milestones] == [STEPS]
    assert set(milestones[0].accuracy) == {b.name for b in BENCHMARKS}
    assert any(key.startswith("val-core/") for key in records[STEPS])
    for step in (1, 2):
        assert records[step]["actor/grad_norm"] > 0 and math.isfinite(records[step]["actor/pg_loss"])
        assert records[step]["critic/advantages/max"] > 0  # a group's responses differ: GRPO has a signal
        assert 0 < records[step]["critic/score/mean"] < 1  # solved and unsolved responses
        assert records[step]["training/rollout_probs_diff_max"] < 0.05  # rollout log-probs = the actor's
        # the GPU recipe's KL loss: verl ran the FSDP2 reference model (offloaded, unpinned) and added the loss. Its
        # value is 0 here: after one step at lr 1e-4 the actor's bf16 log-probs still equal the reference's (the same
        # run at lr 1e-2 logs 1.79 at step 2)
        assert records[step]["timing_s/ref"] > 0 and records[step]["actor/kl_coef"] == 0.001
        assert records[step]["actor/kl_loss"] >= 0 and math.isfinite(records[step]["actor/kl_loss"])
        # verl's own token-level importance weights reach the hook, which passes them unchanged (baseline's are 1);
        # that other arms multiply them is tests/test_verl_trainer.py's (the hook in verl's TransferQueue)
        verl_weights = records[step]["policy/verl_is_weight_mean"]
        assert verl_weights != 1.0 and records[step]["policy/is_weight_mean"] == verl_weights


def test_the_trials_private_ray_has_the_trials_size_and_a_bounded_object_store(runs):
    """verl's TaskRunner sees a Ray instance of `private_ray_logical_cpus` CPUs, one logical GPU and an object store
    of OBJECT_STORE_BYTES (Ray's default would be 30% of this machine's memory, per trial)."""
    runs("control")
    [init] = [e for e in timeline.read(runs.root / "control" / timeline.FILE_NAME) if e["event"] == "trainer_init"]
    config = runs.backend.config
    assert init["ray"] == {
        "CPU": private_ray_logical_cpus(config),
        "GPU": 1.0,
        "object_store_memory": OBJECT_STORE_BYTES,
    }


def same_numbers(record: dict) -> dict:
    """A verl metrics record without its clock readings (`timing_s/`, `timing_per_token_ms/`, `perf/` and
    `actor/perf/`: seconds, throughput, memory)."""
    clock = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
    return {k: v for k, v in record.items() if not k.startswith(clock)}


class Crash(RuntimeError):
    """Raised by the search's side of a trial that died before it could record a milestone."""


def test_a_killed_trial_validates_the_milestone_it_lost_then_continues_with_the_numbers_of_an_uninterrupted_one(runs):
    """A crash of the whole trial as the step-1 milestone arrives (a milestone and a checkpoint every step): every
    verl process is SIGKILLed and the search never records the milestone; verl's log of step 1 is lost too (as when
    the trial dies between verl's checkpoint of a step and that step's validation). The rerun finds a checkpoint
    newer than the last milestone, validates it before training (milestone 1: validation only, no training means,
    the killed start's accuracy: the checkpoint's weights, greedy decoding), trains step 2 only, reports its
    milestone, and leaves no process and no private Ray folder behind. Minutes: two verl starts in sequence, besides
    the shared control run.

    Same arm, same seed, same numbers: the killed start's step 1 and the rerun's step 2 are the uninterrupted
    control's, bit for bit (clock readings aside; the killed start also validated at step 1). Each response is
    seeded by its index in its group and the update sees the responses in submission order
    (trainers/verl/cpu/rollout.py, trainers/verl/trainer.py), not in the order they finished."""
    backend = VerlBackend({**runs.backend.recipe, "milestone_every": 1})
    trial, first, killed, sockets = runs.root / "control_crashed", [], set(), set()

    def crash(milestone) -> None:
        first.append(milestone)
        killed.update(verl_trees(trial))
        signal_all(killed, signal.SIGSTOP)  # frozen at once: verl checkpoints step 2 within a second otherwise
        sockets.update(listening(killed))  # (slow: every socket of ~30 processes)
        signal_all(killed, signal.SIGKILL)
        raise Crash("the trial died before it recorded the milestone")

    with pytest.raises(Crash):
        backend.run_trial(ARMS["control"], SEED, crash, trial)
    assert [m.step for m in first] == [1] and len(killed) >= 3  # supervisor, main_ppo and its Ray at least
    # the running trial's processes listen on loopback only: its private Ray, and its process group's rendezvous
    # is a file (cpu_env's DIST_INIT_METHOD), not a TCPStore on every interface
    assert len(sockets) > 10 and {s for s in sockets if s[1] not in LOOPBACK} == set(), sockets
    assert not (trial / "milestones.jsonl").exists()
    killed_step_1 = same_numbers(verl_log(trial)[1])
    assert trained(trial) == [1] and int((trial / "verl" / "latest_checkpointed_iteration.txt").read_text()) == 1
    (trial / "verl_metrics.jsonl").unlink()
    log_at_crash = (trial / "verl.log").stat().st_size

    again: list = []
    backend.run_trial(ARMS["control"], SEED, again.append, trial)
    assert [m.step for m in again] == [1, STEPS]
    assert again[0].train == {} and again[0].accuracy == first[0].accuracy  # validated from the checkpoint
    assert again[1].train  # trained, not only validated
    logged = records(trial / "verl_metrics.jsonl")
    assert [r["step"] for r in logged] == [1, STEPS] and "timing_s/step" not in logged[0]["data"]
    assert trained(trial) == [STEPS]
    control_milestones, control = runs("control")
    assert len(same_numbers(control[1])) > 50 and control[1]["actor/pg_loss"] != 0
    assert {k: killed_step_1[k] for k in same_numbers(control[1])} == same_numbers(control[1])
    assert same_numbers(verl_log(trial)[STEPS]) == same_numbers(control[STEPS])
    assert again[1].accuracy == control_milestones[0].accuracy
    starts = records(trial / "verl_runs.jsonl")
    assert [s["first_step"] for s in starts] == [1, 1]  # the rerun's first record: the validation of step 1
    with (trial / "verl.log").open("rb") as log:
        log.seek(log_at_crash)
        assert b"global_step_1" in log.read()  # the second start loaded the step-1 checkpoint
    assert not any(alive(pid) for pid in killed)
    assert verl_trees(runs.root) == set() and not ray_temp_dir(trial).exists()
