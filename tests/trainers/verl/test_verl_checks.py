"""Bad input is a clear error before any GPU is requested; calibration of the reward function."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from verl_stand_in import write_model

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.trainers.verl import checks
from tune_dfrl.trainers.verl.backend import VerlBackend
from tune_dfrl.trainers.verl.export import export_tasks
from tune_dfrl.trainers.verl.recipe import VerlRecipe, default_recipe
from tune_dfrl.trainers.verl.reward import compute_score

BASELINE = ArmSpec("baseline", {}, "base", "baseline")
MIXER = ArmSpec("dump_ucb", {"c": 1.0}, "ucb", "dump_ucb")
GSM8K = [
    {"data_source": "openai/gsm8k", "name": "gsm8k", "domain": "math", "items": 3, "reference_format": "#### {answer}"}
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verl_checks")
    model = write_model(root / "model")
    (root / "no_tokenizer").mkdir()
    (root / "no_tokenizer" / "config.json").write_text("{}")
    no_template = write_model(root / "no_template")
    (no_template / "chat_template.jinja").unlink()
    train, val = export_tasks(root / "generated", per_domain=4)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "data_source": "openai/gsm8k",
            "reward_model": {"style": "rule", "ground_truth": str(40 + i)},
        }
        for i in range(3)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "gsm8k.parquet")
    pq.write_table(
        pa.Table.from_pylist([{k: v for k, v in r.items() if k != "reward_model"} for r in rows]),
        root / "no_reward.parquet",
    )
    return {
        "model": model,
        "no_tokenizer": root / "no_tokenizer",
        "no_template": no_template,
        "train": train,
        "val": val,
        "gsm8k": root / "gsm8k.parquet",
        "no_reward": root / "no_reward.parquet",
        "missing": root / "missing.parquet",
    }


def recipe(files, **changes) -> dict:
    base = dict(
        model_path=str(files["model"]),
        train_files=[str(files["train"])],
        val_files=[str(files["val"])],
        gpus_per_trial=1,
        rollout_n=4,
        train_batch_size=8,
    )
    return default_recipe(**{**base, **changes})


def check(arm: ArmSpec, recipe: dict) -> None:
    checks.check_trial(arm, VerlRecipe.from_dict(recipe))


def test_a_good_recipe_passes_every_check_and_this_machine_lacks_what_it_lacks(files):
    backend = VerlBackend(recipe(files))
    backend.validate(MIXER)  # files, columns, benchmarks, arm, composed config through verl's validate_config
    problems = backend.machine_problems()
    assert any("vllm rollout is not installed" in p for p in problems) == (importlib.util.find_spec("vllm") is None)
    assert any("gpus_per_trial=1" in p for p in problems) == (checks.machine_gpus() < 1)
    assert VerlBackend(recipe(files, device="cpu")).machine_problems() == []


@pytest.mark.parametrize(
    ("arm", "changes", "message"),
    [
        (BASELINE, {"model_path": "/nowhere/model"}, "model_path /nowhere/model is not a Hugging Face model directory"),
        (BASELINE, {"train_files": ["MISSING"]}, r"parquet file .*missing\.parquet does not exist"),
        (BASELINE, {"val_files": ["NO_REWARD"]}, r"lacks the verl column\(s\) \['reward_model'\]"),
        (MIXER, {"train_files": ["GSM8K"]}, "mixer arms need the domain column 'domain'"),
        (MIXER, {"domain_column": "topic"}, "mixer arms need the domain column 'topic'"),
        (
            BASELINE,
            {"val_files": ["GSM8K"]},
            r"validation data_source\(s\) \['openai/gsm8k'\] have no benchmark mapping",
        ),
        (
            BASELINE,
            {"val_files": ["GSM8K"], "benchmarks": [{**GSM8K[0], "items": 5}]},
            "benchmark item counts differ from the validation rows: openai/gsm8k: items=5, rows=3",
        ),
        (BASELINE, {"gpus_per_trial": 0}, "gpus_per_trial must be >= 1"),
        (BASELINE, {"model_path": "NO_TOKENIZER"}, r"model_path .*no_tokenizer has no usable tokenizer"),
        (BASELINE, {"model_path": "NO_TEMPLATE"}, r"model_path .*no_template: its tokenizer has no chat template"),
        (ArmSpec("softmax", {"temprature": 2.0}, "x", "x"), {}, "unknown parameter 'temprature'"),
        (
            BASELINE,
            {"overrides": ["actor_rollout_ref.actor.use_dynamic_bsz=false"]},
            "(?s)verl rejects the recipe's configuration: .*ppo_micro_batch_size",
        ),
        (BASELINE, {"overrides": ["trainer.no_such_key=1"]}, "verl rejects the recipe's configuration"),
    ],
)
def test_bad_input_is_a_clear_error(files, arm, changes, message):
    def named(value: str) -> str:
        return str(files[value.lower()]) if value.isupper() else value

    changes = {
        k: [named(f) for f in v] if k.endswith("_files") else named(v) if k == "model_path" else v
        for k, v in changes.items()
    }
    with pytest.raises(ValueError, match=message):
        check(arm, recipe(files, **changes))


def test_missing_verl_or_verl_core_is_named(files, monkeypatch):
    real = importlib.util.find_spec
    hidden: set[str] = set()
    monkeypatch.setattr(checks.importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))
    hidden.add("transfer_queue")
    with pytest.raises(ValueError, match=r"'verl-core' extra is not installed \(missing modules: transfer_queue\)"):
        check(BASELINE, recipe(files))
    hidden.add("verl")
    with pytest.raises(
        ValueError, match=r"needs verl 0\.9\.1, which is not installed: pip install 'verl\[verl-core\]==0\.9\.1'"
    ):
        check(BASELINE, recipe(files))


def test_calibration_passes_on_the_generated_tasks_and_gsm8k(files):
    assert VerlBackend(recipe(files)).calibrate().ok
    gsm8k = recipe(files, val_files=[str(files["gsm8k"])], benchmarks=GSM8K)
    result = VerlBackend(gsm8k).calibrate()
    assert result.ok and result.failures == []


def test_calibration_catches_a_reference_format_the_scorer_rejects(files):
    wrong = [{**GSM8K[0], "reference_format": "The answer is {answer}"}]  # gsm8k's strict scorer wants '#### 42'
    result = VerlBackend(recipe(files, val_files=[str(files["gsm8k"])], benchmarks=wrong)).calibrate()
    assert not result.ok
    assert result.failures[0] == "gsm8k: response 'The answer is 40' (ground truth '40') scores 0.0, expected 1.0"


def test_calibration_skips_a_benchmark_without_reference_format(files, caplog):
    plain = [{k: v for k, v in GSM8K[0].items() if k != "reference_format"}]
    with caplog.at_level(logging.WARNING):
        result = VerlBackend(recipe(files, val_files=[str(files["gsm8k"])], benchmarks=plain)).calibrate()
    assert result.ok
    assert "benchmark gsm8k not calibrated" in caplog.text


def test_calibration_uses_the_reward_function_the_overrides_name(files, tmp_path):
    """A user's own verl reward function (float result: verl's core variable is the score itself)."""
    scorer = tmp_path / "my_reward.py"
    scorer.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str == 'ANSWER ' + ground_truth)\n"
    )
    bench = [{**GSM8K[0], "reference_format": "ANSWER {answer}"}]
    custom = [f"reward.custom_reward_function.path={scorer}", "reward.custom_reward_function.name=score"]
    user = recipe(files, val_files=[str(files["gsm8k"])], benchmarks=bench, overrides=custom)
    assert VerlBackend(user).calibrate().ok
    assert not VerlBackend({**user, "overrides": []}).calibrate().ok  # gsm8k's own scorer rejects that format


def test_reward_on_generated_rows_uses_the_embedded_verifier(files):
    row = pq.read_table(files["val"]).slice(0, 1).to_pylist()[0]  # math_sum3: "a+b+c=" with its answer
    truth, extra = row["reward_model"]["ground_truth"], row["extra_info"]
    assert compute_score(row["data_source"], f" {truth}\n", truth, extra) == {
        "score": 1.0,
        "acc": 1.0,
        "length_chars": float(len(truth) + 2),
        "format_fail": 0.0,
    }
    assert compute_score(row["data_source"], "forty", truth, extra)["format_fail"] == 1.0
    assert compute_score("openai/gsm8k", "#### 41", "42")["acc"] == 0.0


def test_resources_request_the_recipes_gpus_on_cuda_and_only_cpus_on_cpu(files):
    assert VerlBackend(recipe(files, gpus_per_trial=8)).resources() == {"cpu": 1, "gpu": 8}
    assert VerlBackend(recipe(files, device="cpu", cpus_per_trial=3)).resources() == {"cpu": 3, "gpu": 0}
    assert [b.name for b in VerlBackend(recipe(files)).benchmarks()][:2] == ["math_sum3", "math_mix3"]


@pytest.mark.parametrize(
    ("gpus", "tp", "fails"), [(1, 1, False), (4, 2, False), (1, 2, True), (3, 2, True), (8, 3, True)]
)
def test_a_rollout_parallelism_that_does_not_divide_the_trials_gpus_is_refused(files, gpus, tp, fails):
    tp_override = f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"
    changed = recipe(files, gpus_per_trial=gpus, overrides=[tp_override])
    if not fails:
        check(BASELINE, changed)
        return
    with pytest.raises(ValueError, match=f"tensor_model_parallel_size={tp} .* must divide gpus_per_trial={gpus}"):
        check(BASELINE, changed)


def test_a_trial_needing_more_gpus_than_this_machine_has_is_named():
    assert checks.gpu_shortage(2, 2) is None
    assert "gpus_per_trial=2" in checks.gpu_shortage(2, 1) and "set backend.gpus_per_trial to at most 1" in (
        checks.gpu_shortage(2, 1)
    )
    assert "backend.device=cpu" in checks.gpu_shortage(1, 0)


def test_flash_attention_asked_for_without_flash_attn_is_named(files):
    asked = VerlBackend(
        recipe(files, overrides=["+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"])
    )
    flash = [p for p in asked.machine_problems() if "flash-attn does not import" in p]
    assert len(flash) == (importlib.util.find_spec("flash_attn") is None)
    assert not any("flash-attn" in p for p in VerlBackend(recipe(files)).machine_problems())  # the recipe's choice
