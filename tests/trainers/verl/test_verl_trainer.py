"""The plugin trainer with verl's real classes: registration through the entry point, construction
on a real composed config (tokenizer, datasets, dataloader; nothing that needs a GPU), and the
advantage hook on a batch in a real TransferQueue after verl's own `_compute_advantage`."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.trainers.embedded.model import ModelShape, build_tokenizer, new_model, save_model
from tune_dfrl.trainers.verl.export import export_model, export_tasks
from tune_dfrl.trainers.verl.recipe import VerlRecipe, build_overrides, compose_verl_config, default_recipe
from tune_dfrl.trainers.verl.transfer_queue_start import (
    CONTROLLER_WAIT,
    STORAGE_START,
    SWAPPED,
    start_storage_beside_controller,
    storage_first,
)

LENGTHS = [3, 2, 3, 1, 3, 3, 2, 2]
REWARDS = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> VerlRecipe:
    root = tmp_path_factory.mktemp("verl_trainer")
    tokenizer = build_tokenizer()
    save_model(new_model(ModelShape(), len(tokenizer), torch.Generator().manual_seed(0)), tokenizer, root / "raw")
    model = export_model(root / "raw", root / "model")
    train, val = export_tasks(root / "data", per_domain=8)
    return VerlRecipe.from_dict(
        default_recipe(
            model_path=str(model),
            train_files=[str(train)],
            val_files=[str(val)],
            gpus_per_trial=1,
            rollout_n=4,
            train_batch_size=6,
            max_prompt_length=48,
            max_response_length=16,
            steps=4,
            milestone_every=2,
        )
    )


def make_trainer(recipe: VerlRecipe, arm: ArmSpec, tmp_path: Path):
    from tune_dfrl.trainers.verl.trainer import DataPolicyTrainer

    overrides = [
        *build_overrides(recipe, arm, 5, tmp_path),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    trainer = DataPolicyTrainer(compose_verl_config(overrides))
    trainer._init_tokenizer()
    trainer._init_dataloader()
    return trainer


def wait_for_free_cpus(ray, count: int, timeout_s: float = 60.0) -> None:
    """Fail clearly (instead of hanging in ray.get) when other actors still hold the session cluster's CPUs."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < count:
        assert time.monotonic() < deadline, f"session Ray cluster lacks {count} free CPUs: {ray.available_resources()}"
        time.sleep(0.5)


REGISTRY_PROBE = (
    "import json, sys, importlib.metadata as md\n"
    "{first_import}\n"
    "lazy = 'tune_dfrl.trainers.verl.trainer' not in sys.modules\n"
    "from verl.trainer.ppo.v1 import get_trainer_cls, PPOTrainerSync\n"
    "cls = get_trainer_cls('tune_dfrl')\n"
    "import importlib.util, verl.workers.config, transformers.generation.candidate_generator\n"
    "hidden = {{m: [importlib.util.find_spec(m) is not None, m in sys.modules] for m in ('sklearn', 'scipy')}}\n"
    "print(json.dumps({{'entry_points': [e.value for e in md.entry_points(group='verl.plugins')], 'lazy': lazy,\n"
    "                  'cls': cls.__module__ + '.' + cls.__qualname__, 'sync': issubclass(cls, PPOTrainerSync),\n"
    "                  'hidden': hidden}}))\n"
)


def test_plugin_registers_the_trainer_through_the_entry_point():
    """Fresh interpreters: `import verl` loads our entry point and verl's v1 registry then holds the
    trainer; importing the trainer module first (it imports verl's v1 package itself) works too. Either way the
    plugin keeps scikit-learn and scipy, which are installed, from being imported by transformers
    (`import_hooks.lighten_transformers`)."""
    firsts = ("import verl", "import tune_dfrl.trainers.verl.trainer")
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", REGISTRY_PROBE.format(first_import=f)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in firsts
    ]
    outs = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    for out in outs:
        assert "tune_dfrl.trainers.verl.plugin" in out["entry_points"]
        assert out["cls"] == "tune_dfrl.trainers.verl.trainer.DataPolicyTrainer" and out["sync"]
        assert out["hidden"] == {"sklearn": [True, False], "scipy": [True, False]}  # installed, not imported
    assert outs[0]["lazy"]  # `import verl` alone does not pay for the v1 trainer stack


