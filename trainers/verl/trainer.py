"""The plugin trainer: verl's synchronous v1 PPO trainer plus the arm's data policy.

Registered with verl's `register_trainer` as mode `tune_dfrl` (loaded by `plugin.py`); verl's
`TaskRunnerV1.run` (verl/trainer/main_ppo.py) picks it by `trainer.v1.trainer_mode=tune_dfrl`.
Hooks into `PPOTrainer` (verl/trainer/ppo/v1/trainer_base.py):

- `_build_replay_buffer`: verl's replay buffer looks for finished responses every `poll_interval`
  seconds (2.0 in verl 0.9.1, a fixed sleep between looks); a step waits on it at least once for its
  rollouts and once per validation. Set to `REPLAY_POLL_S`: a look is one call to TransferQueue's
  controller, so a short interval costs little and a step no longer idles for seconds.
- `__init__` records the trial's private Ray's resources (logical CPUs and GPUs, object store bytes);
  `__init__`, `_init_dataloader`, `_load_checkpoint`, `on_init_end` and the step and validation
  hooks record the trial's start-up timeline (timeline.py).
- `__init__`: verl branches on the mode *name* (`trainer_mode != "sync"` selects the async
  replay buffer, TransferQueue checkpointing, exact refills), so the mode is reset to `"sync"`
  before verl reads it: the synchronous code paths run unchanged.
- `_submit_batch_to_rollout` / `_balance_batch`: the step's responses, which the replay buffer
  lists in the order they finished, are put back in the order their prompts were submitted
  (then by their index in the group) before verl balances them: the update's rows, sums and
  micro-batches do not depend on which request the rollout finished first.
- `_init_dataloader`: reads the domain column of the training parquet; for a mixer arm the
  training dataloader draws through `MixtureBatchSampler` (sampler.py). With rollout `hf_cpu`, it creates
  replica 0's rollout server (`cpu/rollout.start_server`), empty: its process starts while verl's training
  workers do, instead of after them.
- `_compute_advantage`: after verl's GRPO advantages are in TransferQueue, reads the batch
  back, applies the arm (`DataPolicy.apply`, hook.py) and writes `rollout_is_weights` (the
  policy weights times verl's own, if any) and `advantages`; synthetic padding rows
  (`is_padding` tags, verl/trainer/ppo/padding_utils.py) keep weight 1 and are not shown to
  the policy. Diagnostics go to the step's metrics under `policy/`, the realised per-domain
  counts of the step's batch under `policy/mix/count/<domain>`, the token means of verl's own
  weights (`policy/verl_is_weight_mean`, when verl computes them) and of the weights written
  (`policy/is_weight_mean`) over the real responses.
"""

from __future__ import annotations

import json

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from torchdata.stateful_dataloader import StatefulDataLoader
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.v1 import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.utils.padding import response_to_nested

from . import timeline
from .cpu import ROLLOUT_NAME
from .hook import DataPolicy, domain_ids
from .plugin import TRAINER_MODE
from .sampler import MixtureBatchSampler

POLICY_FIELDS = ("uid", "rm_scores", "advantages", "response_mask", "old_log_probs")
REPLAY_POLL_S = 0.05


