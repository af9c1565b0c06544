"""Our verl Hydra overrides compose with verl's own config and pass verl's validate_config; recipe errors."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tune_dfrl.backends.base import ArmSpec
from tune_dfrl.trainers.verl.recipe import (
    ATTENTION_KEY,
    OBJECT_STORE_BYTES,
    VerlRecipe,
    attention_implementation,
    build_overrides,
    check_verl_config,
    compose_verl_config,
    cuda_settings,
    default_recipe,
    ends_at_final_milestone,
    hydra_quote,
    ray_temp_dir,
)

ARM = ArmSpec("gfpo", {"k": 2, "metric": "short", "note": "it's a \\ test"}, "abc123def456", "gfpo k=2")


def make_recipe(**changes) -> VerlRecipe:
    base = dict(model_path="/models/m", train_files=["/data/train.parquet"], val_files=["/data/val.parquet"])
    return VerlRecipe.from_dict(default_recipe(**{**base, **changes}))


@pytest.mark.parametrize("text", ["plain", "it's", "ends with \\", "a\\'b", 'q"\\"', "/a b/c=d,e.parquet"])
def test_hydra_quote_round_trips(text):
    assert OverridesParser.create().parse_overrides([f"k={hydra_quote(text)}"])[0].value() == text


def test_hydra_quote_refuses_interpolation():
    with pytest.raises(ValueError, match="OmegaConf interpolation"):
        hydra_quote("${oc.env:HOME}")


def test_overrides_compose_with_verl_config_and_pass_validate_config(tmp_path):
    recipe = make_recipe(
        gpus_per_trial=4,
        rollout_n=8,
        milestone_every=10,
        steps=50,
        lr=2e-6,
        overrides=["actor_rollout_ref.actor.kl_loss_coef=0.005"],
    )
    config = compose_verl_config(build_overrides(recipe, ARM, seed=11, checkpoint_dir=tmp_path))
    check_verl_config(config)  # verl/utils/config.py validate_config, as main_ppo runs it
    OmegaConf.resolve(config)  # as verl's TaskRunnerV1 does before reading it

    assert config.algorithm.adv_estimator == "grpo"
    assert config.trainer.v1.trainer_mode == "tune_dfrl" and config.trainer.use_v1
    assert (
        config.data.seed,
        config.actor_rollout_ref.actor.data_loader_seed,
        config.actor_rollout_ref.rollout.seed,
    ) == (11, 11, 11)
    assert list(config.trainer.logger) == ["console", "file"]
    assert (config.trainer.test_freq, config.trainer.save_freq, config.trainer.total_training_steps) == (10, 10, 50)
    assert not config.trainer.val_before_train
    assert config.trainer.n_gpus_per_node == 4 and config.trainer.nnodes == 1
    assert config.actor_rollout_ref.rollout.n == 8 and config.actor_rollout_ref.actor.optim.lr == 2e-6
    assert config.ray_kwargs.ray_init.address == "local"
    assert config.trainer.default_local_dir == str(tmp_path.resolve() / "verl")
    assert list(config.data.train_files) == ["/data/train.parquet"]
    assert config.reward.custom_reward_function.path == "pkg://tune_dfrl.trainers.verl.reward"
    assert json.loads(config.tune_dfrl.policy) == {"method": "gfpo", "params": ARM.params, "arm_id": ARM.arm_id}
    assert config.tune_dfrl.domain_column == "domain"
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0.005  # the recipe's own overrides come last and win


def test_reward_function_path_loads_through_verl():
    from verl.utils.import_utils import load_extern_object

    from tune_dfrl.trainers.verl.reward import compute_score

    assert load_extern_object("pkg://tune_dfrl.trainers.verl.reward", "compute_score") is compute_score


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temprature": 1.0}, r"unknown verl recipe keys \['temprature'\]; allowed: .*lr"),
        ({"model_path": "???"}, "verl recipe key 'model_path' must be set"),
        ({"rollout_n": 0}, "backend.rollout_n=0: allowed: an integer >= 1"),
        ({"lr": "fast"}, "backend.lr='fast': allowed: a number > 0"),
        ({"gpus_per_trial": -1}, "backend.gpus_per_trial=-1: allowed: null or an integer >= 0"),
        ({"benchmarks": [{"data_source": "x", "domain": "math", "items": 0}]}, "benchmark 'x': items=0: allowed"),
        ({"ppo_mini_batch_size": 48}, "ppo_mini_batch_size=48 must divide train_batch_size=128"),
        ({"rollout_engine": "hf"}, r"backend.rollout_engine='hf': allowed: null or one of vllm, sglang"),
        ({"device": "tpu"}, "backend.device='tpu': allowed: one of cuda, cpu"),
        (
            {"device": "cpu", "gpus_per_trial": 1, "rollout_engine": "vllm"},
            "device=cpu rolls out with tune_dfrl's HF rollout; rollout_engine=vllm needs GPUs",
        ),
        ({"device": "cpu", "gpus_per_trial": 2}, "device=cpu .* gpus_per_trial must be 1; got 2"),
        ({"command": "python -m verl"}, "'command' must be null or a non-empty list of strings"),
        ({"val_files": ["data/val.parquet"]}, r"'val_files' needs absolute paths .*\['data/val.parquet'\]"),
        ({"benchmarks": [{"data_source": "x", "items": 3}]}, "keys: data_source, domain, items"),
    ],
)
def test_recipe_errors_name_the_key_and_what_is_allowed(changes, message):
    base = dict(model_path="/m", train_files=["/t.parquet"], val_files=["/v.parquet"])
    with pytest.raises(ValueError, match=message):
        VerlRecipe.from_dict({**default_recipe(**base), **changes})


def test_missing_keys_are_named():
    recipe = default_recipe(model_path="/m", train_files=["/t"], val_files=["/v"])
    del recipe["steps"]
    with pytest.raises(ValueError, match=r"lacks keys \['steps'\]"):
        VerlRecipe.from_dict(recipe)


def test_generated_benchmarks_when_the_recipe_leaves_them_null():
    bench = make_recipe().benchmark_set()
    assert len(bench.benchmarks) == 12 and bench.domains == ["math", "logic", "science"]
    assert all(b.reference_format == "{answer}" for b in make_recipe().benchmark_sources())


def test_default_recipe_file_is_the_hydra_group_file():
    path = Path(__file__).parents[3] / "tune_dfrl" / "conf" / "backend" / "verl.yaml"
    assert OmegaConf.to_container(OmegaConf.load(path)) == default_recipe()


def test_gpus_per_trial_follows_the_device_unless_set():
    assert make_recipe().gpus_per_trial == 8 and make_recipe(device="cpu").gpus_per_trial == 1
    assert make_recipe(gpus_per_trial=2).gpus_per_trial == 2


def test_the_recipes_own_settings_stay_under_the_recipes_overrides_and_follow_the_device(tmp_path):
    """KL loss and rollout TP 1 on both devices; vLLM's memory share and the attention implementation on cuda only;
    the recipe's `overrides` add to them (a user's list never drops them) and win."""
    overrides = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    cuda = compose_verl_config(build_overrides(make_recipe(overrides=overrides), ARM, 0, tmp_path))
    actor, rollout = cuda.actor_rollout_ref.actor, cuda.actor_rollout_ref.rollout
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert rollout.tensor_model_parallel_size == 1 and rollout.gpu_memory_utilization == 0.3
    attention = cuda.actor_rollout_ref.model.override_config.attn_implementation
    assert attention == attention_implementation() == ("sdpa" if find_spec("flash_attn") is None else attention)
    chosen = f"+{ATTENTION_KEY}=eager"
    assert build_overrides(make_recipe(overrides=[chosen]), ARM, 0, tmp_path).count(chosen) == 1
    assert not any(ATTENTION_KEY in o for o in cuda_settings(make_recipe(overrides=[chosen])))
    cpu = build_overrides(make_recipe(device="cpu", gpus_per_trial=1), ARM, 0, tmp_path)
    assert not any("gpu_memory_utilization" in o for o in cpu)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in cpu


def flat_config(recipe: VerlRecipe, checkpoint_dir: Path) -> dict:
    """Every leaf of a trial's verl config as `dotted.key -> value` (interpolations unresolved)."""

    def leaves(node, prefix: str = "") -> dict:
        if not isinstance(node, dict):
            return {prefix[:-1]: node}
        return {k: v for key, value in node.items() for k, v in leaves(value, f"{prefix}{key}.").items()}

    config = compose_verl_config(build_overrides(recipe, ARM, 0, checkpoint_dir))
    return leaves(OmegaConf.to_container(config, resolve=False))


