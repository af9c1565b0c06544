"""Real verl GRPO steps on CPU: `VerlBackend.run_trial` starts `python -m verl.trainer.main_ppo` with our
plugin trainer (device cpu: cpu platform, HF rollout) on the embedded backend's base model, exported.

Each run is 2 steps of 8 prompts x 4 responses, validation at step 2 on 4 items of each of the
twelve benchmarks, verl's own token-level rollout importance weights switched on. Runs are
started on first use and shared by the tests of this module (a run: ~30 processes, about a
minute of start-up on an idle 2-core machine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tune_dfrl.backend import ArmSpec
from tune_dfrl.trainers.embedded.base import BaseRecipe, ensure_base_model
from tune_dfrl.trainers.embedded.benchmarks import BENCHMARKS
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.export import export_model, export_tasks, rows, write_parquet
from tune_dfrl.trainers.verl.recipe import default_recipe

pytestmark = pytest.mark.timeout(3600)

SEED = 1
STEPS = 2
VAL_ITEMS = 4
BASE_STEPS = 150  # a briefly warmed-up base model: some groups solved, some not
ARMS = {
    "control": ArmSpec("baseline", {}, "control", "control"),
    "control_again": ArmSpec("baseline", {}, "control", "control"),
    "band": ArmSpec("difffilter", {"low": 0.3, "high": 0.7}, "band", "difffilter 0.3-0.7"),
    "softmax": ArmSpec("softmax", {"temperature": 0.5}, "softmax", "softmax T=0.5"),
    "mix": ArmSpec("static", {"proportions": [0.5, 0.25, 0.25]}, "mix", "static 2:1:1"),
}
MACHINE_METRICS = ("timing_s/", "perf/", "actor/perf/", "timing_per_token_ms/")


class Runs:
    """(milestones, verl metrics records by step) of each arm in `ARMS`, run on first request."""

    def __init__(self, root: Path, backend: VerlBackend):
        self.root, self.backend, self.done = root, backend, {}

    def __call__(self, name: str) -> tuple[list, dict[int, dict]]:
        if name not in self.done:
            milestones: list = []
            trial = self.root / name
            self.backend.run_trial(ARMS[name], SEED, milestones.append, trial)
            lines = (trial / "verl_metrics.jsonl").read_text().splitlines()
            records = {r["step"]: r["data"] for r in map(json.loads, lines)}
            self.done[name] = milestones, records
        return self.done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, embedded_cache) -> Runs:
    root = tmp_path_factory.mktemp("verl_cpu_run")
    model = export_model(ensure_base_model(BaseRecipe(steps=BASE_STEPS), embedded_cache), root / "model")
    train, _ = export_tasks(root / "data", per_domain=32)
    val = write_parquet([r for b in BENCHMARKS for r in rows(b.items()[:VAL_ITEMS], data_source=b.name)],
                        root / "data" / "val_small.parquet")
    recipe = default_recipe(
        model_path=str(model), train_files=[str(train)], val_files=[str(val)], device="cpu", gpus_per_trial=1,
        cpus_per_trial=2, rollout_n=4, train_batch_size=8, max_prompt_length=48, max_response_length=8,
        steps=STEPS, milestone_every=STEPS, lr=1e-4,
        benchmarks=[{"data_source": b.name, "domain": b.domain, "items": VAL_ITEMS} for b in BENCHMARKS],
        overrides=["algorithm.rollout_correction.rollout_is=token"],
    )
    return Runs(root, VerlBackend(recipe))


def test_grpo_steps_with_validation_milestones(runs):
    milestones, records = runs("control")
    assert sorted(records) == [1, 2]
    assert [m.step for m in milestones] == [STEPS]
    assert set(milestones[0].accuracy) == {b.name for b in BENCHMARKS}
    assert any(key.startswith("val-core/") for key in records[STEPS])
    for step in (1, 2):
        assert records[step]["actor/grad_norm"] > 0 and math.isfinite(records[step]["actor/pg_loss"])
        assert 0 < records[step]["critic/score/mean"] < 1  # solved and unsolved responses
        assert records[step]["training/rollout_probs_diff_max"] < 0.05  # rollout log-probs = the actor's


def test_narrow_difficulty_band_drops_responses_and_changes_the_loss(runs):
    control, band = runs("control")[1][1], runs("band")[1][1]
    assert band["critic/score/mean"] == control["critic/score/mean"]  # same seed, same weights: same rollouts
    assert control["policy/kept_fraction"] == 1.0 and band["policy/kept_fraction"] < 1.0
    assert band["actor/pg_loss"] != control["actor/pg_loss"]


def test_reweighter_weights_multiply_verls_own(runs):
    control, softmax = runs("control")[1][1], runs("softmax")[1][1]
    assert control["policy/verl_is_weight_mean"] == softmax["policy/verl_is_weight_mean"] != 1.0
    assert control["policy/is_weight_mean"] == control["policy/verl_is_weight_mean"]  # baseline weights are 1
    assert softmax["policy/weight_std"] > 0
    assert softmax["policy/is_weight_mean"] != softmax["policy/verl_is_weight_mean"]


def test_mixer_batches_follow_its_proportions(runs):
    _, records = runs("mix")
    for step in (1, 2):
        counts = [records[step][f"policy/mix/count/{d}"] for d in ("logic", "math", "science")]  # sorted domains
        assert counts == [4.0, 2.0, 2.0]  # 0.5 : 0.25 : 0.25 of 8 prompts


def test_same_arm_and_seed_give_the_same_metrics(runs):
    (first_milestones, first), (second_milestones, second) = runs("control"), runs("control_again")
    assert [m.accuracy for m in first_milestones] == [m.accuracy for m in second_milestones]
    for step in first:
        keys = [k for k in first[step] if not k.startswith(MACHINE_METRICS)]
        assert {k: first[step][k] for k in keys} == {k: second[step][k] for k in keys}
