"""`python -m tune_dfrl.search ... backend=verl dry_run=true` through the CLI, on the project's exporter's model and
tasks: the GPU smoke test's exact command (benchmarks/verl_cpu_e2e.py `search_args`), the default recipe on cuda and
the default command on cpu check and print their plan and first verl command, exit 0 and start nothing; a rollout TP
that does not divide the trial's GPUs, more GPUs than this machine has, and an override Hydra cannot parse are one
`error:` line, exit 2, before Ray starts (each run gets its own `RAY_TMPDIR`, which must stay absent). The smoke
command runs as a process; the others call the CLI's `main` in this process (verl's imports once)."""

from __future__ import annotations

import importlib
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tune_dfrl.trainers.embedded.model import ModelShape, build_tokenizer, new_model, save_model
from tune_dfrl.trainers.verl import timeline
from tune_dfrl.trainers.verl.checks import machine_gpus
from tune_dfrl.trainers.verl.recipe import check_verl_config, compose_verl_config, hydra_quote

ROOT = Path(__file__).resolve().parents[3]

# The search command with the verl backend: each exports the tiny model and runs the calibration smoke test (tens of
# seconds of verl imports), which is what `make check` leaves to `make test`.
pytestmark = pytest.mark.integration
_spec = importlib.util.spec_from_file_location("verl_cpu_e2e", ROOT / "benchmarks" / "verl_cpu_e2e.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """The smoke test's files: the exporter run on a randomly initialised embedded model (`e2e.export`)."""
    root = tmp_path_factory.mktemp("verl_dry_run")
    tokenizer = build_tokenizer()
    save_model(new_model(ModelShape(), len(tokenizer), torch.Generator().manual_seed(3)), tokenizer, root / "raw")
    return e2e.export(root / "export", root / "raw")


def search(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in `cwd` with a private, initially absent `RAY_TMPDIR` (asserted absent after: Ray never started)."""
    ray_tmp = cwd / "ray_tmp"
    done = subprocess.run(
        [sys.executable, "-m", "tune_dfrl.search", *args],
        cwd=cwd,
        env=e2e.search_env() | {"RAY_TMPDIR": str(ray_tmp)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert not ray_tmp.exists() and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


@pytest.fixture
def cli(monkeypatch, capsys, tmp_path):
    """`python -m tune_dfrl.search ARGS` as `tune_dfrl.search.cli.main` in this process, in `tmp_path`: its exit code,
    standard output and error; Ray must not have started."""
    import ray

    from tune_dfrl.search import cli as search_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray_tmp"))
    started: list[tuple] = []  # (other tests of the session may have started Ray in this process already)
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: started.append((args, kwargs)))

    def run(*args: str) -> subprocess.CompletedProcess:
        monkeypatch.setattr(sys, "argv", ["tune_dfrl.search", *args])
        with pytest.raises(SystemExit) as exited:
            search_cli.main()
        captured = capsys.readouterr()
        assert started == [] and not (tmp_path / "ray_tmp").exists()
        return subprocess.CompletedProcess(args, exited.value.code, captured.out, captured.err)

    return run


def default_args(files: dict, *changes: str) -> list[str]:
    """The documented command: the model and data paths only (the exporter's full validation file)."""
    return [
        "space=difffilter_band",
        "backend=verl",
        f"backend.model_path={hydra_quote(str(files['model']))}",
        f"backend.train_files=[{hydra_quote(str(files['train']))}]",
        f"backend.val_files=[{hydra_quote(str(files['val'].with_name('val.parquet')))}]",
        *changes,
    ]


def first_trial_config(stdout: str):
    """verl's config composed from the first trial's command line the dry run printed."""
    line = next(line for line in stdout.splitlines() if line.startswith("first trial"))
    command = shlex.split(line.split(": ", 1)[1])
    return compose_verl_config(command[command.index(timeline.DRIVER_MODULE) + 1 :])


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def assert_runnable_on_cuda(config, gpus: int) -> None:
    check_verl_config(config)
    assert config.trainer.n_gpus_per_node == gpus and config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    attention = config.actor_rollout_ref.model.override_config.attn_implementation
    if attention != "sdpa":
        importlib.import_module("flash_attn")  # chosen only where it imports
    assert config.actor_rollout_ref.actor.use_kl_loss  # the recipe's own settings are kept


def test_the_gpu_smoke_command_dry_runs_to_tp_1_on_one_gpu(files, tmp_path):
    out = tmp_path / "out"
    done = search(tmp_path, *e2e.search_args(files, "cuda", 2, 2, 4, out), "dry_run=true")
    assert done.returncode == 0, done.stderr[-3000:]
    config = first_trial_config(done.stdout)
    assert_runnable_on_cuda(config, gpus=1)
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.3  # the smoke's own, added last
    assert '"gpu": 1' in done.stdout and "arms: the control (baseline) + 2 searched; seeds [0, 1]" in done.stdout
    assert any("vllm" in w for w in warnings(done.stderr)) == (importlib.util.find_spec("vllm") is None)
    assert not out.exists()


@pytest.mark.parametrize(("changes", "gpus"), [((), 8), (("backend.gpus_per_trial=1",), 1)])
def test_the_default_recipe_on_cuda_dry_runs_and_writes_nothing(files, cli, tmp_path, changes, gpus):
    done = cli(*default_args(files, *changes, "dry_run=true"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_runnable_on_cuda(first_trial_config(done.stdout), gpus)
    assert "milestones at [20, 40, 60, 80, 100, 120, 140, 160, 180, 200]" in done.stdout
    assert "scheduler paired_asha: rungs at steps [40, 60" in done.stdout
    shortage = any(f"gpus_per_trial={gpus}," in w for w in warnings(done.stderr))
    assert shortage == (machine_gpus() < gpus)
    assert list(tmp_path.iterdir()) == []  # not even the default output folder


def test_the_default_cpu_command_dry_runs_with_one_gpu_and_no_gpu_settings(files, cli, tmp_path):
    done = cli(*default_args(files, "backend.device=cpu", "dry_run=true"))
    assert done.returncode == 0 and warnings(done.stderr) == [], done.stderr[-3000:]
    config = first_trial_config(done.stdout)
    check_verl_config(config)
    assert config.trainer.device == "cpu" and config.trainer.n_gpus_per_node == 1
    assert config.actor_rollout_ref.rollout.gpu_memory_utilization != 0.6  # the cuda-only share is not applied
    assert 'resources per trial (asked of Ray Tune): {"cpu": 1, "gpu": 0}' in done.stdout
    assert list(tmp_path.iterdir()) == []


def errors(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stderr.splitlines() if line.startswith("error: ")]


def test_a_rollout_tp_that_does_not_divide_the_trials_gpus_is_an_error_in_a_dry_run(files, cli, tmp_path):
    tp = hydra_quote("actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    done = cli(*default_args(files, "backend.gpus_per_trial=1", f"backend.overrides=[{tp}]", "dry_run=true"))
    [line] = errors(done)
    assert "tensor_model_parallel_size=2 x data_parallel_size=1 x pipeline_model_parallel_size=1" in line
    assert "must divide gpus_per_trial=1" in line and list(tmp_path.iterdir()) == []


def test_more_gpus_than_this_machine_has_is_an_error_and_a_warning_in_a_dry_run(files, cli, tmp_path):
    many = machine_gpus() + 1
    done = cli(*default_args(files, f"backend.gpus_per_trial={many}"))
    [line] = errors(done)
    assert line.startswith(f"error: device=cuda: gpus_per_trial={many}, the GPUs a trial needs on one machine;")
    assert list(tmp_path.iterdir()) == []
    dry = cli(*default_args(files, f"backend.gpus_per_trial={many}", "dry_run=true"))
    assert dry.returncode == 0 and f"warning: {line.removeprefix('error: ')}" in dry.stderr.splitlines()


def test_an_override_hydra_cannot_parse_is_an_error_line(files, cli):
    unquoted = f"backend.overrides=[{','.join(e2e.GPU_OVERRIDES)}]"  # the smoke test's command once
    [line] = errors(cli(*default_args(files, unquoted, "dry_run=true")))
    assert line.startswith(f"error: Hydra cannot parse the override {unquoted!r}: no viable alternative")


def test_dry_run_is_a_checked_setting(cli):
    assert errors(cli("dry_run=maybe")) == ["error: dry_run='maybe': allowed: one of true, false"]