@pytest.mark.integration
def test_construction_keeps_verls_sync_paths_and_mixes_the_dataloader(ray_session, recipe, tmp_path):
    """The trainer keeps verl's sync mode and replay buffer and draws its batches with the mixture sampler. It is
    built inside a Ray instance (the session's here, a trial's own in a run): it records that instance's resources."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    arm = ArmSpec("reward_gap", {"temperature": 0.5}, "mix", "reward_gap")
    trainer = make_trainer(recipe, arm, tmp_path)
    assert trainer.trainer_mode == "sync" and trainer.config.trainer.v1.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer  # not ReplayBufferAsync
    assert trainer.data_policy.domains == ("logic", "math", "science")
    assert trainer.train_dataloader.batch_sampler is trainer.mixture_sampler
    batch = trainer._fetch_one_gen_batch()  # verl's own fetch, as in prepare_step
    drawn = np.unique(list(batch["domain"]), return_counts=True)
    assert dict(zip(*drawn)) == {"logic": 2, "math": 2, "science": 2}  # warmup step 0: uniform over 3 domains
    assert trainer.mixture_sampler.last_counts.tolist() == [2, 2, 2]
    assert len(batch) == 6


def test_responses_are_ordered_by_prompt_submission_then_session():
    from tune_dfrl.trainers.verl.trainer import submission_order

    submitted = {"f3-b": 0, "0a-c": 1}  # uuid4 uids, in the order the trainer submitted their prompts
    finished = ["0a-c_1_0", "f3-b_1_0", "0a-c_0_0", "f3-b_0_1", "f3-b_0_0", "f3-b"]
    ordered = sorted(finished, key=lambda key: submission_order(key, submitted))
    assert ordered == ["f3-b", "f3-b_0_0", "f3-b_0_1", "f3-b_1_0", "0a-c_0_0", "0a-c_1_0"]
    with pytest.raises(KeyError):
        submission_order("9e-d_0_0", submitted)  # a response of a prompt this trainer never submitted


def test_the_trainer_ranks_submitted_prompts_and_balances_responses_in_that_order(monkeypatch):
    """The two overrides around verl's own methods (replaced here by ones that return their input)."""
    from transfer_queue import KVBatchMeta

    from tune_dfrl.trainers.verl.trainer import DataPolicyTrainer, PPOTrainerSync

    monkeypatch.setattr(PPOTrainerSync, "_submit_batch_to_rollout", lambda self, batch: len(batch["uid"]))
    monkeypatch.setattr(PPOTrainerSync, "_balance_batch", lambda self, batch, metrics, **kwargs: batch)
    trainer = DataPolicyTrainer.__new__(DataPolicyTrainer)  # no config: only the bookkeeping runs
    trainer.submitted = {}
    assert trainer._submit_batch_to_rollout({"uid": ["p", "q"]}) == 2
    assert trainer._submit_batch_to_rollout({"uid": ["r"]}) == 1
    assert trainer.submitted == {"p": 0, "q": 1, "r": 2}
    finished = ["r_0_0", "q_1_0", "p_1_0", "q_0_0", "p_0_0"]
    batch = KVBatchMeta(partition_id="train", keys=finished, tags=[{"seq_len": n} for n in range(5)])
    balanced = trainer._balance_batch(batch, {})
    assert balanced.keys == ["p_0_0", "p_1_0", "q_0_0", "q_1_0", "r_0_0"]
    assert [t["seq_len"] for t in balanced.tags] == [4, 2, 3, 1, 0]  # tags moved with their keys