def test_the_cpu_and_cuda_configurations_differ_in_the_documented_keys_only(tmp_path):
    """docs/readme_verl.md, "What differs from GPU": the default recipe on one GPU, composed for each device."""
    cuda = flat_config(make_recipe(gpus_per_trial=1), tmp_path)
    cpu = flat_config(make_recipe(device="cpu"), tmp_path)
    rollout, actor, absent = "actor_rollout_ref.rollout.", "actor_rollout_ref.actor.", "<absent>"
    documented = {
        "trainer.device": ("cuda", "cpu"),
        rollout + "name": ("vllm", "hf_cpu"),
        rollout + "gpu_memory_utilization": (0.6, 0.5),
        actor + "use_torch_compile": (True, False),
        actor + "fsdp_config.use_torch_compile": (True, False),
        rollout + "full_determinism": (False, True),
        rollout + "agent.default_agent_loop": ("single_turn_agent", "hf_cpu_single_turn"),
        "ray_kwargs.ray_init.num_gpus": (absent, 1),
    }
    if attention_implementation() != "sdpa":  # flash-attn imports here: cuda uses it, cpu sdpa
        documented[ATTENTION_KEY] = (attention_implementation(), "sdpa")
    differ = {
        key: (cuda.get(key, absent), cpu.get(key, absent))
        for key in cuda.keys() | cpu.keys()
        if cuda.get(key, absent) != cpu.get(key, absent)
    }
    assert differ == documented
    for config in (cuda, cpu):  # the GPU recipe's actor on both: FSDP2, KL loss to the reference model
        assert config[actor + "strategy"] == "fsdp2" and config[actor + "use_kl_loss"] is True


