"""Checks that run before any GPU is requested, and the reward calibration smoke test.

`check_trial` raises ValueError naming what is wrong and what is allowed when verl (or its
`verl-core` extra) is missing, the model directory or a parquet file is missing, the model's
tokenizer does not load or has no chat template that renders a training prompt, a parquet file
lacks a column verl or the arm needs (the domain column for mixers), validation data_sources and
the benchmark mapping disagree, the arm's parameters are invalid, or verl's own
`validate_config` rejects the composed configuration, or its rollout parallelism does not divide
`gpus_per_trial` (`check_parallelism`). `check_rollout_engine` checks the rollout engine: vLLM /
SGLang, which only the `gpu` extra installs, or on `device: cpu` our CPU package.
`machine_problems` lists what this machine lacks for a cuda recipe (GPUs, the rollout engine,
flash-attn when the configuration asks for it): errors before a search, warnings of a dry run.

`calibrate` scores, per benchmark, the first `CALIBRATION_ROWS` validation rows with the reward
function the trials will use (`reward.custom_reward_function` of the composed config: ours,
reward.py, unless the recipe's overrides name another): the ground truth rendered by the
benchmark's `reference_format` must score 1 and each `MALFORMED` response 0 on verl's core
validation variable (`acc` when the function returns it, else the score). A benchmark without a
`reference_format` is skipped with a logged warning (its answer format is unknown to us).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import inspect
import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tune_dfrl.backends.base import ArmSpec, CalibrationResult

from .hook import DataPolicy, is_mixer
from .recipe import (
    ATTENTION_KEY,
    VERL_ATTENTION,
    VerlRecipe,
    attention_implementation,
    build_overrides,
    check_verl_config,
    compose_verl_config,
)

VERL_VERSION = "0.9.1"
VERL_CORE_MODULES = ("transfer_queue", "zmq", "msgspec", "tensordict", "torchdata", "datasets", "fastapi", "uvicorn")
VERL_COLUMNS = ("prompt", "data_source", "reward_model")
CALIBRATION_ROWS = 32
MALFORMED = ("", "no answer")
CALIBRATION_ARM = ArmSpec("baseline", {}, "calibration", "calibration")

log = logging.getLogger(__name__)


def check_verl_installed() -> None:
    install = f"pip install 'verl[verl-core]=={VERL_VERSION}'"
    if importlib.util.find_spec("verl") is None:
        raise ValueError(f"the verl backend needs verl {VERL_VERSION}, which is not installed: {install}")
    version = importlib.metadata.version("verl")
    if version != VERL_VERSION:
        raise ValueError(f"the verl backend needs verl {VERL_VERSION}; installed: {version}. {install}")
    missing = [m for m in VERL_CORE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"verl's 'verl-core' extra is not installed (missing modules: {', '.join(missing)}): {install}"
        )


def check_rollout_engine(recipe: VerlRecipe) -> None:
    if recipe.device == "cpu":
        try:
            _ = recipe.engine  # importing the CPU rollout engine is the check
        except Exception as error:
            raise ValueError(
                f"device=cpu needs tune_dfrl.trainers.verl.cpu (the CPU platform and HF rollout), which "
                f"does not import: {type(error).__name__}: {error}"
            ) from error
        return
    if (problem := missing_rollout_engine(recipe)) is not None:
        raise ValueError(problem)


def missing_rollout_engine(recipe: VerlRecipe) -> str | None:
    """What to install when the cuda rollout engine is not installed (found by `find_spec`: importing vLLM takes
    seconds and touches CUDA), else None."""
    if importlib.util.find_spec(recipe.engine) is not None:
        return None
    return (
        f"verl's {recipe.engine} rollout is not installed. On a GPU machine install verl[vllm]==0.9.1 "
        "(the `gpu` extra; steps in docs/readme_verl.md); never on a CPU-only machine, it replaces torch"
    )


def machine_gpus() -> int:
    """GPUs this process sees (`CUDA_VISIBLE_DEVICES` applies); a Ray cluster's other nodes are not counted."""
    import torch

    return torch.cuda.device_count()


def gpu_shortage(gpus_per_trial: int, available: int) -> str | None:
    """Why a trial of `gpus_per_trial` GPUs cannot run on a machine with `available`, else None."""
    if gpus_per_trial <= available:
        return None
    fix = (
        f"set backend.gpus_per_trial to at most {available}"
        if available
        else "run it on a GPU machine, or try the recipe on this one with backend.device=cpu"
    )
    return (
        f"device=cuda: gpus_per_trial={gpus_per_trial}, the GPUs a trial needs on one machine; this one has "
        f"{available} (torch.cuda.device_count(); other nodes of a Ray cluster are not counted): {fix}"
    )