@pytest.fixture(scope="module")
def transfer_queue(ray_session, recipe, tmp_path_factory):
    """verl's TransferQueue (a controller and a storage unit) in the session's Ray, as a trial's trainer opens it
    (`tq.init`, as the plugin leaves it), with the order in which `init` waited for its actors in `tq.waits`."""
    import transfer_queue as tq
    import transfer_queue.interface as interface

    config = make_trainer(recipe, ArmSpec("baseline", {}, "c", "control"), tmp_path_factory.mktemp("tq")).config
    config.transfer_queue.enable = True
    wait_for_free_cpus(ray_session, 2)  # TransferQueue's controller and storage unit actors ask for one CPU each
    waits: list[str] = []
    wait_for_controller, start_storage = interface.process_zmq_server_info, interface._maybe_create_tq_storage

    def controller_address(handle):
        waits.append("controller")
        return wait_for_controller(handle)

    def storage_addresses(conf):
        waits.append("storage units")
        return start_storage(conf)

    interface.process_zmq_server_info, interface._maybe_create_tq_storage = controller_address, storage_addresses
    try:
        tq.init(config.transfer_queue)
    finally:
        interface.process_zmq_server_info, interface._maybe_create_tq_storage = wait_for_controller, start_storage
    tq.waits = waits
    yield tq
    tq.close()


@pytest.mark.integration
def test_transfer_queue_starts_its_storage_units_before_it_waits_for_its_controller(transfer_queue):
    """The plugin swapped the two steps of TransferQueue's `init` (transfer_queue_start.py): the storage units'
    processes start while the controller's does. The queue works (the hook tests below put and get through it)."""
    import transfer_queue.interface as interface

    assert transfer_queue.init is interface.init and getattr(interface.init, SWAPPED)
    assert transfer_queue.waits == ["storage units", "controller"]


def test_the_swap_is_pinned_to_transfer_queues_text(tmp_path):
    """Where `init` lacks the two steps, in that order, it is left as it is, with a warning."""
    import transfer_queue.interface as interface

    assert storage_first(inspect.getsource(interface.init)) is not None  # the installed TransferQueue's text
    assert storage_first(STORAGE_START + CONTROLLER_WAIT) is None  # already in that order
    module = tmp_path / "other_queue.py"
    module.write_text("def init(conf=None):\n" + CONTROLLER_WAIT + STORAGE_START)  # no blank line between
    spec = importlib.util.spec_from_file_location("other_queue", module)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    original = other.init.__code__
    with pytest.warns(UserWarning, match="its storage units start after its controller"):
        start_storage_beside_controller(other)
    assert other.init.__code__ is original and not hasattr(other.init, SWAPPED)