@pytest.mark.parametrize(
    ("cpus", "gpus", "logical_cpus"), [(1, 1, 16), (2, 1, 16), (32, 2, 34), (64, 8, 64), (16, 8, 52)]
)
def test_a_trials_private_ray_is_sized_by_the_trial_and_kept_in_its_folder_on_both_devices(
    tmp_path, cpus, gpus, logical_cpus
):
    """Logical CPUs max(cpus, 16, 3 x gpus + 3 x helpers + 4), Ray's object store bounded, Ray's temporary folder the
    trial's; the GPUs are the ones Tune gives the trial (no num_gpus on cuda)."""
    for device in ("cuda", "cpu") if gpus == 1 else ("cuda",):
        config = flat_config(make_recipe(device=device, gpus_per_trial=gpus, cpus_per_trial=cpus), tmp_path)
        assert config["ray_kwargs.ray_init.num_cpus"] == logical_cpus
        assert config["ray_kwargs.ray_init.object_store_memory"] == OBJECT_STORE_BYTES
        assert config["ray_kwargs.ray_init._temp_dir"] == str(ray_temp_dir(tmp_path))
        assert ("ray_kwargs.ray_init.num_gpus" in config) == (device == "cpu")
    bigger = f"ray_kwargs.ray_init.object_store_memory={4 * 1024**3}"  # a recipe may raise it
    config = flat_config(make_recipe(gpus_per_trial=gpus, cpus_per_trial=cpus, overrides=[bigger]), tmp_path)
    assert config["ray_kwargs.ray_init.object_store_memory"] == 4 * 1024**3


def test_a_long_trial_folder_gets_a_short_private_ray_folder(tmp_path):
    """Ray's Unix socket paths hold at most 107 characters: a trial folder too deep for them gets a folder named by its
    hash in the system's temporary folder, never the machine-wide default."""
    short, deep = Path("/tmp/t"), tmp_path / ("x" * 60)
    assert ray_temp_dir(short) == short / "ray"
    assert len(str(ray_temp_dir(deep))) <= 40 and ray_temp_dir(deep) != Path("/tmp/ray")
    assert ray_temp_dir(deep) == ray_temp_dir(deep) != ray_temp_dir(tmp_path / ("y" * 60))


@pytest.mark.parametrize(("cpus", "helpers"), [(1, 1), (2, 1), (4, 2), (7, 3), (64, 8)])
def test_verls_helper_processes_scale_with_the_trials_cpus_on_both_devices(tmp_path, cpus, helpers):
    """verl's 8 agent-loop workers, reward workers and storage units become one of each per 2 CPUs, at most 8."""
    for device in ("cuda", "cpu"):
        config = flat_config(make_recipe(device=device, gpus_per_trial=1, cpus_per_trial=cpus), tmp_path)
        assert config["actor_rollout_ref.rollout.agent.num_workers"] == helpers
        assert config["reward.num_workers"] == helpers
        assert config["transfer_queue.backend.SimpleStorage.num_data_storage_units"] == helpers


@pytest.mark.parametrize(
    ("device", "overrides", "ends"),
    [
        ("cpu", (), True),
        ("cpu", ("actor_rollout_ref.actor.optim.lr=1e-5", "trainer.log_val_generations=4"), True),
        ("cpu", ("trainer.logger=[console,file,wandb]",), False),
        ("cpu", ("+trainer.rollout_data_dir=/tmp/rollouts",), False),
        ("cpu", ("actor_rollout_ref.actor.checkpoint.async_save=true",), False),
        ("cuda", (), False),
    ],
)
def test_a_trial_ends_at_its_final_milestone_unless_verl_writes_after_its_last_log(device, overrides, ends):
    recipe = make_recipe(device=device, gpus_per_trial=1, overrides=list(overrides))
    assert ends_at_final_milestone(recipe) is ends