def machine_problems(recipe: VerlRecipe) -> list[str]:
    """What this machine lacks for the recipe's trials on cuda (none on cpu): GPUs, the rollout engine, flash-attn
    when the configuration asks for a flash attention implementation."""
    if recipe.device != "cuda":
        return []
    config = trial_config(recipe, CALIBRATION_ARM)
    asked = str(config.actor_rollout_ref.model.override_config.get("attn_implementation", VERL_ATTENTION))
    flash = (
        f"the verl configuration asks for attn_implementation={asked} ({ATTENTION_KEY}), but flash-attn does not "
        "import here: install flash-attn built for this torch, or drop that override (the recipe then uses "
        f"{attention_implementation()})"
    )
    problems = [
        gpu_shortage(recipe.gpus_per_trial, machine_gpus()),
        missing_rollout_engine(recipe),
        flash if asked.startswith("flash_attention") and attention_implementation() != VERL_ATTENTION else None,
    ]
    return [p for p in problems if p is not None]


def check_parallelism(recipe: VerlRecipe, config: Any) -> None:
    """The rollout's tensor x data x pipeline parallel size divides `gpus_per_trial` (verl asserts it only once its
    workers start, engine_workers.py)."""
    rollout = config.actor_rollout_ref.rollout
    tp, dp, pp = (
        int(rollout[k]) for k in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
    )
    if recipe.gpus_per_trial % (tp * dp * pp):
        raise ValueError(
            f"the rollout's tensor_model_parallel_size={tp} x data_parallel_size={dp} x "
            f"pipeline_model_parallel_size={pp} must divide gpus_per_trial={recipe.gpus_per_trial}: set "
            "actor_rollout_ref.rollout.tensor_model_parallel_size (in backend.overrides) to a divisor of "
            f"{recipe.gpus_per_trial}, or change backend.gpus_per_trial"
        )


def parquet_columns(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"parquet file {path} does not exist")
    try:
        return pq.read_schema(path).names
    except Exception as error:
        raise ValueError(f"{path} is not a readable parquet file: {error}") from error


def read_column(paths: tuple[Path, ...], column: str) -> list[Any]:
    return [v for p in paths for v in pq.read_table(p, columns=[column]).column(column).to_pylist()]


def check_data(recipe: VerlRecipe, mixer: bool) -> list[str]:
    """Files and columns; returns the sorted training domains (empty without a domain column)."""
    if not (recipe.model_path / "config.json").is_file():
        raise ValueError(f"model_path {recipe.model_path} is not a Hugging Face model directory (no config.json)")
    columns = {p: parquet_columns(p) for p in (*recipe.train_files, *recipe.val_files)}
    for path, names in columns.items():
        lacking = [c for c in VERL_COLUMNS if c not in names]
        if lacking:
            raise ValueError(
                f"{path} lacks the verl column(s) {lacking}; verl RL parquet files need {list(VERL_COLUMNS)}"
            )
    without_domain = [str(p) for p in recipe.train_files if recipe.domain_column not in columns[p]]
    if without_domain and mixer:
        raise ValueError(
            f"mixer arms need the domain column '{recipe.domain_column}' (recipe key domain_column) in every "
            f"training file; missing in {without_domain}"
        )
    if without_domain:
        return []
    domains = read_column(recipe.train_files, recipe.domain_column)
    if any(d is None or d == "" for d in domains):
        raise ValueError(f"domain column '{recipe.domain_column}' of the training files has empty values")
    return sorted(set(map(str, domains)))


def check_tokenizer(recipe: VerlRecipe) -> None:
    """The model's tokenizer loads, has a chat template, and renders the first training prompt to tokens
    (`apply_chat_template(prompt, add_generation_prompt=True)`, as verl's RLHFDataset renders prompts)."""
    from transformers import AutoTokenizer

    where = f"model_path {recipe.model_path}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(recipe.model_path))
    except Exception as error:
        raise ValueError(f"{where} has no usable tokenizer: {type(error).__name__}: {error}") from error
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{where}: its tokenizer has no chat template, with which verl renders every prompt; add one "
            "(`chat_template` in tokenizer_config.json), e.g. as `python -m tune_dfrl.trainers.verl.export` does"
        )
    prompt = pq.read_table(recipe.train_files[0], columns=["prompt"]).column("prompt")[0].as_py()
    try:
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    except Exception as error:
        raise ValueError(
            f"{where}: its chat template cannot render the first training prompt {prompt!r}: "
            f"{type(error).__name__}: {error}"
        ) from error
    if not tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise ValueError(f"{where}: its chat template renders the first training prompt {prompt!r} to no tokens")