@register_trainer(TRAINER_MODE)
class DataPolicyTrainer(PPOTrainerSync):
    """`PPOTrainerSync` whose update sees the arm's selection, reweighting or domain mixture."""

    def __init__(self, config: DictConfig):
        timeline.record("trainer_init", ray=private_ray_resources())
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.arm = json.loads(config.tune_dfrl.policy)
        self.domain_column = str(config.tune_dfrl.domain_column)
        self.mixture_sampler: MixtureBatchSampler | None = None
        self.submitted: dict[str, int] = {}  # prompt uid -> its rank in submission order

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        if not hasattr(buffer, "poll_interval"):
            raise RuntimeError(
                f"{type(buffer).__name__} has no poll_interval (tune_dfrl's trainer is pinned to verl 0.9.1)"
            )
        buffer.poll_interval = REPLAY_POLL_S
        return buffer

    def _load_checkpoint(self):
        timeline.record("workers_ready")
        return super()._load_checkpoint()

    def on_init_end(self):
        super().on_init_end()
        timeline.record("setup_done")

    def on_step_begin(self):
        timeline.record("step_begin", step=self.global_steps)
        super().on_step_begin()

    def on_step_end(self):
        super().on_step_end()
        timeline.record("step_end", step=self.global_steps)

    def on_validate_begin(self):
        timeline.record("validate_begin", step=self.global_steps)
        super().on_validate_begin()

    def on_validate_end(self):
        super().on_validate_end()
        timeline.record("validate_end", step=self.global_steps)

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        first = len(self.submitted)
        self.submitted.update({str(uid): first + i for i, uid in enumerate(batch["uid"])})
        return super()._submit_batch_to_rollout(batch)

    def _balance_batch(self, batch: KVBatchMeta, metrics: dict, **kwargs) -> KVBatchMeta:
        batch.reorder(sorted(range(len(batch)), key=lambda i: submission_order(batch.keys[i], self.submitted)))
        return super()._balance_batch(batch, metrics, **kwargs)

    def _init_dataloader(self) -> None:
        super()._init_dataloader()
        timeline.record("dataloader_ready")
        rollout = self.config.actor_rollout_ref.rollout
        if rollout.name == ROLLOUT_NAME:  # next, verl builds its training workers, then the rollout replica
            from .cpu.rollout import start_server

            self.early_rollout_server = start_server(0, rollout)  # (an actor without a handle is destroyed)
        frame = self.train_dataset.dataframe
        values = np.asarray(frame[self.domain_column], dtype=str) if self.domain_column in frame.column_names else None
        domains = sorted(set(values.tolist())) if values is not None else []
        self.data_policy = DataPolicy.from_arm(
            self.arm, self.config.actor_rollout_ref.rollout.n, domains, self.domain_column
        )
        if self.data_policy.mixer is None:
            return
        self.mixture_sampler = MixtureBatchSampler(
            domain_ids(values, self.data_policy.domains),
            len(domains),
            self.data_policy.mixer,
            self.config.data.train_batch_size,
            seed=int(self.config.data.get("seed") or 0),
        )
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset, batch_sampler=self.mixture_sampler, num_workers=0, collate_fn=collate_fn
        )

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics)
        present = set(batch.fields or ())
        fields = [*POLICY_FIELDS, *(f for f in ("rollout_is_weights", self.domain_column) if f in present)]
        stored = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        response_mask = stored["response_mask"]
        data = policy_input(stored, self.domain_column)
        real = np.fromiter((not tag.get("is_padding", False) for tag in batch.tags), dtype=bool, count=len(batch))
        subset = data.select_idxs(real)
        tokens = subset.batch["response_mask"].bool()
        if "rollout_is_weights" in present:
            metrics["policy/verl_is_weight_mean"] = float(subset.batch["rollout_is_weights"][tokens].mean())
        metrics.update(self.data_policy.apply(subset, step=self.global_steps - 1))
        metrics["policy/is_weight_mean"] = float(subset.batch["rollout_is_weights"][tokens].mean())
        if self.mixture_sampler is not None:
            counts = self.mixture_sampler.last_counts
            metrics.update({f"policy/mix/count/{d}": float(c) for d, c in zip(self.data_policy.domains, counts)})

        real_rows = torch.from_numpy(real)
        weights = torch.ones_like(data.batch["advantages"], dtype=torch.float32)
        weights[real_rows] = subset.batch["rollout_is_weights"]
        advantages = data.batch["advantages"].clone()
        advantages[real_rows] = subset.batch["advantages"]
        output = {
            "rollout_is_weights": response_to_nested(weights, response_mask),
            "advantages": response_to_nested(advantages, response_mask),
        }
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
        )


def private_ray_resources() -> dict[str, float]:
    """The CPUs, GPUs and object store bytes of the Ray instance this trainer runs in (the trial's own)."""
    import ray

    resources = ray.cluster_resources()
    return {key: float(resources.get(key, 0.0)) for key in ("CPU", "GPU", "object_store_memory")}


def submission_order(key: str, submitted: dict[str, int]) -> tuple[int, ...]:
    """(prompt's submission rank, session, output index) of a response key `{uid}_{session}_{index}`
    (verl/trainer/ppo/v1/agent_loop_tq.py); (rank,) of a prompt's own key `{uid}`."""
    uid, *numbers = key.split("_")
    return (submitted[uid], *map(int, numbers))


def policy_input(stored: TensorDict, domain_column: str) -> DataProto:
    """A padded `DataProto` of the fields read back from TransferQueue (as verl's own
    `_compute_advantage` builds it), with `uid` and the domain column as non-tensor columns."""
    data = DataProto(batch=stored.to_padded_tensor())
    for column in ("uid", domain_column):
        if column in data.batch.keys():
            data.non_tensor_batch[column] = np.array(data.batch.pop(column).tolist(), dtype=object)
    return data