def compute_advantage(tq, trainer, uids: list[str], domains: list[str], verl_weights: list[float]):
    """Put one batch of responses (`LENGTHS`, `REWARDS`, then verl's synthetic padding sample) in TransferQueue with
    verl's own per-response `rollout_is_weights`, run the trainer's `_compute_advantage` (verl's GRPO, then the hook),
    and read back (weights per response, first advantage per response, the step's metrics)."""
    from verl.utils import tensordict_utils as tu

    def nested(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    lengths, rewards = [*LENGTHS, 1], [*REWARDS, 0.0]
    rows = [*uids, "padx"]
    keys = [f"{u}_{i % 4}_0" for i, u in enumerate(rows)]
    fields = {
        "uid": rows,
        "domain": [*domains, domains[-1]],
        "response_mask": nested([torch.ones(n, dtype=torch.int64) * (u != "padx") for n, u in zip(lengths, rows)]),
        "rm_scores": nested([torch.tensor([0.0] * (n - 1) + [r]) for n, r in zip(lengths, rewards)]),
        "old_log_probs": nested([torch.full((n,), -0.7) for n in lengths]),
        "rollout_is_weights": nested([torch.full((n,), w) for n, w in zip(lengths, [*verl_weights, 1.0])]),
    }
    tags = [{"is_padding": u == "padx"} for u in rows]
    meta = tq.kv_batch_put(keys=keys, partition_id="train", fields=tu.get_tensordict(fields), tags=tags)
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    assert "rollout_is_weights" in out.fields
    stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rollout_is_weights", "advantages"])
    weights = [row.tolist() for row in stored["rollout_is_weights"].unbind()]
    advantages = [row[0].item() for row in stored["advantages"].unbind()]
    return weights, advantages, metrics


def token_mean(weights: list[float]) -> float:
    """Mean over the real responses' tokens of a per-response weight."""
    return sum(w * n for w, n in zip(weights, LENGTHS)) / sum(LENGTHS)


@pytest.mark.integration
def test_advantage_hook_writes_policy_weights_times_verls_into_transfer_queue(transfer_queue, recipe, tmp_path):
    """verl computes GRPO advantages from TransferQueue; the hook then writes difffilter's weights times verl's own
    (`rollout_is=token`) back, and logs the token means of both over the real responses."""
    arm = ArmSpec("difffilter", {"low": 0.1, "high": 0.9}, "df", "difffilter")
    trainer = make_trainer(recipe, arm, tmp_path)
    trainer.global_steps = 1
    verl_weights = [0.5, 2.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0]
    uids = ["a"] * 4 + ["b"] * 4
    weights, advantages, metrics = compute_advantage(
        transfer_queue, trainer, uids, ["math"] * 4 + ["logic"] * 4, verl_weights
    )
    kept = [1.0] * 4 + [0.0] * 4  # solve rates 0.25 (kept) and 1.0 (dropped)
    assert weights == [[k * w] * n for k, w, n in zip(kept, verl_weights, LENGTHS)] + [[1.0]]  # padding: 1
    assert advantages[:4] == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)  # verl's GRPO, kept as is
    assert advantages[4:8] == [0.0] * 4
    assert metrics["policy/kept_fraction"] == 0.5  # over the 8 real responses
    assert metrics["policy/verl_is_weight_mean"] == pytest.approx(token_mean(verl_weights))
    assert metrics["policy/is_weight_mean"] == pytest.approx(token_mean([k * w for k, w in zip(kept, verl_weights)]))


@pytest.mark.integration
def test_a_mixers_batches_follow_its_proportions_and_their_counts_are_logged(transfer_queue, recipe, tmp_path):
    """A static mixer: every batch verl's own fetch draws has the proportions' counts (3:1:2 of 6 prompts), logged per
    domain with the step's metrics; the update is the control's (weights: verl's own)."""
    arm = ArmSpec("static", {"proportions": [0.5, 1 / 6, 1 / 3]}, "mix", "static 3:1:2")
    trainer = make_trainer(recipe, arm, tmp_path)
    for step in (1, 2):
        batch = trainer._fetch_one_gen_batch()  # verl's own fetch, as in prepare_step
        drawn = np.unique(list(batch["domain"]), return_counts=True)
        assert dict(zip(*drawn)) == {"logic": 3, "math": 1, "science": 2}
        trainer.global_steps = step
        verl_weights = [0.5, 2.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0]
        uids = [f"m{step}"] * 4 + [f"n{step}"] * 4
        domains = ["logic"] * 4 + ["science"] * 4
        weights, _, metrics = compute_advantage(transfer_queue, trainer, uids, domains, verl_weights)
        assert [metrics[f"policy/mix/count/{d}"] for d in ("logic", "math", "science")] == [3.0, 1.0, 2.0]
        assert weights[:8] == [[w] * n for w, n in zip(verl_weights, LENGTHS)]
        assert metrics["policy/is_weight_mean"] == metrics["policy/verl_is_weight_mean"]