def check_benchmarks(recipe: VerlRecipe) -> None:
    """Every validation data_source is mapped to a benchmark with its exact row count, and back."""
    counts = Counter(read_column(recipe.val_files, "data_source"))
    mapped = {b.data_source: b for b in recipe.benchmark_sources()}
    unmapped = sorted(set(counts) - set(mapped))
    if unmapped:
        raise ValueError(f"validation data_source(s) {unmapped} have no benchmark mapping; mapped: {sorted(mapped)}")
    absent = sorted(set(mapped) - set(counts))
    if absent:
        raise ValueError(
            f"benchmark data_source(s) {absent} have no rows in the validation files {list(recipe.val_files)}"
        )
    wrong = [f"{s}: items={b.items}, rows={counts[s]}" for s, b in mapped.items() if b.items != counts[s]]
    if wrong:
        raise ValueError(f"benchmark item counts differ from the validation rows: {'; '.join(wrong)}")
    recipe.benchmark_set()  # names, domains and subsets


def trial_config(recipe: VerlRecipe, arm: ArmSpec) -> Any:
    """verl's config of a trial of `arm` under `recipe` (seed and checkpoint folder do not matter here)."""
    return compose_verl_config(build_overrides(recipe, arm, seed=0, checkpoint_dir=Path("/nonexistent")))


def check_trial(arm: ArmSpec, recipe: VerlRecipe) -> None:
    """Everything but the rollout engine (see the module docstring)."""
    check_verl_installed()
    if recipe.gpus_per_trial < 1:
        raise ValueError(f"verl trains on GPUs: gpus_per_trial must be >= 1; got {recipe.gpus_per_trial}")
    domains = check_data(recipe, is_mixer(arm.method))
    check_tokenizer(recipe)
    check_benchmarks(recipe)
    DataPolicy.from_arm({"method": arm.method, "params": arm.params}, recipe.rollout_n, domains, recipe.domain_column)
    try:
        config = trial_config(recipe, arm)
        check_verl_config(config)
    except Exception as error:  # Hydra composition and verl's dataclass / assert checks
        raise ValueError(f"verl rejects the recipe's configuration: {error}") from error
    check_parallelism(recipe, config)


def trial_reward_function(recipe: VerlRecipe) -> Callable[..., Any]:
    """The reward function verl will load for this recipe (verl/trainer/ppo/reward.py)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.reward_score import default_compute_score

    return get_custom_reward_fn(trial_config(recipe, CALIBRATION_ARM)) or default_compute_score


def core_value(result: Any) -> float:
    """verl's core validation variable of one reward result (naive reward manager): `acc`, else the score."""
    if inspect.isawaitable(result):
        result = asyncio.run(result)
    if isinstance(result, dict):
        return float(result.get("acc", result["score"]))
    return float(result)


def calibrate(recipe: VerlRecipe) -> CalibrationResult:
    """Reference answers must score 1 and malformed ones 0 (module docstring)."""
    score = trial_reward_function(recipe)
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in recipe.val_files:
        wanted = [c for c in ("data_source", "reward_model", "extra_info") if c in parquet_columns(path)]
        for row in pq.read_table(path, columns=wanted).to_pylist():
            if len(samples[row["data_source"]]) < CALIBRATION_ROWS:
                samples[row["data_source"]].append(row)
    failures: list[str] = []
    for bench in recipe.benchmark_sources():
        if bench.reference_format is None:
            log.warning("benchmark %s not calibrated: its recipe entry has no reference_format", bench.name)
            continue
        if not samples[bench.data_source]:
            failures.append(f"{bench.name}: no validation rows with data_source {bench.data_source!r}")
        for row in samples[bench.data_source]:
            truth = row["reward_model"]["ground_truth"]
            extra_info = dict(row.get("extra_info") or {})
            cases = [(bench.reference_format.format(answer=truth), 1.0), *((m, 0.0) for m in MALFORMED)]
            for response, want in cases:
                got = core_value(
                    score(
                        data_source=bench.data_source, solution_str=response, ground_truth=truth, extra_info=extra_info
                    )
                )
                if got != want:
                    failures.append(
                        f"{bench.name}: response {response!r} (ground truth {truth!r}) scores {got}, expected {want}"
                    )
    return CalibrationResult(ok=not failures, failures=failures)
