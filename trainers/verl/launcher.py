"""Run one verl trial as a child process group and turn its metrics into `Milestone`s.

The child is `supervise.py` wrapping verl's driver, started in its own session (process group)
with its own environment: `VERL_FILE_LOGGER_PATH` into the trial folder, offline settings,
our plugin enabled. Its private Ray instance comes from the `+ray_kwargs.ray_init.address=local`
override, so two trials never share a Ray cluster. The parent tails verl's file logger
(verl/utils/tracking.py `FileLogger`: one JSON object `{"step": s, "data": {metric: value}}` per
line) and hands each record to a callback. Whatever happens (normal end, error, an exception
from the callback) the whole process group is ended before returning; a non-zero exit becomes
`VerlRunError` carrying the tail of the child's log. Once the caller has every record it needs
(`done()`), the group is killed at once instead of waiting for verl's own shutdown (its loggers,
TransferQueue, its Ray instance: seconds per trial), and however the child ended is no error.

Validation metrics (verl `PPOTrainer._val_metrics_update`) are named
`val-core/<data_source>/<acc|reward>/mean@<n>` and `val-aux/<data_source>/<var>/mean@<n>`; our
reward function adds the variables `length_chars` and `format_fail` (reward.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tune_dfrl.backends.base import Milestone
from tune_dfrl.backends.benchmarks import BenchmarkSet, milestone_aggregates
from tune_dfrl.cluster.services import LOCAL_ONLY, NO_WORKER_PRESTART

from .recipe import BenchmarkSource
from .supervise import end_group, signal_group

POLL_S = 0.5
LOG_TAIL_LINES = 40
TRAIN_METRICS = (
    "policy/",
    "critic/score/mean",
    "response_length/mean",
    "actor/entropy",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
)
_VAL_KEY = re.compile(r"val-(?:core|aux)/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)")


class VerlRunError(RuntimeError):
    """The verl child failed; the message names the exit code and carries its log tail."""


def child_env(metrics_path: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trial's environment: GPUs as Ray Tune assigned them (`CUDA_VISIBLE_DEVICES` is kept),
    verl's file logger into the trial folder, no wandb, no hub downloads, our plugin loaded, no
    inherited `RAY_ADDRESS` (the child starts its own Ray instance), that Ray on loopback only with token
    authentication (a fresh token unless the environment already holds one, e.g. the search's), no idle Ray workers started
    ahead of demand (`services.NO_WORKER_PRESTART`): verl's actors each need their own process, so Ray's
    prestarted workers sit idle and only take CPU while the trial starts."""
    env = dict(os.environ if base is None else base)
    env.pop("RAY_ADDRESS", None)
    env.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    env.update(
        NO_WORKER_PRESTART,
        **{LOCAL_ONLY: "0"},  # Ray's local-only mode: every listener on 127.0.0.1
        RAY_AUTH_MODE="token",
        VERL_FILE_LOGGER_PATH=str(metrics_path),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    plugins = env.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if plugins != "auto" and "tune_dfrl" not in plugins.split(","):
        env["VERL_USE_EXTERNAL_PLUGINS"] = "tune_dfrl" if plugins == "none" else f"{plugins},tune_dfrl"
    return env


class JsonlTail:
    """Reads the complete lines appended to a JSONL file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            if line.strip():
                yield json.loads(line)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log written)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def end_process_group(process: subprocess.Popen, at_once: bool = False) -> None:
    """End the child's process group (`supervise.end_group`; SIGKILL `at_once`) and reap the child."""

    def alive() -> bool:
        process.poll()  # reap the leader, or it stays in the group as a zombie
        return signal_group(process.pid, 0)

    if at_once:
        signal_group(process.pid, signal.SIGKILL)
    else:
        end_group(process.pid, alive)
    process.wait()


def run_child(
    command: Sequence[str],
    env: Mapping[str, str],
    work_dir: Path,
    metrics_path: Path,
    log_path: Path,
    on_record: Callable[[dict[str, Any]], None],
    done: Callable[[], bool] = lambda: False,
) -> None:
    """Run `command` under the supervisor, calling `on_record` for every metrics record it logs, until it exits
    or, after a record, `done()`: then its group is killed and how it ended is no error."""
    supervised = [sys.executable, "-m", "tune_dfrl.trainers.verl.supervise", str(os.getpid()), "--", *command]
    tail = JsonlTail(metrics_path)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            supervised,
            cwd=work_dir,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finished = False
    try:
        while True:
            code = process.poll()
            for record in tail.records():
                on_record(record)
            finished = done()
            if code is not None or finished:
                break
            time.sleep(POLL_S)
    finally:
        end_process_group(process, at_once=finished)
    if code != 0 and not finished:
        raise VerlRunError(f"verl exited with code {code}; last lines of {log_path}:\n{log_tail(log_path)}")


class MilestoneReader:
    """Builds a `Milestone` from each verl metrics record that holds validation metrics.

    Accuracy (%) = 100 x the mean of the core variable (`acc`, else `reward`) over the
    validation responses of the benchmark's data_source; response length (characters) and
    format failures (fraction) from `length_chars` and `format_fail`; aggregates from
    `tune_dfrl.report.schema`. Training metrics (`TRAIN_METRICS`) are averaged over the steps
    since the previous milestone.
    """

    def __init__(self, sources: Sequence[BenchmarkSource], bench: BenchmarkSet):
        self.sources, self.bench = tuple(sources), bench
        self.train: dict[str, list[float]] = defaultdict(list)

    def read(self, record: Mapping[str, Any]) -> Milestone | None:
        step, data = int(record["step"]), record["data"]
        for key, value in data.items():
            if key.startswith(TRAIN_METRICS) and _is_number(value):
                self.train[key].append(float(value))
        values = self._validation(data)
        if not values:
            return None
        missing = [s.data_source for s in self.sources if ("core", s.data_source) not in values]
        if missing:
            raise VerlRunError(f"verl validation at step {step} has no accuracy for data_source(s) {missing}")
        accuracy = {s.name: 100.0 * values["core", s.data_source] for s in self.sources}
        length = {s.name: values[k] for s in self.sources if (k := ("length_chars", s.data_source)) in values}
        failures = {s.name: values[k] for s in self.sources if (k := ("format_fail", s.data_source)) in values}
        milestone = Milestone(
            step, accuracy, length, failures, milestone_aggregates(accuracy, length, self.bench), self._train()
        )
        self.train.clear()
        return milestone

    def _validation(self, data: Mapping[str, Any]) -> dict[tuple[str, str], float]:
        """(variable | 'core', data_source) -> mean at the largest n, NaN / null values dropped."""
        best: dict[tuple[str, str], tuple[int, float]] = {}
        for key, value in data.items():
            match = _VAL_KEY.fullmatch(key)
            if match is None or not _is_number(value) or math.isnan(value):
                continue
            var = "core" if key.startswith("val-core/") else match["var"]
            slot, n = (var, match["source"]), int(match["n"])
            if slot not in best or n > best[slot][0]:
                best[slot] = (n, float(value))
        return {slot: value for slot, (_, value) in best.items()}

    def _train(self) -> dict[str, float]:
        return {key: float(np.mean(values)) for key, values in self.train.items()}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
